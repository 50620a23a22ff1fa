r"""Label differential privacy by randomized response, for label protection in vertical FL.

In vertical (split) federated learning the *label party* trains the top model on
its labels and sends gradients w.r.t. the feature parties' embeddings back to
them; those gradients can reveal the labels (e.g. the sign of the gradient of a
binary cross-entropy). :class:`LabelDp` randomises the labels **once, before
training**; everything computed afterwards (top model, gradients, predictions)
is post-processing of the randomised labels and inherits their guarantee.

Mechanism (randomized response, Warner 1965; k-ary form of Kairouz et al. 2016,
as used for label DP by Ghazi et al. 2021, "Deep learning with label
differential privacy", NeurIPS):

* **binary labels** ``y ∈ {0, 1}`` (a 1-D array, or a single column): each label
  is flipped independently with probability

  .. math:: f = \frac{1}{1 + e^{\varepsilon}};

* **k classes** (one-hot rows with ``k ≥ 2`` columns, or integer labels in
  ``[0, k)`` with ``num_classes=k``): each label keeps its class with probability

  .. math:: p_{keep} = \frac{e^{\varepsilon}}{e^{\varepsilon} + k - 1}
                     = \frac{1}{1 + (k-1)e^{-\varepsilon}}

  and otherwise moves to one of the ``k − 1`` *other* classes chosen uniformly,
  each with :math:`1/(e^{\varepsilon} + k - 1)`. For ``k = 2`` this is the binary rule.

Guarantee: for any two values ``y ≠ y'`` of one label and any output ``o``,
``P[o | y] / P[o | y'] ≤ p_keep / p_other = e^ε``. So the release of each label
is **ε-label-DP** under *replacement* of that one label (neighbouring relation
``replace_one``), and, as each label gets independent noise, the release of the
whole batch is ε-DP with respect to changing any one example's label
(parallel composition). Features are **not** protected: only the labels are.
The accounting event of one label's release is
``rr_event(ε, k)`` = dp-accounting ``RandomizedResponseDpEvent(noise_parameter=
k/(e^ε + k − 1), num_buckets=k)``, accountable only under ``replace_one``.
Randomise each label **once** and keep the result
(:mod:`client_mods.label_dp_data`): randomising it again (every epoch or round)
is a new release and composes.

Differences from MindSpore Federated's ``mindspore_federated.privacy.LabelDP``
(FED-M ``privacy/dp.py``), which this class otherwise mirrors (same call
``LabelDP(eps)(labels)``, binary/one-hot auto-detection, same output type):

* **every row is validated**: a one-hot row must hold exactly one 1 and zeros
  elsewhere (MindSpore only checks that the *total* number of ones equals the
  number of rows, so a row with two 1s plus a row with none passes there);
  binary labels must be 0/1; integer labels must be integers in ``[0, k)``;
* **no silent cap** of ε at 100: any finite ε > 0 is used exactly, with the
  keep probability computed as ``1/(1 + (k−1)e^{−ε})`` (no overflow);
* **no global random state**: noise comes from a
  :class:`numpy.random.Generator` (fresh OS entropy by default, see
  :func:`flwr_dp_strategies.privacy.rng.resolve_rng`), never ``np.random.*``;
* ε must lie in ``(0, inf)`` (``ValueError`` naming ``eps`` otherwise). MindSpore
  also allows ε = 0, a uniform relabelling that carries no information about the
  labels (0-DP) and is useless for training; this package rejects ε = 0 like
  every other mechanism here (:func:`~flwr_dp_strategies.privacy.validation.check_epsilon`).
  "No label DP" is simply not applying :class:`LabelDp`;
* numpy arrays and torch tensors are accepted (MindSpore: only its own Tensor),
  plus integer class labels (``num_classes=``), which MindSpore does not take.

The sampling itself is :func:`~flwr_dp_strategies.privacy.binary_randomized_response`
and :func:`~flwr_dp_strategies.privacy.kary_randomized_response` (no mechanism
is implemented twice in this package).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional, TypeVar, cast

import numpy as np
from dp_accounting import dp_event

from flwr_dp_strategies._deprecation import resolve_moved
from flwr_dp_strategies.privacy import (
    Release,
    binary_randomized_response,
    kary_randomized_response,
    keep_probability,
    rr_event,
)
from flwr_dp_strategies.privacy.rng import RngLike, RngSource
from flwr_dp_strategies.privacy.validation import check_epsilon, check_int

LabelsT = TypeVar("LabelsT")

BINARY = "binary"
ONE_HOT = "one-hot"
CLASS_INDEX = "class-index"
_MAX_ROWS_SHOWN = 5


def _torch_of(value: object) -> Any:
    """The torch module if ``value`` is a torch tensor, else None (torch is not imported for numpy input)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(value, torch.Tensor) else None


