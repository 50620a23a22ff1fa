"""Data, model, local training and the client's inference result (mean softmax vector).

Data: scikit-learn's ``load_digits`` (1 797 8x8 images, embedded: no download),
pixels scaled to [0, 1], one fixed stratified 75/25 train/test split
(:data:`SPLIT_SEED`; the test split is the server's central test set). Or MNIST
from the local gzip'ed IDX files (``dataset = "mnist"``, ``data-dir`` = the
folder holding ``train-images-idx3-ubyte.gz`` etc.; official 60k/10k split).

Partitioning (strongly non-IID, so that the clients' mean softmax vectors
cluster by class): the train split is cut with flwr-datasets'
``PathologicalPartitioner`` (``classes-per-partition`` classes per client,
first class = partition id mod 10) or ``DirichletPartitioner`` (small
``dirichlet-alpha``). Each client then keeps a share ``eval-share`` of its own
partition as its local evaluation set (same label distribution as its
training data), split with a fixed per-partition seed.

The client's inference result, as MindSpore's ``DirectClassifierResult``: the
mean of the model's softmax output over the client's evaluation samples, a
probability vector of length 10 (L1 sensitivity 2 between any two clients).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import datasets
import numpy as np
import torch
from flwr_datasets.partitioner import DirichletPartitioner, PathologicalPartitioner
from flwr_datasets.partitioner.partitioner import Partitioner
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

torch.set_num_threads(1)

SPLIT_SEED = 42
NUM_CLASSES = 10
DATASETS = ("digits", "mnist")
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def _read_idx(path: str, magic: int) -> np.ndarray:
    """An IDX array (gzip'ed, big-endian header: magic, then one uint32 per dimension)."""
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise ValueError(f"{path}: IDX magic {found}, expected {magic}")
    ndim = magic & 0xFF
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


@lru_cache(maxsize=2)
def load_data(dataset: str = "digits", data_dir: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, y_train, X_test, y_test): flat float32 features in [0, 1], int64 labels."""
    if dataset == "digits":
        features, labels = load_digits(return_X_y=True)
        features = (features / 16.0).astype(np.float32)
        x_tr, x_te, y_tr, y_te = train_test_split(
            features, labels.astype(np.int64), test_size=0.25, random_state=SPLIT_SEED, stratify=labels)
        return x_tr, y_tr, x_te, y_te
    if dataset == "mnist":
        if not data_dir:
            raise ValueError("dataset 'mnist' needs data-dir (the folder of the gzip'ed IDX files)")
        out = []
        for split in ("train", "test"):
            images, labels = (os.path.join(data_dir, name) for name in MNIST_FILES[split])
            x = _read_idx(images, 2051).reshape(-1, 28 * 28).astype(np.float32) / 255.0
            out += [x, _read_idx(labels, 2049).astype(np.int64)]
        return out[0], out[1], out[2], out[3]
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")


def num_features(dataset: str = "digits") -> int:
    """Input dimension of the dataset's flat images."""
    return 64 if dataset == "digits" else 28 * 28


def _make_partitioner(kind: str, num_partitions: int, classes: int, alpha: float, seed: int) -> Partitioner:
    """A flwr-datasets partitioner by label: pathological (``classes`` per client) or Dirichlet(``alpha``)."""
    if kind == "pathological":
        return PathologicalPartitioner(num_partitions=num_partitions, partition_by="label",
                                       num_classes_per_partition=classes,
                                       class_assignment_mode="first-deterministic", seed=seed)
    if kind == "dirichlet":
        return DirichletPartitioner(num_partitions=num_partitions, partition_by="label", alpha=alpha,
                                    min_partition_size=2, self_balancing=False, seed=seed)
    raise ValueError(f"partitioner must be 'pathological' or 'dirichlet', got {kind!r}")


@lru_cache(maxsize=4)
def _partitioner(dataset: str, data_dir: str, kind: str, num_partitions: int, classes: int, alpha: float,
                 seed: int) -> Partitioner:
    """The partitioner over the train split (cached per process: Ray actors reuse it)."""
    x_tr, y_tr, _, _ = load_data(dataset, data_dir)
    partitioner = _make_partitioner(kind, num_partitions, classes, alpha, seed)
    partitioner.dataset = datasets.Dataset.from_dict({"index": np.arange(len(y_tr)), "label": y_tr})
    return partitioner


def load_partition(partition_id: int, num_partitions: int, config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Client ``partition_id``'s local ``x_train, y_train, x_eval, y_eval`` (numpy)."""
    dataset, data_dir = str(config.get("dataset", "digits")), str(config.get("data-dir", ""))
    partitioner = _partitioner(dataset, data_dir, str(config["partitioner"]), int(num_partitions),
                               int(config["classes-per-partition"]), float(config["dirichlet-alpha"]),
                               int(config["seed"]))
    indices = np.asarray(partitioner.load_partition(partition_id)["index"], dtype=np.int64)
    x_tr, y_tr, _, _ = load_data(dataset, data_dir)
    order = np.random.default_rng([int(config["seed"]), partition_id]).permutation(len(indices))
    n_eval = max(1, int(round(float(config["eval-share"]) * len(indices))))
    eval_idx, train_idx = indices[order[:n_eval]], indices[order[n_eval:]]
    return {"x_train": x_tr[train_idx], "y_train": y_tr[train_idx], "x_eval": x_tr[eval_idx], "y_eval": y_tr[eval_idx]}


def build_model(kind: str = "logreg", features: int = 64) -> nn.Module:
    """``"logreg"``: softmax regression features->10; ``"mlp"``: features-32-10 with ReLU."""
    if kind == "logreg":
        return nn.Sequential(nn.Linear(features, NUM_CLASSES))
    if kind == "mlp":
        return nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
    raise ValueError(f"model must be 'logreg' or 'mlp', got {kind!r}")


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float,
          batch_size: int, seed: int) -> float:
    """Minibatch SGD on cross-entropy; the mean training loss of the last epoch."""
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
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(mean cross-entropy, accuracy, mean softmax vector as float64 summing to 1) on (x, y)."""
    model.eval()
    logits = model(torch.from_numpy(x)).double()
    targets = torch.from_numpy(y)
    loss = float(nn.functional.cross_entropy(logits, targets))
    accuracy = float((logits.argmax(dim=1) == targets).double().mean())
    mean_softmax = torch.softmax(logits, dim=1).mean(dim=0).numpy()
    return loss, accuracy, mean_softmax / mean_softmax.sum()
