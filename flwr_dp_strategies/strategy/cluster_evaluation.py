"""Cluster-score evaluation of (Laplace-protected) client inference results (seed 000).

Needs its client counterpart: each ClientApp's evaluate function returns its inference
result (e.g. the mean softmax output) as an ArrayRecord ``"inference"`` in the reply, and
adds :class:`client_mods.LaplaceInferenceMod` to its mods
(``@app.evaluate(mods=[LaplaceInferenceMod()])``). Without them nothing is scored
(``cluster/*`` read 0.0 and ``cluster/missing`` counts the replies) and the first such
round logs one WARNING saying what to add. Every other attribute (``fraction_train``,
``weighted_by_key``, ...) is read from the wrapped strategy.

:class:`ClusterEvaluation` wraps any Message-API strategy (training and the
wrapped strategy's own evaluation are unchanged) and adds MindSpore's
unsupervised evaluation to every evaluate round:

1. ``configure_evaluate`` tells clients the privacy mode through the evaluate
   config: ``privacy-eval-type`` (``NOT_ENCRYPT`` | ``LAPLACE``), ``laplace-eval-eps``
   and ``eval-type``; :class:`client_mods.LaplaceInferenceMod` reads them.
2. ``aggregate_evaluate`` (the accounted round,
   :class:`~flwr_dp_strategies.rounds.template.AccountedRound`, whose release is
   :meth:`ClusterEvaluation.release_evaluate`) screens each reply on its own, through the package's
   one screening path (:mod:`flwr_dp_strategies.rounds.reply_screening`): identity, one MetricRecord with a
   finite weight in (0, ``max_weight``] and finite metrics (as the wrapped
   strategy's evaluation needs), then the inference result (ArrayRecord
   ``inference_key``, all its arrays concatenated to one point, as MindSpore does):
   not a readable array of a real dtype (complex, string: ``shape``), empty or of
   another length than expected (``shape``), NaN/inf (``non-finite``) or a value
   beyond ``max_inference_abs`` (``values``; default 1e6, see
   :data:`.reply_screening.MAX_INFERENCE_ABS`: the points are probability vectors
   plus Laplace noise) is rejected and counted. The expected length is
   ``num_classes`` when given (recommended). Without it, the length is pinned by
   the first evaluate round whose valid points all have one length (a round whose
   points disagree is not scored, ``cluster/length-mismatch`` = 1, and nobody is
   rejected for length): no majority vote, so no tie can be resolved toward
   attackers, and after pinning each reply is judged alone. A reply without a
   point is kept for the wrapped strategy's evaluation but not scored
   (``cluster/missing``), so an unchanged app keeps its evaluation; Laplace
   declarations are booked in the ledger per node. The wrapped strategy gets the
   accepted replies only, and its own rejection counts are added to these
   (never overwritten) in :attr:`rejections`. A wrapped plain Flower ``FedAvg`` evaluation is computed by
   :func:`.metrics.aggregate_reply_metrics` (same arithmetic, per key over the
   replies carrying it) instead of its consistency check, which would abort on
   honest replies with different metric keys.
3. Up to ``cluster_client_num`` accepted points are scored with scikit-learn on
   labels = argmax (:func:`flwr_dp_strategies.cluster_scores.cluster_scores`):
   ``cluster/silhouette``, ``cluster/calinski-harabasz``, ``cluster/davies-bouldin``,
   ``cluster/labels``, and ``unsupervised-eval`` = the configured ``eval-type``'s score
   (MindSpore's metric). ``cluster/points``, ``cluster/missing`` and ``cluster/length-mismatch``
   (counts of the replies) stay in the server log and
   :attr:`~.template.AccountedRound.server_figures`.

Failed replies (a SuperNode that died mid-round) are skipped, logged and counted
(reason ``error``) with the rejected ones in :attr:`rejections` (training through a
wrapped strategy with a ledger: its counts), never in the round's metrics (see
:mod:`flwr_dp_strategies.rounds.client_accounting`); nothing is booked for them, and the round is scored
with the others.

Training is the wrapped strategy's, called inside :meth:`ClusterEvaluation.release_train`. A
wrapped strategy with a ledger gets every train reply unread and screens and books it in its own
round. Training through a wrapped strategy *without* a ledger (a plain ``FedAvg``) is
screened here (train screening of :mod:`flwr_dp_strategies.rounds.reply_screening` against the arrays
sent; the wrapped strategy gets the accepted replies; a plain ``FedAvg``'s
aggregation is computed without its aborting consistency check). It aggregates
raw updates that nobody accounts: every node whose train reply reaches it is booked ``NonPrivateDpEvent`` (label ``update/unaccounted (non-private)``) in
this ledger, so ``privacy/epsilon`` reads inf, never a finite figure that only
covers the evaluation (issue 16, D9); the train metrics then carry ``privacy/*``.
``book_unaccounted_training=False`` is the operator's explicit statement that
those training releases are accounted elsewhere (or are not of the data this
ledger protects): nothing is booked for them, ``privacy/epsilon`` then covers the
evaluate-phase releases only, and a WARNING says so once.

The server's scores are post-processing of the clients' ε-LDP releases, so they
spend nothing more. An inference result that arrives *without* a declared
release (``NOT_ENCRYPT``, or a client without the mod) is booked as a
``NonPrivateDpEvent``: that client's ε is reported as infinite, never as 0.
Points are scored in node-id order (at most ``cluster_client_num``) and kept in
``points_history`` (one ``{node_id: point}`` per round) with ``scores_history``. Run-config keys (mirroring the seed's yaml) are read by
:meth:`ClusterEvaluation.from_run_config`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from logging import WARNING
from typing import Any, Optional, Unpack

import numpy as np
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.common.logger import log
from flwr.serverapp.strategy import FedAvg, Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from ..rounds.options import AccountingOptions
from ..cluster_scores import EVAL_TYPES, METRIC_NAMES, check_eval_type, cluster_scores
from ..privacy.validation import check_epsilon, check_int
from ..declarations import Declaration
from ..rounds.client_accounting import ContentCheck, replies_already_logged
from ..rounds.client_metrics import AccountedMetrics, check_evaluate_metrics, release_evaluate_metrics
from ..rounds.metrics import aggregate_reply_metrics, failed_replies
from ..rounds.reply_screening import (
    MAX_INFERENCE_ABS,
    ArraySpec,
    array_spec,
    check_weight,
    decode_real,
    named_record,
    screen_train_content,
)
from ..rounds.template import AccountedRound, Booking, RoundRelease, Screened
from ..wire import CONFIG_LAPLACE_EVAL_EPS, CONFIG_PRIVACY_EVAL_TYPE

PRIVACY_EVAL_TYPES = ("NOT_ENCRYPT", "LAPLACE")
UNPROTECTED_LABEL = "inference-results/unprotected"
UNACCOUNTED_TRAIN_LABEL = "update/unaccounted (non-private)"
RUN_CONFIG_KEYS = {
    CONFIG_PRIVACY_EVAL_TYPE: "privacy_eval_type",
    CONFIG_LAPLACE_EVAL_EPS: "laplace_eval_eps",
    "cluster-client-num": "cluster_client_num",
    "eval-type": "eval_type",
}


class ClusterEvaluation(AccountedRound, Strategy):
    """Wrap ``strategy``; score the clients' inference results by clustering every evaluate round.

    Clients must return an ArrayRecord ``inference_key`` from evaluate and run
    :class:`client_mods.LaplaceInferenceMod` (see the module docstring). Attributes this class
    does not have (``fraction_train``, ``weighted_by_key``, ``train_metrics_aggr_fn``, ...) are
    read from ``strategy``.

    Args:
        strategy: any Message-API strategy (FedAvg, AccountedFedAvg, ...).
        eval_type: ``SILHOUETTE_SCORE`` | ``CALINSKI_HARABASZ_SCORE`` |
            ``DAVIES_BOULDIN_SCORE`` | ``NOT_EVAL`` (no scoring).
        privacy_eval_type: ``LAPLACE`` (clients add noise) or ``NOT_ENCRYPT``.
        laplace_eval_eps: ε in (0, inf) sent to clients in LAPLACE mode.
        cluster_client_num: at most this many points are scored per round (>= 3).
        inference_key: ArrayRecord key of the inference result in replies.
        num_classes: the inference vectors' length (None: pinned by the first round whose
            points agree, see the module docstring).
        max_inference_abs: largest accepted |value| of an inference vector, > 0.
        book_unaccounted_training: book the train replies of a wrapped strategy without a
            ledger as non-private (default True; see the module docstring).
        **accounting: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`). A
            wrapped accounting strategy's ledgers and file are shared (one ``ledger_store``): give ``ledger_path``
            to either (or the same to both), a ledger to one of them only. ``max_weight`` bounds an evaluate
            reply's ``weighted_by_key`` (default: the wrapped strategy's, else 1e9). ``evaluate_metrics`` applies
            and ``max_reply_bytes`` apply when the wrapped strategy is not one of this package's (a Flower FedAvg,
            ...); a wrapped strategy of this package releases its own metrics and screens its own train replies
            (give it ``evaluate_metrics`` and ``max_reply_bytes``).
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        eval_type: str = "SILHOUETTE_SCORE",
        privacy_eval_type: str = "LAPLACE",
        laplace_eval_eps: float = 230260.0,
        cluster_client_num: int = 1000,
        inference_key: str = "inference",
        num_classes: Optional[int] = None,
        max_inference_abs: float = MAX_INFERENCE_ABS,
        book_unaccounted_training: bool = True,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise TypeError(
                f"strategy must be a Flower Strategy instance (e.g. FedAvg()), got {type(strategy).__name__} {strategy!r}"
            )
        self.strategy = strategy
        evaluate_metrics = check_evaluate_metrics(accounting.get("evaluate_metrics", AccountedMetrics()))
        if isinstance(strategy, AccountedRound) and evaluate_metrics != AccountedMetrics():
            raise ValueError(
                f"evaluate_metrics must be given to the wrapped {type(strategy).__name__}, not to ClusterEvaluation: "
                "the wrapped strategy releases (and books) its own evaluate metrics"
            )
        if isinstance(strategy, AccountedRound) and accounting.get("max_reply_bytes") is not None:
            raise ValueError(
                f"max_reply_bytes must be given to the wrapped {type(strategy).__name__}, not to ClusterEvaluation: "
                "the wrapped strategy screens its own train replies"
            )
        self.eval_type = "NOT_EVAL" if str(eval_type).upper() == "NOT_EVAL" else check_eval_type(eval_type)
        self.privacy_eval_type = str(privacy_eval_type).upper()
        if self.privacy_eval_type not in PRIVACY_EVAL_TYPES:
            raise ValueError(f"privacy_eval_type must be one of {PRIVACY_EVAL_TYPES}, got {privacy_eval_type!r}")
        self.laplace_eval_eps = check_epsilon(laplace_eval_eps, "laplace_eval_eps")
        self.cluster_client_num = check_int("cluster_client_num", cluster_client_num, minimum=3)
        self.inference_key = inference_key
        # the wrapped strategy's ledgers and file are shared (one store), or its ledger if it has no store
        self.init_accounted_round(wrapped=strategy, **accounting)
        self.num_classes = None if num_classes is None else check_int("num_classes", num_classes, minimum=1)
        self.max_inference_abs = float(max_inference_abs)
        if (
            isinstance(max_inference_abs, bool)
            or not math.isfinite(self.max_inference_abs)
            or self.max_inference_abs <= 0
        ):
            raise ValueError(f"max_inference_abs must be a finite number > 0, got {max_inference_abs!r}")
        self._unaccounted_training = getattr(strategy, "ledger", None) is None and bool(book_unaccounted_training)
        #: the template books a rejected (and an accepted) undeclared train reply of an unaccounted strategy
        self.undeclared_label = UNACCOUNTED_TRAIN_LABEL if self._unaccounted_training else None
        if getattr(strategy, "ledger", None) is None and not book_unaccounted_training:
            log(
                WARNING,
                "ClusterEvaluation(book_unaccounted_training=False): the wrapped strategy's training "
                "releases are not booked; privacy/epsilon covers the evaluate-phase releases only",
            )
        self._train_spec: Optional[ArraySpec] = None
        self._decoded: dict[int, np.ndarray] = {}  # id(content) -> inference point, decoded once while screening
        self._inner_counts_logged = False  # the train counts are the wrapped strategy's, logged by it
        self._hinted: set[str] = set()  # counterpart hints already logged (once each)
        self.scores_history: list[dict[str, float]] = []
        self.points_history: list[dict[int, np.ndarray]] = []

    def __getattr__(self, name: str) -> Any:
        """An attribute this wrapper lacks is the wrapped strategy's (``fraction_train``, ...): an app
        that reads its strategy's settings keeps working when wrapped."""
        if name.startswith("__") or name == "strategy":
            raise AttributeError(name)
        try:
            strategy = self.__dict__["strategy"]
        except KeyError:
            raise AttributeError(name) from None
        try:
            return getattr(strategy, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__!r} object (wrapping {type(strategy).__name__}) has no attribute {name!r}"
            ) from None

    @classmethod
    def from_run_config(cls, strategy: Strategy, run_config: Mapping[str, Any], **kwargs: Any) -> "ClusterEvaluation":
        """Build from the seed's run-config keys (``privacy-eval-type``, ``laplace-eval-eps``, ...)."""
        options = {attr: run_config[key] for key, attr in RUN_CONFIG_KEYS.items() if key in run_config}
        if "cluster_client_num" in options:
            options["cluster_client_num"] = int(options["cluster_client_num"])
        if "laplace_eval_eps" in options:
            options["laplace_eval_eps"] = float(options["laplace_eval_eps"])
        return cls(strategy, **{**options, **kwargs})

    # ------------------------------------------------------------------ training: delegated
    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's training configuration."""
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._train_spec = array_spec(arrays)
        return messages

    def _accounts_training(self) -> bool:
        """Whether the wrapped strategy has a ledger: it screens and books its own train replies."""
        return getattr(self.strategy, "ledger", None) is not None

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
        """:meth:`ClientAccountingMixin.screen`, except for the train replies of a wrapped strategy
        with a ledger: they reach it unread (it screens, books and logs them in its own accounted round,
        with their declarations), so every reply is handed on and nothing is counted here."""
        if phase == "train" and self._accounts_training():
            self.__dict__["_screened"] = (int(server_round), phase)
            return list(replies), Counter(), []
        return super().screen(
            server_round, replies, check, phase=phase, undeclared_label=undeclared_label, declared=declared
        )

    def train_check(self) -> Optional[ContentCheck]:
        """For a wrapped strategy without a ledger: train screening against the arrays sent (identity,
        structure, weight, metrics, keys, shapes, finite values)."""
        spec = self._train_spec
        return lambda content: screen_train_content(content, spec, self._weight_key(), max_weight=self.max_weight)

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """The wrapped strategy's training aggregation.

        A wrapped strategy with a ledger gets every reply and screens and books them itself; its
        rejection counts (or, if it keeps none, the failed replies) become this strategy's
        ``rejections["train"]``. One without a ledger gets only the replies that passed this
        strategy's screening, and every node among them is booked non-private (D9: the undeclared
        ones by the template, under :attr:`undeclared_label`) unless ``book_unaccounted_training=False``.
        """
        if self._accounts_training():
            arrays, metrics = self.strategy.aggregate_train(server_round, screened.replies)
            inner = getattr(self.strategy, "rejections", {}).get("train")
            if inner is not None:  # counted and logged by the wrapped strategy
                screened.rejected.update(inner)
                self._inner_counts_logged = True
            else:
                screened.rejected["error"] += failed_replies(screened.replies, server_round)
            return RoundRelease(arrays, metrics)
        bookings = []
        if self._unaccounted_training:  # the declared ones: the template books the undeclared ones
            bookings = [
                Booking(NonPrivateDpEvent(), UNACCOUNTED_TRAIN_LABEL, client=int(r.metadata.src_node_id))
                for r in screened.accepted
                if id(r) not in screened.undeclared
            ]
        arrays, metrics = self._wrapped_train(server_round, screened.accepted) if screened.accepted else (None, None)
        return RoundRelease(arrays, metrics, bookings)

    def note_rejections(
        self, rejected: Counter[str], phase: Optional[str] = None, server_round: Optional[int] = None
    ) -> None:
        """:meth:`ClientAccountingMixin.note_rejections`; counts a wrapped accounting strategy logged already
        are kept without a second log line."""
        if self._inner_counts_logged:
            self._inner_counts_logged = False
            screened_phase = self.__dict__.get("_screened", (None, None))[1]
            self.rejections[phase or screened_phase or "train"] = Counter({k: int(n) for k, n in rejected.items() if n})
            return
        super().note_rejections(rejected, phase, server_round)

    def _wrapped_train(
        self, server_round: int, accepted: list[Message]
    ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """The wrapped strategy's training aggregation of screened replies.

        Flower's own ``FedAvg.aggregate_train`` (not overridden) is computed with its own
        ``aggregate_arrayrecords`` (the same arrays, bit for bit) and
        :func:`.metrics.aggregate_reply_metrics`: its consistency check would abort the round
        on honest replies with different metric keys.
        """
        strategy = self.strategy
        if isinstance(strategy, FedAvg) and type(strategy).aggregate_train is FedAvg.aggregate_train:
            contents = [r.content for r in accepted]
            return (
                aggregate_arrayrecords(contents, strategy.weighted_by_key),
                aggregate_reply_metrics(strategy.train_metrics_aggr_fn, contents, strategy.weighted_by_key),
            )
        with replies_already_logged():  # logged by this strategy's screening
            return strategy.aggregate_train(server_round, accepted)

    # ------------------------------------------------------------------ evaluation
    def instruct_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's evaluate messages, with the privacy mode in their config."""
        config = ConfigRecord(dict(config))
        config[CONFIG_PRIVACY_EVAL_TYPE] = self.privacy_eval_type
        config[CONFIG_LAPLACE_EVAL_EPS] = float(self.laplace_eval_eps)
        config["eval-type"] = self.eval_type
        messages = list(self.strategy.configure_evaluate(server_round, arrays, config, grid))
        return messages

    def evaluate_check(self) -> Optional[ContentCheck]:
        """An evaluate reply's weight in (0, ``max_weight``], finite metrics, then its inference point (decoded
        once, kept for :meth:`release_evaluate`; see the module docstring)."""
        decoded: dict[int, np.ndarray] = {}
        self._decoded = decoded
        return lambda content: self._check(content, decoded)

    def release_evaluate(self, server_round: int, screened: Screened) -> RoundRelease:
        """Score the inference results of the accepted replies, then the wrapped evaluation; bookings: a
        ``NonPrivateDpEvent`` for each inference result that came without a declaration."""
        decoded, accepted = self._decoded, screened.accepted
        with_points = [r for r in accepted if decoded.get(id(r.content)) is not None]
        if accepted and not with_points:
            self._hint_once(
                "inference",
                "ClusterEvaluation: none of the %d evaluate replies of round %d carries an "
                "ArrayRecord %r, so nothing is scored (cluster/* read 0.0). Each ClientApp's evaluate "
                "function must return its inference result (e.g. the mean softmax output) as "
                "ArrayRecord %r in the reply and add client_mods.LaplaceInferenceMod to its mods: "
                "@app.evaluate(mods=[LaplaceInferenceMod()])",
                len(accepted),
                server_round,
                self.inference_key,
                self.inference_key,
            )
        bookings = self._unprotected_bookings(server_round, [r for r in with_points if id(r) in screened.undeclared])
        missing = len(accepted) - len(with_points)
        mismatch = self._pin_length(with_points, decoded)
        if mismatch:
            with_points = []
        metrics, wrapped_bookings = self._wrapped_evaluate(server_round, screened)
        bookings += wrapped_bookings
        if accepted:  # the wrapped strategy's own rejections are added, never overwritten
            screened.rejected.update(Counter(getattr(self.strategy, "rejections", {}).get("evaluate", {})))
        metrics = MetricRecord() if metrics is None else metrics
        metrics["cluster/missing"] = float(missing)
        metrics["cluster/length-mismatch"] = float(mismatch)
        if self.eval_type != "NOT_EVAL":
            for key, value in self._score(with_points, decoded).items():
                metrics[key] = value
        # counts of the replies with (and without) an inference point move with who replied
        return RoundRelease(metrics=metrics, bookings=bookings).keep_on_server(
            "cluster/missing", "cluster/length-mismatch", "cluster/points"
        )

    def _wrapped_evaluate(self, server_round: int, screened: Screened) -> tuple[Optional[MetricRecord], list[Booking]]:
        """The clients' evaluate metrics and their bookings: a wrapped strategy of this package releases (and books)
        its own; for any other (Flower's FedAvg, ...) they are released as ``evaluate_metrics`` says
        (:mod:`flwr_dp_strategies.rounds.client_metrics`), never as Flower's un-noised mean by default."""
        strategy, accepted = self.strategy, screened.accepted
        if isinstance(strategy, AccountedRound):
            if not accepted:
                return None, []
            with replies_already_logged():  # logged by this strategy's screening
                return strategy.aggregate_evaluate(server_round, accepted), []
        return release_evaluate_metrics(
            self.evaluate_metrics,
            [r.content for r in accepted],
            denominator=self.evaluated_nodes(server_round, screened),
            weighted_by_key=getattr(strategy, "weighted_by_key", "num-examples"),
            aggregation=getattr(strategy, "evaluate_metrics_aggr_fn", None),
            generator=self._metrics_rng(),
            withheld_logged=self._withheld_logged,
            all_declared=not any(id(r) in screened.undeclared for r in accepted),
        )

    def _pin_length(self, with_points: list[Message], decoded: dict[int, np.ndarray]) -> bool:
        """Without ``num_classes``: pin the length once the valid points of a round agree; True if they do not."""
        if self.num_classes is not None or not with_points:
            return False
        lengths = {decoded[id(r.content)].size for r in with_points}
        if len(lengths) > 1:
            log(
                WARNING,
                "ClusterEvaluation: inference vectors of lengths %s in one round; not scored until "
                "they agree (pass num_classes to judge each reply alone)",
                sorted(lengths),
            )
            return True
        self.num_classes = lengths.pop()
        return False

    def _hint_once(self, key: str, message: str, *args: object) -> None:
        """One WARNING per missing counterpart and strategy instance."""
        if key not in self._hinted:
            self._hinted.add(key)
            log(WARNING, message, *args)

    def _unprotected_bookings(self, server_round: int, replies: list[Message]) -> list[Booking]:
        """An inference result sent without a declared release is not DP: a ``NonPrivateDpEvent`` (ε = inf)."""
        if replies and self.privacy_eval_type == "LAPLACE":
            self._hint_once(
                "laplace",
                "ClusterEvaluation: %d inference results of round %d arrived without a Laplace "
                "declaration and are booked as non-private (epsilon = inf). Add "
                "client_mods.LaplaceInferenceMod to each ClientApp's evaluate mods: "
                "@app.evaluate(mods=[LaplaceInferenceMod()])",
                len(replies),
                server_round,
            )
        return [Booking(NonPrivateDpEvent(), UNPROTECTED_LABEL, client=int(r.metadata.src_node_id)) for r in replies]

    def _point(self, content: RecordDict) -> tuple[Optional[np.ndarray], Optional[str]]:
        """The reply's inference point (float64) and None, or (None, reason); (None, None) if it has none."""
        record = named_record(content, self.inference_key, ArrayRecord)
        if record is None:
            return None, None
        parts = []
        for arr in record.values():
            values = decode_real(arr)
            if values is None:
                return None, "shape"
            parts.append(values.ravel())
        point = np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)
        if point.size == 0 or (self.num_classes is not None and point.size != self.num_classes):
            return None, "shape"
        if not np.isfinite(point).all():
            return None, "non-finite"
        if float(np.abs(point).max()) > self.max_inference_abs:
            return None, "values"
        return point, None

    def _check(self, content: RecordDict, decoded: dict[int, np.ndarray]) -> Optional[str]:
        reason = check_weight(content, self._weight_key(), self.max_weight)
        if reason is not None:
            return reason
        point, reason = self._point(content)
        if point is not None:
            decoded[id(content)] = point
        return reason

    def _weight_key(self) -> str:
        return str(getattr(self.strategy, "weighted_by_key", "num-examples"))

    def _score(self, accepted: list[Message], decoded: dict[int, np.ndarray]) -> dict[str, float]:
        chosen = sorted(accepted, key=lambda r: r.metadata.src_node_id)[: self.cluster_client_num]
        points = {r.metadata.src_node_id: decoded[id(r.content)] for r in chosen}
        self.points_history.append(points)
        x = np.stack(list(points.values())) if points else np.zeros((0, 1))
        scores = cluster_scores(x)
        self.scores_history.append(scores)
        out = {f"cluster/{name}": value for name, value in scores.items()}
        out["unsupervised-eval"] = scores[METRIC_NAMES[self.eval_type]]
        return out

    def summary(self) -> None:
        """The wrapped strategy's summary."""
        self.strategy.summary()

    def __repr__(self) -> str:
        return (
            f"ClusterEvaluation({self.strategy!r}, eval_type={self.eval_type}, "
            f"privacy_eval_type={self.privacy_eval_type}, laplace_eval_eps={self.laplace_eval_eps})"
        )


__all__ = ["ClusterEvaluation", "EVAL_TYPES", "PRIVACY_EVAL_TYPES", "RUN_CONFIG_KEYS"]