def to_numpy(labels: object) -> np.ndarray:
    """A numpy view/copy of ``labels`` (numpy array, torch tensor on any device, or array-like)."""
    torch = _torch_of(labels)
    if torch is None:
        return np.asarray(labels)
    tensor = cast(Any, labels).detach().cpu()  # a torch tensor (_torch_of found its module)
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; 0/1 and small ints are exact in float32
        tensor = tensor.to(torch.float32)
    return tensor.numpy()


def like(values: np.ndarray, template: LabelsT) -> LabelsT:
    """``values`` converted to ``template``'s type, dtype and device (torch) or dtype (numpy)."""
    torch = _torch_of(template)
    if torch is not None:
        out = torch.from_numpy(np.ascontiguousarray(values))
        tensor_template = cast(Any, template)  # a torch tensor
        return cast(LabelsT, out.to(device=tensor_template.device, dtype=tensor_template.dtype))
    dtype = np.asarray(template).dtype
    return cast(LabelsT, np.asarray(values).astype(dtype, copy=False))


def _show(rows: np.ndarray) -> str:
    shown = ", ".join(str(int(r)) for r in rows[:_MAX_ROWS_SHOWN])
    return f"[{shown}{', ...' if rows.size > _MAX_ROWS_SHOWN else ''}] ({rows.size} in all)"


def _check_numeric(arr: np.ndarray) -> None:
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_) or np.issubdtype(
        arr.dtype, np.complexfloating
    ):
        raise ValueError(f"labels must be a numeric or bool array, got dtype {arr.dtype}")


def class_indices(arr: np.ndarray, num_classes: int) -> np.ndarray:
    """Validate integer class labels (any numeric dtype, integral values) in ``[0, k)``; return int64.

    Every element is checked; the error names the offending rows.
    """
    _check_numeric(arr)
    flat = arr.reshape(-1)
    if np.issubdtype(flat.dtype, np.floating):
        bad = ~np.isfinite(flat) | (flat != np.round(flat)) | (flat < 0) | (flat >= num_classes)
    else:
        bad = (flat < 0) | (flat >= num_classes)
    rows = np.flatnonzero(bad)
    if rows.size:
        what = "0 or 1 (binary labels)" if num_classes == 2 else f"integers in [0, {num_classes - 1}]"
        raise ValueError(
            f"labels must be {what}; invalid value(s) at row(s) {_show(rows)}, e.g. {flat[rows[0]].item()!r}"
        )
    return flat.astype(np.int64)


def one_hot_indices(arr: np.ndarray) -> np.ndarray:
    """Validate one-hot rows (each exactly one 1, zeros elsewhere); return the int64 class of each row.

    Unlike MindSpore, which checks only the total count of ones, every row is checked.
    """
    _check_numeric(arr)
    is_one = arr == 1
    binary = is_one | (arr == 0)
    rows = np.flatnonzero(~binary.all(axis=1) | (is_one.sum(axis=1) != 1))
    if rows.size:
        raise ValueError(
            f"one-hot labels must have exactly one 1 and zeros elsewhere in every row; invalid row(s) {_show(rows)}"
        )
    return np.argmax(is_one, axis=1).astype(np.int64)


def label_format(shape: tuple[int, ...], num_classes: Optional[int]) -> tuple[str, int]:
    """(format, k) of a label array of ``shape``: binary, class-index (k = num_classes) or one-hot (k = columns)."""
    if len(shape) == 2 and shape[1] >= 2:
        if num_classes is not None and num_classes != shape[1]:
            raise ValueError(f"num_classes={num_classes} does not match the {shape[1]} columns of the one-hot labels")
        return ONE_HOT, shape[1]
    if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):
        k = 2 if num_classes is None else num_classes
        return (BINARY if k == 2 else CLASS_INDEX), k
    raise ValueError(
        f"labels must be 1-D (binary or class indices), a single column, or 2-D one-hot "
        f"(n, k >= 2); got shape {tuple(shape)}"
    )


def validated_indices(arr: np.ndarray, num_classes: Optional[int]) -> tuple[np.ndarray, str, int]:
    """(int64 class index per row, format, k) of a label array, every row validated."""
    fmt, k = label_format(arr.shape, num_classes)
    idx = one_hot_indices(arr) if fmt == ONE_HOT else class_indices(arr, k)
    return idx, fmt, k


