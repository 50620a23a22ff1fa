"""DpEvents: what a mechanism released, in dp-accounting's vocabulary.

Native events come from :mod:`dp_accounting.dp_event` (Gaussian, Laplace,
DiscreteLaplace, RandomizedResponse, PoissonSampled, SelfComposed, Composed, …).
dp-accounting 0.6.0 (the newest on PyPI) has no event for the exponential
mechanism nor for a generic (ε, δ) release, so this module adds three, which
:mod:`flwr_dp_strategies.privacy.accounting.accountants` knows how to compose:

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

:class:`~flwr_dp_strategies.privacy.mechanisms.skellam.SkellamDpEvent` (Δ₁, Δ₂, μ), defined
in :mod:`.skellam` with its RDP bound, is registered here for serialisation.

Events are serialised to plain JSON dicts (:func:`event_to_dict`) and restored
only into an allow-list of known classes (:func:`event_from_dict`), so a ledger
file cannot name arbitrary code.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

import attr
import numpy as np
from dp_accounting import dp_event

from .custom_events import CUSTOM_EVENTS, CustomDpEvent, real
from ..validation import check_delta, check_epsilon


def _pure_pld(epsilon: float, delta: float, interval: float) -> Any:
    """The pessimistic PLD of an (ε, δ) mechanism (binary randomized response, mass δ at +∞)."""
    from dp_accounting.pld import common as pld_common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    return pld_lib.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(epsilon, delta), interval)


@attr.s(frozen=True)
class _PureEpsilonEvent(CustomDpEvent):
    """The rules the pure ε-DP events share: ε in (0, ∞); RDP ``min(ε, α ε² · RDP_FACTOR)``; PLD of (ε, 0); pure
    ε; replace-one: the same event at 2ε (group privacy of size 2); textbook (ε, 0). Not registered itself."""

    FIELDS: ClassVar[dict] = {"epsilon": real(0.0)}
    RDP_FACTOR: ClassVar[float]
    epsilon: float = attr.ib()

    def __attrs_post_init__(self) -> None:
        check_epsilon(self.epsilon)

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        eps = float(self.epsilon)
        return np.minimum(eps, np.asarray(orders) * eps * eps * self.RDP_FACTOR)

    def pld(self, value_discretization_interval: float) -> Any:
        return _pure_pld(float(self.epsilon), 0.0, value_discretization_interval)

    def pure_epsilon(self) -> float:
        return float(self.epsilon)

    def replace_one(self) -> dp_event.DpEvent:
        return type(self)(2.0 * float(self.epsilon))

    def textbook(self, delta: float) -> tuple[float, float]:
        return float(self.epsilon), 0.0


@attr.s(frozen=True)
class ExponentialMechanismDpEvent(_PureEpsilonEvent):
    """One draw of the ε exponential mechanism (ε-DP, ε-bounded-range).

    RDP ``min(ε, α ε²/8)`` (ε-bounded range ⇒ ε²/8-zCDP, Cesar & Rogers 2021); PLD of (ε, 0); replace-one: 2ε
    (group privacy of size 2)."""

    RDP_FACTOR: ClassVar[float] = 1.0 / 8.0


@attr.s(frozen=True)
class PureDpEvent(_PureEpsilonEvent):
    """A release that is ε-DP and about which nothing finer is known.

    RDP ``min(ε, α ε²/2)`` (ε-DP ⇒ ε²/2-zCDP, Bun & Steinke 2016, Prop. 3.3); PLD of (ε, 0); replace-one: 2ε."""

    RDP_FACTOR: ClassVar[float] = 1.0 / 2.0


@attr.s(frozen=True)
class ApproxDpEvent(CustomDpEvent):
    """A release that is (ε, δ)-DP and about which nothing finer is known.

    RDP cannot express δ > 0: composed basically beside the curve (ε sums, δ sums); PLD: the pessimistic
    (ε, δ) PLD; replace-one: (2ε, (1 + e^ε)δ) by group privacy (Vadhan 2017, Lemma 2.2), non-private when
    that δ reaches 1."""

    FIELDS: ClassVar[dict] = {"epsilon": real(0.0), "delta": real(0.0, high=1.0)}
    epsilon: float = attr.ib()
    delta: float = attr.ib()

    def __attrs_post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta)

    def approx_dp(self) -> tuple[float, float]:
        return float(self.epsilon), float(self.delta)

    def pld(self, value_discretization_interval: float) -> Any:
        return _pure_pld(float(self.epsilon), float(self.delta), value_discretization_interval)

    def replace_one(self) -> dp_event.DpEvent:
        eps, delta = float(self.epsilon), float(self.delta)
        group_delta = (1.0 + math.exp(eps)) * delta if eps < 700 else math.inf
        return ApproxDpEvent(2.0 * eps, group_delta) if group_delta < 1.0 else dp_event.NonPrivateDpEvent()

    def textbook(self, delta: float) -> tuple[float, float]:
        return float(self.epsilon), float(self.delta)


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
_NATIVE_CLASSES: dict[str, type[dp_event.DpEvent]] = {cls.__name__: cls for cls in _NATIVE}


def event_classes() -> dict[str, type[dp_event.DpEvent]]:
    """Every class a serialised event may name: dp-accounting's native events and each registered
    :class:`~.custom_events.CustomDpEvent`."""
    # SkellamDpEvent lives with its mechanism and registers itself on import; importing it here, at call time,
    # keeps accounting -> mechanisms out of the import graph (mechanisms import accounting)
    from ..mechanisms import skellam  # noqa: F401

    return {**_NATIVE_CLASSES, **CUSTOM_EVENTS}


def event_to_dict(event: dp_event.DpEvent) -> dict[str, Any]:
    """Serialise an event (recursively) to a JSON-compatible dict."""
    name = type(event).__name__
    known = event_classes()
    if known.get(name) is not type(event):
        raise ValueError(f"event type {name} is not supported by the ledger; known: {sorted(known)}")
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
    """Inverse of :func:`event_to_dict`, restricted to :func:`event_classes`.

    Strict: the dict must name a known class and hold exactly that class's fields
    (a missing or unknown field is a ``ValueError``, not a silent default), and
    nesting deeper than :data:`MAX_EVENT_DEPTH` is refused. Parameter domains are
    checked by :func:`~flwr_dp_strategies.privacy.accounting.event_validation.validate_event`.
    """
    if _depth > MAX_EVENT_DEPTH:
        raise ValueError(f"event description nested deeper than {MAX_EVENT_DEPTH} levels")
    known = event_classes()
    if not isinstance(data, dict) or data.get("type") not in known:
        raise ValueError(f"not a known DpEvent description: {data!r:.200}")
    cls = known[data["type"]]
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
