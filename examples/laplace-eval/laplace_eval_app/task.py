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

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import datasets
import numpy as np
import torch
from flwr_datasets.partitioner import DirichletPartitioner, PathologicalPartitioner
from flwr_datasets.partitioner.partitioner import Partitioner
from torch import nn

from flwr_dp_experiments.datasets import load_digits_split, load_mnist
from flwr_dp_experiments.training import train_sgd as train

torch.set_num_threads(1)

SPLIT_SEED = 42
NUM_CLASSES = 10
DATASETS = ("digits", "mnist")


@lru_cache(maxsize=2)
def load_data(dataset: str = "digits", data_dir: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, y_train, X_test, y_test): flat float32 features in [0, 1], int64 labels."""
    if dataset == "digits":
        return load_digits_split(0.25, SPLIT_SEED)
    if dataset == "mnist":
        if not data_dir:
            raise ValueError("dataset 'mnist' needs data-dir (the folder of the gzip'ed IDX files)")
        return load_mnist(data_dir)
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")


def num_features(dataset: str = "digits") -> int:
    """Input dimension of the dataset's flat images."""
    return 64 if dataset == "digits" else 28 * 28


def _make_partitioner(kind: str, num_partitions: int, classes: int, alpha: float, seed: int) -> Partitioner:
    """A flwr-datasets partitioner by label: pathological (``classes`` per client) or Dirichlet(``alpha``)."""
    if kind == "pathological":
        return PathologicalPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            num_classes_per_partition=classes,
            class_assignment_mode="first-deterministic",
            seed=seed,
        )
    if kind == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=alpha,
            min_partition_size=2,
            self_balancing=False,
            seed=seed,
        )
    raise ValueError(f"partitioner must be 'pathological' or 'dirichlet', got {kind!r}")


@lru_cache(maxsize=4)
def _partitioner(
    dataset: str, data_dir: str, kind: str, num_partitions: int, classes: int, alpha: float, seed: int
) -> Partitioner:
    """The partitioner over the train split (cached per process: Ray actors reuse it)."""
    x_tr, y_tr, _, _ = load_data(dataset, data_dir)
    partitioner = _make_partitioner(kind, num_partitions, classes, alpha, seed)
    partitioner.dataset = datasets.Dataset.from_dict({"index": np.arange(len(y_tr)), "label": y_tr})
    return partitioner


def load_partition(partition_id: int, num_partitions: int, config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Client ``partition_id``'s local ``x_train, y_train, x_eval, y_eval`` (numpy)."""
    dataset, data_dir = str(config.get("dataset", "digits")), str(config.get("data-dir", ""))
    partitioner = _partitioner(
        dataset,
        data_dir,
        str(config["partitioner"]),
        int(num_partitions),
        int(config["classes-per-partition"]),
        float(config["dirichlet-alpha"]),
        int(config["seed"]),
    )
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


__all__ = [
    "DATASETS",
    "NUM_CLASSES",
    "SPLIT_SEED",
    "build_model",
    "evaluate",
    "load_data",
    "load_partition",
    "num_features",
    "train",
]
