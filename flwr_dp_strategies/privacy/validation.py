"""Parameter validation shared by every mechanism and accountant.

Every check raises :class:`ValueError` that names the parameter and its
allowed domain, so a misconfigured run fails before anything is released.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np


def _as_real(name: str, value: object, domain: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (Real, np.floating, np.integer)):
        raise ValueError(f"{name} must be a real number in {domain}, got {value!r} ({type(value).__name__})")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must be in {domain}, got nan")
    return value


def check_positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    """Return ``value`` as float if it lies in (0, inf) (or (0, inf] with ``allow_inf``)."""
    domain = "(0, inf]" if allow_inf else "(0, inf)"
    v = _as_real(name, value, domain)
    if v <= 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be in {domain}, got {value!r}")
    return v


def check_nonnegative(name: str, value: object) -> float:
    """Return ``value`` as float if it lies in [0, inf)."""
    v = _as_real(name, value, "[0, inf)")
    if v < 0 or math.isinf(v):
        raise ValueError(f"{name} must be in [0, inf), got {value!r}")
    return v


def check_epsilon(value: object, name: str = "epsilon") -> float:
    """ε must lie in (0, inf)."""
    return check_positive(name, value)


def check_delta(value: object, name: str = "delta") -> float:
    """δ must lie in the open interval (0, 1)."""
    v = _as_real(name, value, "(0, 1)")
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return v


def check_sensitivity(value: object, name: str = "sensitivity") -> float:
    """A sensitivity must lie in (0, inf)."""
    return check_positive(name, value)


def check_probability(name: str, value: object, *, low_open: bool = False, high_open: bool = False) -> float:
    """A probability in [0, 1], with optionally open ends."""
    domain = ("(" if low_open else "[") + "0, 1" + (")" if high_open else "]")
    v = _as_real(name, value, domain)
    lo_ok = v > 0.0 if low_open else v >= 0.0
    hi_ok = v < 1.0 if high_open else v <= 1.0
    if not (lo_ok and hi_ok):
        raise ValueError(f"{name} must be in {domain}, got {value!r}")
    return v


def check_int(name: str, value: object, *, minimum: int) -> int:
    """An integer ≥ ``minimum`` (bool rejected)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer in [{minimum}, inf), got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer in [{minimum}, inf), got {value!r}")
    return int(value)


def as_finite_array(name: str, values: object) -> np.ndarray:
    """Return ``values`` as a float64 array; reject non-numeric dtypes, NaN and inf."""
    return as_finite_float_array(name, values).astype(np.float64, copy=False)


def as_finite_float_array(name: str, values: object) -> np.ndarray:
    """``values`` as a floating array *in its own precision* (integers: float64); no copy for
    float arrays; non-numeric dtypes, NaN and inf rejected. For mechanisms that only compare
    or select entries (no noise is added in that precision)."""
    arr = np.asarray(values)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name} must be a real-valued (integer or float) array, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.bool_):
        raise ValueError(f"{name} must be a real-valued (integer or float) array, got dtype bool")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    if not _all_finite(arr):
        raise ValueError(f"{name} must contain only finite values (no NaN or inf)")
    return arr


def _all_finite(arr: np.ndarray) -> bool:
    """No NaN/inf: a finite sum proves it (NaN and inf propagate) without a d-sized temporary;
    only a non-finite sum (possibly a mere overflow) is checked entry by entry."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.add.reduce(arr, axis=None)):
            return True
    return bool(np.all(np.isfinite(arr)))


def check_bool(name: str, value: object) -> bool:
    """A flag must be a real ``bool`` (``0``, ``"yes"`` or ``None`` are refused, not coerced)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)
