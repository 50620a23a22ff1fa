r"""MagRR: adaptive step size for SignDS by binary randomized response (MindSpore spec §3).

Client (one bit per round). r = |mean of the update over the top-k set|; with the
server's current estimate :math:`r_{est}` and phase,

* growth phase (``is_reached = 0``): b = 1 iff r < ``growth_margin``·r_est (2);
* shrink phase (``is_reached = 1``): b = 1 iff r < r_est / ``shrink_margin`` (2;
  the docs say r < r_est);

then :math:`\hat b` = b with probability :math:`P = e^{\varepsilon_{rr}}/(1+e^{\varepsilon_{rr}})`,
else 1 − b (:func:`flwr_dp_strategies.privacy.binary_randomized_response`,
ε_rr = 5 as MindSpore hard-codes): ε_rr-LDP.

Server (once per round, on the N received bits, :math:`N^C` of them 1). Debiased
count of true ones :math:`N^T = (N^C - N + N P)/(2P - 1)`; majority
:math:`B = 1[N^T > N - N^T]` (the same decision as :math:`N^C > N/2`). Then

* growth: B = 0 → r_est ← ``expansion_factor``·r_est (5); B = 1 → a counter of
  such rounds (cumulative) is incremented and, if it was already ≥
  ``reached_threshold`` (10), the phase switches to shrink (the 11th such round);
* shrink: B = 1 → r_est ← r_est / ``reduction_factor`` (1.5; the docs say 2);
  B = 0 → unchanged; there is no way back to growth.

If fewer than ``min_bit_ratio``·(expected participants) bits arrived (5 %), the
update is skipped and r_est is set so that the step equals ``sign_global_lr``
(the fallback of spec §2.3). The step each vote moves a selected coordinate is
``step_ratio``·N·r_est (3.0; the docs say 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..privacy.validation import check_int, check_nonnegative, check_positive

INITIAL_R_EST = 1e-5
RR_EPSILON = 5.0


@dataclass(frozen=True)
class MagRRConfig:
    """MagRR's constants; defaults are MindSpore's code values (docs' values in the module docstring)."""

    initial_r_est: float = INITIAL_R_EST
    expansion_factor: float = 5.0
    reduction_factor: float = 1.5
    reached_threshold: int = 10
    growth_margin: float = 2.0
    shrink_margin: float = 2.0
    rr_epsilon: float = RR_EPSILON
    step_ratio: float = 3.0
    min_bit_ratio: float = 0.05

    def __post_init__(self) -> None:
        check_positive("initial_r_est", self.initial_r_est)
        for name in ("expansion_factor", "reduction_factor"):
            if not getattr(self, name) > 1.0:
                raise ValueError(f"{name} must be in (1, inf), got {getattr(self, name)}")
        for name in ("growth_margin", "shrink_margin", "rr_epsilon", "step_ratio"):
            check_positive(name, getattr(self, name))
        check_int("reached_threshold", self.reached_threshold, minimum=0)
        check_nonnegative("min_bit_ratio", self.min_bit_ratio)

    @property
    def keep_probability(self) -> float:
        """P = e^ε_rr/(1 + e^ε_rr)."""
        return 1.0 / (1.0 + math.exp(-self.rr_epsilon))


@dataclass(frozen=True)
class MagRRState:
    """Server state: r_est, phase (0 growth, 1 shrink) and the count of growth rounds with majority 1."""

    r_est: float = INITIAL_R_EST
    is_reached: int = 0
    reach_count: int = 0


def magnitude_bit(r: float, r_est: float, is_reached: int, config: MagRRConfig) -> int:
    """The true bit b: 1 iff r is small compared with r_est (phase rule)."""
    limit = config.growth_margin * r_est if not is_reached else r_est / config.shrink_margin
    return int(r < limit)


def debiased_ones(ones: int, total: int, keep_probability: float) -> float:
    """N^T = (N^C − N + N·P)/(2P − 1)."""
    return (ones - total + total * keep_probability) / (2.0 * keep_probability - 1.0)


def update_state(
    state: MagRRState, ones: int, total: int, expected_participants: float, global_lr: float, config: MagRRConfig
) -> tuple[MagRRState, dict[str, float]]:
    """One end-of-round update from the received bits; returns the new state and what happened.

    What happened: ``fallback`` (1.0 when fewer than ``min_bit_ratio`` × the expected participants
    sent a bit, else 0.0), ``majority`` (the debiased majority bit, −1.0 in a fallback round) and,
    outside a fallback round, ``debiased-ones`` (:func:`debiased_ones`; a fallback round has too few
    bits to estimate it, so the key is absent there). Every value is finite.
    """
    if total < config.min_bit_ratio * expected_participants:
        r_est = global_lr / config.step_ratio / max(expected_participants, 1.0)
        return replace(state, r_est=r_est), {"fallback": 1.0, "majority": -1.0}
    n_true = debiased_ones(ones, total, config.keep_probability)
    majority = int(n_true > total - n_true)
    r_est, is_reached, count = state.r_est, state.is_reached, state.reach_count
    if not is_reached:
        if majority == 0:
            r_est *= config.expansion_factor
        else:
            if count >= config.reached_threshold:
                is_reached = 1
            count += 1
    elif majority == 1:
        r_est /= config.reduction_factor
    new = MagRRState(r_est=r_est, is_reached=is_reached, reach_count=count)
    return new, {"fallback": 0.0, "majority": float(majority), "debiased-ones": float(n_true)}


def step_size(r_est: float, expected_participants: float, config: MagRRConfig) -> float:
    """g = step_ratio · N · r_est: how far one vote moves a selected coordinate (before averaging)."""
    return config.step_ratio * expected_participants * r_est


__all__ = [
    "INITIAL_R_EST",
    "MagRRConfig",
    "MagRRState",
    "RR_EPSILON",
    "debiased_ones",
    "magnitude_bit",
    "step_size",
    "update_state",
]
