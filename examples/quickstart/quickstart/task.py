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
from torch import nn

from flwr_dp_experiments.datasets import load_digits_split
from flwr_dp_experiments.training import evaluate_classifier as test
from flwr_dp_experiments.training import train_sgd as train

torch.set_num_threads(1)

SPLIT_SEED = 42
NUM_FEATURES = 64
NUM_CLASSES = 10


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, y_train, X_test, y_test): float32 features in [0, 1], int64 labels (digits, 75/25)."""
    return load_digits_split(0.25, SPLIT_SEED)


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


__all__ = ["NUM_CLASSES", "NUM_FEATURES", "SPLIT_SEED", "build_model", "load_data", "load_partition", "test", "train"]
