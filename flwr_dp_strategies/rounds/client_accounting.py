"""The accounting base every strategy of this package shares: screen, book, publish.

:class:`ClientAccountingMixin` gives a Message-API strategy

* a :class:`~flwr_dp_strategies.privacy.PrivacyLedger` (restored from and saved
  to ``ledger_path`` when given, so a restarted ServerApp loses nothing);
* reply screening (:mod:`.reply_screening`): malformed replies are dropped and
  counted per reason, the round goes on;
  every train and evaluate reply of every strategy goes through
  :meth:`ClientAccountingMixin.screen_and_book`, so subclass hooks only ever see
  screened replies;
* identity (reason ``identity``): the mixin remembers the messages its
  ``configure_train`` / ``configure_evaluate`` returned; a reply from a node that
  was sent no instruction of that phase in that round (or answering another
  message id), and every reply of a node after its first one in the round, is
  dropped unread: nothing is booked for it. Flower's SuperLink stores exactly one
  reply per instruction (its ``reply_to_message_id`` is unique) and authenticates
  the sender, so such a reply is not a release of that node through Flower; booking
  it would let anyone who can inject messages inflate an honest client's ε, and
  the first reply of the node is screened and booked as usual. Without a
  remembered configuration (a hook called directly) only the duplicate check applies;
* failed replies (a SuperNode that died mid-round: ``reply.has_error()``) are
  logged, skipped and counted under the reason ``error``; nothing is booked for
  them, since they carry no content;
* the counts of failed and rejected replies stay on the server: one WARNING per
  reply, one summary line per round and phase, and :attr:`ClientAccountingMixin.rejections`;
  they are never put in the round's metrics. Whether a reply fails or is rejected can
  depend on the client's data (a training run that diverges to NaN, an update past
  the clipping norm, an empty data set), and any count of replies bounds a secret
  Poisson sample's size from below, so publishing the counts un-noised would release
  data-dependent figures that no ε covers;
* a train reply that books no declaration (none, or an unreadable one) and is
  rejected for its content (NaN, wrong shape, bad keys...) is booked as
  ``NonPrivateDpEvent`` by strategies that book undeclared updates
  (``undeclared_label``): the server did receive the raw update;
* booking of what clients declare they released (:mod:`flwr_dp_strategies.declarations`)
  under the replying node id, each event checked with
  :meth:`PrivacyLedger.check_accountable` first (an unreadable or unaccountable
  declaration rejects the reply: it was computed by a client whose release we
  cannot account, so it is not aggregated);
* the ledger's figures (``privacy/epsilon``, ``privacy/delta``, ...) in every
  round's train and evaluate metrics, and per node
  (``privacy/epsilon/node-<id>``) with ``per_client_metrics=True``; when clients declare
  record-level releases (``unit="record"``: DP-SGD, label DP), also ``privacy/epsilon-record-level`` and
  ``privacy/epsilon-client-level`` (:meth:`PrivacyLedger.metrics`; the latter counts a client's
  record-level replies as covered only in a strategy with :attr:`ClientAccountingMixin.central_covers_replies`).

Composition: a client's declared events of every round are composed in the ledger
(RDP and PLD, adaptively); the federation's ``privacy/epsilon`` is the worst
client's ε, as client datasets are disjoint (parallel composition).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from typing import Any, Optional

from dp_accounting.dp_event import DpEvent, NonPrivateDpEvent
from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log

from ..declarations import PRIVACY_RECORD, Declaration, MalformedDeclaration, read_declarations
from ..privacy import PrivacyLedger
from ..privacy.accounting.ledger_file import MAIN, LedgerStore
from ..privacy.validation import check_bool, check_int
from .metrics import log_failed_reply, with_privacy_metrics
from .reply_screening import DEFAULT_MAX_WEIGHT, check_max_weight, has_config_record

PHASES = ("train", "evaluate")

_REPLIES_LOGGED: ContextVar[bool] = ContextVar("replies_logged", default=False)


@contextmanager
def replies_already_logged() -> Iterator[None]:
    """Inside the block, :meth:`ClientAccountingMixin.screen_and_book` does not log Flower's
    ``Received N results and M failures`` line: a wrapper that logged it hands its accepted replies
    to the wrapped strategy, and the line must appear once per round and phase."""
    token = _REPLIES_LOGGED.set(True)
    try:
        yield
    finally:
        _REPLIES_LOGGED.reset(token)


def log_received(phase: Optional[str], replies: list[Message]) -> None:
    """Flower's ``FedAvg`` line, verbatim: ``aggregate_train: Received 3 results and 1 failures``."""
    if not replies or phase not in PHASES or _REPLIES_LOGGED.get():
        return
    failures = sum(1 for reply in replies if reply.has_error())
    log(INFO, "%s: Received %s results and %s failures", f"aggregate_{phase}", len(replies) - failures, failures)


