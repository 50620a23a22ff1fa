"""Data and model: sklearn digits (embedded, no download), IID shards, an MLP 64-h-10 (softmax regression at h = 0)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch import nn

from flwr_dp_experiments.datasets import iid_partition_indices, load_digits_split
from flwr_dp_experiments.training import evaluate_classifier, train_sgd

torch.set_num_threads(1)


@lru_cache(maxsize=1)
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of digits, 75/25 stratified split."""
    return load_digits_split(0.25, 42)


def partition(partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``partition_id``'s IID shard of the training split."""
    x, y, _, _ = data()
    rows = iid_partition_indices(len(y), num_partitions)[partition_id]
    return x[rows], y[rows]


def build_model(hidden_units: int) -> nn.Module:
    """An MLP 64-h-10 (h = ``hidden_units``), or softmax regression 64-10 at h = 0."""
    if hidden_units <= 0:
        return nn.Sequential(nn.Linear(64, 10))
    return nn.Sequential(nn.Linear(64, hidden_units), nn.ReLU(), nn.Linear(hidden_units, 10))


def test_accuracy(model: nn.Module) -> float:
    """Accuracy on the held-out test split (the server's own evaluation)."""
    _, _, x, y = data()
    return evaluate_classifier(model, x, y)[1]


__all__ = ["build_model", "data", "partition", "test_accuracy", "train_sgd"]
