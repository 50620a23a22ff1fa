r"""Streaming, in-place aggregation of Flower replies: payloads read zero-copy, O(d) memory.

Flower's ``FedAvg`` decodes every reply (``Array.numpy()`` copies the payload) and
builds a new array per reply and key. The strategies of this package instead read
each reply's payload **zero-copy** and add it into **one accumulator per key**:

* :func:`~flwr_dp_strategies.npy_codec.npy_view` - a read-only ``np.frombuffer``
  view of an ``Array``'s ``.npy`` payload (see :mod:`flwr_dp_strategies.npy_codec`;
  anything unusual falls back to ``Array.numpy()``, which decodes it or raises
  exactly as Flower would).
* :class:`WeightedMean` - per key :math:`\bar x = \sum_i w_i x_i / \sum_i w_i`.
  While every weight added to a key is the same :math:`w_0` the accumulator holds
  the plain sum :math:`\sum_i x_i` (BLAS ``axpy`` with factor 1, bit-identical to
  ``np.add(acc, x, out=acc)``: the work of a stacked ``np.mean``) and the mean is
  that sum divided by the count once at the end. The first different weight rescales the accumulator once
  (:math:`acc \leftarrow w_0\,acc`) and from then on every reply is added as
  :math:`acc \leftarrow acc + w_i x_i` by one BLAS ``axpy`` (or, for dtypes BLAS
  does not cover, ``np.multiply`` into one reusable scratch buffer and ``np.add``).
* :class:`ClippedSum` - for central DP with fixed clipping,
  :math:`S = \sum_i a_i s_i \Delta_i`, :math:`\Delta_i = x_i - w`,
  :math:`s_i = \min(1, C/\lVert\Delta_i\rVert_2)`: per reply one pass forms
  :math:`\Delta_i` block by block (1 MiB, in cache) and sums the blocks' ``dot``
  into :math:`\lVert\Delta_i\rVert_2^2` (a Python float), then one ``axpy`` adds
  :math:`a_i s_i x_i` to the accumulator; :math:`(\sum_i a_i s_i)\,w` is
  subtracted once at the end. A reply whose squared norm is not finite holds
  NaN/inf: it is refused before anything of it is added.

Memory: the accumulators (one model), at most one scratch buffer (the largest
key, or one block for :class:`ClippedSum`) and the encoded result; never O(n·d).

Dtypes follow Flower's ``FedAvg`` (``x.numpy() * weight`` summed): floating and
complex arrays keep their dtype, integer and bool arrays come back as float64.
Accumulators are float32 for float16/float32 inputs, the input dtype for wider
floating/complex ones and float64 for integers and bools.

Floating point: sums are accumulated in the accumulator dtype in reply order, so
results equal Flower's up to rounding (a few ulps of float32 per reply, as with
``np.mean`` over the stacked replies); an equal-weight sum of values above
~3e38/n overflows float32 (where the pre-scaled FedAvg sum would not).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

import numpy as np
from flwr.app import ArrayRecord
from scipy.linalg import blas
from threadpoolctl import ThreadpoolController

from flwr_dp_strategies.npy_codec import ArrayLike, npy_view, to_array

_NOISE_CHUNK = 1 << 16
_BLOCK_BYTES = 1 << 20  # blocks of the clipped difference squared while still in (L2) cache
_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64), np.dtype(np.complex128))


_BLAS_CONTROLLER: Optional[ThreadpoolController] = None
Method = TypeVar("Method", bound=Callable[..., object])


def blas_single_thread():
    """A scope in which BLAS (OpenBLAS/MKL, numpy's and scipy's) runs on one thread.

    In a simulation the ServerApp shares the cores with Ray's client actors; a
    multi-threaded BLAS ``axpy``/``dot`` then spins its worker threads against them
    (measured at load 2.5 on 2 cores, n = 100, d = 1e6: 4.5-19x a stacked ``np.mean``,
    1.1x with one thread). Aggregation is bandwidth-bound, so one thread loses
    nothing on an idle machine. The limit applies to this process while the scope
    is open (threadpoolctl, about 10 µs to enter) and is restored on exit.
    """
    global _BLAS_CONTROLLER
    if _BLAS_CONTROLLER is None:
        _BLAS_CONTROLLER = ThreadpoolController()
    return _BLAS_CONTROLLER.limit(limits=1, user_api="blas")


def single_threaded_blas(method: Method) -> Method:
    """Run ``method`` inside :func:`blas_single_thread` (for the strategies' aggregation entry points)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with blas_single_thread():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def all_finite(values: np.ndarray) -> bool:
    """True if no entry is NaN or ±inf: one summation pass, exact check only if the sum is not finite."""
    if values.dtype.kind not in "fc" or values.size == 0:
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(values, axis=None)
    if np.isfinite(total):
        return True  # NaN and ±inf propagate into a sum; a finite sum means finite entries
    return bool(np.isfinite(values).all())  # the sum may merely have overflowed


# ---------------------------------------------------------------------------------------------- dtypes
def accumulator_dtype(dtype: np.dtype) -> np.dtype:
    """float32 for float16/32, the dtype itself for wider floating/complex, float64 for the rest."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return np.promote_types(dtype, np.float32)
    return np.dtype(np.float64)


def mean_dtype(dtype: np.dtype) -> np.dtype:
    """FedAvg's output dtype: floating/complex dtypes are kept, integers and bools give float64."""
    dtype = np.dtype(dtype)
    return dtype if dtype.kind in "fc" else np.dtype(np.float64)


def cast_mean(values: np.ndarray, dtype: np.dtype, round_integers: bool = False) -> np.ndarray:
    """``values`` in ``mean_dtype(dtype)``, or (``round_integers``) in ``dtype`` itself, integers rounded."""
    dtype = np.dtype(dtype)
    if round_integers and dtype.kind not in "fc":
        return np.rint(values, out=values).astype(dtype, copy=False)
    return values.astype(mean_dtype(dtype), copy=False)


# ---------------------------------------------------------------------------------------------- kernels
def _axpy_function(acc: np.ndarray, values: np.ndarray) -> Optional[Callable[..., np.ndarray]]:
    """BLAS ``?axpy`` for ``acc`` if both are contiguous, native and of one BLAS dtype, else None."""
    if acc.dtype not in _BLAS_DTYPES or values.dtype != acc.dtype or acc.size < 1024:
        return None
    if not (acc.flags.c_contiguous and values.flags.c_contiguous and values.dtype.isnative):
        return None
    return blas.get_blas_funcs("axpy", (acc,))


def add_scaled(acc: np.ndarray, values: np.ndarray, factor: float, scratch: Callable[[], np.ndarray]) -> None:
    r"""In place :math:`acc \leftarrow acc + factor \cdot values` (one pass; ``scratch()`` if BLAS cannot).

    BLAS ``axpy`` whenever the dtypes allow, also for ``factor = 1`` (``1·x`` is exact, so
    the sum is bit-identical to ``np.add``; OpenBLAS' axpy streams faster than numpy's add,
    0.72x against 1.0x of a stacked ``np.mean`` per reply in ``flwr_dp_benchmarks/bench_aggregation``).
    """
    axpy = _axpy_function(acc, values)
    if axpy is not None:
        flat = acc.reshape(-1)
        result = axpy(values.reshape(-1), flat, a=factor)  # in place: f2py returns ``flat`` itself
        if result is not flat:  # f2py had to copy: write the result back
            flat[...] = result
        return
    if factor == 1.0:
        np.add(acc, values, out=acc, dtype=acc.dtype, casting="same_kind")
        return
    buffer = scratch()
    np.multiply(values, factor, out=buffer, dtype=acc.dtype, casting="same_kind")
    np.add(acc, buffer, out=acc)


def squared_norm(values: np.ndarray) -> float:
    r""":math:`\lVert v\rVert_2^2` of a contiguous real or complex array (BLAS ``dot``; complex: ``vdot``)."""
    flat = values.reshape(-1)
    if values.dtype.kind == "c":
        return float(np.vdot(flat, flat).real)
    return float(np.dot(flat, flat))


def squared_norm_float64(values: np.ndarray) -> float:
    r""":math:`\lVert v\rVert_2^2` accumulated in float64 (complex: :math:`\sum_j |v_j|^2`), read in blocks of
    :data:`_BLOCK_BYTES` converted to float64 one at a time: no float64 copy of the whole array (8 bytes per
    value, twice a float32 model) and no squared temporary."""
    flat = np.asarray(values).reshape(-1)
    if flat.dtype.kind == "c":
        return squared_norm(np.asarray(flat, dtype=np.complex128))
    if flat.dtype == np.float64:
        return squared_norm(flat)
    step = _BLOCK_BYTES // 8
    block = np.empty(min(step, flat.size), dtype=np.float64)
    total = 0.0
    for start in range(0, flat.size, step):
        part = block[: min(step, flat.size - start)]
        part[...] = flat[start : start + step]
        total += float(np.dot(part, part))
    return total


class _Scratch:
    """One reusable flat buffer per dtype, grown to the largest size asked for."""

    def __init__(self) -> None:
        self._buffers: dict[np.dtype, np.ndarray] = {}

    def get(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.size < size:
            buffer = self._buffers[dtype] = np.empty(size, dtype=dtype)
        return buffer[:size].reshape(shape)

    def clear(self) -> None:
        self._buffers.clear()


# ---------------------------------------------------------------------------------------------- weighted mean
@dataclass
class _Slot:
    """One key's accumulator: ``acc = Σ x`` while every weight equals ``common``, else ``Σ w x``;
    ``inputs`` keeps the (zero-copy) values and weights added, for the overflow-safe recompute."""

    acc: np.ndarray
    dtype: np.dtype
    common: Optional[float]
    total: float = 0.0
    count: int = 0
    inputs: list = field(default_factory=list)
    overflowed: bool = False


class WeightedMean:
    r"""Per key :math:`\sum_i w_i x_i / \sum_i w_i`, added reply by reply into one accumulator per key.

    Keys may receive different weights (layer-wise schemes): every key keeps its own
    total weight. Shapes must agree per key (``ValueError`` otherwise).

    Overflow. The fast path sums :math:`w_i x_i` (or :math:`x_i` for equal weights) in the
    accumulator dtype, which can overflow for finite inputs (two float32-max arrays; a
    weight of 1e39 times a large value). :meth:`is_finite` tells such a key from one fed a
    NaN/inf: if every input of a non-finite accumulator is finite, the key's mean is
    recomputed as the convex combination :math:`\sum_i a_i x_i`, :math:`a_i = (w_i/w_{max})
    / \sum_j (w_j/w_{max})`, in float64, whose partial sums never exceed :math:`\max|x|`:
    the mean of finite values is finite, as in Flower's FedAvg (which also scales first).
    """

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self._scratch = _Scratch()

    def __contains__(self, key: str) -> bool:
        return key in self._slots

    @property
    def keys(self) -> list[str]:
        """The keys seen so far, in order of first appearance."""
        return list(self._slots)

    def add(self, key: str, values: ArrayLike, weight: float) -> None:
        """Add ``weight · values`` to ``key`` (``values``: an ``Array``, read zero-copy, or an ndarray)."""
        weight = _check_weight(weight)
        values = npy_view(values)
        slot = self._slots.get(key)
        if slot is None:  # the first value is copied in: no zero-filled buffer to read back
            acc = np.array(values, dtype=accumulator_dtype(values.dtype), order="C", copy=True)
            self._slots[key] = _Slot(acc, values.dtype, weight, weight, 1, [(values, weight)])
            return
        slot.inputs.append((values, weight))
        if values.shape != slot.acc.shape:
            raise ValueError(f"array {key!r}: shape {values.shape} differs from {slot.acc.shape}")
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is recomputed safely (is_finite)
            if slot.common is not None and weight != slot.common:
                slot.acc *= slot.common  # from Σ x to Σ w x, once
                slot.common = None
            factor = 1.0 if slot.common is not None else weight
            add_scaled(slot.acc, values, factor, lambda: self._scratch.get(slot.acc.dtype, slot.acc.shape))
        slot.total += weight
        slot.count += 1

    def add_record(self, record: Mapping[str, ArrayLike], weight: float) -> None:
        """Add every array of ``record`` with the same ``weight``."""
        for key, values in record.items():
            self.add(key, values, weight)

    def is_finite(self) -> bool:
        """True unless an added value was NaN/±inf. An accumulator that overflowed on finite
        inputs is marked for the overflow-safe recompute in :meth:`mean` (and counts as finite)."""
        for slot in self._slots.values():
            if all_finite(slot.acc):
                continue
            if not all(all_finite(values) for values, _ in slot.inputs):
                return False
            slot.overflowed = True
        return True

    def mean(self, key: str, round_integers: bool = False) -> np.ndarray:
        """``key``'s weighted mean in FedAvg's dtype (:func:`cast_mean`); consumes its accumulator."""
        slot = self._slots.pop(key)
        self._scratch.clear()
        if slot.overflowed or not math.isfinite(slot.total):
            return cast_mean(_convex_mean(slot.inputs), slot.dtype, round_integers)
        divisor = slot.count if slot.common is not None else slot.total
        np.divide(slot.acc, divisor, out=slot.acc)
        return cast_mean(slot.acc, slot.dtype, round_integers)

    def result(self, keys: Optional[Iterable[str]] = None, round_integers: bool = False) -> ArrayRecord:
        """The means of ``keys`` (default: all, in order of first appearance) as an ``ArrayRecord``."""
        order = list(self._slots) if keys is None else list(keys)
        return ArrayRecord({key: to_array(self.mean(key, round_integers)) for key in order})


def _convex_mean(inputs: Sequence[tuple[np.ndarray, float]]) -> np.ndarray:
    r""":math:`\sum_i a_i x_i` in float64 with :math:`a_i = (w_i/w_{max}) / \sum_j (w_j/w_{max})`: weights
    scaled before they are summed and values before they are added, so nothing overflows."""
    top = max(weight for _, weight in inputs)
    scaled = [weight / top for _, weight in inputs]
    total = math.fsum(scaled)
    out = np.zeros(inputs[0][0].shape, dtype=np.complex128 if inputs[0][0].dtype.kind == "c" else np.float64)
    for (values, _), share in zip(inputs, scaled):
        out += (share / total) * np.asarray(values, dtype=out.dtype)
    return out


def _check_weight(weight: float) -> float:
    value = float(weight)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"aggregation weights must be finite and > 0, got {weight!r}")
    return value


class NonFiniteReplies(ValueError):
    """An aggregation found NaN/±inf in these replies (indices into the list it was given)."""

    def __init__(self, indices: Iterable[int]) -> None:
        self.indices = sorted(set(indices))
        super().__init__(f"non-finite values in replies {self.indices}")


def non_finite_records(records: Sequence[Mapping[str, ArrayLike]]) -> list[int]:
    """Indices of the records holding NaN/±inf in some array (read zero-copy)."""
    return [i for i, record in enumerate(records) if not all(all_finite(npy_view(a)) for a in record.values())]


def mean_of_records(records: Sequence[Mapping[str, ArrayLike]], weights: Sequence[float]) -> ArrayRecord:
    r"""FedAvg's :math:`\sum_i w_i x_i / \sum_i w_i` per key, streamed.

    Non-finite values are not scanned for up front: if the finished mean is not
    finite, the offending records are found and :class:`NonFiniteReplies` is
    raised (nothing is returned), so the caller can drop them and aggregate again.
    """
    mean = WeightedMean()
    for record, weight in zip(records, weights, strict=True):
        mean.add_record(record, weight)
    if not mean.is_finite():
        bad = non_finite_records(records)
        if bad:
            raise NonFiniteReplies(bad)
    return mean.result()


# ---------------------------------------------------------------------------------------------- clipped sum
class ClippedSum:
    r""":math:`S = \sum_i f_i \min(1, C/\lVert x_i - w\rVert_2)(x_i - w)` over replies, streamed.

    Args:
        reference: the current model :math:`w`, one array per key (read-only views are fine).
        clipping_norm: :math:`C > 0`.

    :meth:`add` takes a reply's arrays in the order of ``reference`` and a factor
    :math:`f_i` (1 for a plain sum, e.g. a FedAvg weight :math:`n_i`). Per reply:

    1. :math:`\lVert x_i - w\rVert_2^2`: the difference is formed block by block
       (1 MiB) in a small buffer that stays in cache, each block's ``dot`` summed
       in a Python float, so the norm is that of the exact float difference;
    2. :math:`c_i = f_i \min(1, C/\lVert x_i - w\rVert_2)` and
       :math:`acc \leftarrow acc + c_i x_i` (one ``axpy``, :math:`x_i` still in cache).

    :meth:`result` returns :math:`S = acc - (\sum_i c_i)\,w`, the same sum by
    linearity. Its rounding error is that of adding :math:`w` back to each clipped
    update before averaging, as Flower's wrapper does. Buffers: the accumulators
    (one model) and one block.
    """

    def __init__(self, reference: Mapping[str, np.ndarray], clipping_norm: float) -> None:
        if not clipping_norm > 0:
            raise ValueError(f"clipping_norm must be > 0, got {clipping_norm!r}")
        self.clipping_norm = float(clipping_norm)
        self.reference = {key: np.asarray(values) for key, values in reference.items()}
        self._sums = {key: np.zeros(v.shape, dtype=accumulator_dtype(v.dtype)) for key, v in self.reference.items()}
        self._offset = 0.0  # Σ c_i: the multiple of w to subtract from the accumulators
        self._scratch = _Scratch()
        self.count = 0
        self.clipped = 0

    def add(
        self, arrays: Sequence[ArrayLike], factor: float = 1.0, *, limit: Optional[float] = None
    ) -> Optional[float]:
        """Clip ``x − w`` to norm C and add ``factor ·`` it; returns ‖x − w‖₂, or None (nothing added) if not finite.

        With ``limit``: a reply with ‖x − w‖₂ > ``limit`` is not added (its norm is returned, the
        caller compares), e.g. a reply a client should have clipped to C itself.
        """
        values = [npy_view(a) for a in arrays]
        if len(values) != len(self.reference):
            raise ValueError(f"{len(values)} arrays in a reply, {len(self.reference)} in the model")
        with np.errstate(over="ignore", invalid="ignore"):  # NaN/inf/overflow are handled just below
            squared = sum(self._squared_distance(key, x) for key, x in zip(self.reference, values))
        norm = math.sqrt(squared) if squared >= 0 else math.nan
        if not math.isfinite(norm):
            norm = self._exact_norm(values)
            if norm is None:
                return None
        if limit is not None and norm > limit:
            return norm
        scale = min(1.0, self.clipping_norm / norm) if norm > 0 else 1.0
        coefficient = factor * scale
        for acc, x in zip(self._sums.values(), values):
            add_scaled(acc, x, coefficient, lambda acc=acc: self._scratch.get(acc.dtype, acc.shape))
        self._offset += coefficient
        self.clipped += scale < 1.0
        self.count += 1
        return norm

    def add_records(self, records: Sequence[Mapping[str, ArrayLike]]) -> list[int]:
        """:meth:`add` each record's arrays (looked up in the model's key order); the indices of
        the records not added because their update holds NaN/inf."""
        keys = list(self.reference)
        return [index for index, record in enumerate(records) if self.add([record[key] for key in keys]) is None]

    def _squared_distance(self, key: str, x: np.ndarray) -> float:
        """‖x − w‖₂² of one key, from cache-sized blocks of the difference."""
        ref = self.reference[key]
        if x.shape != ref.shape:
            raise ValueError(f"array {key!r}: shape {x.shape} differs from the model's {ref.shape}")
        dtype = self._sums[key].dtype
        if not (x.flags.c_contiguous and ref.flags.c_contiguous):
            return squared_norm(np.subtract(x, ref, dtype=dtype, casting="same_kind"))
        flat_x, flat_ref = x.reshape(-1), ref.reshape(-1)
        step = max(1, _BLOCK_BYTES // dtype.itemsize)
        block = self._scratch.get(dtype, (min(step, flat_x.size),))
        total = 0.0
        for start in range(0, flat_x.size, step):
            part = block[: min(step, flat_x.size - start)]
            np.subtract(
                flat_x[start : start + step], flat_ref[start : start + step], out=part, dtype=dtype, casting="same_kind"
            )
            total += squared_norm(part)
        return total

    def _exact_norm(self, values: list[np.ndarray]) -> Optional[float]:
        """The norm when the float dots overflowed; None if a difference holds NaN/inf."""
        with np.errstate(over="ignore", invalid="ignore"):
            diffs = [
                np.subtract(x, ref, dtype=acc.dtype, casting="same_kind")
                for x, ref, acc in zip(values, self.reference.values(), self._sums.values())
            ]
        if not all(bool(np.isfinite(d).all()) for d in diffs):
            return None
        scale = max(float(np.max(np.abs(d))) if d.size else 0.0 for d in diffs)
        return scale * math.sqrt(sum(squared_norm(np.asarray(d / scale, dtype=np.float64)) for d in diffs))

    def result(self) -> dict[str, np.ndarray]:
        """:math:`S` per key, in the accumulators (consumes them: call once, after the last :meth:`add`)."""
        self._scratch.clear()
        for acc, ref in zip(self._sums.values(), self.reference.values()):
            if self._offset:
                add_scaled(acc, ref, -self._offset, lambda acc=acc: np.empty_like(acc))
        self._offset = 0.0
        return self._sums


def add_gaussian_noise(values: np.ndarray, sigma: float, rng: np.random.Generator) -> None:
    r"""In place :math:`v \leftarrow v + \mathcal N(0, \sigma^2 I)`, drawn in float64 in chunks of 65 536.

    The draws are those of one ``rng.normal(0, sigma, values.size)`` call (a
    ``Generator`` fills sequentially), without its d-sized float64 temporary.
    """
    flat = values.reshape(-1)
    if not np.shares_memory(flat, values):
        raise ValueError("add_gaussian_noise needs a contiguous array")
    for start in range(0, flat.size, _NOISE_CHUNK):
        part = flat[start : start + _NOISE_CHUNK]
        np.add(part, rng.normal(0.0, sigma, part.size), out=part, casting="same_kind")


__all__ = [
    "blas_single_thread",
    "single_threaded_blas",
    "ClippedSum",
    "NonFiniteReplies",
    "WeightedMean",
    "accumulator_dtype",
    "add_gaussian_noise",
    "add_scaled",
    "all_finite",
    "cast_mean",
    "mean_dtype",
    "mean_of_records",
    "non_finite_records",
    "npy_view",
    "squared_norm",
    "squared_norm_float64",
    "to_array",
]
