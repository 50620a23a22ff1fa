r"""FedAvg behind a layer-wise Split & Shuffle (DELM §3.4), with a sound shuffle-amplified ε.

:class:`ShuffleAmplifiedFedAvg` is :class:`AccountedFedAvg` (screening, booking
of the clients' declarations in ``self.ledger``, ``privacy/*`` metrics,
rejection counts in the server log) whose aggregation hook passes the accepted updates
through a :class:`~flwr_dp_strategies.layer_shuffler.LayerShuffler`: the
replies' single ArrayRecords are split into layers (:func:`layer_groups`), every
layer is permuted independently across the reports with its weight, the node
ids are dropped, and the shuffled reports are averaged per layer (weighted,
streamed in place into one accumulator per key by
:class:`~.streaming_aggregation.WeightedMean`, payloads read zero-copy). The
aggregate equals FedAvg's. NaN/inf replies are found from a non-finite mean
(before anything is booked) and rejected, as in :class:`AccountedFedAvg`.

Privacy (proof and trust assumption: :mod:`flwr_dp_strategies.layer_shuffler`).
The per-client ledger ``self.ledger`` is unchanged: the shuffler sees every
report. Against an analyst that sees only the shuffler's output, each round is
(ε, δ)-DP under replacement of one client's whole local data with
ε = FMT(ε₀, n, δ) (Feldman-McMillan-Talwar 2021), n = the number of reports
shuffled (accepted replies), ε₀ = the reports' pure LDP ε. That event is booked
centrally in ``shuffle_ledger`` (label "shuffled round") only when all of:

* ``amplification="fmt"``;
* ``reports_are_ldp=True``: the operator asserts that every client's declared ε
  is LDP with respect to its *whole* local data and that all clients run the
  same randomizer (e.g. local update noise on a clipped update). Record-level
  DP (functional mechanism, DP-SGD) is not: FMT needs the randomizer's output on
  any input to be e^{ε₀}-close to its output on any other input;
* every accepted reply declared events that are pure ε-DP as a whole
  (``basic_pure_epsilon``, summed within the round), all replies declared the
  same events and carry the same weight (a weight travelling with the segments
  is part of the report: unequal ones identify their sender);
* every earlier train round was booked this way too (otherwise the shuffle
  ledger is not a complete account and is no longer used).

ε₀ = the largest declared pure ε of the round. Each round's event is taken at
δ_r = ``shuffle_round_delta``; by default δ_r = δ/(2T) with δ the shuffle
ledger's target and T the planned rounds (``planned_rounds``, else the
``num_rounds`` given to :meth:`start`), so T rounds spend at most T·δ_r = δ/2 of
the target on the events themselves and leave δ/2 to their composition; past T
rounds the composed ε grows and eventually becomes infinite (reported as such).
Without either (a custom round loop), δ_r = δ: one round is reported exactly,
two or more compose to an infinite ε at δ (logged once).

``amplification="paper"`` also reports the paper's ε₀/m (m layers) as
``shuffle/epsilon-paper``, with a WARNING every round: it is **not** a DP bound
(the appendix's mixture argument bounds one position, not the joint output in
which every layer of every client still appears) and it is never booked.

Train metrics: FedAvg's metric aggregation of the accepted replies, plus
``shuffle/layers`` (m), ``shuffle/epsilon0`` (ε₀; inf
if some reply declared no finite pure ε), ``shuffle/epsilon`` and
``shuffle/delta``: ``shuffle_ledger``'s composed ε when every round was
amplified, else the clients' own worst ε from ``self.ledger`` (no amplification
claimed; the reason is logged once at INFO). ``shuffle/reports`` (n, the number of accepted
reports) stays in the server log and :attr:`~.template.AccountedRound.server_figures`.

Not covered by any figure here: the clients' train metrics, which reach the
server unshuffled (not accounted, as elsewhere in this package).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any, Optional, Unpack

from dp_accounting.dp_event import DpEvent, NonPrivateDpEvent
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from ..rounds.options import AccountingOptions
from ..declarations import Declaration
from ..privacy.accounting.relations import convert_event
from ..layer_shuffler import LayerShuffler, layer_groups
from ..privacy import PrivacyLedger
from ..privacy.accounting.accountants import basic_pure_epsilon
from ..privacy.accounting.events import event_key
from ..privacy.analyses.shuffle import shuffle_amplified_event
from ..privacy.validation import check_delta, check_int
from .accounted_fedavg import AccountedFedAvg, MetricsAggregationFn, fedavg_arguments
from ..rounds.template import Booking, RoundRelease, Screened
from ..rounds.metrics import aggregate_reply_metrics
from ..rounds.reply_screening import metric_scalar, records_of, reply_arrays
from ..rounds.streaming_aggregation import NonFiniteReplies, WeightedMean, non_finite_records

AMPLIFICATIONS: tuple[str, ...] = ("fmt", "none", "paper")
UNAMPLIFIED_LABEL = "round not amplified"
Segment = tuple[tuple[str, Array], ...]


@dataclass(frozen=True)
class _Declared:
    """What one reply declared: its pure ε₀ (None unless finite pure ε-DP) and its events' keys."""

    epsilon0: Optional[float]
    signature: tuple[str, ...]


