"""Local datasets for examples, benchmarks and tests: nothing is downloaded.

* :func:`load_digits_split` - scikit-learn's embedded ``load_digits`` (1 797 8x8
  images, 10 classes), pixels scaled to [0, 1], one fixed stratified split.
* :func:`load_mnist` - MNIST from the official gzip'ed IDX files in a local folder
  (e.g. ``../shared/data/mnist`` of a checkout, see :func:`shared_data_dir`).
* :func:`load_emnist_letters` - EMNIST Letters (Cohen et al. 2017; 124 800 / 20 800,
  26 classes) from its gzip'ed IDX files (``../shared/data/emnist-letters``): labels
  1..26 mapped to 0..25, images transposed back to the MNIST orientation.

Every loader returns ``(x_train, y_train, x_test, y_test)``: flat float32 features
in [0, 1] and int64 labels. Loaders are cached per argument tuple.
"""

from __future__ import annotations

import gzip
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
DATA_DIR_ENV = "FLWR_DP_DATA_DIR"
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
EMNIST_LETTERS_FILES = {
    "train": ("emnist-letters-train-images-idx3-ubyte.gz", "emnist-letters-train-labels-idx1-ubyte.gz"),
    "test": ("emnist-letters-test-images-idx3-ubyte.gz", "emnist-letters-test-labels-idx1-ubyte.gz"),
}
IDX_LABELS, IDX_IMAGES = 2049, 2051


def shared_data_dir(name: str) -> str:
    """``$FLWR_DP_DATA_DIR/<name>``, else ``../shared/data/<name>`` next to this checkout."""
    root = os.environ.get(DATA_DIR_ENV) or str(Path(__file__).resolve().parents[2] / "shared" / "data")
    return os.path.join(root, name)


@lru_cache(maxsize=4)
def load_digits_split(test_size: float = 0.25, seed: int = 42) -> Split:
    """scikit-learn digits, pixels / 16, stratified train/test split with ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(
        features, labels.astype(np.int64), test_size=test_size, random_state=seed, stratify=labels
    )
    return x_tr, y_tr, x_te, y_te


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzip'ed or not): magic 2051 = uint8 images (n, rows, cols), 2049 = uint8 labels (n,)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        data = handle.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic not in (IDX_LABELS, IDX_IMAGES):
        raise ValueError(f"{path} is not an IDX label (2049) or image (2051) file (magic {magic})")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


@lru_cache(maxsize=2)
def load_mnist(data_dir: str = "") -> Split:
    """MNIST (60 000 / 10 000) from ``data_dir`` (default :func:`shared_data_dir` ``("mnist")``), pixels / 255."""
    folder = data_dir or shared_data_dir("mnist")
    out: list[np.ndarray] = []
    for split in ("train", "test"):
        images_file, labels_file = (os.path.join(folder, name) for name in MNIST_FILES[split])
        if not os.path.exists(images_file):
            raise FileNotFoundError(f"MNIST file {images_file} not found; pass data_dir or set ${DATA_DIR_ENV}")
        out += [
            read_idx(images_file).reshape(-1, 28 * 28).astype(np.float32) / 255.0,
            read_idx(labels_file).astype(np.int64),
        ]
    return out[0], out[1], out[2], out[3]


@lru_cache(maxsize=1)
def load_emnist_letters(data_dir: str = "") -> Split:
    """EMNIST Letters (124 800 / 20 800) from ``data_dir`` (default :func:`shared_data_dir` ``("emnist-letters")``).

    The IDX files store every 28x28 image transposed (the EMNIST layout), so each is
    transposed back before flattening; pixels / 255 (float32, 784 features) and labels
    1..26 ('a'..'z', case merged) shifted to 0..25 (int64). The DELM paper's §6.1 uses
    EMNIST for its low-quality data scenario.
    """
    folder = data_dir or shared_data_dir("emnist-letters")
    out: list[np.ndarray] = []
    for split in ("train", "test"):
        images_file, labels_file = (os.path.join(folder, name) for name in EMNIST_LETTERS_FILES[split])
        if not os.path.exists(images_file):
            raise FileNotFoundError(f"EMNIST file {images_file} not found; pass data_dir or set ${DATA_DIR_ENV}")
        images = read_idx(images_file).transpose(0, 2, 1).reshape(-1, 28 * 28)
        out += [images.astype(np.float32) / np.float32(255.0), read_idx(labels_file).astype(np.int64) - 1]
    return out[0], out[1], out[2], out[3]


def standardise(images: np.ndarray, mean: float, std: float) -> np.ndarray:
    """(x − mean)/std as float32 (one scalar mean/std for all features)."""
    return ((images - np.float32(mean)) / np.float32(std)).astype(np.float32, copy=False)


MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def standardise_mnist(images: np.ndarray) -> np.ndarray:
    """MNIST's usual normalisation of [0, 1] pixels: (x − 0.1307)/0.3081, float32."""
    return ((images - MNIST_MEAN) / MNIST_STD).astype(np.float32)


