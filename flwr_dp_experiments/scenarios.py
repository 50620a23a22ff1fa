"""Data scenarios of the DELM paper's experiments (§6.1.1 and §6.1.3): who holds which samples.

* IID ("一般场景"): every client gets an equal random share of the training set
  (:func:`~flwr_dp_experiments.datasets.iid_partition_indices`, flwr-datasets' ``IidPartitioner``).
* n-class non-IID ("1-class", "2-class", any "<n>-class"; McMahan et al. / Zhao et al. 2018,
  the paper's ref. [10]): every client holds samples of exactly n labels, cut by
  flwr-datasets' ``PathologicalPartitioner``. With "first-deterministic" (the default,
  as in Li et al. 2021) client p's first class is ``p mod num_classes`` and the other
  n−1 are drawn at random; each class's samples are split evenly among the clients
  that hold it, so client sizes are equal only when every class is used equally often
  (e.g. 1-class with num_clients a multiple of num_classes).
* Low-quality data (§6.1.3 "低质量数据场景"): an ``lq_user`` share of the clients have
  an ``lq_data`` share of their samples noised and relabelled (:func:`corrupt_low_quality`).

Only indices and labels go through ``datasets.Dataset``; features stay numpy arrays.
Nothing here imports Flower itself (only flwr-datasets' partitioners).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

import numpy as np

from .datasets import iid_partition_indices, load_dataset

Partitions = tuple[np.ndarray, ...]
SCHEMES = ("iid", "1-class", "2-class")
CLASS_ASSIGNMENT_MODES = ("first-deterministic", "random", "deterministic")
_N_CLASS = re.compile(r"^([1-9][0-9]*)-class$")


def classes_per_partition(scheme: str) -> Optional[int]:
    """n for an ``"<n>-class"`` scheme, None for ``"iid"``; ValueError for anything else."""
    if scheme == "iid":
        return None
    match = _N_CLASS.match(scheme)
    if match is None:
        raise ValueError(f"scheme must be 'iid' or '<n>-class' with n >= 1 (e.g. {SCHEMES}), got {scheme!r}")
    return int(match.group(1))


def share(fraction: float, total: int) -> int:
    """round(fraction·total), halves rounded up: how many of ``total`` a share ``fraction`` selects."""
    return int(math.floor(fraction * total + 0.5))


def _check_fraction(name: str, value: float) -> float:
    if not (isinstance(value, (int, float, np.floating)) and 0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def n_class_partition_indices(
    labels: np.ndarray, num_partitions: int, n: int, seed: int = 42, class_assignment: str = "first-deterministic"
) -> Partitions:
    """n-class pathological non-IID partition (§6.1.3) via flwr-datasets' ``PathologicalPartitioner``.

    The rows are permuted with ``seed`` first, so which samples of a class a client
    gets (and the random class draws) depend on ``seed`` only, not on the file order.
    """
    import datasets
    from flwr_datasets.partitioner import PathologicalPartitioner

    if class_assignment not in CLASS_ASSIGNMENT_MODES:
        raise ValueError(f"class_assignment must be one of {CLASS_ASSIGNMENT_MODES}, got {class_assignment!r}")
    order = np.random.default_rng(seed).permutation(len(labels))
    partitioner = PathologicalPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        num_classes_per_partition=n,
        class_assignment_mode=class_assignment,
        shuffle=True,
        seed=seed,
    )
    partitioner.dataset = datasets.Dataset.from_dict({"idx": order.tolist(), "label": labels[order].tolist()})
    return tuple(np.asarray(partitioner.load_partition(p)["idx"], dtype=np.int64) for p in range(num_partitions))


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str = "iid",
    seed: int = 42,
    class_assignment: str = "first-deterministic",
) -> Partitions:
    """Training-set indices of each of ``num_partitions`` clients for ``scheme`` (§6.1.3).

    Args:
        labels: int labels of the training set (only their number matters for "iid").
        num_partitions: number of clients, in [1, len(labels)].
        scheme: "iid", "1-class", "2-class" (or any "<n>-class").
        seed: seeds the permutation and the partitioner's random choices.
        class_assignment: ``PathologicalPartitioner``'s ``class_assignment_mode`` for n-class.

    Raises ValueError if a parameter is out of range or some partition would be empty.
    """
    labels = np.asarray(labels)
    n = classes_per_partition(scheme)
    if not (isinstance(num_partitions, (int, np.integer)) and 1 <= num_partitions <= len(labels)):
        raise ValueError(f"num_partitions must be an integer in [1, {len(labels)}], got {num_partitions!r}")
    if n is None:
        parts = iid_partition_indices(len(labels), int(num_partitions), seed)
    else:
        parts = n_class_partition_indices(labels, int(num_partitions), n, seed, class_assignment)
    if any(len(part) == 0 for part in parts):
        raise ValueError(f"scheme {scheme!r} leaves a partition empty with {num_partitions} partitions")
    return parts


def _check_partitions(partitions: Partitions, num_examples: int) -> None:
    flat = np.concatenate(partitions) if len(partitions) else np.zeros(0, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= num_examples):
        raise ValueError(f"partitions must hold indices in [0, {num_examples})")
    if np.unique(flat).size != flat.size:
        raise ValueError("partitions must be disjoint (no index in two partitions or twice in one)")


def corrupt_low_quality(
    x: np.ndarray,
    y: np.ndarray,
    partitions: Partitions,
    lq_user: float,
    lq_data: float,
    num_classes: int,
    seed: int = 42,
    noise_std: Optional[float] = None,
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Low-quality data scenario (§6.1.3): noise and relabel part of some clients' samples.

    ``share(lq_user, N)`` of the N clients, drawn with ``seed``, each get
    ``share(lq_data, |D_i|)`` of their samples (drawn with ``seed``) corrupted:
    features + N(0, noise_std²) per coordinate, clipped to [x.min(), x.max()], and the
    label replaced by a uniformly drawn *different* class. The others are untouched.

    Args:
        x, y: training features (n, d) and int labels (n,) in [0, num_classes).
        partitions: disjoint index arrays, one per client (e.g. :func:`partition_indices`).
        lq_user: share of low-quality clients, in [0, 1].
        lq_data: share of each low-quality client's samples corrupted, in [0, 1].
        num_classes: number of classes, in [2, inf).
        noise_std: std of the additive noise in feature units, in [0, inf); default the
            global std of ``x`` (signal-to-noise ratio about 1).

    Returns:
        (x copy, y copy, sorted low-quality client ids).
    """
    lq_user, lq_data = _check_fraction("lq_user", lq_user), _check_fraction("lq_data", lq_data)
    if not (isinstance(num_classes, (int, np.integer)) and num_classes >= 2):
        raise ValueError(f"num_classes must be an integer in [2, inf), got {num_classes!r}")
    x_new, y_new = np.array(x, copy=True), np.array(y, copy=True)
    if y_new.size and (y_new.min() < 0 or y_new.max() >= num_classes):
        raise ValueError(f"labels must be in [0, {num_classes}) for num_classes={num_classes}")
    std = float(np.std(x_new, dtype=np.float64)) if noise_std is None else float(noise_std)
    if not (math.isfinite(std) and std >= 0.0):
        raise ValueError(f"noise_std must be a finite number in [0, inf), got {noise_std!r}")
    _check_partitions(partitions, len(y_new))
    rng = np.random.default_rng(seed)
    lq_ids = sorted(int(c) for c in rng.choice(len(partitions), size=share(lq_user, len(partitions)), replace=False))
    low, high = (x_new.min(), x_new.max()) if x_new.size else (0.0, 0.0)
    for client in lq_ids:
        part = np.asarray(partitions[client])
        rows = rng.choice(part, size=share(lq_data, len(part)), replace=False)
        noise = rng.normal(0.0, std, size=(len(rows),) + x_new.shape[1:])
        x_new[rows] = np.clip(x_new[rows] + noise, low, high).astype(x_new.dtype, copy=False)
        y_new[rows] = (y_new[rows] + rng.integers(1, num_classes, size=len(rows))) % num_classes
    return x_new, y_new, lq_ids