def randomize(
    arr: np.ndarray, epsilon: float, num_classes: Optional[int], rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """Randomised ``arr`` (numpy, same shape; int64 indices or float64 one-hot rows) and the class count k."""
    idx, fmt, k = validated_indices(arr, num_classes)
    if k == 2 and fmt != ONE_HOT:
        noisy = binary_randomized_response(idx, epsilon=epsilon, rng=rng).value
    else:
        noisy = kary_randomized_response(idx, epsilon=epsilon, num_classes=k, rng=rng).value
    if fmt == ONE_HOT:
        return np.eye(k, dtype=np.float64)[noisy], k
    return noisy.reshape(arr.shape), k


class LabelDp:
    r"""ε-label-DP randomized response on a batch of labels: ``LabelDp(eps)(labels)``.

    Args:
        eps: privacy parameter ε in ``(0, inf)``. Not capped: large ε are exact.
        num_classes: number of classes k (int ≥ 2). Needed for 1-D *integer class*
            labels with more than 2 classes; without it, 1-D labels (or a single
            column) are binary 0/1. For one-hot labels (2-D, ≥ 2 columns) k is the
            number of columns (if given, it must match).
        rng: ``None`` (a generator seeded from OS entropy, the default), an ``int``
            seed or a :class:`numpy.random.Generator`. The generator is resolved
            once, so successive calls draw fresh, independent noise.

    Calling the object on labels returns randomised labels of the same type
    (numpy array or torch tensor; other array-likes come back as numpy arrays),
    dtype, device and shape. Binary and integer
    labels keep their values' dtype; one-hot labels come back one-hot.

    Binary: flip with :math:`1/(1+e^{\varepsilon})`. k classes: keep with
    :math:`e^{\varepsilon}/(e^{\varepsilon}+k-1)`, else a uniformly chosen *other*
    class. Each label's release is ε-DP under replacement of that label; the
    features are not protected. See the module docstring for the proof sketch,
    references (Warner 1965; Ghazi et al. 2021) and the differences from MindSpore.

    Raises:
        ValueError: ``eps`` outside ``(0, inf)``, ``num_classes`` not an int ≥ 2,
            or (on call) labels that are not valid binary / one-hot / class labels,
            with the offending rows named.
    """

    def __init__(self, eps: float, *, num_classes: Optional[int] = None, rng: RngLike = None) -> None:
        self.eps = check_epsilon(eps, "eps")
        self.num_classes = None if num_classes is None else check_int("num_classes", num_classes, minimum=2)
        self._rng = RngSource(rng)

    def __repr__(self) -> str:
        return f"LabelDp(eps={self.eps!r}, num_classes={self.num_classes!r})"

    def __call__(self, labels: LabelsT) -> LabelsT:
        """Randomised copy of ``labels`` (same type, dtype, device and shape)."""
        return self.release(labels).value

    def release(self, labels: LabelsT) -> Release[LabelsT]:
        """Randomised labels plus the DpEvent of *one* label's release (``rr_event(eps, k)``)."""
        arr = to_numpy(labels)
        noisy, k = randomize(arr, self.eps, self.num_classes, self._rng())
        return Release(like(noisy, labels), rr_event(self.eps, k))

    def _k(self, num_classes: Optional[int]) -> int:
        k = self.num_classes if num_classes is None else num_classes
        if k is None:
            raise ValueError("num_classes must be an integer in [2, inf): pass it here or to LabelDp(num_classes=...)")
        return check_int("num_classes", k, minimum=2)

    def keep_probability(self, num_classes: Optional[int] = None) -> float:
        """P[output = true label] = e^ε/(e^ε + k − 1) = 1/(1 + (k−1)e^{−ε}) (binary: k = 2)."""
        return keep_probability(self.eps, self._k(num_classes))

    def flip_probability(self, num_classes: Optional[int] = None) -> float:
        """P[output ≠ true label] = (k−1)/(e^ε + k − 1), computed as (k−1)e^{−ε}·p_keep (exact for large ε).

        For k = 2 this is the binary flip probability 1/(1 + e^ε).
        """
        k = self._k(num_classes)
        return (k - 1) * math.exp(-self.eps) * keep_probability(self.eps, k)

    def other_class_probability(self, num_classes: Optional[int] = None) -> float:
        """P[output = one given other class] = 1/(e^ε + k − 1) (MindSpore's p₂)."""
        k = self._k(num_classes)
        return math.exp(-self.eps) * keep_probability(self.eps, k)

    def event(self, num_classes: Optional[int] = None) -> dp_event.RandomizedResponseDpEvent:
        """dp-accounting event of one label's release: ``rr_event(eps, k)`` (relation ``replace_one``)."""
        return rr_event(self.eps, self._k(num_classes))


def __getattr__(name: str):
    """``LabelDP``, the former spelling of :class:`LabelDp`: still resolves, with a DeprecationWarning."""
    return resolve_moved(__name__, name, {"LabelDP": "client_mods:LabelDp"})


__all__ = [
    "LabelDp",
    "class_indices",
    "label_format",
    "like",
    "one_hot_indices",
    "randomize",
    "to_numpy",
    "validated_indices",
]
