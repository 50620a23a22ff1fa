"""The one accounted round every strategy of this package runs: configure → screen → release → book → save →
publish.

:class:`AccountedRound` owns ``configure_train``, ``configure_evaluate``, ``aggregate_train`` and
``aggregate_evaluate`` as a fixed template (the way Flower's ``Strategy.start`` owns the loop and
dp-accounting's ``compose()`` owns the bookkeeping):

0. **configure**: the strategy's hook :meth:`AccountedRound.instruct_train` /
   :meth:`AccountedRound.instruct_evaluate` chooses the nodes and writes their instructions; the
   template remembers what it sent, so the identity check of step 1 holds whatever the hook does
   (a hook cannot switch it off by not chaining to a parent);
1. **screen** (:meth:`ClientAccountingMixin.screen`, which books nothing): failed replies, identity,
   declarations (to be booked for the replying node in step 3), then the strategy's content check
   (:meth:`AccountedRound.train_check` / :meth:`AccountedRound.evaluate_check`);
2. **collect** (multi-message protocols only, :meth:`AccountedRound.collect_train`): the further
   message rounds of the protocol (SecAgg's unmask), whose result the release gets;
   **release**: the strategy's mechanism, :meth:`AccountedRound.release_train` /
   :meth:`AccountedRound.release_evaluate`, which gets the :class:`Screened` replies and
   returns a :class:`RoundRelease`: the arrays, the metrics and the :class:`Booking` of every DP
   event it caused; it books nothing itself;
3. **book**, once, every booking in its ledger (the strategy's main ledger unless it names another):
   screening's (each declaration; a ``NonPrivateDpEvent`` for a rejected reply that declared nothing),
   the release's, and, for a strategy with :attr:`AccountedRound.undeclared_label`, a ``NonPrivateDpEvent``
   for every accepted train reply that declared nothing (the raw update reached the server);
4. **save** every ledger of the strategy to its file (when it has one), after every release, booked or not
   (a release may move state kept with the ledger, as BandMF's noise stream);
   if the release raises, screening's bookings are booked and saved before the error goes on;
5. **publish** the release's metrics with the ledger's figures (:meth:`round_metrics`); the
   counts of rejected and failed replies stay in the server log.

A subclass implements its release (and its ``instruct_*`` hooks when it samples clients or
runs SecAgg stages); it cannot replace the template: defining ``configure_train``,
``configure_evaluate``, ``aggregate_train`` or ``aggregate_evaluate`` in a subclass raises
``TypeError`` at class creation, so no strategy can skip the identity check, screening or booking.
"""

from __future__ import annotations

import io
import time
from logging import INFO, WARNING
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Unpack, cast

from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info

from ..declarations import Declaration
from ..privacy.rng import RngSource
from ..privacy.validation import check_bool
from .client_accounting import Booking, ClientAccountingMixin, ContentCheck, undeclared_replies
from .exchange import exchange
from .options import AccountingOptions, check_accounting
from .client_metrics import AccountedMetrics, check_evaluate_metrics, release_evaluate_metrics
from .reply_screening import DEFAULT_MAX_WEIGHT, check_weight, oversized, reply_arrays
from .streaming_aggregation import ClippedSum, NonFiniteReplies, single_threaded_blas

TEMPLATE_METHODS = ("configure_train", "configure_evaluate", "aggregate_train", "aggregate_evaluate")


@dataclass
class Collected:
    """What a multi-message protocol's collect stage gathered after the round's replies were screened (the
    revealed sum of a secure-aggregation round): ``value`` for the release, ``bookings`` for the book step
    (what the stage's messages released)."""

    value: Any = None
    bookings: list[Booking] = field(default_factory=list)


