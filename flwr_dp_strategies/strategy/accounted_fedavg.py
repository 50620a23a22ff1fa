r"""FedAvg that accounts what its clients release and survives malformed replies.

Drop-in for :class:`flwr.serverapp.strategy.FedAvg`: FedAvg's arguments in FedAvg's
order, plus the keyword-only accounting options (:mod:`flwr_dp_strategies.rounds.options`).
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
metrics are released as every strategy of this package releases them
(``evaluate_metrics``, :mod:`flwr_dp_strategies.rounds.client_metrics`): noised and booked
when declared, withheld otherwise.

A train reply that declares nothing and is *rejected* (NaN, wrong shape, bad
keys, an unreadable declaration, ...) is booked as ``NonPrivateDpEvent`` too: the
server received its raw update all the same.

What it checks and reports: see :mod:`flwr_dp_strategies.rounds.reply_screening` and
:mod:`flwr_dp_strategies.rounds.client_accounting` (train and evaluate replies alike: identity, structure,
finite weights in (0, ``max_weight``], finite metrics, keys, shapes, payload size);
evaluate metrics are released by :mod:`flwr_dp_strategies.rounds.client_metrics`
(with ``evaluate_metrics="flower"`` Flower's arithmetic, per key over the replies that carry it),
never by an unscreened FedAvg call; failed replies (a SuperNode that died mid-round) are
counted in the server's log (reason ``error``) and the round goes on with the others.

Aggregation is streamed (:mod:`flwr_dp_strategies.rounds.streaming_aggregation`): the released model is
FedAvg's :math:`\bar x = \sum_i n_i x_i / \sum_i n_i` per key (``n_i`` = the
``weighted_by_key`` value), each reply's payload read zero-copy and added in place
into one accumulator per key, never stacked. NaN/inf are not scanned for before
aggregating: a non-finite mean reveals them, the offending replies are rejected
(``non-finite``) and the rest is aggregated again, so a well-formed round
reads every value once. A strategy that aggregates differently (layer shuffling,
divergence-based selection, an objective sum) subclasses it and implements only
:meth:`AccountedFedAvg.release_train` (:mod:`flwr_dp_strategies.rounds.template`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..rounds.client_accounting import ContentCheck
from ..rounds.options import split_accounting
from ..rounds.metrics import aggregate_reply_metrics
from ..rounds.reply_screening import (
    ArraySpec,
    array_spec,
    reply_arrays,
    reply_weight,
    screen_train_content,
)
from ..rounds.streaming_aggregation import mean_of_records
from ..rounds.template import AccountedRound, RoundRelease, Screened

NON_PRIVATE_LABEL = "update/undeclared (non-private)"


MetricsAggregationFn = Callable[[list[RecordDict], str], MetricRecord]
FEDAVG_PARAMETERS = (
    "fraction_train",
    "fraction_evaluate",
    "min_train_nodes",
    "min_evaluate_nodes",
    "min_available_nodes",
    "weighted_by_key",
    "arrayrecord_key",
    "configrecord_key",
    "train_metrics_aggr_fn",
    "evaluate_metrics_aggr_fn",
)
"""FedAvg's constructor parameters (Flower 1.41), in order: every FedAvg of this package takes them
first, positionally or by name, with FedAvg's meaning; its own parameters are keyword-only."""


def fedavg_arguments(scope: Mapping[str, Any]) -> dict[str, Any]:
    """FedAvg's arguments picked by name from a subclass constructor's ``locals()``."""
    return {name: scope[name] for name in FEDAVG_PARAMETERS}


class AccountedFedAvg(AccountedRound, FedAvg):
    """FedAvg + reply screening + a ledger of the clients' declared releases.

    Args:
        fraction_train ... evaluate_metrics_aggr_fn: :class:`flwr.serverapp.strategy.FedAvg`'s,
            in FedAvg's order and with its meaning and defaults.
        **kwargs: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`:
            ``ledger``, ``ledger_path``, ``resume``, ``high_water_path``, ``per_client_metrics``,
            ``max_reply_bytes``, ``max_weight``, ``evaluate_metrics``); any other keyword is passed on to the next
            constructor of the MRO, for a FedAvg variant combined
            with this class (``class AccountedFedProx(AccountedFedAvg, FedProx)`` takes
            ``proximal_mu=``); FedAvg itself accepts none.
    """

    undeclared_label = NON_PRIVATE_LABEL
    #: screening reads every value for NaN/inf (True) or the release finds them while it aggregates (False)
    screens_values = False

    # pylint: disable=too-many-arguments
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
        **kwargs: Any,
    ) -> None:
        accounting, flower = split_accounting(kwargs)
        super().__init__(**fedavg_arguments(locals()), **flower)
        self.init_accounted_round(**accounting)
        self._spec: Optional[ArraySpec] = None

    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's configuration; remembers the arrays' keys, shapes and sizes to screen replies."""
        self._spec = array_spec(arrays)
        return super().instruct_train(server_round, arrays, config, grid)

    def train_check(self) -> ContentCheck:
        """Identity and structure of a train reply (:func:`.reply_screening.screen_train_content`); NaN/inf
        are found by :meth:`release_train` while it aggregates, so a well-formed round reads every value once."""
        return lambda content: screen_train_content(
            content,
            self._spec,
            self.weighted_by_key,
            check_values=self.screens_values,
            max_weight=self.max_weight,
        )

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """FedAvg's weighted mean of the accepted replies, streamed (replies found non-finite are rejected and
        the others aggregated again); no noise: the clients' declared releases are booked by screening."""
        result, _ = screened.finite(self.weighted_mean)
        if result is None:
            return RoundRelease()
        arrays, metrics = result
        return RoundRelease(arrays, metrics)

    def weighted_mean(self, replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """FedAvg's weighted mean of ``replies`` (non-empty) and Flower's train-metric aggregation; raises
        :class:`NonFiniteReplies` if some replies hold NaN/inf."""
        arrays = mean_of_records(
            [reply_arrays(r) for r in replies], [reply_weight(r, self.weighted_by_key) for r in replies]
        )
        metrics = aggregate_reply_metrics(
            self.train_metrics_aggr_fn, [r.content for r in replies], self.weighted_by_key
        )
        return arrays, metrics


# reply_arrays and reply_weight live in .reply_screening; re-exported here, where they were public first
__all__ = ["AccountedFedAvg", "FEDAVG_PARAMETERS", "fedavg_arguments", "reply_arrays", "reply_weight"]
