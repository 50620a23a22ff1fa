r"""The contract of an event this package adds to dp-accounting's: it carries its own rules.

dp-accounting's native events (Gaussian, Laplace, sampled, composed, …) are composed by its accountants.
An event it does not know (the exponential mechanism, a pure or approximate (ε, δ) release, Skellam noise)
subclasses :class:`CustomDpEvent` and states, in one place, everything the ledger needs:

=========================== ====================================================================
rule                        used by
=========================== ====================================================================
``FIELDS``                  :func:`~.event_validation.validate_event`: each field's real domain
``AMPLIFIABLE``             :func:`~.event_validation.validate_event`: False refuses the event
                            inside a sampled event (no amplification bound derived for it)
``rdp(orders)``             :class:`~.accountants.LedgerRdpAccountant`: the RDP curve, or None
``approx_dp()``             :class:`~.accountants.LedgerRdpAccountant`: an (ε, δ) composed
                            basically beside the RDP curve (RDP cannot express δ > 0), or None
``pld(interval)``           :class:`~.accountants.LedgerPldAccountant`: a pessimistic PLD, or None
                            (unknown to PLD: its ε is ∞ there and the ledger's ``"best"`` takes RDP)
``pure_epsilon()``          :func:`~.accountants.basic_pure_epsilon`: ε of a pure ε-DP event, or None
``replace_one()``           :func:`~.relations.convert_event`: the event, declared under
                            add/remove-one, as one sound under replace-one
``textbook(delta)``         :func:`~.bounds.event_epsilon_delta`: a textbook (ε, δ), or None
=========================== ====================================================================

Every subclass is registered by name (:data:`CUSTOM_EVENTS`) for serialisation
(:func:`~.events.event_from_dict` restores only registered and native classes). An event with
neither an RDP curve nor an (ε, δ) cannot be composed by the RDP accountant and is refused there.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Optional

import numpy as np
from dp_accounting import dp_event

#: Every :class:`CustomDpEvent` subclass, by class name.
CUSTOM_EVENTS: dict[str, type["CustomDpEvent"]] = {}


def real(low: float = 0.0, *, low_open: bool = True, high: float = math.inf, high_open: bool = True) -> dict:
    """The domain of a real field for ``FIELDS``: (low, high), a side closed with ``*_open=False``."""
    return {"low": float(low), "low_open": bool(low_open), "high": float(high), "high_open": bool(high_open)}


class CustomDpEvent(dp_event.DpEvent):
    """An event with its own validation, accounting, relation and serialisation rules (module docstring)."""

    FIELDS: ClassVar[dict[str, dict[str, Any]]] = {}
    AMPLIFIABLE: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__name__.startswith("_"):  # a private base that shares rules is not an event of its own
            return
        known = CUSTOM_EVENTS.get(cls.__name__)
        if known is not None and known.__module__ != cls.__module__:
            raise TypeError(f"a custom DpEvent named {cls.__name__} is already registered (from {known.__module__})")
        CUSTOM_EVENTS[cls.__name__] = cls

    def rdp(self, orders: np.ndarray) -> Optional[np.ndarray]:
        """RDP ε(α) at each order (one release), or None."""
        return None

    def approx_dp(self) -> Optional[tuple[float, float]]:
        """(ε, δ) to compose basically beside the RDP curve, or None."""
        return None

    def pld(self, value_discretization_interval: float) -> Any:
        """A pessimistic ``PrivacyLossDistribution`` of one release, or None (unknown to PLD)."""
        return None

    def pure_epsilon(self) -> Optional[float]:
        """ε when the release is pure ε-DP, else None."""
        return None

    def replace_one(self) -> dp_event.DpEvent:
        """This event (declared under add/remove-one) as one sound under replace-one."""
        raise ValueError(f"{type(self).__name__} declared under 'add_or_remove_one' has no conversion to 'replace_one'")

    def textbook(self, delta: float) -> Optional[tuple[float, float]]:
        """A textbook (ε, δ) of one release, or None."""
        return None


__all__ = ["CUSTOM_EVENTS", "CustomDpEvent", "real"]
