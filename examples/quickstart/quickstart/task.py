"""Data, model and local training for the quickstart (sklearn digits, no download).

Data: ``load_digits`` (1 797 8x8 images, embedded in scikit-learn), pixels scaled
to [0, 1], one fixed stratified 75/25 train/test split. Each split is partitioned
IID over the clients with flwr-datasets' ``IidPartitioner`` (contiguous shards of
the already shuffled split).
"""

from __future__ import annotations

from functools import lru_cache

import datasets
import numpy as np
import torch
from flwr_datasets.partitioner import IidPartitioner
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

torch.set_num_threads(1)

SPLIT_SEED = 42
NUM_FEATURES = 64
NUM_CLASSES = 10


@lru_cache(maxsize=1)
def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, y_train, X_test, y_test): float32 features in [0, 1], int64 labels."""
    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(
        features, labels.astype(np.int64), test_size=0.25, random_state=SPLIT_SEED, stratify=labels
    )
    return x_tr, y_tr, x_te, y_te


@lru_cache(maxsize=8)
def _partitioner(num_partitions: int, split: str) -> IidPartitioner:
    """An IidPartitioner over the train or test split (cached per process)."""
    x_tr, y_tr, x_te, y_te = load_data()
    x, y = (x_tr, y_tr) if split == "train" else (x_te, y_te)
    partitioner = IidPartitioner(num_partitions=num_partitions)
    partitioner.dataset = datasets.Dataset.from_dict({"x": x.tolist(), "label": y.tolist()})
    return partitioner


def load_partition(partition_id: int, num_partitions: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Client ``partition_id``'s shard of the ``"train"`` or ``"test"`` split as numpy arrays."""
    part = _partitioner(num_partitions, split).load_partition(partition_id).with_format("numpy")[:]
    return np.asarray(part["x"], dtype=np.float32), np.asarray(part["label"], dtype=np.int64)


def build_model(kind: str = "logreg") -> nn.Module:
    """``"logreg"``: softmax regression 64->10; ``"mlp"``: 64-32-10 with ReLU."""
    if kind == "logreg":
        return nn.Sequential(nn.Linear(NUM_FEATURES, NUM_CLASSES))
    if kind == "mlp":
        return nn.Sequential(nn.Linear(NUM_FEATURES, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
    raise ValueError(f"model must be 'logreg' or 'mlp', got {kind!r}")


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float,
          batch_size: int = 32, seed: int = 0) -> float:
    """Plain minibatch SGD on cross-entropy; returns the mean training loss of the last epoch."""
    generator = torch.Generator().manual_seed(seed)
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    losses: list[float] = []
    for _ in range(epochs):
        losses = []
        order = torch.randperm(len(targets), generator=generator)
        for start in range(0, len(targets), batch_size):
            batch = order[start:start + batch_size]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs[batch]), targets[batch])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return float(np.mean(losses)) if losses else 0.0


@torch.no_grad()
def test(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on (x, y)."""
    model.eval()
    logits = model(torch.from_numpy(x))
    targets = torch.from_numpy(y)
    loss = float(nn.functional.cross_entropy(logits, targets))
    accuracy = float((logits.argmax(dim=1) == targets).float().mean())
    return loss, accuracy
