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

Only a client's own releases can have the unit ``"record"``: a central event is the federation's,
booked for every client at once, and is always client-level.
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
