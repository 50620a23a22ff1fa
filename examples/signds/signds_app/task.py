"""Data and model of the SignDS example: sklearn digits (embedded) or MNIST from local IDX files.

Data
* ``digits``: scikit-learn's ``load_digits`` (1 797 8x8 images, nothing
  downloaded), pixels in [0, 1], one fixed stratified 75/25 split (1 347 / 450).
* ``mnist``: the gzip'ed IDX files in ``data_dir`` (default
  ``$SIGNDS_MNIST_DIR`` or ``../shared/data/mnist`` of the checkout), 60 000 /
  10 000, standardised with mean 0.1307 and std 0.3081.

The train split is partitioned IID with flwr-datasets' ``IidPartitioner`` over
example *indices* (the images are never copied into a ``datasets.Dataset``); the
test split stays with the server (central evaluation every round).

Models (MLPs with ReLU; the flattening order of the update is the state dict's):
* digits: 64-32-10, d = 2 410 parameters;
* MNIST: 784-128-10, d = 101 770 parameters (the seed's LeNet has 266 084).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

from flwr_dp_experiments.datasets import DATASETS, iid_client_shard, load_dataset, shared_data_dir
from flwr_dp_experiments.training import evaluate_classifier, train_sgd

SPLIT_SEED = 42
NUM_CLASSES = 10
MNIST_ENV = "SIGNDS_MNIST_DIR"
FEATURES = {"digits": 64, "mnist": 784}
DEFAULT_HIDDEN = {"digits": 32, "mnist": 128}

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def default_mnist_dir() -> str:
    """``$SIGNDS_MNIST_DIR``, else ``../shared/data/mnist`` next to the checkout."""
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


def hidden_units(dataset: str, hidden: int = 0) -> int:
    """``hidden`` if > 0, else the dataset's default width (32 digits, 128 MNIST)."""
    return int(hidden) if int(hidden) > 0 else DEFAULT_HIDDEN[dataset]


def build_model(dataset: str, hidden: int = 0) -> nn.Module:
    """MLP ``features -> hidden -> 10`` with ReLU."""
    return nn.Sequential(
        nn.Linear(FEATURES[dataset], hidden_units(dataset, hidden)),
        nn.ReLU(),
        nn.Linear(hidden_units(dataset, hidden), NUM_CLASSES),
    )


def initial_model(dataset: str, hidden: int, seed: int) -> nn.Module:
    """The model every method starts from (same seed, same weights)."""
    torch.manual_seed(int(seed))
    return build_model(dataset, hidden)


def num_parameters(dataset: str, hidden: int = 0) -> int:
    """d: the length of the flattened update."""
    return sum(p.numel() for p in build_model(dataset, hidden).parameters())


def train(
    model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, batch_size: int, seed: int
) -> float:
    """Plain local SGD (not private by itself: the privacy is the SignDS encoding of the update)."""
    return train_sgd(model, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)


def test(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(loss, accuracy)."""
    return evaluate_classifier(model, x, y)


__all__ = [
    "DATASETS",
    "NUM_CLASSES",
    "build_model",
    "default_mnist_dir",
    "hidden_units",
    "initial_model",
    "load_data",
    "load_partition",
    "num_parameters",
    "test",
    "train",
]
