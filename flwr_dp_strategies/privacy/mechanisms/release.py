"""The value a mechanism returns: its output plus what it released."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from dp_accounting import dp_event

T = TypeVar("T")


@dataclass(frozen=True)
class Release(Generic[T]):
    """Output of a mechanism and the DpEvent that describes its privacy cost.

    ``event`` describes the release for *one unit of privacy* (one record, or
    one client's whole contribution, depending on what the caller's
    neighbouring relation protects): record it in a
    :class:`~flwr_dp_strategies.privacy.accounting.ledger.PrivacyLedger` for that unit.
    """

    value: T
    event: dp_event.DpEvent
