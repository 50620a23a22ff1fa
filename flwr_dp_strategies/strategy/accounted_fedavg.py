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

A train reply that declares nothing is a non-private release of its update: it
is booked as ``NonPrivateDpEvent`` and that client's ε is reported as infinite,
never as 0 (a mechanism whose later replies are post-processing of an earlier
release declares ``NoOpDpEvent``, as the label-DP wrapper does). Evaluate
metrics are not accounted (as everywhere in this package).

What it checks and reports: see :mod:`.reply_screening` and
:mod:`.client_accounting`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..declarations import PRIVACY_RECORD
from ..privacy import PrivacyLedger
from .client_accounting import ClientAccountingMixin
from .reply_screening import ArraySpec, array_spec, check_weight, screen_train_content


NON_PRIVATE_LABEL = "update/undeclared (non-private)"


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
        replies = list(replies)
        undeclared = {id(r) for r in replies if not r.has_error() and PRIVACY_RECORD not in r.content.config_records}
        accepted, rejected = self.screen_and_book(
            server_round, replies,
            lambda content: screen_train_content(content, self._spec, self.weighted_by_key, self.max_reply_bytes),
        )
        self._book_non_private(server_round, [r for r in accepted if id(r) in undeclared])
        arrays, metrics = self.aggregate_accepted(server_round, accepted) if accepted else (None, None)
        return arrays, self.round_metrics(metrics, rejected)

    def aggregate_accepted(
        self, server_round: int, replies: list[Message]
    ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Aggregate the screened, booked replies (non-empty): FedAvg's weighted mean.

        The hook subclasses override to aggregate differently (layer shuffling,
        divergence-based selection); screening and booking stay in
        :meth:`aggregate_train`, so no subclass can skip them.
        """
        return FedAvg.aggregate_train(self, server_round, replies)

    def _book_non_private(self, server_round: int, replies: list[Message]) -> None:
        """A model update sent without any declared release is not DP: book it (ε = inf, never 0)."""
        for reply in replies:
            self.ledger.record(NonPrivateDpEvent(), server_round=server_round, client=reply.metadata.src_node_id,
                               label=NON_PRIVATE_LABEL)
        if replies:
            self.save_ledger()

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        """Screen, book the declarations (e.g. Laplace-protected inference results), then FedAvg's metrics."""
        accepted, rejected = self.screen_and_book(
            server_round, replies, lambda content: check_weight(content, self.weighted_by_key))
        metrics = super().aggregate_evaluate(server_round, accepted) if accepted else None
        return self.round_metrics(metrics, rejected)


__all__ = ["AccountedFedAvg"]
