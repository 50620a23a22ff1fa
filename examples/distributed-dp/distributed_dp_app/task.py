"""Data and model: MNIST from local IDX files when present, else scikit-learn's digits; softmax regression in numpy.

* ``dataset = "auto"`` (default): MNIST (60 000 / 10 000, 784 features) when its
  gzip'ed IDX files are in ``data-dir`` (default ``../shared/data/mnist`` next to the
  checkout, or ``$FLWR_DP_DATA_DIR/mnist``), else scikit-learn's embedded digits
  (1 347 / 450, 64 features, nothing downloaded). ``"mnist"`` or ``"digits"`` pick one.
* IID shards: a seeded permutation of the train split cut into ``num-partitions``
  nearly equal parts. (Plain numpy, not flwr-datasets' partitioner: in a deployment
  every message starts a fresh ClientApp process, and importing ``datasets`` costs
  seconds each time.)
* Model (``model``): ``"logreg"``, softmax regression ``features -> 10`` (two float32
  arrays ``weight`` and ``bias``), or ``"mlp"``, one ReLU hidden layer
  ``features -> hidden -> 10`` (``w1``, ``b1``, ``w2``, ``b2``; 50 890 values for MNIST at
  ``hidden = 64``, the benchmarks' model), both trained with minibatch SGD on the
  cross-entropy. Plain numpy keeps each ClientApp process light; any model whose train
  function returns the received arrays, updated, works with ``distributed_dp_mod``.

The server keeps the test split (central evaluation of the released model).
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord

from flwr_dp_experiments.datasets import MNIST_FILES, load_dataset, shared_data_dir

NUM_CLASSES = 10
SPLIT_SEED = 42

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
Arrays = dict[str, np.ndarray]


def mnist_dir(data_dir: str = "") -> str:
    """``data_dir``, else ``$FLWR_DP_DATA_DIR/mnist`` or ``../shared/data/mnist`` next to the checkout."""
    return data_dir or shared_data_dir("mnist")


def resolve_dataset(dataset: str, data_dir: str = "") -> str:
    """``"auto"`` -> ``"mnist"`` if its IDX files are in :func:`mnist_dir`, else ``"digits"``."""
    if dataset != "auto":
        return dataset
    folder = mnist_dir(data_dir)
    files = [name for pair in MNIST_FILES.values() for name in pair]
    return "mnist" if all(os.path.exists(os.path.join(folder, name)) for name in files) else "digits"


@lru_cache(maxsize=2)
def load_data(dataset: str, data_dir: str = "") -> Split:
    """(x_train, y_train, x_test, y_test) of ``dataset`` (``"digits"`` or ``"mnist"``), float32 features."""
    x_tr, y_tr, x_te, y_te = load_dataset(dataset, mnist_dir(data_dir) if dataset == "mnist" else "", SPLIT_SEED)
    flat = (
        x_tr.reshape(len(x_tr), -1).astype(np.float32),
        y_tr.astype(np.int64),
        x_te.reshape(len(x_te), -1).astype(np.float32),
        y_te.astype(np.int64),
    )
    return flat


def partition(
    partition_id: int, num_partitions: int, dataset: str, data_dir: str = "", max_samples: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Client ``partition_id``'s IID shard of the train split (its first ``max_samples`` rows if > 0)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id must be in [0, {num_partitions}), got {partition_id}")
    x, y, _, _ = load_data(dataset, data_dir)
    rows = np.array_split(_permutation(len(y)), num_partitions)[partition_id]
    if max_samples > 0:
        rows = rows[:max_samples]
    return x[rows], y[rows]


@lru_cache(maxsize=2)
def _permutation(size: int) -> np.ndarray:
    return np.random.default_rng(SPLIT_SEED).permutation(size)


def num_features(dataset: str) -> int:
    """Input size: 64 for digits, 784 for MNIST."""
    return {"digits": 64, "mnist": 784}[dataset]


MODELS = ("logreg", "mlp")


def initial_arrays(features: int, model: str = "logreg", hidden: int = 64, seed: int = 0) -> Arrays:
    """``"logreg"``: zero weights and biases (softmax regression has no symmetry to break); ``"mlp"``: He-initialised
    ``w1`` (seeded), zero ``b1``, ``w2`` and ``b2``."""
    if model == "logreg":
        return {"weight": np.zeros((features, NUM_CLASSES), np.float32), "bias": np.zeros(NUM_CLASSES, np.float32)}
    if model != "mlp":
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if hidden < 1:
        raise ValueError(f"hidden must be a positive integer, got {hidden!r}")
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.normal(size=(features, hidden)) * np.sqrt(2.0 / features)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.normal(size=(hidden, NUM_CLASSES)) * np.sqrt(1.0 / hidden)).astype(np.float32),
        "b2": np.zeros(NUM_CLASSES, np.float32),
    }


def model_size(arrays: Arrays) -> int:
    """Number of values d of the model (the length of the flattened update)."""
    return int(sum(a.size for a in arrays.values()))


def to_record(arrays: Arrays) -> ArrayRecord:
    """The model as Flower's ArrayRecord (keys in order: ``weight``, ``bias``)."""
    return ArrayRecord({key: Array(value) for key, value in arrays.items()})