@dataclass(frozen=True)
class Scenario:
    """One data scenario of §6.1.3 (the DELM paper uses 100 clients, equal shares).

    ``lq_user = lq_data = 0`` means no low-quality data; the paper's low-quality runs use
    0.3/0.3 and 0.5/0.5 (IID split). ``noise_std`` None → the features' global std.
    """

    name: str
    dataset: str = "mnist"
    scheme: str = "iid"
    lq_user: float = 0.0
    lq_data: float = 0.0
    num_clients: int = 100
    seed: int = 42
    class_assignment: str = "first-deterministic"
    noise_std: Optional[float] = None


PAPER_SCENARIOS = (
    Scenario("iid-mnist", "mnist", "iid"),
    Scenario("1-class-mnist", "mnist", "1-class"),
    Scenario("2-class-mnist", "mnist", "2-class"),
    Scenario("lq-0.3-emnist", "emnist-letters", "iid", lq_user=0.3, lq_data=0.3),
    Scenario("lq-0.5-emnist", "emnist-letters", "iid", lq_user=0.5, lq_data=0.5),
)


@lru_cache(maxsize=8)
def _scenario_partitions(
    dataset: str, data_dir: str, num_clients: int, scheme: str, seed: int, class_assignment: str
) -> Partitions:
    _, y_tr, _, _ = load_dataset(dataset, data_dir, seed)
    return partition_indices(y_tr, num_clients, scheme, seed, class_assignment)


