"""The two guarantees of this example, read apart from the one ledger the strategy keeps.

The strategy (``AccountedPoissonFixedClipping``) books, in one :class:`~flwr_dp_strategies.privacy.PrivacyLedger`,
the central release of every round (``PoissonSampled(q, Gaussian(z_c))``, for the federation: client level,
neighbours differ by one whole client) and each reply's declared DP-SGD event under its node
(``SelfComposed(PoissonSampled(q_r, Gaussian(z_r)), steps)``: record level, neighbours differ by one training
example of that client). Its ``privacy/epsilon`` (and ``privacy/epsilon/node-<id>``) is the composition of both
for a node: an upper bound on either loss, loose for each, and of no single unit. The ledger cannot report the
two separately (both relations are ``add_or_remove_one``; nothing tags the unit), so :func:`privacy_split`
recomputes each from the ledger's own events, with the same accountants and δ:

* ``client_level``: the central events alone. Adding or removing one client changes the released models by
  at most what this bounds, for anyone who sees only the released global models; the server, which sees
  every update before the noise, is trusted for this guarantee.
* ``record_level``: each node's own DP-SGD events alone (the worst node, and per node). This holds against
  the server too: everything a client sends is its DP-SGD output, and the central release is post-processing
  of those outputs, so it adds nothing to the record-level loss.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from flwr_dp_strategies.privacy import PrivacyLedger

PUBLISHED_KEYS = {
    "client_level": "privacy/epsilon-client-level",
    "record_level": "privacy/epsilon-record-level",
}


def _finite(value: float) -> Optional[float]:
    return float(value) if math.isfinite(value) else None


def privacy_split(ledger: PrivacyLedger) -> dict[str, Any]:
    """Client-level ε (central events only), record-level ε (each node's own events only), and the ledger's
    combined ε, all at the ledger's δ; None stands for ε = ∞ (JSON has no infinity)."""
    central = PrivacyLedger(ledger.target_delta, neighboring_relation=ledger.neighboring_relation)
    for server_round, event, label in ledger.events():
        central.record(event, server_round=server_round, label=label)
    records = PrivacyLedger(ledger.target_delta, neighboring_relation=ledger.neighboring_relation)
    for node in ledger.clients:
        for server_round, event, label in ledger.events(node):
            records.record(event, server_round=server_round, client=node, label=label)
    return {
        "delta": ledger.target_delta,
        "client_level": _finite(central.epsilon()) if central.rounds() else 0.0,
        "record_level": _finite(records.epsilon()) if records.clients else 0.0,
        "record_level_per_node": {node: _finite(records.epsilon(node)) for node in records.clients},
        "combined": _finite(ledger.epsilon()),
        "central_releases": len(ledger.events()),
        "dp_sgd_releases": sum(len(ledger.events(node)) for node in ledger.clients),
    }


def published(split: dict[str, Any]) -> dict[str, float]:
    """The two figures as round metrics (``inf`` where ε is unbounded)."""
    return {key: float("inf") if split[name] is None else float(split[name]) for name, key in PUBLISHED_KEYS.items()}