@lru_cache(maxsize=16)
def iid_partition_indices(num_examples: int, num_partitions: int, seed: int = 42) -> tuple[np.ndarray, ...]:
    """IID shards of a seeded permutation of range(num_examples), cut by flwr-datasets' IidPartitioner.

    The partitioner sees only example indices, so large arrays (60 000 MNIST
    images) are never copied into a ``datasets.Dataset``. Raises ``ValueError`` unless
    1 <= num_partitions <= num_examples (an empty shard would fail deep inside ``datasets``).
    """
    if not isinstance(num_partitions, (int, np.integer)) or not 1 <= num_partitions <= num_examples:
        raise ValueError(
            f"num_partitions must be an integer in [1, {num_examples}] (one example per "
            f"partition at least), got {num_partitions!r}"
        )
    import datasets
    from flwr_datasets.partitioner import IidPartitioner

    order = np.random.default_rng(seed).permutation(num_examples)
    partitioner = IidPartitioner(num_partitions=num_partitions)
    partitioner.dataset = datasets.Dataset.from_dict({"idx": order.tolist()})
    return tuple(np.asarray(partitioner.load_partition(p)["idx"], dtype=np.int64) for p in range(num_partitions))


DATASETS = ("digits", "mnist", "emnist-letters")


@lru_cache(maxsize=4)
def load_dataset(dataset: str = "digits", data_dir: str = "", seed: int = 42) -> Split:
    """``digits`` (75/25 split with ``seed``), ``mnist`` or ``emnist-letters`` from ``data_dir`` (standardised).

    MNIST uses its usual constants (0.1307, 0.3081); EMNIST Letters the scalar mean and
    std of its own [0, 1] train pixels (the test split reuses them). ``seed`` only
    affects ``digits``.
    """
    if dataset == "digits":
        return load_digits_split(0.25, seed)
    if dataset == "mnist":
        x_tr, y_tr, x_te, y_te = load_mnist(data_dir)
        return standardise_mnist(x_tr), y_tr, standardise_mnist(x_te), y_te
    if dataset == "emnist-letters":
        x_tr, y_tr, x_te, y_te = load_emnist_letters(data_dir)
        mean, std = float(x_tr.mean(dtype=np.float64)), float(x_tr.std(dtype=np.float64))
        return standardise(x_tr, mean, std), y_tr, standardise(x_te, mean, std), y_te
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")


@lru_cache(maxsize=4)
def emnist_letters_constants(data_dir: str = "") -> tuple[float, float]:
    """The scalar train-pixel mean and std that :func:`load_dataset` standardises EMNIST Letters with."""
    raw = load_emnist_letters(data_dir)[0]
    return float(raw.mean(dtype=np.float64)), float(raw.std(dtype=np.float64))


def unit_norm_features(x_std: np.ndarray, dataset: str, pool: int = 1, data_dir: str = "") -> np.ndarray:
    """Rows of :func:`load_dataset`'s images as unit-norm float64 features (the DELM mechanisms' domain).

    Undoes the affine standardisation exactly (MNIST's constants; EMNIST's public
    train-split pixel mean and std), average-pools ``pool`` × ``pool`` blocks of a
    square image when ``pool`` > 1, then divides each row by its L2 norm. Every step
    is per record and data-independent, so it costs no privacy; the functional
    mechanism and Analyze Gauss need ‖x‖₂ ≤ 1.
    """
    if pool < 1:
        raise ValueError(f"pool must be an integer >= 1, got {pool!r}")
    x = np.asarray(x_std, dtype=np.float64)
    if dataset == "mnist":
        x = x * MNIST_STD + MNIST_MEAN
    elif dataset == "emnist-letters":
        mean, std = emnist_letters_constants(data_dir)
        x = x * std + mean
    if pool > 1:
        side = int(round(np.sqrt(x.shape[1])))
        if side * side != x.shape[1] or side % pool:
            raise ValueError(f"pool must divide the image side {side} of a square image, got {pool}")
        x = x.reshape(-1, side // pool, pool, side // pool, pool).mean(axis=(2, 4)).reshape(len(x), -1)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def iid_client_shard(
    partition_id: int, num_partitions: int, dataset: str = "digits", data_dir: str = "", seed: int = 42
) -> tuple[np.ndarray, np.ndarray]:
    """Client ``partition_id``'s IID shard of the train split of :func:`load_dataset`."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must be in [0, {num_partitions}), got {partition_id}")
    x_tr, y_tr, _, _ = load_dataset(dataset, data_dir, seed)
    idx = iid_partition_indices(len(y_tr), num_partitions, seed)[partition_id]
    return x_tr[idx], y_tr[idx]


__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "EMNIST_LETTERS_FILES",
    "emnist_letters_constants",
    "unit_norm_features",
    "iid_client_shard",
    "iid_partition_indices",
    "load_dataset",
    "load_emnist_letters",
    "standardise",
    "standardise_mnist",
    "MNIST_FILES",
    "Split",
    "load_digits_split",
    "load_mnist",
    "read_idx",
    "shared_data_dir",
]
