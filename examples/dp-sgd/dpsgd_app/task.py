"""Data and model for the DP-SGD example: sklearn digits (embedded) or MNIST from local IDX files.

Data
* ``digits``: scikit-learn's ``load_digits`` (1 797 8x8 images shipped with
  scikit-learn, nothing downloaded), pixels scaled to [0, 1], one fixed
  stratified 75/25 train/test split (1 347 / 450).
* ``mnist``: the official gzip'ed IDX files (``train-images-idx3-ubyte.gz`` and
  the others) in ``data_dir``, read with numpy; 60 000 train / 10 000 test,
  normalised with mean 0.1307 and std 0.3081.

The train split is partitioned IID over the clients with flwr-datasets'
``IidPartitioner`` (contiguous shards of a fixed permutation; the partitioner
only sees example indices, so 60 000 MNIST images are never copied into a
``datasets.Dataset``). The test split stays with the server (central evaluation).

Model: an MLP ``features -> hidden -> 10`` with ReLU (only ``nn.Linear`` layers,
so the trainer's ``grad_sample_mode="auto"`` picks ghost clipping).
"""

from __future__ import annotations

import os

import numpy as np
from torch import nn

from flwr_dp_experiments.datasets import DATASETS, iid_client_shard, load_dataset, shared_data_dir
from flwr_dp_experiments.training import evaluate_classifier as test

SPLIT_SEED = 42
NUM_CLASSES = 10
MNIST_ENV = "DPSGD_MNIST_DIR"

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def default_mnist_dir() -> str:
    """``$DPSGD_MNIST_DIR``, else ``../shared/data/mnist`` next to the checkout."""
    return os.environ.get(MNIST_ENV) or shared_data_dir("mnist")


def load_data(dataset: str = "digits", data_dir: str = "") -> Split:
    """(X_train, y_train, X_test, y_test): float32 features, int64 labels (MNIST standardised)."""
    return load_dataset(dataset, data_dir or (default_mnist_dir() if dataset == "mnist" else ""), SPLIT_SEED)


def load_partition(
    partition_id: int, num_partitions: int, dataset: str = "digits", data_dir: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Client ``partition_id``'s IID shard of the train split."""
    return iid_client_shard(
        partition_id,
        num_partitions,
        dataset,
        data_dir or (default_mnist_dir() if dataset == "mnist" else ""),
        SPLIT_SEED,
    )


def build_model(num_features: int, hidden: int = 32) -> nn.Module:
    """MLP ``num_features -> hidden -> 10`` with ReLU."""
    return nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, NUM_CLASSES))


def num_features(dataset: str) -> int:
    """Input size: 64 for digits, 784 for MNIST."""
    return {"digits": 64, "mnist": 784}[dataset]


__all__ = [
    "DATASETS",
    "NUM_CLASSES",
    "SPLIT_SEED",
    "build_model",
    "default_mnist_dir",
    "load_data",
    "load_partition",
    "num_features",
    "test",
]