def build_scenario(
    scenario: Scenario, data_dir: str = ""
) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray], dict[str, Any]]:
    """Client datasets, the server's test set and a description of ``scenario`` (§6.1).

    Loads :func:`~flwr_dp_experiments.datasets.load_dataset` (standardised features),
    partitions the train split with :func:`partition_indices`, then applies
    :func:`corrupt_low_quality` when ``lq_user`` and ``lq_data`` are both > 0. The test
    split is never corrupted. ``meta`` holds the settings, ``num_classes``,
    ``input_dim``, ``client_sizes``, ``client_classes`` (sorted distinct labels per
    client, before corruption) and ``low_quality_clients``.
    """
    x_tr, y_tr, x_te, y_te = load_dataset(scenario.dataset, data_dir, scenario.seed)
    parts = _scenario_partitions(
        scenario.dataset, data_dir, scenario.num_clients, scenario.scheme, scenario.seed, scenario.class_assignment
    )
    num_classes = int(max(y_tr.max(), y_te.max())) + 1
    client_classes = [sorted(int(c) for c in np.unique(y_tr[p])) for p in parts]
    lq_ids: list[int] = []
    lq_user, lq_data = _check_fraction("lq_user", scenario.lq_user), _check_fraction("lq_data", scenario.lq_data)
    if lq_user > 0 and lq_data > 0:
        x_tr, y_tr, lq_ids = corrupt_low_quality(
            x_tr, y_tr, parts, scenario.lq_user, scenario.lq_data, num_classes, scenario.seed, scenario.noise_std
        )
    clients = [(x_tr[p], y_tr[p]) for p in parts]
    meta = {
        "name": scenario.name,
        "dataset": scenario.dataset,
        "scheme": scenario.scheme,
        "num_clients": scenario.num_clients,
        "seed": scenario.seed,
        "lq_user": scenario.lq_user,
        "lq_data": scenario.lq_data,
        "class_assignment": scenario.class_assignment,
        "num_classes": num_classes,
        "input_dim": int(x_tr.shape[1]),
        "client_sizes": [len(p) for p in parts],
        "client_classes": client_classes,
        "low_quality_clients": lq_ids,
    }
    return clients, (x_te, y_te), meta


__all__ = [
    "CLASS_ASSIGNMENT_MODES",
    "PAPER_SCENARIOS",
    "Partitions",
    "SCHEMES",
    "Scenario",
    "build_scenario",
    "classes_per_partition",
    "corrupt_low_quality",
    "n_class_partition_indices",
    "partition_indices",
    "share",
]
