"""Textbook composition and subsampling bounds, for comparison with the accountants.

These are what most papers and tutorials quote; the ledger's RDP/PLD figures
are tighter and are what the project reports. All take and return (ε, δ).

* Basic composition (Dwork et al. 2006): (Σεᵢ, Σδᵢ).
* Strong (advanced) composition (Dwork, Rothblum, Vadhan 2010, "Boosting and
  Differential Privacy", FOCS), in the form DP-SGD tutorials quote: T mechanisms, each (ε, δ)-DP,
  compose to ε̃ = ε·√(2T·ln(1/δ')) + T·ε·(e^ε − 1)/(e^ε + 1), δ̃ = T·δ + δ'.
* Amplification by subsampling (Balle, Barthe, Gaboardi 2018, Thm 9; Poisson
  or uniform sampling with rate q under the matching relation):
  ε' = log(1 + q·(e^ε − 1)), δ' = q·δ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dp_accounting import dp_event
from dp_accounting import gaussian_mechanism as _analytic

from ..accounting.custom_events import CustomDpEvent
from ..validation import check_delta, check_epsilon, check_int, check_probability


def basic_composition(params: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(Σεᵢ, Σδᵢ)."""
    return float(sum(e for e, _ in params)), float(sum(d for _, d in params))


def strong_composition(epsilon: float, delta: float, num_compositions: int, delta_prime: float) -> tuple[float, float]:
    """ε̃ = ε√(2T ln(1/δ')) + Tε(e^ε−1)/(e^ε+1), δ̃ = Tδ + δ' (DP-SGD seed, eq. after (1))."""
    eps = check_epsilon(epsilon)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    t = check_int("num_compositions", num_compositions, minimum=1)
    dp = check_delta(delta_prime, "delta_prime")
    eps_total = eps * math.sqrt(2.0 * t * math.log(1.0 / dp)) + t * eps * math.tanh(eps / 2.0)
    return eps_total, t * delta + dp


def amplify_by_subsampling(epsilon: float, delta: float, sampling_rate: float) -> tuple[float, float]:
    """ε' = log(1 + q(e^ε − 1)), δ' = qδ."""
    eps = check_epsilon(epsilon)
    q = check_probability("sampling_rate", sampling_rate, low_open=True)
    return math.log1p(q * math.expm1(eps)), q * delta


def event_epsilon_delta(event: dp_event.DpEvent, delta: float) -> tuple[float, float]:
    """A textbook (ε, δ) for one event; Gaussian parts are charged δ each (analytic Gaussian)."""
    if isinstance(event, dp_event.LaplaceDpEvent):
        return 1.0 / event.noise_multiplier, 0.0
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return event.noise_parameter * event.sensitivity, 0.0
    if isinstance(event, dp_event.RandomizedResponseDpEvent):
        p, k = event.noise_parameter, event.num_buckets
        return math.log1p(k * (1.0 - p) / p), 0.0
    if isinstance(event, CustomDpEvent):
        bound = event.textbook(delta)
        if bound is None:
            raise ValueError(f"no textbook (epsilon, delta) for {type(event).__name__}")
        return bound
    if isinstance(event, dp_event.GaussianDpEvent):
        return float(_analytic.get_epsilon_gaussian(event.noise_multiplier, delta)), delta
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        eps, dlt = event_epsilon_delta(event.event, delta)
        return amplify_by_subsampling(eps, dlt, event.sampling_probability)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        eps, dlt = event_epsilon_delta(event.event, delta)
        return eps * event.count, dlt * event.count
    if isinstance(event, dp_event.ComposedDpEvent):
        return basic_composition([event_epsilon_delta(e, delta) for e in event.events])
    raise ValueError(f"no textbook (epsilon, delta) for {type(event).__name__}")


def _flatten(event: dp_event.DpEvent, count: int) -> list[tuple[dp_event.DpEvent, int]]:
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _flatten(event.event, count * event.count)
    if isinstance(event, dp_event.ComposedDpEvent):
        return [item for e in event.events for item in _flatten(e, count)]
    return [(event, count)]


def textbook_bounds(events: Sequence[tuple[dp_event.DpEvent, int]], delta: float) -> dict[str, tuple[float, float]]:
    """Basic and strong composition of ``(event, count)`` pairs at total δ.

    δ split: basic charges δ/T to each of the T releases; strong charges δ/(2T)
    to each and δ' = δ/2, using the largest per-release ε (every release is then
    (ε_max, δ/(2T))-DP, as strong composition requires).
    """
    flat = [item for event, count in events for item in _flatten(event, count)]
    total = sum(count for _, count in flat)
    if total == 0:
        return {"basic": (0.0, 0.0), "strong": (0.0, 0.0)}
    basic = basic_composition(
        [(eps * c, dlt * c) for ev, c in flat for eps, dlt in [event_epsilon_delta(ev, delta / total)]]
    )
    per = [event_epsilon_delta(ev, delta / (2 * total)) for ev, _ in flat]
    eps_max = max(e for e, _ in per)
    dlt_max = max(d for _, d in per)
    strong = strong_composition(eps_max, dlt_max, total, delta / 2.0)
    return {"basic": basic, "strong": strong}