ContentCheck = Callable[[RecordDict], Optional[str]]


@dataclass(frozen=True)
class Booking:
    """One DP event to book: what a reply declared, or what a release caused.

    ``client``: the node whose data it is about (None: a central event, every client's);
    ``neighboring_relation``: the relation ``event`` is stated under (None: the ledger's);
    ``replace_one_event``: its tighter replace-one form, if the mechanism has one;
    ``ledger``: the ledger to book it in (None: the strategy's main ledger);
    ``unit``: what it protects, ``"client"`` (default) or ``"record"`` (one record of ``client``; of any client for a
    central event).
    """

    event: DpEvent
    label: str
    client: Optional[int] = None
    neighboring_relation: Optional[str] = None
    replace_one_event: Optional[DpEvent] = None
    ledger: Optional[PrivacyLedger] = None
    unit: str = "client"


class ClientAccountingMixin:
    """Ledger, reply screening and client declarations for a Message-API strategy.

    ``rejections``: ``{phase: {reason: count}}`` of the last round of each phase (``"train"``,
    ``"evaluate"``) that this strategy aggregated, failed replies under ``error``: what the server's
    operator reads instead of round metrics (see the module docstring); also logged.
    """

    ledger: PrivacyLedger
    ledger_path: Optional[str]
    per_client_metrics: bool
    max_reply_bytes: Optional[int]
    max_weight: float = DEFAULT_MAX_WEIGHT
    #: whether every train reply reaches the published outputs only through a central client-level release this
    #: strategy books (clipped replies, noise on the sum): then a client's record-level replies are covered by it
    #: at the client level (:meth:`PrivacyLedger.client_level_report`); False: nothing says so, and a client with
    #: record-level bookings has an infinite ``privacy/epsilon-client-level``
    central_covers_replies: bool = False

    def _init_accounting(
        self,
        ledger: Optional[PrivacyLedger],
        ledger_path: Optional[str],
        per_client_metrics: bool,
        max_reply_bytes: Optional[int],
        neighboring_relation: str = "replace_one",
        *,
        wrapped: object = None,
        resume: bool = False,
        high_water_path: Optional["os.PathLike[str] | str"] = None,
    ) -> None:
        """Open the strategy's ledgers (:func:`open_ledgers`); ``wrapped``: a strategy this one wraps,
        whose ledger store (all its named ledgers, and its file) is shared rather than duplicated;
        ``resume``, ``high_water_path``: as :func:`open_ledgers`."""
        check_ledger_types(ledger, ledger_path)
        store = getattr(wrapped, "ledger_store", None)
        if not isinstance(store, LedgerStore):
            store = None
            inner = getattr(wrapped, "ledger", None)
            ledger = ledger if ledger is not None or not isinstance(inner, PrivacyLedger) else inner
        self.ledger_path = None if ledger_path is None else os.fspath(ledger_path)
        self.ledger_resume = check_bool("resume", resume)
        self.high_water_path = high_water_path
        self.ledger_store, self.ledger = open_ledgers(
            ledger,
            self.ledger_path,
            neighboring_relation,
            store=store,
            resume=self.ledger_resume,
            high_water_path=high_water_path,
        )
        self.per_client_metrics = bool(per_client_metrics)
        self.max_reply_bytes = (
            None if max_reply_bytes is None else check_int("max_reply_bytes", max_reply_bytes, minimum=1)
        )

    def _init_screening(self, max_weight: float = DEFAULT_MAX_WEIGHT) -> None:
        """Set ``max_weight`` (validated): replies weighing more are rejected as ``weight``."""
        self.max_weight = check_max_weight(max_weight)

    # ------------------------------------------------------------------ identity
    def within_budget(self, server_round: int, messages: list[Message]) -> list[Message]:
        """``messages`` without those to nodes whose own ε (their declared releases and the central ones) already
        exceeds the ledger's ``max_epsilon``: a client over its budget, at ε = ∞ after a non-private reply
        included, is not asked again (logged, node ids in the server log only). Unchanged without a budget."""
        ledger = self.ledger
        if ledger.max_epsilon is None:
            return messages
        booked = set(ledger.clients)
        kept, over = [], []
        for msg in messages:
            node = int(msg.metadata.dst_node_id)
            if str(node) in booked and ledger.epsilon(node) > ledger.max_epsilon:
                over.append(node)
            else:
                kept.append(msg)
        if over:
            log(
                INFO,
                "Round %d: %d sampled node(s) over max_epsilon=%g are not asked to train: %s",
                server_round,
                len(over),
                ledger.max_epsilon,
                ", ".join(str(n) for n in sorted(over)),
            )
        return kept

    def remember_instructions(self, phase: str, server_round: int, messages: list[Message]) -> None:
        """Remember the instructions of ``phase`` in ``server_round``: replies are checked against them.

        The messages themselves are kept: the Grid sets their message ids when it
        sends them, after ``configure_*`` returned.
        """
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        sent = self.__dict__.setdefault("_sent_instructions", {})
        sent[phase] = (int(server_round), list(messages))
        self.__dict__["_last_phase"] = phase

    def _expected_senders(self, server_round: int, phase: Optional[str]) -> Optional[dict[int, list[Message]]]:
        """``{node id: instructions}`` of ``phase`` in ``server_round``, or None if none were remembered."""
        phase = phase if phase is not None else self.__dict__.get("_last_phase")
        sent = self.__dict__.get("_sent_instructions", {}).get(phase)
        if sent is None or sent[0] != server_round:
            return None
        expected: dict[int, list[Message]] = {}
        for message in sent[1]:
            expected.setdefault(int(message.metadata.dst_node_id), []).append(message)
        return expected

    @staticmethod
    def _answers_an_instruction(reply: Message, expected: dict[int, list[Message]]) -> bool:
        """The reply's node was sent an instruction, and the reply answers one of its message ids
        (ids are compared only once the Grid has set them)."""
        instructions = expected.get(int(reply.metadata.src_node_id))
        if not instructions:
            return False
        ids = {m.metadata.message_id for m in instructions}
        return ids == {""} or reply.metadata.reply_to_message_id in ids

    # ------------------------------------------------------------------ screening
    def screen_and_book(
        self, server_round: int, replies: Iterable[Message], check: Optional[ContentCheck] = None, **options: Any
    ) -> tuple[list[Message], Counter[str]]:
        """:meth:`screen` (``options``: its keyword arguments), then :meth:`book` its bookings under ``server_round``:
        for a helper that runs its own message round outside the accounted round (``LdpFederatedPCA``)."""
        accepted, rejected, bookings = self.screen(server_round, replies, check, **options)
        self.book(server_round, bookings)
        return accepted, rejected

    def book(self, booked_round: int, bookings: list[Booking]) -> None:
        """Book each of ``bookings`` in its ledger under ``booked_round``, then save every ledger of the strategy
        (once; when ``ledger_path`` is set). The one place this package books an event."""
        for booking in bookings:
            ledger = booking.ledger if booking.ledger is not None else self.ledger
            ledger.record(
                booking.event,
                server_round=booked_round,
                client=booking.client,
                label=booking.label,
                neighboring_relation=booking.neighboring_relation,
                replace_one_event=booking.replace_one_event,
                unit=booking.unit,
            )
        self.save_ledger()

    def screen(
        self,
        server_round: int,
        replies: Iterable[Message],
        check: Optional[ContentCheck] = None,
        *,
        phase: Optional[str] = None,
        undeclared_label: Optional[str] = None,
        declared: Optional[dict[int, list[Declaration]]] = None,
    ) -> tuple[list[Message], Counter[str], list[Booking]]:
        """The replies to aggregate, the count of rejected ones per reason, and what screening found to book
        (it books nothing itself: the caller books it, once).

        Logs Flower's ``aggregate_<phase>: Received N results and M failures`` line first (once:
        not again inside :func:`replies_already_logged`). In order: failed replies (``error``),
        identity (``identity``, see the module docstring; ``phase`` names the instructions to compare with, default the
        last configured phase), the declaration (``declaration``), then
        ``check(content)`` (a reason or None). Acceptance depends on each reply alone.

        Every readable declaration is to be booked (:meth:`declaration_bookings`), also for a reply that is
        then rejected for its content: the client did release it to us. With ``undeclared_label``, a rejected
        reply that declared nothing is to be booked as ``NonPrivateDpEvent`` under that label (the raw content
        reached the server). Declarations are consumed (removed from the reply), so a wrapped accounting
        strategy that sees the same reply does not book them twice; ``declared`` (when given) receives them,
        keyed by the reply's ``id``.
        """
        rejected: Counter[str] = Counter()
        screened: list[Message] = []
        phase = phase if phase is not None else self.__dict__.get("_last_phase")
        self.__dict__["_screened"] = (int(server_round), phase)  # for round_metrics' record of the counts
        replies = list(replies)
        log_received(phase, replies)
        expected = self._expected_senders(server_round, phase)
        seen: set[int] = set()
        bookings: list[Booking] = []
        for reply in replies:
            if reply.has_error():
                log_failed_reply(server_round, reply)
                rejected["error"] += 1
                continue
            node = reply.metadata.src_node_id
            if expected is not None and not self._answers_an_instruction(reply, expected):
                _consume_declarations(reply)  # unread: no client of this round
                self._reject(server_round, reply, "identity", rejected)
                continue
            if node in seen:  # a second reply of this node in the round: unread, unbooked
                _consume_declarations(reply)
                self._reject(server_round, reply, "identity", rejected)
                continue
            seen.add(node)
            reason, declarations = self._declared(reply)
            _consume_declarations(reply)  # consumed: a wrapped strategy must not book it again
            if declared is not None:
                declared[id(reply)] = declarations
            if declarations:
                bookings += self.declaration_bookings(int(node), declarations, phase)
            if reason is None and check is not None:
                reason = check(reply.content)
            if reason is None:
                screened.append(reply)
                continue
            self._reject(server_round, reply, reason, rejected)
            if undeclared_label is not None and not declarations:
                bookings.append(Booking(NonPrivateDpEvent(), undeclared_label, client=int(node)))
        return screened, rejected, bookings

    def declaration_bookings(self, node: int, declarations: list[Declaration], phase: Optional[str]) -> list[Booking]:
        """What to book for ``node``'s declarations (each under its own relation and unit); a subclass may book
        more, never less."""
        return [
            Booking(
                d.event,
                d.label,
                client=node,
                neighboring_relation=d.neighboring_relation,
                replace_one_event=d.replace_one_event,
                unit=d.unit,
            )
            for d in declarations
        ]

    def drop_rejected(
        self, server_round: int, replies: list[Message], indices: Iterable[int], reason: str, rejected: Counter[str]
    ) -> list[Message]:
        """``replies`` without those at ``indices``, each of which is rejected (logged, counted) for ``reason``."""
        bad = set(indices)
        for index in sorted(bad):
            self._reject(server_round, replies[index], reason, rejected)
        return [reply for index, reply in enumerate(replies) if index not in bad]

    @staticmethod
    def _reject(server_round: int, reply: Message, reason: str, rejected: Counter[str]) -> None:
        rejected[reason] += 1
        log(WARNING, "Round %d: reply from node %s rejected (%s)", server_round, reply.metadata.src_node_id, reason)

    def _declared(self, reply: Message) -> tuple[Optional[str], list]:
        if not has_config_record(reply.content, PRIVACY_RECORD):
            return None, []
        try:
            declarations = read_declarations(reply.content)
            for declaration in declarations:
                self.ledger.check_accountable(
                    declaration.event,
                    neighboring_relation=declaration.neighboring_relation,
                    replace_one_event=declaration.replace_one_event,
                )
        except (MalformedDeclaration, ValueError) as err:
            if "neighboring_relation" in str(err):
                log(
                    ERROR,
                    "Node %s declared a release this ledger cannot account under neighboring_relation=%r: "
                    "%s. Label DP / randomized response is accounted only by a ledger built with "
                    "PrivacyLedger(neighboring_relation='replace_one'); the reply is rejected.",
                    reply.metadata.src_node_id,
                    self.ledger.neighboring_relation,
                    err,
                )
            else:
                log(WARNING, "Privacy declaration of node %s rejected: %s", reply.metadata.src_node_id, err)
            return "declaration", []
        return None, declarations

    def round_metrics(self, metrics: Optional[MetricRecord], rejected: Counter[str]) -> MetricRecord:
        """``metrics`` plus the ledger's figures (and ``privacy/epsilon/node-<id>`` with
        ``per_client_metrics``). ``rejected`` (failed replies under ``error``) is recorded by
        :meth:`note_rejections`, not published."""
        self.note_rejections(rejected)
        merged = with_privacy_metrics(metrics, self.ledger, central_covers_replies=self.central_covers_replies)
        self._log_non_private()
        if self.per_client_metrics:
            for client in self.ledger.clients:
                merged[f"privacy/epsilon/node-{client}"] = float(self.ledger.epsilon(client))
        return merged

    def _log_non_private(self) -> None:
        """Log when the number of clients at ε = ∞ grows: a WARNING while they are left out of the published
        ``privacy/epsilon`` (some clients followed the protocol), INFO when every client is (the figure is ∞,
        as with an app whose ClientApps declare nothing). The count and node ids stay in the server log."""
        at_infinity = self.ledger.non_private_clients()
        if len(at_infinity) <= self.__dict__.get("_non_private_logged", 0):
            return
        self.__dict__["_non_private_logged"] = len(at_infinity)
        if len(at_infinity) == len(self.ledger.clients):
            log(
                INFO,
                "Every client so far (%d) sent a non-private release: privacy/epsilon is inf",
                len(at_infinity),
            )
            return
        log(
            WARNING,
            "%d client(s) sent a non-private release (their epsilon is inf) and are left out of the published "
            "privacy/epsilon, the worst case over the clients that followed the protocol: %s",
            len(at_infinity),
            ", ".join(sorted(at_infinity)),
        )

    @property
    def rejections(self) -> dict[str, Counter[str]]:
        """``{phase: {reason: count}}`` of the last aggregated round of each phase (see the class docstring)."""
        return self.__dict__.setdefault("_rejections", {})

    def note_rejections(
        self, rejected: Counter[str], phase: Optional[str] = None, server_round: Optional[int] = None
    ) -> None:
        """Keep the round's counts of failed and rejected replies in :attr:`rejections` and log them
        (one WARNING line when any); ``phase`` and ``server_round`` default to those of the last
        :meth:`screen_and_book`. The counts never reach the round's metrics (module docstring)."""
        screened_round, screened_phase = self.__dict__.get("_screened", (None, None))
        phase = phase if phase is not None else (screened_phase if screened_phase is not None else "train")
        server_round = server_round if server_round is not None else screened_round
        counts: Counter[str] = Counter({reason: int(n) for reason, n in rejected.items() if n})
        self.rejections[phase] = counts
        if counts:
            log(
                WARNING,
                "Round %s, %s: %d replies failed or rejected (%s); these counts stay in the server log "
                "(they can depend on the clients' data) and are not in the round's metrics",
                server_round,
                phase,
                sum(counts.values()),
                ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items())),
            )

    def save_ledger(self) -> None:
        """Persist every ledger of the strategy (``self.ledger_store``) to ``ledger_path``, if configured:
        one checksummed file, written atomically (:mod:`flwr_dp_strategies.privacy.accounting.ledger_file`).

        A ``ledger_path`` assigned after construction is bound (locked, checked against what is
        there, with the strategy's ``resume`` and ``high_water_path``) at the first save.
        """
        store = self.ledger_store
        if self.ledger_path is not None and store.path is None:
            store.bind(
                self.ledger_path,
                resume=getattr(self, "ledger_resume", False),
                high_water_path=getattr(self, "high_water_path", None),
            )
        store.save()