class ShuffleAmplifiedFedAvg(AccountedFedAvg):
    """AccountedFedAvg whose accepted updates are layer-wise shuffled before averaging.

    Args:
        fraction_train ... evaluate_metrics_aggr_fn: FedAvg's, in FedAvg's order; the accounting
            options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`) keyword-only, like every
            argument below.
        shuffler: the :class:`LayerShuffler` (default: OS-entropy randomness).
        layer_of: key → layer name (default: the part before the last ``.``).
        amplification: ``"fmt"`` (sound, see the module docstring), ``"none"``,
            or ``"paper"`` (also reports the paper's non-DP ε₀/m).
        reports_are_ldp: the operator asserts the clients' declared ε is LDP w.r.t.
            their whole local data, from one common randomizer.
        shuffle_ledger: central ledger of the shuffled rounds (default
            ``PrivacyLedger(1e-5, neighboring_relation="replace_one")``; FMT is a
            replace-one bound, so another relation is refused).
        shuffle_round_delta: δ of each round's FMT event (default: δ/(2T), see the
            module docstring).
        planned_rounds: T for that default (default: ``num_rounds`` of :meth:`start`).
    """

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Optional[MetricsAggregationFn] = None,
        evaluate_metrics_aggr_fn: Optional[MetricsAggregationFn] = None,
        *,
        shuffler: Optional[LayerShuffler] = None,
        layer_of: Optional[Callable[[str], str]] = None,
        amplification: str = "fmt",
        reports_are_ldp: bool = False,
        shuffle_ledger: Optional[PrivacyLedger] = None,
        shuffle_round_delta: Optional[float] = None,
        planned_rounds: Optional[int] = None,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        if amplification not in AMPLIFICATIONS:
            raise ValueError(f"amplification must be one of {AMPLIFICATIONS}, got {amplification!r}")
        super().__init__(
            **fedavg_arguments(locals()),
            **accounting,
        )
        self.shuffler = shuffler if shuffler is not None else LayerShuffler()
        self.layer_of = layer_of
        self.amplification = amplification
        self.reports_are_ldp = bool(reports_are_ldp)
        self.shuffle_ledger = _shuffle_ledger(
            self.ledger_store.claim(  # persisted with the main ledger
                "shuffle", shuffle_ledger, lambda: _shuffle_ledger(None)
            )
        )
        self._explicit_round_delta = (
            None if shuffle_round_delta is None else _round_delta(shuffle_round_delta, self.shuffle_ledger)
        )
        self.planned_rounds = None if planned_rounds is None else check_int("planned_rounds", planned_rounds, minimum=1)
        self._logged: set[str] = set()
        self._unamplified: Optional[str] = None
        if self.ledger.clients and not self.shuffle_ledger.rounds():
            self._unamplified = "the client ledger holds earlier rounds that the shuffle ledger does not cover"
        elif any(label == UNAMPLIFIED_LABEL for _, _, label in self.shuffle_ledger.events()):
            self._unamplified = "a round before the restart was not amplified"

    @property
    def shuffle_round_delta(self) -> float:
        """δ_r of each round's FMT event: the explicit one, else δ/(2T), else δ (see the module docstring)."""
        if self._explicit_round_delta is not None:
            return self._explicit_round_delta
        if self.planned_rounds is not None:
            return self.shuffle_ledger.target_delta / (2 * self.planned_rounds)
        return self.shuffle_ledger.target_delta

    def start(self, grid: Any, initial_arrays: ArrayRecord, num_rounds: int = 3, *args: Any, **kwargs: Any) -> Any:
        """Flower's ``Strategy.start``; ``num_rounds`` becomes T of the default round δ unless given."""
        if self.planned_rounds is None:
            self.planned_rounds = check_int("num_rounds", num_rounds, minimum=1)
        return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """Split into layers, shuffle with the weights, forget the senders, average per layer; the FMT event
        of the round (or the loss of amplification) is booked in ``shuffle_ledger``."""
        result, replies = screened.finite(self._shuffle_and_average)
        if result is None:
            return RoundRelease()
        arrays, metrics, weights, layers = result
        declared = [_declared_epsilon(screened.declarations.get(id(r), [])) for r in replies]
        figures, bookings = self._shuffle_metrics(server_round, declared, weights, layers)
        for key, value in figures.items():
            metrics[key] = float(value)
        # n, the number of reports, moves with who replied
        return RoundRelease(arrays, metrics, bookings, ledger_figures=self._shuffle_epsilon).keep_on_server(
            "shuffle/reports"
        )

    def _shuffle_and_average(self, replies: list[Message]) -> tuple[ArrayRecord, MetricRecord, list[float], int]:
        reports, weights, keys = split_into_layers([r.content for r in replies], self.weighted_by_key, self.layer_of)
        shuffled, shuffled_weights = self.shuffler.shuffle(reports, weights)
        mean = layer_sums(shuffled, shuffled_weights)
        if not mean.is_finite():  # found before anything is booked: those replies are rejected, the rest retried
            bad = non_finite_records([reply_arrays(r) for r in replies])
            if bad:
                raise NonFiniteReplies(bad)
        arrays = mean.result(keys)
        metrics = aggregate_reply_metrics(
            self.train_metrics_aggr_fn, [r.content for r in replies], self.weighted_by_key
        )
        return arrays, metrics, weights, len(reports[0])

    def _shuffle_metrics(
        self, server_round: int, declared: list[Optional[_Declared]], weights: list[float], m: int
    ) -> tuple[dict[str, float], list[Booking]]:
        """The round's FMT event when every condition holds; the ``shuffle/*`` metrics but ε and δ
        (``shuffle/epsilon`` and ``shuffle/delta`` are read from the ledgers once the round is booked)."""
        n, eps0 = len(declared), _worst_epsilon0(declared)
        reason = self._no_amplification_reason(declared, weights, eps0)
        bookings = []
        if reason is None:
            event = shuffle_amplified_event(eps0, n, self.shuffle_round_delta)
            bookings.append(Booking(event, "shuffled round", ledger=self.shuffle_ledger))
        else:
            if self._unamplified is None and self.shuffle_ledger.rounds():  # persisted, so that after a restart
                # the earlier amplified rounds are not claimed as the whole account
                bookings.append(Booking(NonPrivateDpEvent(), UNAMPLIFIED_LABEL, ledger=self.shuffle_ledger))
            self._unamplified = self._unamplified or reason
            self._log_once(INFO, f"shuffle/epsilon claims no amplification: {reason}")
        metrics = {"shuffle/reports": n, "shuffle/layers": m, "shuffle/epsilon0": eps0}
        if self.amplification == "paper":
            metrics["shuffle/epsilon-paper"] = eps0 / m
            log(
                WARNING,
                "Round %d: shuffle/epsilon-paper = epsilon0/m = %.4g is the DELM paper's claim, NOT a "
                "differential-privacy bound (every layer still reaches the analyst); it is never booked.",
                server_round,
                eps0 / m,
            )
        return metrics, bookings

    def _no_amplification_reason(
        self, declared: list[Optional[_Declared]], weights: list[float], eps0: float
    ) -> Optional[str]:
        """Why this round's shuffle cannot be booked as FMT-amplified (None if it can)."""
        if self.amplification != "fmt":
            return f"amplification={self.amplification!r}"
        if not self.reports_are_ldp:
            return (
                "reports_are_ldp=False (record-level DP such as DP-SGD or the functional mechanism is "
                "not LDP w.r.t. a client's whole data, and shuffling does not amplify it)"
            )
        if self._unamplified is not None:
            return f"an earlier round was not amplified ({self._unamplified})"
        if not math.isfinite(eps0):
            return "a shuffled reply declared no finite pure epsilon (approximate-DP, non-private or no declaration)"
        if len({d.signature for d in declared if d is not None}) > 1:
            return "the shuffled replies declared different mechanisms (FMT needs one common randomizer)"
        if len(set(weights)) > 1:
            return "the shuffled replies' weights differ (a weight travelling with the segments identifies its sender)"
        return None

    def _shuffle_epsilon(self) -> dict[str, float]:
        """``shuffle/epsilon`` and ``shuffle/delta``: the shuffle ledger's, or the clients' own worst."""
        if self._unamplified is not None:
            return {"shuffle/epsilon": self.ledger.epsilon(), "shuffle/delta": self.ledger.target_delta}
        eps = self.shuffle_ledger.epsilon()
        if not math.isfinite(eps):
            self._log_once(
                WARNING,
                "the shuffle ledger's composed epsilon is infinite: the rounds' delta add up to "
                "its target delta; pass planned_rounds or a smaller shuffle_round_delta",
            )
        return {"shuffle/epsilon": eps, "shuffle/delta": self.shuffle_ledger.target_delta}

    def _log_once(self, level: int, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log(level, "%s", message)


def split_into_layers(
    contents: Sequence[RecordDict], weighted_by_key: str, layer_of: Optional[Callable[[str], str]] = None
) -> tuple[list[list[Segment]], list[float], list[str]]:
    """Reports of (key, Array) segments per layer, their weights, and the first reply's key order.

    Only the replies' contents are read: the reports carry no node id.
    """
    keys = list(records_of(contents[0], ArrayRecord)[0].keys())
    groups = list(layer_groups(keys, layer_of).values())
    reports, weights = [], []
    for content in contents:
        arrays = records_of(content, ArrayRecord)[0]
        reports.append([tuple((key, arrays[key]) for key in group) for group in groups])
        weights.append(metric_scalar(records_of(content, MetricRecord)[0][weighted_by_key]))
    return reports, weights, keys


def layer_sums(shuffled: Sequence[Sequence[Segment]], shuffled_weights: Sequence[Sequence[float]]) -> WeightedMean:
    """Every shuffled segment added with its own weight into one streaming accumulator per key."""
    mean = WeightedMean()
    for report, report_weights in zip(shuffled, shuffled_weights):
        for segment, weight in zip(report, report_weights):
            for key, array in segment:
                mean.add(key, array, weight)
    return mean


def weighted_layer_mean(
    shuffled: Sequence[Sequence[Segment]], shuffled_weights: Sequence[Sequence[float]], keys: Sequence[str]
) -> ArrayRecord:
    r"""Σ_r w̃^j_r x̃^j_r / Σ_r w̃^j_r per key, streamed in place (payloads read zero-copy, never stacked).

    Floating arrays keep their dtype; other dtypes come back as float64, as in FedAvg.
    """
    return layer_sums(shuffled, shuffled_weights).result(keys)


def _declared_epsilon(declarations: list[Declaration]) -> _Declared:
    """A reply's declared pure ε₀ (sum over its events; None unless every one is pure ε-DP) and event keys."""
    if not declarations:
        return _Declared(None, ())
    try:
        events = [_as_replace_one(d) for d in declarations]
        signature = tuple(sorted(event_key(e) for e in events))
    except (ValueError, TypeError):
        return _Declared(None, ())
    parts = [basic_pure_epsilon(e) for e in events]
    finite_parts = [p for p in parts if p is not None]
    if not parts or len(finite_parts) != len(parts):
        return _Declared(None, signature)
    total = float(sum(finite_parts))
    return _Declared(total if math.isfinite(total) and total > 0 else None, signature)


def _as_replace_one(declaration: Declaration) -> DpEvent:
    """The declared event under replacement, the relation the FMT local randomiser ε₀ is defined for."""
    if declaration.replace_one_event is not None:
        return declaration.replace_one_event
    return convert_event(declaration.event, declaration.neighboring_relation, "replace_one")


def _worst_epsilon0(declared: Sequence[Optional[_Declared]]) -> float:
    """max ε₀ over the shuffled replies; inf if one declared no finite pure ε."""
    return max(d.epsilon0 if d is not None and d.epsilon0 is not None else math.inf for d in declared)


def _shuffle_ledger(ledger: Optional[PrivacyLedger]) -> PrivacyLedger:
    if ledger is None:
        return PrivacyLedger(1e-5, neighboring_relation="replace_one")
    if ledger.neighboring_relation != "replace_one":
        raise ValueError(
            "shuffle_ledger must use neighboring_relation='replace_one': the FMT shuffle bound is "
            f"for replacing one client's data, got {ledger.neighboring_relation!r}"
        )
    return ledger


def _round_delta(delta: Optional[float], ledger: PrivacyLedger) -> float:
    if delta is None:
        return ledger.target_delta
    value = check_delta(delta, "shuffle_round_delta")
    if value > ledger.target_delta:
        raise ValueError(
            f"shuffle_round_delta={value:g} exceeds the shuffle ledger's target delta {ledger.target_delta:g}"
        )
    return value


__all__ = ["AMPLIFICATIONS", "ShuffleAmplifiedFedAvg", "layer_sums", "split_into_layers", "weighted_layer_mean"]
