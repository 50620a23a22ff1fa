"""The unit of privacy of a booked release: one record of a client, or everything one client holds.

A DP event's neighbouring relation says *how* two inputs differ (one element added, removed or
replaced); its unit says *what* that element is:

* ``"client"`` (the default, and the meaning of every booking made before units existed): the
  element is one client's whole data. Central mechanisms (noise on the sum of clipped updates),
  local DP on a client's whole update (``LocalUpdateNoiseMod``, SignDS) and LDP on an inference
  result protect this unit.
* ``"record"``: the element is one record (one training example, one label) of one client.
  DP-SGD (per-example clipping), the functional mechanism, covariance with per-row clipping and
  randomized response on labels protect this unit; they bound nothing about a client's data as a
  whole (a client has many records).

A central event (booked for the federation, ``client=None``) is client-level by default (noise on the sum of
clipped updates: one client's whole update added or removed). It is record-level when its sensitivity is that of
one record of any client (the Skellam sum of the clients' exact functional-mechanism coefficients under secure
aggregation, ``SecureObjectiveSum``). How each unit's figure composes them (``PrivacyLedger.record_level_report``,
``client_level_report``):

* record level: a client's own record-level events, every central record-level event (computed from every
  client's data, and the only bound of that release: it is no post-processing of a client's record-level
  release), and a central client-level event only if non-private (otherwise it is post-processing of the replies,
  which the clients' record-level events bound);
* client level: a client's own client-level events and the central client-level events; a central record-level
  event bounds nothing about a client's whole data (a client holds many records), so while the ledger holds one
  the client-level ε of every client is ∞.
"""

from __future__ import annotations

from typing import Optional

RECORD = "record"
CLIENT = "client"
UNITS = (RECORD, CLIENT)


def check_unit(unit: Optional[object], name: str = "unit") -> str:
    """``unit`` if it is ``"record"`` or ``"client"``; ``ValueError`` otherwise (None included)."""
    if not isinstance(unit, str) or unit not in UNITS:
        raise ValueError(f"{name} must be one of {UNITS}, got {unit!r}")
    return unit


__all__ = ["CLIENT", "RECORD", "UNITS", "check_unit"]