@dataclass
class RoundRelease:
    """What a mechanism released in one round: the arrays (None: no new model), the metrics
    published beside them (the ledger's figures are added by the template) and its bookings."""

    arrays: Optional[ArrayRecord] = None
    metrics: Optional[MetricRecord] = None
    bookings: list[Booking] = field(default_factory=list)
    #: figures read from the strategy's ledgers once the bookings are made, added to ``metrics``
    ledger_figures: Optional[Callable[[], Mapping[str, float]]] = None
    #: figures for the server's operator only (counts that move with who replied, un-noised statistics of the
    #: replies): logged once and kept in :attr:`AccountedRound.server_figures`, never published
    server_only: dict[str, float] = field(default_factory=dict)

    def keep_on_server(self, *keys: str) -> "RoundRelease":
        """Move ``keys`` (those present) from :attr:`metrics` to :attr:`server_only`; this release."""
        if self.metrics is not None:
            for key in keys:
                if key in self.metrics:
                    self.server_only[key] = float(cast(float, self.metrics.pop(key)))
        return self


@dataclass
class Screened:
    """The replies of one round and phase after screening.

    ``replies``: every reply received (failed and rejected ones included), in order;
    ``accepted``: those that passed screening (the release rejects more with :meth:`reject`);
    ``passed``: those that passed screening, before the release rejected any; ``rejected``:
    counts per reason; ``undeclared``: ``id`` of each reply that carried no declaration;
    ``declarations``: what each screened reply declared (booked already), by ``id``.
    """

    server_round: int
    replies: list[Message]
    accepted: list[Message]
    rejected: Counter[str]
    undeclared: set[int]
    declarations: dict[int, list[Declaration]]
    strategy: "AccountedRound"
    passed: list[Message] = field(default_factory=list)
    #: what screening found to book (declarations; undeclared rejected updates), booked with the release's
    bookings: list[Booking] = field(default_factory=list)
    #: what the collect stage gathered (:meth:`AccountedRound.collect_train`), for the release; None without one
    collected: Any = None

    def __post_init__(self) -> None:
        self.passed = list(self.accepted)

    def reject(self, replies: Iterable[Message], reason: str) -> list[Message]:
        """Reject each of ``replies`` (each one of :attr:`accepted`; logged, counted under ``reason``); the
        others, also kept as :attr:`accepted`."""
        return self.reject_each([(reply, reason) for reply in replies])

    def reject_each(self, rejections: Iterable[tuple[Message, str]]) -> list[Message]:
        """Reject each ``(reply, reason)`` (the reply one of :attr:`accepted`, by identity: never an index that
        could refer to another list); the others, kept as :attr:`accepted`, in their order."""
        position = {id(reply): index for index, reply in enumerate(self.accepted)}
        reasons: dict[int, str] = {}
        for reply, reason in rejections:
            if id(reply) not in position:
                raise ValueError("reject: the reply is not one of the accepted replies of this round")
            reasons[position[id(reply)]] = reason
        for index in sorted(reasons):
            self.strategy.drop_rejected(self.server_round, [self.accepted[index]], [0], reasons[index], self.rejected)
        self.accepted = [reply for index, reply in enumerate(self.accepted) if index not in reasons]
        return self.accepted

    def add_clipped(self, summed: ClippedSum) -> list[Message]:
        """Clip and add every accepted reply's arrays to ``summed``; those holding NaN/inf are rejected as
        ``non-finite`` before any of their values is added. The replies added."""
        replies = list(self.accepted)
        bad = summed.add_records([reply_arrays(reply) for reply in replies])
        return self.reject([replies[index] for index in bad], "non-finite")

    def finite(self, aggregate: Callable[[list[Message]], Any]) -> tuple[Any, list[Message]]:
        """``aggregate(accepted)``, again without the replies it reports as non-finite (it raises
        :class:`NonFiniteReplies` with their indices before any side effect), until it succeeds;
        its result (None when no reply is left) and the replies it used."""
        while self.accepted:
            try:
                return aggregate(self.accepted), self.accepted
            except NonFiniteReplies as err:
                if not err.indices:
                    raise
                tried = list(self.accepted)
                self.reject([tried[index] for index in err.indices], "non-finite")
        return None, []


