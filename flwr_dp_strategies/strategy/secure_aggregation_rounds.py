"""The secure-aggregation part of a strategy: one SecAgg+ round inside Flower's own round loop.

Flower's ``Strategy.start`` owns the loop (configure_train → send → aggregate_train); a strategy
that mixes in :class:`SecureAggregationMixin` runs the extra protocol stages through the Grid it
is handed:

* :meth:`SecureAggregationMixin.open_secure_round` (from ``configure_train``): budget check, SecAgg+
  *setup* and *share-keys*, then the *collect* messages (FedAvg's train content + the protocol
  record + the strategy's public fields), remembered for the identity check;
* :meth:`SecureAggregationMixin.reveal_sum` (from ``aggregate_train``): one screening path
  (:meth:`ClientAccountingMixin.screen_and_book` with :meth:`check_secure_reply`), the masked
  vectors added, the *unmask* stage, the revealed sum mod 2^b, or None when the round aborts
  (nothing revealed, nothing to book).

The subclass calibrates (vector length, public fields, the DpEvent it will book) and decodes.
Every stage waits ``stage_timeout`` seconds, by default the ``timeout`` given to ``Strategy.start``
(which bounds the collect stage, Flower's own train round).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from logging import WARNING
from typing import Any, Optional

import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..privacy.validation import check_int, check_positive, check_probability
from ..secure_aggregation.protocol import MASKED_RECORD, RECORD, ProtocolError
from ..secure_aggregation.server_protocol import (PROTOCOL_REJECTION, SecureAggregationAborted,
                                                  SecureAggregationRound)
from .central_release import log_budget_stop, require_configured

UNMASKED_METRICS_LABEL = "reply carried un-noised records next to its masked vector (non-private)"
Sizes = tuple[int, int, int]


def fraction_or_count(name: str, value: int | float, minimum: int) -> int | float:
    """A count ≥ ``minimum`` (int) or a fraction in (0, 1] (float), validated."""
    if isinstance(value, float):
        return check_probability(name, value, low_open=True)
    return check_int(name, value, minimum=minimum)


def resolve_count(name: str, value: int | float, n: int) -> int:
    """An int as given, or a fraction of ``n`` rounded up (at least 1)."""
    if isinstance(value, float):
        return max(1, math.ceil(check_probability(name, value, low_open=True) * n))
    return check_int(name, value, minimum=1)


class SecureAggregationMixin:
    """SecAgg+ stages for a ``ClientAccountingMixin`` + FedAvg strategy (see the module docstring)."""

    num_shares: int | float
    reconstruction_threshold: int | float
    min_survivors: int | float
    stage_timeout: Optional[float]
    budget_exhausted: bool

    def _init_secure_aggregation(self, num_shares: int | float, reconstruction_threshold: int | float,
                                 min_survivors: int | float, stage_timeout: Optional[float]) -> None:
        self.num_shares = fraction_or_count("num_shares", num_shares, 2)
        self.reconstruction_threshold = fraction_or_count("reconstruction_threshold", reconstruction_threshold, 2)
        self.min_survivors = fraction_or_count("min_survivors", min_survivors, 1)
        self.stage_timeout = None if stage_timeout is None else check_positive("stage_timeout", stage_timeout)
        self._start_timeout: float = 3600.0  # Strategy.start's default, until start() says otherwise
        self._round: Optional[SecureAggregationRound] = None
        self._grid: Optional[Grid] = None
        self._protocol_rejected: Counter[str] = Counter()
        self.budget_exhausted = False

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              *args: Any, **kwargs: Any) -> Any:
        """Flower's ``Strategy.start``; its ``timeout`` also bounds the extra stages unless
        ``stage_timeout`` was given."""
        self._start_timeout = check_positive("timeout", timeout)
        return super().start(grid, initial_arrays, num_rounds, timeout, *args, **kwargs)  # type: ignore[misc]

    def protocol_sizes(self, n_sampled: int) -> Sizes:
        """(k, t, m): neighbourhood size, reconstruction threshold, minimum survivors for ``n_sampled`` nodes."""
        k = min(resolve_count("num_shares", self.num_shares, n_sampled), n_sampled)
        t = resolve_count("reconstruction_threshold", self.reconstruction_threshold, k)
        if not 2 <= t <= k:
            raise ValueError(f"reconstruction_threshold must give t in [2, num_shares={k}], got t={t}")
        m = min(max(resolve_count("min_survivors", self.min_survivors, n_sampled), t), n_sampled)
        return k, t, m

    def enough_nodes(self, server_round: int, planned: list[Message]) -> bool:
        """Secure aggregation needs two nodes or more (the round is skipped, with a WARNING, otherwise)."""
        if len(planned) >= 2:
            return True
        log(WARNING, "%s: round %d samples %d node(s); secure aggregation needs 2 or more, the round is skipped",
            type(self).__name__, server_round, len(planned))
        return False

    def begin_round(self, grid: Grid) -> None:
        """Forget the previous round's protocol state (first thing in ``configure_train``)."""
        self._round, self._grid, self._protocol_rejected = None, grid, Counter()

    def open_secure_round(self, server_round: int, grid: Grid, planned: list[Message], *, sizes: Sizes,
                          bits: int, length: int, event: dp_event.DpEvent,
                          public: dict[str, Any], replace_one_event: Optional[dp_event.DpEvent] = None
                          ) -> list[Message]:
        """Budget check for ``event`` (calibrated under add/remove; ``replace_one_event``: its tighter
        replace-one form, as it will be booked), setup and share-keys with the nodes of ``planned``, then their
        collect messages (their content + the protocol record + ``public``); [] if it cannot go on."""
        ledger = self.ledger  # type: ignore[attr-defined]
        tighter = replace_one_event is not None and ledger.neighboring_relation == "replace_one"
        if ledger.would_exceed(central_events=[replace_one_event if tighter else event],
                               neighboring_relation="replace_one" if tighter else "add_or_remove_one"):
            log_budget_stop(server_round, self.ledger)  # type: ignore[attr-defined]
            self.budget_exhausted = True
            return []
        k, t, m = sizes
        content = {int(msg.metadata.dst_node_id): msg.content for msg in planned}
        timeout = self.stage_timeout if self.stage_timeout is not None else self._start_timeout
        secure = SecureAggregationRound(server_round, content, num_shares=k, threshold=t, min_survivors=m,
                                        bits=bits, length=length, timeout=timeout)
        try:
            secure.setup(grid)
            secure.share_keys(grid)
        except SecureAggregationAborted as err:
            self._log_abort(err)
            self._protocol_rejected = secure.rejected
            return []
        self._round = secure
        messages = secure.collect_messages(lambda node: RecordDict(dict(content[node].items())), public)
        self.remember_instructions("train", server_round, messages)  # type: ignore[attr-defined]
        return messages

    def reveal_sum(self, server_round: int, replies: Iterable[Message]
                   ) -> tuple[Optional[np.ndarray], Optional[SecureAggregationRound], Counter[str]]:
        """(the revealed sum mod 2^b or None if the round aborted or never opened, the round, the
        rejection counts of every stage)."""
        require_configured(self)
        replies = list(replies)
        secure, self._round = self._round, None
        if secure is None:
            return None, None, self._protocol_rejected
        accepted, rejected = self.screen_and_book(  # type: ignore[attr-defined]
            server_round, replies, lambda content: self.check_secure_reply(secure, content), phase="train")
        self._book_unmasked_records(server_round, replies, accepted)
        for reply in accepted:
            secure.add_vector(int(reply.metadata.src_node_id), secure.masked_vector(reply.content))
        try:
            total = secure.unmask(self._grid)
        except SecureAggregationAborted as err:
            self._log_abort(err)
            return None, secure, rejected + secure.rejected
        rejected.update(secure.rejected)  # the other stages' dropouts and malformed replies
        return total, secure, rejected

    @staticmethod
    def check_secure_reply(secure: SecureAggregationRound, content: RecordDict) -> Optional[str]:
        """A reason to reject a collect reply: anything but the protocol and masked records
        (``structure``), or a masked vector that does not parse (``secure-aggregation``)."""
        if set(content.keys()) != {RECORD, MASKED_RECORD}:
            return "structure"
        try:
            secure.masked_vector(content)
        except ProtocolError:
            return PROTOCOL_REJECTION
        return None

    def _book_unmasked_records(self, server_round: int, replies: list[Message], accepted: list[Message]) -> None:
        """A reply that carried more than the protocol's records released them un-noised: book it."""
        kept = {id(r) for r in accepted}
        for reply in replies:
            if reply.has_error() or id(reply) in kept:
                continue
            if not set(reply.content.keys()) <= {RECORD, MASKED_RECORD}:
                self.ledger.record(NonPrivateDpEvent(), server_round=server_round,  # type: ignore[attr-defined]
                                   client=int(reply.metadata.src_node_id), label=UNMASKED_METRICS_LABEL)

    @staticmethod
    def survivor_metrics(secure: SecureAggregationRound) -> dict[str, float]:
        """``secagg/survivors`` (|U_3|) and ``secagg/dropped`` (sampled − survivors)."""
        return {"secagg/survivors": float(len(secure.survivors)),
                "secagg/dropped": float(len(secure.sampled) - len(secure.survivors))}

    def _log_abort(self, err: Exception) -> None:
        log(WARNING, "%s: secure aggregation aborted (%s); nothing revealed, nothing booked",
            type(self).__name__, err)


__all__ = ["SecureAggregationMixin", "UNMASKED_METRICS_LABEL", "fraction_or_count", "resolve_count"]