def from_record(record: ArrayRecord) -> Arrays:
    """numpy arrays of an ArrayRecord, in its key order."""
    return {key: record[key].numpy() for key in record.keys()}


def logits(arrays: Arrays, x: np.ndarray) -> np.ndarray:
    if "w1" in arrays:
        return np.maximum(x @ arrays["w1"] + arrays["b1"], 0.0) @ arrays["w2"] + arrays["b2"]
    return x @ arrays["weight"] + arrays["bias"]


def train_sgd(
    arrays: Arrays, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, batch_size: int, seed: int
) -> Arrays:
    """``epochs`` of minibatch SGD on the mean cross-entropy, from ``arrays``; new arrays, same dtypes."""
    if "w1" in arrays:
        return _train_mlp(arrays, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
    weight, bias = arrays["weight"].astype(np.float64), arrays["bias"].astype(np.float64)
    rng = np.random.default_rng(seed)
    onehot = np.eye(NUM_CLASSES)[y]
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch_size):
            rows = order[start : start + batch_size]
            z = x[rows] @ weight + bias
            z -= z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            grad = (p - onehot[rows]) / len(rows)
            weight -= lr * (x[rows].T @ grad)
            bias -= lr * grad.sum(axis=0)
    return {"weight": weight.astype(arrays["weight"].dtype), "bias": bias.astype(arrays["bias"].dtype)}


def _train_mlp(arrays: Arrays, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, batch_size: int, seed: int):
    params = {key: value.astype(np.float64) for key, value in arrays.items()}
    rng = np.random.default_rng(seed)
    onehot = np.eye(NUM_CLASSES)[y]
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch_size):
            rows = order[start : start + batch_size]
            hidden = np.maximum(x[rows] @ params["w1"] + params["b1"], 0.0)
            z = hidden @ params["w2"] + params["b2"]
            z -= z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            grad = (p - onehot[rows]) / len(rows)
            back = (grad @ params["w2"].T) * (hidden > 0)
            params["w2"] -= lr * (hidden.T @ grad)
            params["b2"] -= lr * grad.sum(axis=0)
            params["w1"] -= lr * (x[rows].T @ back)
            params["b1"] -= lr * back.sum(axis=0)
    return {key: params[key].astype(arrays[key].dtype) for key in arrays}


def accuracy(arrays: Arrays, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of ``x`` classified as ``y``."""
    return float(np.mean(np.argmax(logits(arrays, x), axis=1) == y))


__all__ = [
    "MODELS",
    "NUM_CLASSES",
    "accuracy",
    "initial_arrays",
    "load_data",
    "model_size",
    "num_features",
    "partition",
    "resolve_dataset",
    "to_record",
    "from_record",
    "train_sgd",
]