class AccountedRound(ClientAccountingMixin):
    """The accounted round (module docstring): a Flower strategy that inherits it runs every
    ``aggregate_train`` / ``aggregate_evaluate`` through screen → release → book → save → publish.

    Subclasses implement :meth:`release_train` (and may set :attr:`undeclared_label`, override
    :meth:`instruct_train`, :meth:`instruct_evaluate`, :meth:`train_check`, :meth:`skip_train`, :meth:`booking_round`, :meth:`evaluate_check`,
    :meth:`release_evaluate`).
    """

    #: Label of the ``NonPrivateDpEvent`` booked for a train reply that declared nothing
    #: (None: declarations are not expected in this strategy's train replies).
    undeclared_label: Optional[str] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in TEMPLATE_METHODS:
            if name in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} defines {name}: the accounted round owns it (configure → screen → release "
                    "→ book → save → publish); implement instruct_train / instruct_evaluate or release_train / "
                    "release_evaluate instead"
                )

    def init_accounted_round(
        self,
        *,
        neighboring_relation: str = "replace_one",
        rng: Any = None,
        wrapped: object = None,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        """Open the strategy's ledger and set the screening limits from the accounting options
        (:class:`.options.AccountingOptions`: validated here, defaults applied here, nowhere else); call it in
        ``__init__`` after the Flower strategy's own constructor. ``neighboring_relation``: the default ledger's
        (``add_or_remove_one`` for central DP, ``replace_one`` for client-declared releases); the clients'
        evaluate metrics are noised from ``rng`` (None: OS entropy; a seed or Generator in tests only). ``wrapped``: a
        strategy this one wraps (``ClusterEvaluation``), whose ledger store is shared and whose ``max_weight`` is
        the default."""
        options = check_accounting(accounting, type(self).__name__)
        self.evaluate_metrics = check_evaluate_metrics(options.get("evaluate_metrics", AccountedMetrics()))
        self._metrics_rng = RngSource(rng)
        self._withheld_logged: set[str] = set()
        self._init_accounting(
            options.get("ledger"),
            options.get("ledger_path"),
            check_bool("per_client_metrics", options.get("per_client_metrics", False)),
            options.get("max_reply_bytes"),
            neighboring_relation,
            wrapped=wrapped,
            resume=options.get("resume", False),
            high_water_path=options.get("high_water_path"),
        )
        max_weight = options.get("max_weight")
        self._init_screening(getattr(wrapped, "max_weight", DEFAULT_MAX_WEIGHT) if max_weight is None else max_weight)

    # ------------------------------------------------------------------ hooks
    @property
    def fedavg(self) -> Any:
        """The FedAvg whose ``weighted_by_key`` and metric aggregation functions apply: the strategy itself,
        or the strategy a wrapper wraps."""
        return getattr(self, "strategy", self)

    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Choose this round's training nodes and write their instructions. By default the Flower strategy's
        ``configure_train`` (the next class of the MRO after this package's bases), less the nodes already
        over ``max_epsilon`` (:meth:`~.client_accounting.ClientAccountingMixin.within_budget`)."""
        messages = list(cast(Any, super()).configure_train(server_round, arrays, config, grid))
        return self.within_budget(server_round, messages)

    def instruct_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Choose this round's evaluation nodes and write their instructions; by default the Flower
        strategy's ``configure_evaluate``."""
        return cast(Any, super()).configure_evaluate(server_round, arrays, config, grid)

    def skip_train(self, server_round: int) -> bool:
        """True when this round configured no training (budget exhausted, a protocol that never opened):
        ``aggregate_train`` then returns ``(None, None)`` without reading the replies."""
        return False

    def train_check(self) -> Optional[ContentCheck]:
        """The content check of a train reply (a reason to reject it, or None); None: no check."""
        return None

    def collect_train(self, server_round: int, screened: Screened) -> Optional[Collected]:
        """The collect stage of a multi-message protocol, between screening and the release: the further
        message rounds it runs on the grid it kept from configure (SecAgg's unmask), with their own screening;
        what it gathered becomes ``screened.collected`` and its bookings are booked with the release's. None
        (default): the round's replies are all there is."""
        return None

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """The mechanism: what is released from the screened train replies, and its bookings."""
        raise NotImplementedError

    def evaluate_check(self) -> Optional[ContentCheck]:
        """The content check of an evaluate reply: its weight in (0, ``max_weight``], finite metrics."""
        key = self.fedavg.weighted_by_key
        return lambda content: check_weight(content, key, self.max_weight)

    def release_evaluate(self, server_round: int, screened: Screened) -> RoundRelease:
        """The clients' evaluate metrics as ``evaluate_metrics`` says (:mod:`.client_metrics`): by default each
        declared metric a noised bounded mean over the m nodes asked, booked; ``"flower"``: Flower's mean,
        booked non-private."""
        policy = self.__dict__.get("evaluate_metrics", AccountedMetrics())
        fedavg = self.fedavg
        metrics, bookings = release_evaluate_metrics(
            policy,
            [r.content for r in screened.accepted],
            denominator=self.evaluated_nodes(server_round, screened),
            weighted_by_key=fedavg.weighted_by_key,
            aggregation=fedavg.evaluate_metrics_aggr_fn,
            generator=self.__dict__.setdefault("_metrics_rng", RngSource(None))(),
            withheld_logged=self.__dict__.setdefault("_withheld_logged", set()),
            all_declared=not any(id(r) in screened.undeclared for r in screened.accepted),
        )
        return RoundRelease(metrics=metrics, bookings=bookings)

    def evaluated_nodes(self, server_round: int, screened: Screened) -> int:
        """m of the evaluate metrics: the nodes this round's ``configure_evaluate`` asked (the server's choice,
        fixed before any reply); the number of replies received when no instruction was remembered."""
        expected = self._expected_senders(server_round, "evaluate")
        if expected is None:
            return len(screened.replies)
        return len(expected)

    def booking_round(self, server_round: int) -> int:
        """The round number events of ``server_round`` are booked under."""
        return server_round

    def server_step(self, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        """Post-processing of the released arrays before they become the model (a wrapped server optimizer's
        step); nothing it does is booked. The release itself by default."""
        return arrays

    def budget_spent(self) -> bool:
        """After a round: True when the ledger says the next round cannot run (its release would exceed the
        budget, or the plan is done). Read from the ledger and the configuration only (free,
        :mod:`.early_stop`); False here: a strategy whose next release is known overrides it."""
        return bool(self.__dict__.get("budget_exhausted", False))

    # ------------------------------------------------------------------ the run
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: Optional[ConfigRecord] = None,
        evaluate_config: Optional[ConfigRecord] = None,
        evaluate_fn: Optional[Callable[[int, ArrayRecord], Optional[MetricRecord]]] = None,
        should_stop: Optional[Any] = None,
    ) -> Result:
        """Flower's ``Strategy.start`` (its arguments, its log lines, its ``Result``; on every supported Flower,
        1.43's ``should_stop`` included, ``num_rounds`` a maximum), stopping early only without a hidden release
        (:mod:`.early_stop`): after a round, when :meth:`budget_spent` (the ledger says the next round cannot
        run: free), when an :class:`~.early_stop.AccountedEarlyStop` given as ``should_stop`` halts (booked), or
        when a user's ``should_stop(round, result)`` says so, shown only the public and accounted metrics."""
        from .early_stop import AccountedEarlyStop, stop_reason

        early = should_stop if isinstance(should_stop, AccountedEarlyStop) else None
        user = None if early is not None else should_stop
        if user is not None and not callable(user):
            raise TypeError(f"should_stop must be callable or an AccountedEarlyStop, got {type(user).__name__}")
        self.__dict__["_early_stop"] = early
        log(INFO, "Starting %s strategy:", self.__class__.__name__)
        log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
        self.summary()
        log(INFO, "")
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()
        result.arrays = initial_arrays
        started = time.time()
        if evaluate_fn:
            res = evaluate_fn(0, initial_arrays)
            log(INFO, "Initial global evaluation results: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        arrays = initial_arrays
        for current_round in range(1, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", current_round, num_rounds)
            replies = exchange(grid, self.configure_train(current_round, arrays, train_config, grid), timeout)
            agg_arrays, train_metrics = self.aggregate_train(current_round, replies)
            if agg_arrays is not None:
                result.arrays = arrays = agg_arrays
            if train_metrics is not None:
                log(INFO, "\t└──> Aggregated MetricRecord: %s", train_metrics)
                result.train_metrics_clientapp[current_round] = train_metrics
            replies = exchange(grid, self.configure_evaluate(current_round, arrays, evaluate_config, grid), timeout)
            evaluate_metrics = self.aggregate_evaluate(current_round, replies)
            if evaluate_metrics is not None:
                log(INFO, "\t└──> Aggregated MetricRecord: %s", evaluate_metrics)
                result.evaluate_metrics_clientapp[current_round] = evaluate_metrics
            if evaluate_fn:
                log(INFO, "Global evaluation")
                res = evaluate_fn(current_round, arrays)
                log(INFO, "\t└──> MetricRecord: %s", res)
                if res is not None:
                    result.evaluate_metrics_serverapp[current_round] = res
            if current_round < num_rounds and self.budget_spent():
                log(
                    INFO,
                    "Privacy budget: stopping after round %s, the next round would exceed max_epsilon (the ledger "
                    "alone says so: no cost)",
                    current_round,
                )
                break
            reason = stop_reason(early)
            if reason is not None:
                log(INFO, "Accounted early stop after round %s: %s", current_round, reason)
                break
            if user is not None and user(current_round, self._public_view(result)):
                log(INFO, "Stopping early after round %s", current_round)
                break
        log(INFO, "")
        log(INFO, "Strategy execution finished in %.2fs", time.time() - started)
        log(INFO, "")
        log(INFO, "Final results:")
        log(INFO, "")
        for line in io.StringIO(str(result)):
            log(INFO, "\t%s", line.strip("\n"))
        log(INFO, "")
        return result

    def _public_view(self, result: Result) -> Result:
        """``result`` with only the round metrics a stop decision may read for free: public keys, ledger figures,
        accounted releases (:mod:`.published_keys`); the server's own evaluation (``evaluate_fn``) as it is. The
        hidden keys are named in a WARNING, once."""
        from .published_keys import protection

        hidden: set[str] = set()
        view = Result()
        view.arrays = result.arrays
        view.evaluate_metrics_serverapp = dict(result.evaluate_metrics_serverapp)
        for source, target in (
            (result.train_metrics_clientapp, view.train_metrics_clientapp),
            (result.evaluate_metrics_clientapp, view.evaluate_metrics_clientapp),
        ):
            for rnd, record in source.items():
                kept = {key: value for key, value in record.items() if protection(key) is not None}
                hidden.update(key for key in record if key not in kept)
                target[rnd] = MetricRecord(kept)
        new = sorted(hidden - self.__dict__.setdefault("_hidden_from_stop", set()))
        if new:
            self.__dict__["_hidden_from_stop"].update(new)
            log(
                WARNING,
                "should_stop is not shown %s: a stop decision read from un-noised client metrics would be a release "
                "nobody booked (give an AccountedEarlyStop, or declare the metric: evaluate_metrics=AccountedMetrics)",
                ", ".join(new),
            )
        return view

    # ------------------------------------------------------------------ template
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """:meth:`instruct_train`'s messages, remembered for the identity check of this round's replies."""
        messages = list(self.instruct_train(server_round, arrays, config, grid))
        self.remember_instructions("train", server_round, messages)
        return messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """:meth:`instruct_evaluate`'s messages, remembered for the identity check of this round's replies."""
        messages = list(self.instruct_evaluate(server_round, arrays, config, grid))
        self.remember_instructions("evaluate", server_round, messages)
        return messages

    @single_threaded_blas
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Screen → release → book → save → publish (module docstring)."""
        if self.skip_train(server_round):
            return None, None
        screened = self._screen(server_round, replies, "train", self.train_check(), self.undeclared_label)
        collected = self._run_release(server_round, screened, self.collect_train)
        if collected is not None:
            screened.collected = collected.value
            screened.bookings += collected.bookings
        release = self._run_release(server_round, screened, self.release_train)
        bookings = list(screened.bookings) + list(release.bookings)
        if self.undeclared_label is not None:
            bookings += [
                Booking(NonPrivateDpEvent(), self.undeclared_label, client=int(r.metadata.src_node_id))
                for r in screened.passed
                if id(r) in screened.undeclared
            ]
        self._book(server_round, bookings)
        arrays = None if release.arrays is None else self.server_step(server_round, release.arrays)
        return arrays, self._publish(release, screened)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        """Screen → release (metrics) → book → save → publish."""
        screened = self._screen(server_round, replies, "evaluate", self.evaluate_check(), None)
        release = self._run_release(server_round, screened, self.release_evaluate)
        bookings = list(screened.bookings) + list(release.bookings)
        early = self.__dict__.get("_early_stop")
        if early is not None:  # the accounted early stop's query (booked once per chain)
            bookings += early.observe(
                [r.content for r in screened.accepted], self.evaluated_nodes(server_round, screened)
            )
        self._book(server_round, bookings)
        return self._publish(release, screened)

    def _run_release(self, server_round: int, screened: Screened, mechanism: Callable[[int, Screened], Any]) -> Any:
        """``mechanism(server_round, screened)``; if it raises, what screening found is booked first (the
        clients' declared releases reached the server all the same), then the error goes on."""
        try:
            return mechanism(server_round, screened)
        except BaseException:
            self._book(server_round, screened.bookings)
            raise

    def _publish(self, release: RoundRelease, screened: Screened) -> MetricRecord:
        self._keep_server_figures(screened.server_round, release.server_only)
        metrics = self.round_metrics(release.metrics, screened.rejected)
        if release.ledger_figures is not None:
            for key, value in release.ledger_figures().items():
                metrics[key] = float(value)
        return metrics

    def _keep_server_figures(self, server_round: int, figures: Mapping[str, float]) -> None:
        """Log the release's server-only figures (one INFO line) and keep them in :attr:`server_figures` under the
        phase just screened; they never reach the round's metrics."""
        phase = self.__dict__.get("_screened", (None, "train"))[1] or "train"
        kept = {key: float(value) for key, value in figures.items()}
        self.__dict__.setdefault("_server_figures", {})[phase] = kept
        if kept:
            log(
                INFO,
                "Round %d, %s (server log only, not published): %s",
                server_round,
                phase,
                ", ".join(f"{key}={value:g}" for key, value in sorted(kept.items())),
            )

    @property
    def server_figures(self) -> dict[str, dict[str, float]]:
        """``{phase: {name: value}}`` of the last round of each phase: the figures a release keeps for the
        operator (:attr:`RoundRelease.server_only`), as :attr:`rejections` keeps the rejection counts."""
        return self.__dict__.setdefault("_server_figures", {})

    def _screen(
        self,
        server_round: int,
        replies: Iterable[Message],
        phase: str,
        check: Optional[ContentCheck],
        undeclared_label: Optional[str],
    ) -> Screened:
        replies = list(replies)
        limit = self.max_reply_bytes
        if phase == "train" and limit is not None:  # every strategy's replies, before its own check
            check = _within_size(check, limit)
        undeclared = undeclared_replies(replies)
        declarations: dict[int, list[Declaration]] = {}
        accepted, rejected, bookings = self.screen(
            server_round, replies, check, phase=phase, undeclared_label=undeclared_label, declared=declarations
        )
        screened = Screened(int(server_round), replies, accepted, rejected, undeclared, declarations, self)
        screened.bookings = bookings
        return screened

    def _book(self, server_round: int, bookings: list[Booking]) -> None:
        """The book and save steps: every booking under :meth:`booking_round`, every ledger saved (once)."""
        self.book(self.booking_round(server_round), bookings)


def _within_size(check: Optional[ContentCheck], limit: int) -> ContentCheck:
    """``check`` after :func:`.reply_screening.oversized` (``max_reply_bytes``): an oversized reply is rejected as
    ``oversized`` before the strategy reads it."""

    def checked(content: RecordDict) -> Optional[str]:
        if oversized(content, limit):
            return "oversized"
        return None if check is None else check(content)

    return checked


def reply_contents(replies: Iterable[Message]) -> list[RecordDict]:
    """The contents of ``replies``, in order."""
    return [reply.content for reply in replies]


__all__ = ["AccountedRound", "Booking", "Collected", "RoundRelease", "Screened", "TEMPLATE_METHODS", "reply_contents"]
