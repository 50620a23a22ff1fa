"""FedAvg that accounts what its clients release and survives malformed replies.

Drop-in for :class:`flwr.serverapp.strategy.FedAvg` (same arguments, plus
``ledger``, ``ledger_path``, ``per_client_metrics`` and ``max_reply_bytes``).
Use it with the client mods of :mod:`client_mods` (local update noise, Laplace
inference protection, label DP, DP-SGD): each declares its releases in the
reply, and this strategy books them per node and publishes the ε spent in every
round's metrics. Label DP (randomized response) is defined under the
replace-one relation only: give ``ledger=PrivacyLedger(neighboring_relation="replace_one")``
(with the default add/remove ledger such declarations are rejected with an
error in the log). It adds no noise itself; the aggregate is FedAvg's weighted
mean of the accepted replies (post-processing of what the clients released).

What it checks and reports: see :mod:`.reply_screening` and
:mod:`.client_accounting`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..privacy import PrivacyLedger
from .client_accounting import ClientAccountingMixin
from .reply_screening import ArraySpec, array_spec, check_weight, screen_train_content


class AccountedFedAvg(ClientAccountingMixin, FedAvg):
    """FedAvg + reply screening + a ledger of the clients' declared releases.

    Args:
        *args, **kwargs: those of :class:`flwr.serverapp.strategy.FedAvg`.
        ledger: the ledger to book into (default: a new ``PrivacyLedger(1e-5)``).
        ledger_path: JSON file the ledger is restored from (if it exists) and saved
            to after every booking, so a restarted ServerApp loses nothing.
        per_client_metrics: also publish ``privacy/epsilon/node-<id>`` per node.
        max_reply_bytes: reject train replies whose arrays exceed this many bytes.
    """

    def __init__(
        self,
        *args: Any,
        ledger: Optional[PrivacyLedger] = None,
        ledger_path: Optional[str] = None,
        per_client_metrics: bool = False,
        max_reply_bytes: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._init_accounting(ledger, ledger_path, per_client_metrics, max_reply_bytes)
        self._spec: Optional[ArraySpec] = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's configuration; remembers the arrays' keys, shapes and sizes to screen replies."""
        self._spec = array_spec(arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Screen, book the declarations, then FedAvg over the accepted replies."""
        accepted, rejected = self.screen_and_book(
            server_round, replies,
            lambda content: screen_train_content(content, self._spec, self.weighted_by_key, self.max_reply_bytes),
        )
        arrays, metrics = super().aggregate_train(server_round, accepted) if accepted else (None, None)
        return arrays, self.round_metrics(metrics, rejected)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        """Screen, book the declarations (e.g. Laplace-protected inference results), then FedAvg's metrics."""
        accepted, rejected = self.screen_and_book(
            server_round, replies, lambda content: check_weight(content, self.weighted_by_key))
        metrics = super().aggregate_evaluate(server_round, accepted) if accepted else None
        return self.round_metrics(metrics, rejected)


__all__ = ["AccountedFedAvg"]
