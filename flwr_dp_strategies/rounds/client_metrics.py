r"""The clients' evaluate metrics, released accounted: each one a noised bounded mean booked in the ledger.

Flower's strategies publish the weighted mean of the metrics the clients' evaluate replies carry (accuracy,
loss): a statistic of the clients' data, un-noised. Every private strategy of this package instead releases,
by default, per metric ``key`` the user declared a range ``[lower, upper]`` for,

.. math:: \text{dp-eval/key} = \ell + \frac1m\Big(\sum_{i} \big(\operatorname{clip}(v_i, \ell, u) - \ell\big)
          + \mathcal N\!\big(0, (z\,(u - \ell))^2\big)\Big)

(:func:`~flwr_dp_strategies.privacy.mechanisms.gaussian.bounded_mean`): m = the number of nodes the round's
``configure_evaluate`` asked (chosen by the server before any reply, never the number of replies),
uniform weights (a client-reported example count would make the sensitivity data dependent) and z =
``noise_multiplier``. Each metric is its own ``GaussianDpEvent(z)``, booked in the strategy's ledger as a
central event (every client's) under its relation (the same event under ``add_or_remove_one`` and
``replace_one``: the bounded_mean docstring), so the ``privacy/epsilon`` published with the round's
evaluate metrics includes them. A reply without a declared key, or with a value that is not a finite
number, contributes ℓ (nothing to the shifted sum): it cannot change the sensitivity.

Undeclared metrics are withheld (their names are logged once, on the server) and so is the weight key:
with ``AccountedMetrics()`` (the default) a round's evaluate metrics hold the ledger's figures only.
``evaluate_metrics="flower"`` asks, by name, for Flower's weighted mean instead (every key, the weight key's
value as the weight): it is published under the clients' own key names and every such round is booked as
``NonPrivateDpEvent`` (ε = ∞), the truth about publishing it, unless every reply in it declared its own
release (a client mod noised it, booked per client: the mean is then post-processing).

Trust: the noise is added by the server, so it protects the clients against whoever reads the round's
metrics (Flower's ``Result``, logs, dashboards), not against the server, which sees the raw values (a client
that distrusts the server must not put its data in an evaluate reply un-noised).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO
from typing import Any, Optional, Union

import numpy as np
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import MetricRecord, RecordDict
from flwr.common.logger import log

from ..privacy.mechanisms.gaussian import bounded_mean
from ..privacy.validation import check_positive
from .client_accounting import Booking
from .metrics import MetricsAggregation, aggregate_reply_metrics
from .reply_screening import records_of

FLOWER = "flower"
PREFIX = "dp-eval/"
FLOWER_LABEL = "client evaluate metrics (Flower's mean, published un-noised: non-private)"


def metric_label(key: str, lower: float, upper: float) -> str:
    """The ledger label of one accounted evaluate metric."""
    return f"evaluate metric {key!r} (bounded mean in [{lower:g}, {upper:g}])"


@dataclass(frozen=True)
class AccountedMetrics:
    """Which client evaluate metrics are released, and how noised (module docstring).

    Args:
        ranges: ``{key: (lower, upper)}``, each a finite range declared before the run (e.g.
            ``{"accuracy": (0.0, 1.0), "loss": (0.0, 5.0)}``); values are clipped to it. Keys not listed are
            withheld.
        noise_multiplier: z in (0, inf), required when ``ranges`` is not empty: each released metric's noise
            std is z·(upper − lower)/m.
    """

    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    noise_multiplier: Optional[float] = None

    def __post_init__(self) -> None:
        if not isinstance(self.ranges, Mapping):
            raise TypeError(f"ranges must be a mapping {{key: (lower, upper)}}, got {type(self.ranges).__name__}")
        checked: dict[str, tuple[float, float]] = {}
        for key, bounds in self.ranges.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"ranges keys must be non-empty metric names (str), got {key!r}")
            if (
                not isinstance(bounds, Sequence)
                or isinstance(bounds, str)
                or len(bounds) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
            ):
                raise TypeError(f"ranges[{key!r}] must be a (lower, upper) pair of numbers, got {bounds!r}")
            lower, upper = float(bounds[0]), float(bounds[1])
            if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
                raise ValueError(f"ranges[{key!r}] must be finite with lower < upper, got {bounds!r}")
            checked[key] = (lower, upper)
        object.__setattr__(self, "ranges", checked)
        if checked:
            if self.noise_multiplier is None:
                raise ValueError("noise_multiplier must be given (a z in (0, inf)) when ranges are declared")
            object.__setattr__(self, "noise_multiplier", check_positive("noise_multiplier", self.noise_multiplier))
        elif self.noise_multiplier is not None:
            check_positive("noise_multiplier", self.noise_multiplier)


EvaluateMetrics = Union[AccountedMetrics, str]


def check_evaluate_metrics(value: object) -> EvaluateMetrics:
    """``evaluate_metrics``: an :class:`AccountedMetrics` or the name ``"flower"``; TypeError/ValueError naming it."""
    if isinstance(value, AccountedMetrics):
        return value
    if isinstance(value, str):
        if value != FLOWER:
            raise ValueError(f"evaluate_metrics must be an AccountedMetrics or {FLOWER!r}, got {value!r}")
        return value
    raise TypeError(f"evaluate_metrics must be an AccountedMetrics or {FLOWER!r}, got {type(value).__name__}")


def _value(content: RecordDict, key: str) -> Optional[float]:
    """The first finite scalar ``key`` holds in the reply's metric records (None: absent or not one)."""
    for record in records_of(content, MetricRecord):
        if key in record:
            value = record[key]
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
                return float(value)
            return None
    return None