def check_ledger_types(ledger: object, ledger_path: object) -> None:
    """TypeError naming the argument unless ``ledger`` is a PrivacyLedger or None and ``ledger_path`` a path or None
    (a path passed as ``ledger`` used to be accepted and fail in round 1)."""
    if ledger is not None and not isinstance(ledger, PrivacyLedger):
        hint = " (to keep the ledger in a file, pass ledger_path=...)" if isinstance(ledger, (str, os.PathLike)) else ""
        raise TypeError(f"ledger must be a PrivacyLedger or None, got {type(ledger).__name__} {ledger!r}{hint}")
    if ledger_path is not None and not isinstance(ledger_path, (str, os.PathLike)):
        raise TypeError(f"ledger_path must be a path (str or os.PathLike) or None, got {type(ledger_path).__name__}")


def open_ledgers(
    ledger: Optional[PrivacyLedger],
    ledger_path: Optional["os.PathLike[str] | str"],
    neighboring_relation: str = "replace_one",
    *,
    store: Optional[LedgerStore] = None,
    resume: bool = False,
    high_water_path: Optional["os.PathLike[str] | str"] = None,
) -> tuple[LedgerStore, PrivacyLedger]:
    """A strategy's ledger store (locked on ``ledger_path``, restored from it) and its main ledger.

    ``store``: the store of a wrapped strategy, shared (a wrapper books into the same
    ledgers and file). The main ledger is the file's, restored into ``ledger`` when one
    is passed (it must then be empty and have the file's ``target_delta`` and
    ``neighboring_relation``, else :class:`~flwr_dp_strategies.privacy.accounting.ledger_file.LedgerFileError`:
    a conflict is never resolved silently; its ``max_epsilon`` and ``accounting`` apply), else
    ``ledger``, else a new ``PrivacyLedger(1e-5, neighboring_relation=neighboring_relation)``.

    The default relation is ``replace_one``, the relation this package's client-side
    mechanisms are calibrated under (local update noise with Δ = 2C, FM, Analyze Gauss,
    randomized response, Laplace inference vectors); add/remove declarations (DP-SGD)
    are converted soundly into it. Central strategies pass ``add_or_remove_one``.
    Anything at ``ledger_path`` that is not a valid ledger file (a dangling link, an
    empty, corrupted or edited file) raises: a path that was given is never a silent
    fresh start.

    Resuming is explicit. ``resume=False`` (default) starts a new run: a ledger file
    already at ``ledger_path`` is refused, never overwritten (unless the ledger passed is
    the continuation of exactly that file in this process), and so is a high-water mark
    whose ledger is gone. ``resume=True`` continues the run whose ledger is at
    ``ledger_path``: a missing file, a file of another run or copied from another path,
    one whose high-water mark is missing, or one older than its high-water mark (a
    rollback) raises; it never starts from ε = 0. ``high_water_path``: where the
    high-water record lives (default beside the file, ``<ledger_path>.hwm``; see
    :class:`~flwr_dp_strategies.privacy.accounting.ledger_file.LedgerStore` for what each place detects).
    """
    if ledger is not None and not isinstance(ledger, PrivacyLedger):
        raise TypeError(
            f"ledger must be a PrivacyLedger or None, got {type(ledger).__name__} {ledger!r}"
            + (
                " (to keep the ledger in a file, pass ledger_path=...)"
                if isinstance(ledger, (str, os.PathLike))
                else ""
            )
        )
    if ledger_path is not None and (isinstance(ledger_path, bool) or not isinstance(ledger_path, (str, os.PathLike))):
        raise TypeError(f"ledger_path must be a path (str or os.PathLike) or None, got {type(ledger_path).__name__}")
    if resume and ledger_path is None and (store is None or store.path is None):
        raise ValueError("resume=True needs a ledger_path (the ledger file of the run to resume)")
    if high_water_path is not None and ledger_path is None and (store is None or store.path is None):
        raise ValueError("high_water_path needs a ledger_path")
    store = store if store is not None else LedgerStore()
    if ledger_path is not None:
        store.bind(ledger_path, resume=resume, high_water_path=high_water_path)
    main = store.claim(MAIN, ledger, lambda: PrivacyLedger(1e-5, neighboring_relation=neighboring_relation))
    if ledger_path is not None and store.restored:
        log(
            INFO,
            "Privacy ledger restored from %s (run %s, generation %d): epsilon=%.4f at delta=%g, %d clients "
            "(ledgers: %s)",
            ledger_path,
            store.run_id,
            store.generation,
            main.epsilon(),
            main.target_delta,
            len(main.clients),
            ", ".join(store.names),
        )
    elif ledger_path is not None:
        log(
            INFO,
            "Privacy ledger: new run %s, saved to %s (high-water mark %s)",
            store.run_id,
            ledger_path,
            store.high_water_path,
        )
    return store, main


def resolve_ledger(
    ledger: Optional[PrivacyLedger],
    ledger_path: Optional[str],
    neighboring_relation: str = "replace_one",
    *,
    resume: bool = False,
) -> PrivacyLedger:
    """The main ledger of :func:`open_ledgers` (without keeping its store: save it with
    ``ledger.save(ledger_path)``, which checks that no one else wrote the file meanwhile)."""
    return open_ledgers(ledger, ledger_path, neighboring_relation, resume=resume)[1]


def _consume_declarations(reply: Message) -> None:
    """Remove the reply's declaration record (only a ConfigRecord under that name: any other record
    of that name stays and is screened as part of the content)."""
    if has_config_record(reply.content, PRIVACY_RECORD):
        reply.content.pop(PRIVACY_RECORD)


def undeclared_replies(replies: Iterable[Message]) -> set[int]:
    """``id`` of every reply without error that carries no privacy declaration (before screening consumes them)."""
    return {id(r) for r in replies if not r.has_error() and not has_config_record(r.content, PRIVACY_RECORD)}


__all__ = [
    "Booking",
    "ClientAccountingMixin",
    "PHASES",
    "log_received",
    "open_ledgers",
    "replies_already_logged",
    "resolve_ledger",
    "undeclared_replies",
]
