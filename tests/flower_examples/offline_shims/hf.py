"""``FederatedDataset`` and ``load_dataset`` on local data, for Flower's examples run offline.

The examples ask Hugging Face for ``uoft-cs/cifar10`` (quickstart-pytorch, opacus) and
``hitorilabs/iris`` (quickstart-sklearn). Here:

* ``uoft-cs/cifar10`` -> MNIST from the local IDX files (``$FLWR_DP_DATA_DIR/mnist`` or
  ``../shared/data/mnist``, :func:`flwr_dp_experiments.datasets.shared_data_dir`; only the
  images used are decompressed), each
  28 x 28 digit zero-padded to 32 x 32 and repeated over 3 channels: CIFAR-10's shape
  (``img``: a 32 x 32 RGB PIL image, ``label``: 0..9), so the examples' ``Net`` is unchanged.
  Without the MNIST files (a checkout with no ``../shared/data``), scikit-learn's embedded digits
  are used instead, each 8 x 8 image scaled up to 32 x 32.
  Only the first :data:`CIFAR_SHAPED_TRAIN` / :data:`CIFAR_SHAPED_TEST` examples are used
  (the tests run a few rounds on 2 CPU cores; override with ``FLOWER_EXAMPLES_TRAIN_SIZE`` /
  ``FLOWER_EXAMPLES_TEST_SIZE``).
* ``hitorilabs/iris`` -> scikit-learn's embedded iris (150 examples), under the Hub dataset's
  column names (``petal_length``, ``petal_width``, ``sepal_length``, ``sepal_width``,
  ``species`` 0..2).

``FederatedDataset`` keeps flwr-datasets' defaults (``shuffle=True``, ``seed=42``: each split is
shuffled before it is partitioned) and hands the split to the example's own partitioner.
"""

from __future__ import annotations

import gzip
import os
from typing import Any, Optional

import numpy as np
from datasets import Dataset, Features, Image, Value
from PIL import Image as PILImage

CIFAR_SHAPED_TRAIN = int(os.environ.get("FLOWER_EXAMPLES_TRAIN_SIZE", "400"))
CIFAR_SHAPED_TEST = int(os.environ.get("FLOWER_EXAMPLES_TEST_SIZE", "200"))
IRIS_COLUMNS = {"sepal_length": 0, "sepal_width": 1, "petal_length": 2, "petal_width": 3}


def _read_idx_head(path: str, count: int, item_bytes: int, header_bytes: int) -> np.ndarray:
    """The first ``count`` items of a gzip'ed IDX file (only those bytes are decompressed)."""
    with gzip.open(path, "rb") as handle:
        handle.read(header_bytes)
        data = handle.read(count * item_bytes)
    if len(data) != count * item_bytes:
        raise ValueError(f"{path} holds fewer than {count} items")
    return np.frombuffer(data, dtype=np.uint8).reshape(count, -1)


def _mnist_as_cifar(split: str) -> Dataset:
    from flwr_dp_experiments.datasets import MNIST_FILES, shared_data_dir

    n = CIFAR_SHAPED_TRAIN if split == "train" else CIFAR_SHAPED_TEST
    images_file, labels_file = (os.path.join(shared_data_dir("mnist"), name) for name in MNIST_FILES[split])
    if os.path.exists(images_file) and os.path.exists(labels_file):
        images = _read_idx_head(images_file, n, 28 * 28, 16).reshape(-1, 28, 28)
        labels = _read_idx_head(labels_file, n, 1, 8).reshape(-1)
        images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    else:  # a checkout without ../shared/data: scikit-learn's embedded digits, 8 x 8 -> 32 x 32
        images, labels = _digits_head(split, n)
    images = np.repeat(images[..., None], 3, axis=-1)
    # PIL images under an Image feature, as the Hub's CIFAR-10: transforms get what they get there
    features = Features({"img": Image(), "label": Value("int64")})
    return Dataset.from_dict({"img": [PILImage.fromarray(im) for im in images],
                              "label": labels.astype(np.int64).tolist()}, features=features)


def _digits_head(split: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (16 grey levels) as uint8 32 x 32 images: train = the first 1 497, test = the rest."""
    from sklearn.datasets import load_digits

    features, labels = load_digits(return_X_y=True)
    rows = slice(0, min(count, 1497)) if split == "train" else slice(1497, 1497 + min(count, 300))
    images = (features[rows].reshape(-1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)
    return np.kron(images, np.ones((1, 4, 4), dtype=np.uint8)), labels[rows]


def _iris(split: str) -> Dataset:
    from sklearn.datasets import load_iris

    if split != "train":
        raise ValueError("hitorilabs/iris has only a 'train' split")
    features, labels = load_iris(return_X_y=True)
    columns = {name: features[:, col] for name, col in IRIS_COLUMNS.items()}
    return Dataset.from_dict({**columns, "species": labels.astype(np.int64)})


LOCAL = {"uoft-cs/cifar10": _mnist_as_cifar, "hitorilabs/iris": _iris}


def load_dataset(path: str, split: str, **_: Any) -> Dataset:
    """``datasets.load_dataset(path, split=split)`` for the datasets in :data:`LOCAL`."""
    if path not in LOCAL:
        raise ValueError(f"no local copy of {path!r}; known: {sorted(LOCAL)}")
    return LOCAL[path](split)


class FederatedDataset:
    """``flwr_datasets.FederatedDataset(dataset=..., partitioners=...)`` on :func:`load_dataset`."""

    def __init__(self, *, dataset: str, partitioners: dict[str, Any], shuffle: bool = True, seed: Optional[int] = 42,
                 **_: Any) -> None:
        self._dataset = dataset
        self._partitioners = dict(partitioners)
        self._shuffle = shuffle
        self._seed = seed

    def load_split(self, split: str) -> Dataset:
        data = load_dataset(self._dataset, split)
        return data.shuffle(seed=self._seed) if self._shuffle else data

    def load_partition(self, partition_id: int, split: Optional[str] = None) -> Dataset:
        if split is None:
            if len(self._partitioners) != 1:
                raise ValueError("name the split: more than one partitioner")
            split = next(iter(self._partitioners))
        partitioner = self._partitioners[split]
        if not partitioner.is_dataset_assigned():
            partitioner.dataset = self.load_split(split)
        return partitioner.load_partition(partition_id)