def release_evaluate_metrics(
    policy: EvaluateMetrics,
    contents: Sequence[RecordDict],
    *,
    denominator: int,
    weighted_by_key: str,
    aggregation: Optional[MetricsAggregation],
    generator: np.random.Generator,
    withheld_logged: set[str],
    all_declared: bool = False,
) -> tuple[MetricRecord, list[Booking]]:
    """The round's published evaluate metrics and their bookings (module docstring); ``withheld_logged``: the
    keys already logged as withheld (the caller keeps it across rounds, so each is logged once);
    ``all_declared``: every content declared its own release (a client-side mechanism, booked per client by
    screening), so Flower's mean of them is post-processing and ``"flower"`` books nothing more."""
    if policy == FLOWER:
        if not contents:
            return MetricRecord(), []
        metrics = aggregate_reply_metrics(aggregation, list(contents), weighted_by_key)
        return metrics, [] if all_declared else [Booking(NonPrivateDpEvent(), FLOWER_LABEL)]
    assert isinstance(policy, AccountedMetrics)
    sent = {key for content in contents for record in records_of(content, MetricRecord) for key in record}
    withheld = sorted(sent - set(policy.ranges) - withheld_logged)
    if withheld:
        withheld_logged.update(withheld)
        log(
            INFO,
            "Evaluate metrics withheld (no declared range: evaluate_metrics=AccountedMetrics(ranges=...) releases "
            "them noised and booked, evaluate_metrics='flower' un-noised and non-private): %s",
            ", ".join(withheld),
        )
    if denominator < 1:
        return MetricRecord(), []
    z = policy.noise_multiplier
    assert z is not None or not policy.ranges  # AccountedMetrics requires it with ranges
    metrics: dict[str, Any] = {}
    bookings: list[Booking] = []
    for key, (lower, upper) in policy.ranges.items():
        values = [v for v in (_value(content, key) for content in contents) if v is not None]
        release = bounded_mean(
            np.asarray(values, dtype=np.float64),
            lower=lower,
            upper=upper,
            denominator=denominator,
            noise_multiplier=float(z or 0.0),
            rng=generator,
        )
        metrics[PREFIX + key] = float(release.value)
        bookings.append(Booking(release.event, metric_label(key, lower, upper)))
    return MetricRecord(metrics), bookings


__all__ = [
    "AccountedMetrics",
    "EvaluateMetrics",
    "FLOWER",
    "FLOWER_LABEL",
    "PREFIX",
    "check_evaluate_metrics",
    "metric_label",
    "release_evaluate_metrics",
]
