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

import gzip
import os
from functools import lru_cache
from pathlib import Path

import datasets
import numpy as np
import torch
from flwr_datasets.partitioner import IidPartitioner
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

SPLIT_SEED = 42
NUM_CLASSES = 10
DATASETS = ("digits", "mnist")
MNIST_ENV = "DPSGD_MNIST_DIR"
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def default_mnist_dir() -> str:
    """``$DPSGD_MNIST_DIR``, else ``<repo>/../shared/data/mnist`` of a plain checkout."""
    return os.environ.get(MNIST_ENV) or str(Path(__file__).resolve().parents[3].parent / "shared" / "data" / "mnist")


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzip'ed or not): magic 2051 = uint8 images (n, rows, cols), 2049 = uint8 labels (n,)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        data = handle.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic not in (2049, 2051):
        raise ValueError(f"{path} is not an IDX label (2049) or image (2051) file (magic {magic})")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


@lru_cache(maxsize=2)
def load_data(dataset: str = "digits", data_dir: str = "") -> Split:
    """(X_train, y_train, X_test, y_test): float32 features, int64 labels."""
    if dataset == "digits":
        features, labels = load_digits(return_X_y=True)
        features = (features / 16.0).astype(np.float32)
        x_tr, x_te, y_tr, y_te = train_test_split(
            features, labels.astype(np.int64), test_size=0.25, random_state=SPLIT_SEED, stratify=labels)
        return x_tr, y_tr, x_te, y_te
    if dataset == "mnist":
        return _load_mnist(data_dir or default_mnist_dir())
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")


def _load_mnist(data_dir: str) -> Split:
    out = []
    for split in ("train", "test"):
        images_file, labels_file = (os.path.join(data_dir, name) for name in MNIST_FILES[split])
        if not os.path.exists(images_file):
            raise FileNotFoundError(f"MNIST file {images_file} not found; set data-dir (or ${MNIST_ENV})")
        images = read_idx(images_file).reshape(-1, 28 * 28).astype(np.float32) / 255.0
        out += [((images - 0.1307) / 0.3081).astype(np.float32), read_idx(labels_file).astype(np.int64)]
    return out[0], out[1], out[2], out[3]


@lru_cache(maxsize=8)
def _partition_indices(num_examples: int, num_partitions: int) -> tuple[np.ndarray, ...]:
    """IID shards of a fixed permutation of range(num_examples), via IidPartitioner."""
    order = np.random.default_rng(SPLIT_SEED).permutation(num_examples)
    partitioner = IidPartitioner(num_partitions=num_partitions)
    partitioner.dataset = datasets.Dataset.from_dict({"idx": order.tolist()})
    return tuple(np.asarray(partitioner.load_partition(p)["idx"], dtype=np.int64) for p in range(num_partitions))


def load_partition(partition_id: int, num_partitions: int, dataset: str = "digits",
                   data_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Client ``partition_id``'s IID shard of the train split."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must be in [0, {num_partitions}), got {partition_id}")
    x_tr, y_tr, _, _ = load_data(dataset, data_dir)
    idx = _partition_indices(len(y_tr), num_partitions)[partition_id]
    return x_tr[idx], y_tr[idx]


def build_model(num_features: int, hidden: int = 32) -> nn.Module:
    """MLP ``num_features -> hidden -> 10`` with ReLU."""
    return nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, NUM_CLASSES))


def num_features(dataset: str) -> int:
    """Input size: 64 for digits, 784 for MNIST."""
    return {"digits": 64, "mnist": 784}[dataset]


@torch.no_grad()
def test(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on (x, y)."""
    model.eval()
    logits = model(torch.from_numpy(x))
    targets = torch.from_numpy(y)
    loss = float(nn.functional.cross_entropy(logits, targets))
    accuracy = float((logits.argmax(dim=1) == targets).float().mean())
    return loss, accuracy
