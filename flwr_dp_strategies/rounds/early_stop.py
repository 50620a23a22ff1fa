r"""Stopping a run early without a hidden release: the budget stop and the accounted early stop.

A decision to stop that reads the clients' metrics is a release about their data (it is visible: the run
ends). :meth:`~.template.AccountedRound.start` therefore stops a run in three ways only:

* **the budget stop** (free): after a round, when the ledger says the next round would exceed its
  ``max_epsilon`` (the strategy's :meth:`~.template.AccountedRound.budget_spent`). It reads the ledger and the
  configuration only, both already public, so it costs nothing;
* **the accounted early stop**, :class:`AccountedEarlyStop` given as ``should_stop``: a client evaluate
  metric read through AboveThreshold (:class:`~flwr_dp_strategies.privacy.mechanisms.sparse_vector.AboveThreshold`,
  Dwork & Roth §3.6; Lyu et al. 2017), booked once per stopping chain as ``PureDpEvent(ε)``;
* **the user's own** ``should_stop(round, result)``, which is shown only the round metrics that are public,
  ledger figures or accounted (:mod:`.published_keys`); any other key (a client's own metric published by
  name, ``evaluate_metrics="flower"``) is hidden from it, with a warning naming the keys once.

The accounted early stop's query. Round i's evaluate replies carry a value :math:`v_j` of ``metric``; with
[ℓ, u] its declared range, :math:`m_i` the nodes the round asked (public) and T the threshold, "the mean
has reached T" is :math:`S_i = \sum_j (\operatorname{clip}(v_j, \ell, u) - \ell) \ge (T - \ell)\, m_i`.
The query is :math:`q_i = (S_i - (T - \ell) m_i)/(u - \ell)` (``direction="above"``) or its negation
(``"below"``, e.g. a loss), tested against 0: :math:`S_i` moves by at most u − ℓ when one client is added,
removed or replaced, so every :math:`q_i` has sensitivity 1 under either relation and the chain is one
ε-DP AboveThreshold with Δ = 1, booked in the strategy's ledger (as a central event, every client's) when
its first query is answered. The noise is in units of clients: Lap(4/ε) clients' worth on each query.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np
from flwr.app import MetricRecord, RecordDict

from ..privacy.rng import RngLike
from ..privacy.mechanisms.sparse_vector import AboveThreshold
from ..privacy.validation import check_epsilon
from .client_accounting import Booking
from .reply_screening import records_of

DIRECTIONS = ("above", "below")
LABEL = "accounted early stop (AboveThreshold)"


class AccountedEarlyStop:
    """Stop once a client evaluate metric's mean crosses ``threshold``, read through AboveThreshold (module docstring).

    Give it as ``strategy.start(..., should_stop=AccountedEarlyStop(...))``.

    Args:
        metric: the key the clients' evaluate replies carry (e.g. ``"accuracy"``).
        lower, upper: its declared range (finite, lower < upper); values are clipped to it.
        threshold: T, in [lower, upper].
        epsilon: ε of the whole stopping chain, booked once.
        direction: ``"above"`` (stop when the mean reaches T from below: an accuracy) or ``"below"`` (a loss).
        rng: None (OS entropy); a seed or Generator in tests only.
    """

    def __init__(
        self,
        metric: str,
        *,
        lower: float,
        upper: float,
        threshold: float,
        epsilon: float,
        direction: str = "above",
        rng: RngLike = None,
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise TypeError(f"metric must be a non-empty metric name (str), got {metric!r}")
        bounds = []
        for name, value in (("lower", lower), ("upper", upper), ("threshold", threshold)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            bounds.append(float(value))
        self.lower, self.upper, self.threshold = bounds
        if not self.lower < self.upper:
            raise ValueError(f"lower must be < upper, got lower={lower!r}, upper={upper!r}")
        if not self.lower <= self.threshold <= self.upper:
            raise ValueError(f"threshold must be in [lower, upper], got {threshold!r}")
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        self.metric, self.direction = metric, direction
        self.epsilon = check_epsilon(epsilon, "epsilon")
        self.chain = AboveThreshold(0.0, epsilon=self.epsilon, sensitivity=1.0, rng=rng)

    @property
    def halted(self) -> bool:
        return self.chain.halted

    def query_value(self, contents: Sequence[RecordDict], denominator: int) -> float:
        """:math:`q_i` of the module docstring (not released: only whether the chain halts is)."""
        total = 0.0
        for content in contents:
            for record in records_of(content, MetricRecord):
                if self.metric in record:
                    value = record[self.metric]
                    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                        total += float(np.clip(float(value), self.lower, self.upper)) - self.lower
                    break
        margin = (total - (self.threshold - self.lower) * denominator) / (self.upper - self.lower)
        return margin if self.direction == "above" else -margin

    def observe(self, contents: Sequence[RecordDict], denominator: int) -> list[Booking]:
        """Answer this round's query (nothing once halted, or when no node was asked); the chain's booking the first
        time a query is answered."""
        if self.halted or denominator < 1:
            return []
        first = self.chain.answered == 0
        self.chain.query(self.query_value(contents, denominator))
        return (
            [Booking(self.chain.event, f"{LABEL}: {self.metric} {self.direction} {self.threshold:g}")] if first else []
        )

    def __repr__(self) -> str:
        return (
            f"AccountedEarlyStop({self.metric!r}, [{self.lower:g}, {self.upper:g}], {self.direction} "
            f"{self.threshold:g}, epsilon={self.epsilon:g})"
        )


def stop_reason(stop: Optional[AccountedEarlyStop]) -> Optional[str]:
    """The log line's reason when ``stop`` halted (None otherwise)."""
    if stop is None or not stop.halted:
        return None
    return (
        f"{stop.metric} {stop.direction} {stop.threshold:g} (AboveThreshold, epsilon={stop.epsilon:g} booked once "
        f"for the chain of {stop.chain.answered} queries)"
    )


__all__ = ["AccountedEarlyStop", "DIRECTIONS", "LABEL", "stop_reason"]
