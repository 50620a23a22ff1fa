"""SignDS parameters and their domains (MindSpore yaml checks, spec §4.1)."""

from __future__ import annotations

import math
from dataclasses import dataclass


def _check_range(name: str, value: float, low: float, high: float, *, low_open: bool, high_open: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SignDSParams:
    """sign_k ∈ (0, 0.25], sign_eps ∈ (0, 100], sign_thr_ratio ∈ [0.5, 1], sign_dim_out ∈ [0, 50] (int)."""

    sign_k: float = 0.01
    sign_eps: float = 100.0
    sign_thr_ratio: float = 0.6
    sign_dim_out: int = 0

    def __post_init__(self) -> None:
        _check_range("sign_k", self.sign_k, 0.0, 0.25, low_open=True, high_open=False)
        _check_range("sign_eps", self.sign_eps, 0.0, 100.0, low_open=True, high_open=False)
        _check_range("sign_thr_ratio", self.sign_thr_ratio, 0.5, 1.0, low_open=False, high_open=False)
        if (
            isinstance(self.sign_dim_out, bool)
            or not isinstance(self.sign_dim_out, (int,))
            or not 0 <= self.sign_dim_out <= 50
        ):
            raise ValueError(f"sign_dim_out must be an integer in [0, 50], got {self.sign_dim_out!r}")


def check_global_lr(value: float) -> float:
    """sign_global_lr ∈ (0, inf)."""
    return _check_range("sign_global_lr", value, 0.0, math.inf, low_open=True, high_open=True)


__all__ = ["SignDSParams", "check_global_lr"]
