"""Exponential mechanism and k-of-n selection without replacement.

Math (McSherry & Talwar 2007): given utilities u(D, r) with sensitivity
Δu = max_r max_{D~D'} |u(D,r) − u(D',r)|, sampling r with
P[r] ∝ exp(ε·u(D,r)/(2Δu)) is ε-DP, and moreover ε-bounded-range (Durfee &
Rogers 2019), which gives the tighter ε²/8-zCDP for composition (Cesar &
Rogers 2021). The event is :class:`~.events.ExponentialMechanismDpEvent` (ε).

Sampling uses the Gumbel-max trick: argmax_r (log w_r + G_r) with G_r i.i.d.
standard Gumbel is distributed as P[r] ∝ w_r. Taking the k largest of
(log w_r + G_r), in decreasing order, has the same distribution as k
sequential draws without replacement, each from the remaining candidates in
proportion to w (Vieira 2014; Kool, van Hoof & Welling 2019, "Stochastic Beams
and Where to Find Them", Thm 1). So k-of-n selection by the exponential
mechanism is k adaptively composed ε-EM draws: the event is
``SelfComposedDpEvent(ExponentialMechanismDpEvent(ε), k)``. Cost: one O(n)
Gumbel draw plus an O(n) argpartition, no Python loop.
"""

from __future__ import annotations

import numpy as np
from dp_accounting import dp_event

from ..accounting.events import ExponentialMechanismDpEvent
from .release import Release
from ..rng import RngLike, resolve_rng
from ..validation import as_finite_array, check_epsilon, check_int, check_sensitivity


def gumbel_top_k(log_weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of k draws without replacement with P ∝ exp(log_weights), in draw order.

    Entries of ``log_weights`` equal to −inf are never drawn. No privacy claim is
    attached: callers supply weights whose ratio bound they have proven.
    """
    n = log_weights.shape[0]
    keys = log_weights + rng.gumbel(size=n)
    if k < n:
        top = np.argpartition(-keys, k - 1)[:k]
    else:
        top = np.arange(n)
    return top[np.argsort(-keys[top], kind="stable")]


def exponential_mechanism(
    utilities: object,
    *,
    epsilon: float,
    sensitivity: float = 1.0,
    k: int = 1,
    rng: RngLike = None,
) -> Release[np.ndarray]:
    """Select ``k`` distinct indices of ``utilities`` with the ε exponential mechanism.

    Args:
        utilities: 1-D real array u(D, r), one entry per candidate r (finite).
        epsilon: ε in (0, inf) *per draw*.
        sensitivity: Δu in (0, inf).
        k: number of distinct picks in [1, n].
        rng: None (OS entropy), an int seed or a numpy Generator.

    Returns:
        Release with an int64 array of k indices in draw order, and the event
        ``SelfComposedDpEvent(ExponentialMechanismDpEvent(ε), k)`` (k ε-EM draws).
    """
    u = as_finite_array("utilities", utilities)
    if u.ndim != 1 or u.size == 0:
        raise ValueError(f"utilities must be a non-empty 1-D array, got shape {u.shape}")
    eps = check_epsilon(epsilon)
    delta_u = check_sensitivity(sensitivity)
    picks = check_int("k", k, minimum=1)
    if picks > u.size:
        raise ValueError(f"k must be in [1, {u.size}] (the number of candidates), got {k}")
    log_w = eps * u / (2.0 * delta_u)
    chosen = gumbel_top_k(log_w, picks, resolve_rng(rng)).astype(np.int64)
    event: dp_event.DpEvent = ExponentialMechanismDpEvent(epsilon=eps)
    if picks > 1:
        event = dp_event.SelfComposedDpEvent(event=event, count=picks)
    return Release(chosen, event)
