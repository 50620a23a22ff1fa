r"""AboveThreshold, the sparse vector technique: one ε-DP answer to "which query is the first above T?".

Dwork & Roth, *The Algorithmic Foundations of Differential Privacy*, §3.6, Algorithm 1 (AboveThreshold),
Theorem 3.23; Lyu, Su & Li, "Understanding the Sparse Vector Technique for Differential Privacy", VLDB 2017,
Algorithm 1 with c = 1. For a stream of queries :math:`q_1, q_2, \dots` each of sensitivity Δ (under the
neighbouring relation in use), with

.. math:: \hat T = T + \mathrm{Lap}(2\Delta/\varepsilon), \qquad
          \text{halt at the first } i \text{ with } q_i(D) + \nu_i \ge \hat T, \quad \nu_i \sim \mathrm{Lap}(4\Delta/\varepsilon),

the whole chain (every "below" answer and the one "above") is ε-DP, however many queries it answers and
whichever query halts it (Theorem 3.23's proof: the threshold noise pays ε/2, the halting query's noise
ε/2; the "below" answers cost nothing more). The queries may be chosen adaptively. Nothing else is
released: not the noisy values, not the margin. Without the monotonicity Lyu et al. use to halve the query
noise, Lap(4Δ/ε) is the sound scale for any queries.

So a chain is booked once, as ``PureDpEvent(ε)``, when its first query is answered (the cost is the same
whether it halts or not). After it halts, the chain answers nothing more; a new chain is a new ε.
No Flower import.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..accounting.events import PureDpEvent
from ..rng import RngLike, resolve_rng
from ..validation import check_epsilon, check_sensitivity


class AboveThreshold:
    """One AboveThreshold chain (module docstring).

    Args:
        threshold: T, finite.
        epsilon: ε in (0, inf) for the whole chain.
        sensitivity: Δ in (0, inf), of every query under the ledger's relation.
        rng: None (OS entropy), an int seed or a numpy Generator (tests only).
    """

    def __init__(self, threshold: float, *, epsilon: float, sensitivity: float, rng: RngLike = None) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite number, got {threshold!r}")
        self.threshold = float(threshold)
        self.epsilon = check_epsilon(epsilon, "epsilon")
        self.sensitivity = check_sensitivity(sensitivity)
        self._generator = resolve_rng(rng)
        self.threshold_scale = 2.0 * self.sensitivity / self.epsilon
        self.query_scale = 4.0 * self.sensitivity / self.epsilon
        self._noisy_threshold = self.threshold + float(self._generator.laplace(0.0, self.threshold_scale))
        self.answered = 0
        self.halted_at: Optional[int] = None

    @property
    def event(self) -> PureDpEvent:
        """The chain's cost: ``PureDpEvent(ε)``, whatever the number of queries and the answer."""
        return PureDpEvent(self.epsilon)

    @property
    def halted(self) -> bool:
        return self.halted_at is not None

    def query(self, value: float) -> bool:
        """True (and the chain halts) when ``value`` + Lap(4Δ/ε) ≥ the noisy threshold; RuntimeError once halted."""
        if self.halted:
            raise RuntimeError(f"the chain halted at query {self.halted_at}: a new chain is a new epsilon")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value):
            raise ValueError(f"value must be a finite number, got {value!r}")
        self.answered += 1
        noise = float(self._generator.laplace(0.0, self.query_scale))
        self._last_noise = noise  # kept in process only (the statistical test reads it); never released
        if float(value) + noise >= self._noisy_threshold:
            self.halted_at = self.answered
            return True
        return False


__all__ = ["AboveThreshold"]
