"""Binary and k-ary randomized response (Warner 1965; Kairouz et al. 2016).

Binary RR: each bit is flipped independently with probability
f = 1/(1 + e^ε), kept with 1 − f = e^ε/(1 + e^ε). For two inputs y ≠ y' the
likelihood ratio of any output is at most (1−f)/f = e^ε, so each bit's release
is ε-DP under replacement of that bit (label DP: Ghazi et al. 2021, "Deep Learning
with Label Differential Privacy", NeurIPS).

k-ary RR: the true value y ∈ {0..k−1} is kept with probability
e^ε/(e^ε + k − 1) and otherwise replaced by one of the k − 1 other values
uniformly, each with 1/(e^ε + k − 1); the worst ratio is again e^ε.

dp-accounting parametrises RR as "with probability p output a uniform bucket
(true one included), else the truth": P[other] = p/k, so p = k/(e^ε + k − 1)
(binary: p = 2/(1 + e^ε)). The event is
``RandomizedResponseDpEvent(noise_parameter=p, num_buckets=k)``, which its
accountants accept only under the REPLACE_ONE relation (the relation RR
protects). One event describes the release of *one* value: a batch of labels
from different people is one event per person, not a composition.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event

from .release import Release
from ..rng import RngLike, resolve_rng
from ..validation import check_epsilon, check_int


def flip_probability(epsilon: float) -> float:
    """f = 1/(1 + e^ε), computed stably for large ε."""
    eps = check_epsilon(epsilon)
    tail = math.exp(-eps)  # 1/(1 + e^ε) = e^−ε/(1 + e^−ε): no overflow; exact until e^−ε underflows (ε > 745)
    return tail / (1.0 + tail)


def keep_probability(epsilon: float, num_classes: int) -> float:
    """e^ε/(e^ε + k − 1) = 1/(1 + (k−1)e^{−ε})."""
    eps = check_epsilon(epsilon)
    k = check_int("num_classes", num_classes, minimum=2)
    return 1.0 / (1.0 + (k - 1) * math.exp(-eps))


def rr_event(epsilon: float, num_classes: int) -> dp_event.RandomizedResponseDpEvent:
    """The dp-accounting event of one k-ary RR release: p = k/(e^ε + k − 1)."""
    eps = check_epsilon(epsilon)
    k = check_int("num_classes", num_classes, minimum=2)
    p = k * math.exp(-eps) / (1.0 + (k - 1) * math.exp(-eps))
    return dp_event.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=k)


def _check_labels(name: str, values: object, num_classes: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise ValueError(f"{name} must hold integers in [0, {num_classes - 1}], got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
        raise ValueError(f"{name} must hold integers in [0, {num_classes - 1}], got range [{arr.min()}, {arr.max()}]")
    return arr.astype(np.int64, copy=False)


def binary_randomized_response(bits: object, *, epsilon: float, rng: RngLike = None) -> Release[np.ndarray]:
    """Flip each 0/1 value with probability 1/(1 + e^ε); returns int64 array of the same shape."""
    b = _check_labels("bits", bits, 2)
    f = flip_probability(epsilon)
    flips = resolve_rng(rng).random(b.shape) < f
    return Release(np.where(flips, 1 - b, b), rr_event(epsilon, 2))


def kary_randomized_response(
    labels: object, *, epsilon: float, num_classes: int, rng: RngLike = None
) -> Release[np.ndarray]:
    """k-ary RR on integer labels in [0, k): keep with e^ε/(e^ε+k−1), else a uniform *other* label."""
    k = check_int("num_classes", num_classes, minimum=2)
    y = _check_labels("labels", labels, k)
    keep = keep_probability(epsilon, k)
    gen = resolve_rng(rng)
    move = gen.random(y.shape) >= keep
    shift = gen.integers(1, k, size=y.shape)  # uniform over the k−1 other labels
    return Release(np.where(move, (y + shift) % k, y), rr_event(epsilon, k))
