"""DpEvents: what a mechanism released, in dp-accounting's vocabulary.

Native events come from :mod:`dp_accounting.dp_event` (Gaussian, Laplace,
DiscreteLaplace, RandomizedResponse, PoissonSampled, SelfComposed, Composed, …).
dp-accounting 0.6.0 (the newest on PyPI) has no event for the exponential
mechanism nor for a generic (ε, δ) release, so this module adds three, which
:mod:`flwr_dp_strategies.privacy.accountants` knows how to compose:

* :class:`ExponentialMechanismDpEvent` (ε): one draw of the exponential
  mechanism ``P[r] ∝ exp(ε·u(r)/(2Δu))``. It is ε-DP and ε-bounded-range
  (Durfee & Rogers 2019), hence ε²/8-zCDP (Cesar & Rogers 2021, Lemma 3.2).
  PLD accounting uses the pessimistic PLD of a pure (ε, 0) mechanism
  (``privacy_loss_distribution.from_privacy_parameters``: binary randomized
  response, which dominates every ε-DP mechanism); RDP accounting uses
  ``min(ε, α·ε²/8)``.
* :class:`PureDpEvent` (ε): any other ε-DP release (e.g. the SignDS encoder).
  PLD: (ε, 0) as above; RDP: ``min(ε, α·ε²/2)`` (Bun & Steinke 2016, Prop. 3.3).
* :class:`ApproxDpEvent` (ε, δ): a release known only to be (ε, δ)-DP (e.g. a
  shuffle-amplified output). PLD: the pessimistic (ε, δ) PLD; RDP cannot express
  δ > 0, so the RDP path adds these by basic composition (ε sums, δ sums).

:class:`~flwr_dp_strategies.privacy.skellam.SkellamDpEvent` (Δ₁, Δ₂, μ), defined
in :mod:`.skellam` with its RDP bound, is registered here for serialisation.

Events are serialised to plain JSON dicts (:func:`event_to_dict`) and restored
only into an allow-list of known classes (:func:`event_from_dict`), so a ledger
file cannot name arbitrary code.
"""

from __future__ import annotations

import json
from typing import Any

import attr
from dp_accounting import dp_event

from .skellam import SkellamDpEvent
from .validation import check_delta, check_epsilon


@attr.s(frozen=True)
class ExponentialMechanismDpEvent(dp_event.DpEvent):
    """One draw of the ε exponential mechanism (ε-DP, ε-bounded-range)."""

    epsilon: float = attr.ib()

    def __attrs_post_init__(self) -> None:
        check_epsilon(self.epsilon)


@attr.s(frozen=True)
class PureDpEvent(dp_event.DpEvent):
    """A release that is ε-DP and about which nothing finer is known."""

    epsilon: float = attr.ib()

    def __attrs_post_init__(self) -> None:
        check_epsilon(self.epsilon)


@attr.s(frozen=True)
class ApproxDpEvent(dp_event.DpEvent):
    """A release that is (ε, δ)-DP and about which nothing finer is known."""

    epsilon: float = attr.ib()
    delta: float = attr.ib()

    def __attrs_post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta)


MAX_EVENT_DEPTH = 32

_NATIVE = (
    dp_event.NoOpDpEvent,
    dp_event.NonPrivateDpEvent,
    dp_event.GaussianDpEvent,
    dp_event.LaplaceDpEvent,
    dp_event.DiscreteLaplaceDpEvent,
    dp_event.RandomizedResponseDpEvent,
    dp_event.SelfComposedDpEvent,
    dp_event.ComposedDpEvent,
    dp_event.PoissonSampledDpEvent,
    dp_event.SampledWithoutReplacementDpEvent,
    dp_event.SampledWithReplacementDpEvent,
    dp_event.ZCDpEvent,
)
EVENT_CLASSES: dict[str, type[dp_event.DpEvent]] = {
    cls.__name__: cls for cls in (*_NATIVE, ExponentialMechanismDpEvent, PureDpEvent, ApproxDpEvent, SkellamDpEvent)
}


def event_to_dict(event: dp_event.DpEvent) -> dict[str, Any]:
    """Serialise an event (recursively) to a JSON-compatible dict."""
    name = type(event).__name__
    if EVENT_CLASSES.get(name) is not type(event):
        raise ValueError(f"event type {name} is not supported by the ledger; known: {sorted(EVENT_CLASSES)}")
    out: dict[str, Any] = {"type": name}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dp_event.DpEvent):
            value = event_to_dict(value)
        elif isinstance(value, (list, tuple)):
            value = [event_to_dict(v) if isinstance(v, dp_event.DpEvent) else v for v in value]
        out[field.name] = value
    return out


def event_from_dict(data: dict[str, Any], _depth: int = 0) -> dp_event.DpEvent:
    """Inverse of :func:`event_to_dict`, restricted to :data:`EVENT_CLASSES`.

    Strict: the dict must name a known class and hold exactly that class's fields
    (a missing or unknown field is a ``ValueError``, not a silent default), and
    nesting deeper than :data:`MAX_EVENT_DEPTH` is refused. Parameter domains are
    checked by :func:`~flwr_dp_strategies.privacy.event_validation.validate_event`.
    """
    if _depth > MAX_EVENT_DEPTH:
        raise ValueError(f"event description nested deeper than {MAX_EVENT_DEPTH} levels")
    if not isinstance(data, dict) or data.get("type") not in EVENT_CLASSES:
        raise ValueError(f"not a known DpEvent description: {data!r:.200}")
    cls = EVENT_CLASSES[data["type"]]
    names = [field.name for field in attr.fields(cls)]
    unknown = set(data) - set(names) - {"type"}
    missing = set(names) - set(data)
    if unknown or missing:
        raise ValueError(
            f"{data['type']} description must hold exactly the fields {names}; "
            f"unknown {sorted(unknown)}, missing {sorted(missing)}"
        )
    kwargs = {}
    for name in names:
        value = data[name]
        if isinstance(value, dict):
            value = event_from_dict(value, _depth + 1)
        elif isinstance(value, list):
            value = [event_from_dict(v, _depth + 1) if isinstance(v, dict) else v for v in value]
        kwargs[name] = value
    return cls(**kwargs)


def event_key(event: dp_event.DpEvent) -> str:
    """A canonical string identifying an event (equal events → equal keys)."""
    return json.dumps(event_to_dict(event), sort_keys=True, separators=(",", ":"))
