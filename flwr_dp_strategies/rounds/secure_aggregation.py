"""The secure-aggregation part of a strategy: one SecAgg+ round inside Flower's own round loop.

Flower's ``Strategy.start`` owns the loop (configure_train → send → aggregate_train); a strategy
that mixes in :class:`SecureAggregationMixin` runs the extra protocol stages through the Grid it
is handed:

* :meth:`SecureAggregationMixin.open_secure_round` (from ``configure_train``): budget check, SecAgg+
  *setup* and *share-keys*, then the *collect* messages (FedAvg's train content + the protocol
  record + the strategy's public fields), remembered for the identity check;
* the accounted round (:class:`~flwr_dp_strategies.rounds.template.AccountedRound`) of
  ``aggregate_train``: :meth:`SecureAggregationMixin.skip_train` (no protocol round was opened
  and no stage rejected anyone), the screening with :meth:`SecureAggregationMixin.train_check`
  (:meth:`check_secure_reply` against the open round), then the template's collect stage,
  :meth:`SecureAggregationMixin.collect_train` (:meth:`~SecureAggregationMixin.reveal_sum`): the
  masked vectors added, the *unmask* stage, the revealed sum mod 2^b, or None when the round aborts (nothing revealed; only
  the un-noised records some replies carried are booked, :meth:`SecureAggregationMixin.unmasked_bookings`).

The subclass calibrates (vector length, public fields, the DpEvent it will book) for
:attr:`ProtocolSizes.honest` = m − c noise shares and decodes. :meth:`SecureAggregationMixin.plan_sizes`
derives the protocol's sizes from the cohort, the colluders to resist, the dropout rate and the
failure probability (:func:`~flwr_dp_strategies.secure_aggregation.protocol.choose_num_shares`,
:func:`~flwr_dp_strategies.secure_aggregation.protocol.min_threshold`), and skips a round whose
sizes cannot meet them, with a WARNING.
Every stage waits ``stage_timeout`` seconds, by default the ``timeout`` given to ``Strategy.start``
(which bounds the collect stage, Flower's own train round).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from logging import WARNING
from typing import Any, Optional

import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..privacy.validation import check_int, check_positive, check_probability
from ..secure_aggregation.protocol import (
    MASKED_RECORD,
    RECORD,
    ProtocolError,
    choose_num_shares,
    min_threshold,
    neighbourhood_size,
)
from ..secure_aggregation.server_protocol import PROTOCOL_REJECTION, SecureAggregationAborted, SecureAggregationRound
from .central_release import log_budget_stop, require_configured
from .client_accounting import ContentCheck
from .template import AccountedRound, Booking, Collected, Screened

UNMASKED_METRICS_LABEL = "reply carried un-noised records next to its masked vector (non-private)"


@dataclass(frozen=True)
class ProtocolSizes:
    """The sizes of one secure round: ring parameter k, neighbourhood size h (|N(u)|), threshold t,
    m = ``calibrated`` (the user's minimum survivors, the noise is split over m − c), the round's abort
    size max(m, t), colluders c."""

    num_shares: int
    neighbourhood: int
    threshold: int
    calibrated: int
    colluders: int
    n_sampled: int

    @property
    def min_survivors(self) -> int:
        """The round aborts with fewer survivors: max(m, t) (t shares rebuild each survivor's seed)."""
        return min(max(self.calibrated, self.threshold), self.n_sampled)

    @property
    def honest(self) -> int:
        """n_h = m − c: the honest noise shares in any sum holding an honest client that any server (active,
        lying about dropouts, with c colluders; Sybils kept out by the roster) can unmask, since every client
        signs a survivor set only under :func:`~flwr_dp_strategies.secure_aggregation.protocol.survivor_set_flaw`'s
        rule; each client adds μ/(m − c)."""
        return self.calibrated - self.colluders

    @property
    def complete(self) -> bool:
        """Whether the graph is SecAgg's complete graph."""
        return self.neighbourhood >= self.n_sampled


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


@dataclass
class Revealed:
    """What :meth:`SecureAggregationMixin.reveal_sum` got from a round's protocol: ``total``, the revealed
    sum mod 2^b (None: the round aborted or never opened), ``secure``, the round (None: never opened),
    and ``bookings``, the un-noised records replies carried (:meth:`SecureAggregationMixin.unmasked_bookings`)."""

    total: Optional[np.ndarray]
    secure: Optional[SecureAggregationRound]
    bookings: list[Booking]


class SecureAggregationMixin(AccountedRound):
    """SecAgg+ stages for an accounted FedAvg strategy (see the module docstring): it opens the protocol in
    ``configure_train`` and supplies the accounted round's :meth:`skip_train` and :meth:`train_check`;
    the template's collect stage runs :meth:`reveal_sum`, and the strategy's ``release_train`` reads its
    :meth:`revealed` sum."""

    num_shares: Optional[int | float]
    reconstruction_threshold: Optional[int | float]
    min_survivors: int | float
    max_colluding_clients: int
    dropout_rate: float
    failure_probability: float
    stage_timeout: Optional[float]
    budget_exhausted: bool

    # pylint: disable=too-many-arguments
    def _init_secure_aggregation(
        self,
        num_shares: Optional[int | float],
        reconstruction_threshold: Optional[int | float],
        min_survivors: int | float,
        stage_timeout: Optional[float],
        *,
        max_colluding_clients: int = 0,
        dropout_rate: float = 0.05,
        failure_probability: float = 1e-6,
    ) -> None:
        self.max_colluding_clients = check_int("max_colluding_clients", max_colluding_clients, minimum=0)
        c = self.max_colluding_clients
        self.num_shares = None if num_shares is None else fraction_or_count("num_shares", num_shares, 2)
        if reconstruction_threshold is None:
            self.reconstruction_threshold = None
        elif isinstance(reconstruction_threshold, float):
            if not 0.5 < reconstruction_threshold <= 1.0:
                raise ValueError(
                    "reconstruction_threshold as a fraction of the neighbourhood must be in (0.5, 1]: "
                    f"at most half would let a server rebuild both secrets of a client, got "
                    f"{reconstruction_threshold!r}"
                )
            self.reconstruction_threshold = reconstruction_threshold
        else:
            self.reconstruction_threshold = check_int(
                "reconstruction_threshold", reconstruction_threshold, minimum=max(2, c + 1)
            )
        self.min_survivors = fraction_or_count("min_survivors", min_survivors, c + 1)
        self.dropout_rate = check_probability("dropout_rate", dropout_rate, high_open=True)
        self.failure_probability = check_probability(
            "failure_probability", failure_probability, low_open=True, high_open=True
        )
        self.stage_timeout = None if stage_timeout is None else check_positive("stage_timeout", stage_timeout)
        self._start_timeout: float = 3600.0  # Strategy.start's default, until start() says otherwise
        self._round: Optional[SecureAggregationRound] = None
        self._grid: Optional[Grid] = None
        self._protocol_rejected: Counter[str] = Counter()
        self._sizes: Optional[ProtocolSizes] = None
        self.budget_exhausted = False

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """The template's ``start`` (:meth:`.template.AccountedRound.start`); its ``timeout`` also bounds the extra
        stages unless ``stage_timeout`` was given."""
        self._start_timeout = check_positive("timeout", timeout)
        return super().start(grid, initial_arrays, num_rounds, timeout, *args, **kwargs)  # the template's run

    def protocol_sizes(self, n_sampled: int) -> ProtocolSizes:
        """The sizes for ``n_sampled`` nodes (ValueError naming the setting that cannot be met):
        k from ``num_shares`` or, when None, :func:`choose_num_shares` for the dropout rate and failure
        probability; m from ``min_survivors``, above the colluders; t from ``reconstruction_threshold`` or,
        when None, the least the clients accept (:func:`min_threshold`: 2t > h + c)."""
        c, n = self.max_colluding_clients, int(n_sampled)
        if self.num_shares is None:
            k = choose_num_shares(
                n, colluders=c, dropout_rate=self.dropout_rate, failure_probability=self.failure_probability
            )
        else:
            k = resolve_count("num_shares", self.num_shares, n)
        k = max(2, min(k, n))
        h = neighbourhood_size(n, k)
        least = min_threshold(h, c)
        m = min(resolve_count("min_survivors", self.min_survivors, n), n)
        if m <= c:
            raise ValueError(
                f"min_survivors gives m = {m} for {n} sampled nodes, not above "
                f"max_colluding_clients = {c}: the colluders could hold every noise share"
            )
        if self.reconstruction_threshold is None:
            t = least
        elif isinstance(self.reconstruction_threshold, float):
            t = max(math.ceil(self.reconstruction_threshold * h), 2)
        else:
            t = self.reconstruction_threshold
        if not least <= t <= h:
            raise ValueError(
                f"reconstruction_threshold gives t = {t} for neighbourhoods of {h} nodes and "
                f"max_colluding_clients = {c}: it must be in [{least}, {h}] (2t > h + c)"
            )
        return ProtocolSizes(num_shares=k, neighbourhood=h, threshold=t, calibrated=m, colluders=c, n_sampled=n)

    def plan_sizes(self, server_round: int, n_sampled: int) -> Optional[ProtocolSizes]:
        """:meth:`protocol_sizes`, or None (the round is skipped, with a WARNING) when they cannot be met."""
        try:
            sizes = self.protocol_sizes(n_sampled)
        except ValueError as err:
            log(
                WARNING,
                "%s: round %d samples %d node(s), and %s; the round is skipped",
                type(self).__name__,
                server_round,
                n_sampled,
                err,
            )
            return None
        self._sizes = sizes
        return sizes

    def enough_nodes(self, server_round: int, planned: list[Message]) -> bool:
        """Secure aggregation needs two nodes or more (the round is skipped, with a WARNING, otherwise)."""
        if len(planned) >= 2:
            return True
        log(
            WARNING,
            "%s: round %d samples %d node(s); secure aggregation needs 2 or more, the round is skipped",
            type(self).__name__,
            server_round,
            len(planned),
        )
        return False

    def begin_round(self, grid: Grid) -> None:
        """Forget the previous round's protocol state (first thing in ``configure_train``)."""
        self._round, self._grid, self._protocol_rejected = None, grid, Counter()

    def budget_spent(self) -> bool:
        """After a round: the budget is spent, or one more round with this round's event would exceed it (the
        event is a function of the configuration and the planned sizes, not of the replies: a ledger-only check)."""
        if self.budget_exhausted:
            return True
        planned = self.__dict__.get("_round_event")
        return planned is not None and self.ledger.would_exceed(
            central_events=[planned[0]], neighboring_relation=planned[1]
        )

    def open_secure_round(
        self,
        server_round: int,
        grid: Grid,
        planned: list[Message],
        *,
        sizes: ProtocolSizes,
        bits: int,
        length: int,
        event: dp_event.DpEvent,
        public: dict[str, Any],
        replace_one_event: Optional[dp_event.DpEvent] = None,
    ) -> list[Message]:
        """Budget check for ``event`` (calibrated under add/remove; ``replace_one_event``: its tighter
        replace-one form, as it will be booked), setup and share-keys with the nodes of ``planned``, then their
        collect messages (their content + the protocol record + ``public``); [] if it cannot go on."""
        ledger = self.ledger
        tighter = replace_one_event is not None and ledger.neighboring_relation == "replace_one"
        self._round_event = (replace_one_event if tighter else event, "replace_one" if tighter else "add_or_remove_one")
        if ledger.would_exceed(
            central_events=[self._round_event[0]],
            neighboring_relation=self._round_event[1],
        ):
            log_budget_stop(server_round, self.ledger)
            self.budget_exhausted = True
            return []
        content = {int(msg.metadata.dst_node_id): msg.content for msg in planned}
        timeout = self.stage_timeout if self.stage_timeout is not None else self._start_timeout
        secure = SecureAggregationRound(
            server_round,
            content,
            num_shares=sizes.num_shares,
            threshold=sizes.threshold,
            min_survivors=sizes.min_survivors,
            bits=bits,
            length=length,
            timeout=timeout,
            colluders=sizes.colluders,
            honest=sizes.honest,
        )
        try:
            secure.setup(grid)
            secure.share_keys(grid)
        except SecureAggregationAborted as err:
            self._log_abort(err)
            self._protocol_rejected = secure.rejected
            return []
        self._round = secure
        messages = secure.collect_messages(lambda node: RecordDict(dict(content[node].items())), public)
        return messages

    def skip_train(self, server_round: int) -> bool:
        """True when no protocol round was opened this round and no stage rejected anyone (nothing to
        aggregate or report); Flower's ``AggregationError`` before ``configure_train``."""
        require_configured(self)
        return self._round is None and not self._protocol_rejected

    def train_check(self) -> Optional[ContentCheck]:
        """A collect reply's content check against the open round (:meth:`check_secure_reply`); without one,
        every reply is rejected (``identity``: no collect stage was sent)."""
        secure = self._round
        if secure is None:
            return lambda content: "identity"
        return lambda content: self.check_secure_reply(secure, content)

    def collect_train(self, server_round: int, screened: Screened) -> Collected:
        """The collect stage: :meth:`reveal_sum` (the unmask stage); the release reads the :class:`Revealed` from
        ``screened.collected``, the un-noised records replies carried are booked with the release's events."""
        revealed = self.reveal_sum(server_round, screened)
        return Collected(revealed, revealed.bookings)

    @staticmethod
    def revealed(screened: Screened) -> Revealed:
        """What the collect stage revealed this round (nothing if the round never opened)."""
        collected = screened.collected
        return collected if isinstance(collected, Revealed) else Revealed(None, None, [])

    def reveal_sum(self, server_round: int, screened: Screened) -> Revealed:
        """Close the round's protocol: the accepted replies' masked vectors added, the unmask stage, the revealed
        sum; the rejection counts of every protocol stage merged into ``screened.rejected``. The round is
        forgotten (one reveal per round); :attr:`Revealed.bookings` holds the un-noised records replies carried."""
        secure, self._round = self._round, None
        rejected = screened.rejected
        if secure is None:
            rejected.update(self._protocol_rejected)
            return Revealed(None, None, [])
        bookings = self.unmasked_bookings(screened.replies, screened.accepted, secure.collect_sent)
        for reply in screened.accepted:
            secure.add_vector(int(reply.metadata.src_node_id), secure.masked_vector(reply.content))
        try:
            total = secure.unmask(self._grid)
        except SecureAggregationAborted as err:
            self._log_abort(err)
            rejected.update(secure.rejected)
            return Revealed(None, secure, bookings)
        rejected.update(secure.rejected)  # the other stages' dropouts and malformed replies
        return Revealed(total, secure, bookings)

    @staticmethod
    def check_secure_reply(secure: SecureAggregationRound, content: RecordDict) -> Optional[str]:
        """A reason to reject a collect reply: anything but the protocol and masked records
        (``structure``), or a masked vector that does not parse (``secure-aggregation``)."""
        if set(content.keys()) != {RECORD, MASKED_RECORD}:
            return "structure"
        try:
            secure.packed_vector(content)  # unpacked once, when added (reveal_sum)
        except ProtocolError:
            return PROTOCOL_REJECTION
        return None

    @staticmethod
    def unmasked_bookings(replies: list[Message], accepted: list[Message], asked: set[int]) -> list[Booking]:
        """A ``NonPrivateDpEvent`` for each node whose reply carried more than the protocol's records (it released
        them un-noised). Only a node's own reply counts: the first from a node that was sent the collect stage
        (a second reply, or one from a node never asked, was rejected for its identity and books nothing)."""
        kept = {id(r) for r in accepted}
        seen: set[int] = set()
        bookings = []
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            first = node in asked and node not in seen
            seen.add(node)
            if reply.has_error() or id(reply) in kept or not first:
                continue
            if not set(reply.content.keys()) <= {RECORD, MASKED_RECORD}:
                bookings.append(Booking(NonPrivateDpEvent(), UNMASKED_METRICS_LABEL, client=node))
        return bookings

    def trust_lines(self) -> list[str]:
        """The trust model the protocol enforces, for the summary log (docs/distributed-dp.md has the table)."""
        c = self.max_colluding_clients
        lines = [
            f"Trust model: epsilon holds against an active server with up to {c} colluding client(s), for every "
            "client whose mod authenticates its peers with an operator-signed roster and requires at least the "
            "booked noise (min_noise_multiplier); a client without a roster counts only its own noise share"
        ]
        sizes = self._sizes
        if sizes is not None:
            lines.append(
                f"Last round: k = {sizes.num_shares} (neighbourhood {sizes.neighbourhood} of "
                f"{sizes.n_sampled}), t = {sizes.threshold}, m = {sizes.min_survivors}: any sum a server can "
                f"unmask holds at least n_h = {sizes.honest} honest noise share(s), each mu/{sizes.honest}"
            )
        lines.append(
            "Not covered: the server still chooses whom it samples and can abort any round; "
            "more than the assumed colluders; a roster signer that admits Sybils"
        )
        return lines

    def _log_abort(self, err: Exception) -> None:
        log(WARNING, "%s: secure aggregation aborted (%s); nothing revealed, nothing booked", type(self).__name__, err)


__all__ = [
    "ProtocolSizes",
    "Revealed",
    "SecureAggregationMixin",
    "UNMASKED_METRICS_LABEL",
    "fraction_or_count",
    "resolve_count",
]
