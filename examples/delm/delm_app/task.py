"""Data for the DELM app: unit-norm features of one client's partition, and the server's test set.

The features are :func:`flwr_dp_experiments.datasets.unit_norm_features` of the
standardised images (exact de-standardisation, optional pooling, rows / ‖row‖₂):
per record and data-independent, so free of privacy cost; or, with ``features`` =
"hog", histograms of oriented gradients (:mod:`flwr_dp_experiments.feature_maps`),
equally per record and data-independent. Partitions come from
:func:`flwr_dp_experiments.scenarios.partition_indices` (IID, or flwr-datasets'
PathologicalPartitioner for n-class), seeded, so every process (a deployed
SuperNode starts a new one per message) computes the same split.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from flwr_dp_experiments.datasets import load_dataset, unit_norm_features
from flwr_dp_experiments.feature_maps import hog_features
from flwr_dp_experiments.scenarios import partition_indices


def pool_of(config: dict[str, Any]) -> int:
    """The pooling factor: ``pool`` for 28×28 datasets, 1 for digits (8×8)."""
    return 1 if config["dataset"] == "digits" else int(config["pool"])


@lru_cache(maxsize=4)
def _partitions(dataset: str, data_dir: str, num_partitions: int, scheme: str, seed: int) -> tuple[np.ndarray, ...]:
    _, y_tr, _, _ = load_dataset(dataset, data_dir, seed)
    return tuple(partition_indices(y_tr, num_partitions, scheme, seed))


#: HOG cell side: 4 px on 28×28 images (7×7 cells), 2 px on digits' 8×8 (4×4 cells); 6 unsigned bins.
HOG_CELL = {"digits": 2, "mnist": 4, "emnist-letters": 4}


def features_of(config: dict[str, Any], images: np.ndarray) -> np.ndarray:
    """Unit-norm rows: pooled pixels, or HOG (``features`` = "hog"); per record, data-independent."""
    dataset = str(config["dataset"])
    if config["features"] == "hog":
        return hog_features(images, cell=HOG_CELL[dataset], bins=6)
    return unit_norm_features(images, dataset, pool_of(config), str(config["data-dir"]))


def client_data(config: dict[str, Any], partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """(unit-norm features, labels) of client ``partition_id``."""
    dataset, data_dir, seed = str(config["dataset"]), str(config["data-dir"]), int(config["seed"])
    x_tr, y_tr, _, _ = load_dataset(dataset, data_dir, seed)
    idx = _partitions(dataset, data_dir, num_partitions, str(config["scheme"]), seed)[partition_id]
    return features_of(config, x_tr[idx]), y_tr[idx]


def test_data(config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(unit-norm features, labels) of the test split, for the server's central evaluation."""
    dataset, data_dir = str(config["dataset"]), str(config["data-dir"])
    _, _, x_te, y_te = load_dataset(dataset, data_dir, int(config["seed"]))
    return features_of(config, x_te), y_te


def input_dim(config: dict[str, Any]) -> int:
    """Feature dimension d after pooling."""
    return int(test_data(config)[0].shape[1])


def num_classes(config: dict[str, Any]) -> int:
    """Number of classes of the dataset (labels are 0..c-1)."""
    return int(test_data(config)[1].max()) + 1


def accuracy(features: np.ndarray, labels: np.ndarray, projection: np.ndarray, head: np.ndarray) -> float:
    """Share of rows whose argmax of (x V) W is the label."""
    return float(np.mean(np.argmax(features @ projection @ head, axis=1) == labels))
