"""Data, models and message layout of the vertical label-DP example (digits or MNIST, no download).

Data (``dataset``): ``digits`` is scikit-learn's ``load_digits`` (1 797 8x8
images of the digits 0-9, embedded), pixels scaled to [0, 1]; its train/test
split is a seeded random permutation that does not look at the labels, so the
feature parties can compute it without them. ``mnist`` reads the gzip'ed IDX
files in ``data-dir`` (28x28 images, pixels / 255) and keeps MNIST's own
60 000 / 10 000 split (``test-fraction`` and ``split-seed`` are not used).
Every party holds the *same samples*, aligned by index (as after private set
intersection). Party ``p`` of ``P`` holds the pixels of a contiguous group of
image columns: for ``P = 2`` on digits, party 0 the left 4 columns (32
features) and party 1 the right 4 (on MNIST, 14 columns = 392 features each).

Models: each feature party has a bottom MLP ``in -> hidden -> embedding``
(ReLU); the label party has the top model ``ReLU -> Linear(P * embedding, 10)``
on the concatenated embeddings.
"""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

from flwr_dp_experiments.datasets import load_mnist

NUM_CLASSES = 10
IMAGE_SIDE = 8  # digits
IMAGE_SIDES = {"digits": 8, "mnist": 28}
DATASETS = tuple(IMAGE_SIDES)

# Message layout (RecordDict keys).
CONFIG = "config"  # ConfigRecord: server-round, hyperparameters, split seed
BATCH = "batch"  # ArrayRecord {"indices": int64 train indices of the requested embeddings}
GRAD = "grad"  # ArrayRecord {"grad": d loss / d embeddings of the previous train batch}
EMBEDDINGS = "embeddings"  # ArrayRecord {"embeddings": float32 (batch, embedding-dim)}
PARTY = "party"  # ConfigRecord {"party-id": int}


def split_indices(num_samples: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, test indices): a seeded random permutation, independent of the labels."""
    perm = np.random.default_rng(seed).permutation(num_samples)
    num_test = int(round(test_fraction * num_samples))
    return np.sort(perm[num_test:]), np.sort(perm[:num_test])


def party_columns(party_id: int, num_parties: int, side: int = IMAGE_SIDE) -> np.ndarray:
    """Flat pixel indices of party ``party_id``: a contiguous group of the (side x side) image's columns."""
    if not 0 <= party_id < num_parties <= side:
        raise ValueError(
            f"party_id must be in [0, num_parties) with num_parties in [1, {side}], got {party_id} of {num_parties}"
        )
    groups = np.array_split(np.arange(side), num_parties)
    pixels = np.arange(side * side).reshape(side, side)
    return pixels[:, groups[party_id]].ravel()


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    features, labels = load_digits(return_X_y=True)
    return (features / 16.0).astype(np.float32), labels.astype(np.int64)


def _split(dataset: str, data_dir: str, test_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test) of ``dataset`` (cached by the loaders; do not modify)."""
    if dataset == "mnist":
        return load_mnist(data_dir)
    if dataset != "digits":
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    features, labels = _digits()
    train, test = split_indices(len(labels), test_fraction, seed)
    return features[train], labels[train], features[test], labels[test]


@lru_cache(maxsize=8)
def load_party_features(
    party_id: int, num_parties: int, test_fraction: float, seed: int, dataset: str = "digits", data_dir: str = ""
) -> dict[str, np.ndarray]:
    """A feature party's data: ``{"train": X_train[:, cols], "test": X_test[:, cols]}`` (no labels)."""
    x_train, _, x_test, _ = _split(dataset, data_dir, test_fraction, seed)
    cols = party_columns(party_id, num_parties, IMAGE_SIDES[dataset])
    return {"train": np.ascontiguousarray(x_train[:, cols]), "test": np.ascontiguousarray(x_test[:, cols])}


def load_labels(
    test_fraction: float, seed: int, dataset: str = "digits", data_dir: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """The label party's data: (true train labels, true test labels). Fresh copies on each call."""
    _, y_train, _, y_test = _split(dataset, data_dir, test_fraction, seed)
    return y_train.copy(), y_test.copy()


def build_bottom(in_features: int, hidden_dim: int, embedding_dim: int) -> nn.Module:
    """A feature party's bottom model: ``in -> hidden (ReLU) -> embedding``."""
    return nn.Sequential(nn.Linear(in_features, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, embedding_dim))


def build_top(num_parties: int, embedding_dim: int, num_classes: int = NUM_CLASSES) -> nn.Module:
    """The label party's top model on the concatenated embeddings."""
    return nn.Sequential(nn.ReLU(), nn.Linear(num_parties * embedding_dim, num_classes))


def optimizer_to_bytes(optimizer: torch.optim.Optimizer) -> bytes:
    """An optimizer's state (e.g. Adam's moments) as bytes, for a ConfigRecord in ``context.state``."""
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    return buffer.getvalue()


def optimizer_from_bytes(optimizer: torch.optim.Optimizer, data: bytes) -> None:
    """Restore :func:`optimizer_to_bytes` output (``weights_only``: tensors and plain values only)."""
    optimizer.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))
