"""Cluster-score evaluation of (Laplace-protected) client inference results (seed 000).

:class:`ClusterEvaluation` wraps any Message-API strategy (training and the
wrapped strategy's own evaluation are unchanged) and adds MindSpore's
unsupervised evaluation to every evaluate round:

1. ``configure_evaluate`` tells clients the privacy mode through the evaluate
   config: ``privacy-eval-type`` (``NOT_ENCRYPT`` | ``LAPLACE``), ``laplace-eval-eps``
   and ``eval-type``; :class:`client_mods.LaplaceInferenceMod` reads them.
2. ``aggregate_evaluate`` screens each reply's inference result (ArrayRecord
   ``inference_key``, all its arrays concatenated to one point, as MindSpore does):
   NaN/inf (``non-finite``) or of another length than most replies (``shape``) is
   rejected and counted; a reply without one is kept for the wrapped strategy's
   evaluation but not scored (``cluster/missing``), so an unchanged app keeps its
   evaluation; Laplace declarations are booked in the ledger per node.
3. Up to ``cluster_client_num`` accepted points are scored with scikit-learn on
   labels = argmax (:func:`flwr_dp_strategies.cluster_scores.cluster_scores`):
   ``cluster/silhouette``, ``cluster/calinski-harabasz``, ``cluster/davies-bouldin``,
   ``cluster/points``, ``cluster/labels``, and ``unsupervised-eval`` = the
   configured ``eval-type``'s score (MindSpore's metric).

Failed replies (a SuperNode that died mid-round) are skipped and counted as the
int ``replies/failed`` in the evaluate metrics (and in the train metrics of the
wrapped strategy, added here if it does not report them); nothing is booked for
them, and the round is scored with the others.

The server's scores are post-processing of the clients' ε-LDP releases, so they
spend nothing more. An inference result that arrives *without* a declared
release (``NOT_ENCRYPT``, or a client without the mod) is booked as a
``NonPrivateDpEvent``: that client's ε is reported as infinite, never as 0.
Points are scored in node-id order (at most ``cluster_client_num``) and kept in
``points_history`` (one ``{node_id: point}`` per round) with ``scores_history``. Run-config keys (mirroring the seed's yaml) are read by
:meth:`ClusterEvaluation.from_run_config`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import numpy as np
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ..cluster_scores import EVAL_TYPES, METRIC_NAMES, check_eval_type, cluster_scores
from ..privacy import PrivacyLedger
from ..privacy.validation import check_epsilon, check_int
from .client_accounting import ClientAccountingMixin, undeclared_replies
from .metrics import FAILED_REPLIES_KEY, failed_replies, with_failed_replies
from ..npy_codec import npy_view
from .reply_screening import named_record

PRIVACY_EVAL_TYPES = ("NOT_ENCRYPT", "LAPLACE")
UNPROTECTED_LABEL = "inference-results/unprotected"
RUN_CONFIG_KEYS = {
    "privacy-eval-type": "privacy_eval_type",
    "laplace-eval-eps": "laplace_eval_eps",
    "cluster-client-num": "cluster_client_num",
    "eval-type": "eval_type",
}


class ClusterEvaluation(ClientAccountingMixin, Strategy):
    """Wrap ``strategy``; score the clients' inference results by clustering every evaluate round.

    Args:
        strategy: any Message-API strategy (FedAvg, AccountedFedAvg, ...).
        eval_type: ``SILHOUETTE_SCORE`` | ``CALINSKI_HARABASZ_SCORE`` |
            ``DAVIES_BOULDIN_SCORE`` | ``NOT_EVAL`` (no scoring).
        privacy_eval_type: ``LAPLACE`` (clients add noise) or ``NOT_ENCRYPT``.
        laplace_eval_eps: ε in (0, inf) sent to clients in LAPLACE mode.
        cluster_client_num: at most this many points are scored per round (>= 3).
        inference_key: ArrayRecord key of the inference result in replies.
        ledger, ledger_path, per_client_metrics: as :class:`AccountedFedAvg`; a wrapped
            accounting strategy's ledgers and file are shared (one ``ledger_store``): give
            ``ledger_path`` to either (or the same to both), a ledger to one of them only.
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
        ledger: Optional[PrivacyLedger] = None,
        ledger_path: Optional[str] = None,
        per_client_metrics: bool = False,
    ) -> None:
        self.strategy = strategy
        self.eval_type = "NOT_EVAL" if str(eval_type).upper() == "NOT_EVAL" else check_eval_type(eval_type)
        self.privacy_eval_type = str(privacy_eval_type).upper()
        if self.privacy_eval_type not in PRIVACY_EVAL_TYPES:
            raise ValueError(f"privacy_eval_type must be one of {PRIVACY_EVAL_TYPES}, got {privacy_eval_type!r}")
        self.laplace_eval_eps = check_epsilon(laplace_eval_eps, "laplace_eval_eps")
        self.cluster_client_num = check_int("cluster_client_num", cluster_client_num, minimum=3)
        self.inference_key = inference_key
        # the wrapped strategy's ledgers and file are shared (one store), or its ledger if it has no store
        self._init_accounting(ledger, ledger_path, per_client_metrics, None, wrapped=strategy)
        self.scores_history: list[dict[str, float]] = []
        self.points_history: list[dict[int, np.ndarray]] = []

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
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The wrapped strategy's training configuration."""
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """The wrapped strategy's training aggregation, with ``replies/failed`` if it does not report it."""
        replies = list(replies)
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if metrics is not None and FAILED_REPLIES_KEY in metrics:
            return arrays, metrics
        failed = failed_replies(replies)
        return arrays, (with_failed_replies(metrics, failed) if metrics is not None or failed else None)

    # ------------------------------------------------------------------ evaluation
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The wrapped strategy's evaluate messages, with the privacy mode in their config."""
        config = ConfigRecord(dict(config))
        config["privacy-eval-type"] = self.privacy_eval_type
        config["laplace-eval-eps"] = float(self.laplace_eval_eps)
        config["eval-type"] = self.eval_type
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        """Screen and book the replies, score the inference results, then the wrapped evaluation."""
        replies = list(replies)
        length = self._majority_length(replies)
        undeclared = undeclared_replies(replies)
        decoded: dict[int, np.ndarray] = {}  # id(content) -> point, decoded once while screening
        accepted, rejected = self.screen_and_book(server_round, replies,
                                                  lambda c: self._check(c, length, decoded))
        with_points = [r for r in accepted if decoded.get(id(r.content)) is not None]
        self._book_unprotected(server_round, [r for r in with_points if id(r) in undeclared])
        metrics = self.strategy.aggregate_evaluate(server_round, accepted) if accepted else None
        merged = self.round_metrics(metrics, rejected)
        merged["cluster/missing"] = float(len(accepted) - len(with_points))
        if self.eval_type != "NOT_EVAL":
            for key, value in self._score(with_points, decoded).items():
                merged[key] = value
        return merged

    def _book_unprotected(self, server_round: int, replies: list[Message]) -> None:
        """An inference result sent without a declared release is not DP: book it as such (ε = inf)."""
        for reply in replies:
            self.ledger.record(NonPrivateDpEvent(), server_round=server_round, client=reply.metadata.src_node_id,
                               label=UNPROTECTED_LABEL)
        if replies:
            self.save_ledger()

    def _point(self, content: RecordDict) -> Optional[np.ndarray]:
        record = named_record(content, self.inference_key, ArrayRecord)
        if record is None or len(record) == 0:
            return None
        return np.concatenate([np.asarray(npy_view(arr), dtype=np.float64).ravel() for arr in record.values()])

    def _majority_length(self, replies: list[Message]) -> Optional[int]:
        lengths: Counter[int] = Counter()
        for reply in replies:
            if not reply.has_error() and (record := named_record(reply.content, self.inference_key, ArrayRecord)):
                lengths[sum(int(np.prod(arr.shape)) for arr in record.values())] += 1
        return max(lengths, key=lambda k: (lengths[k], -k)) if lengths else None

    def _check(self, content: RecordDict, length: Optional[int], decoded: dict[int, np.ndarray]) -> Optional[str]:
        try:
            point = decoded[id(content)] = self._point(content)
        except Exception:  # noqa: BLE001 - undecodable arrays are malformed
            return "shape"
        if point is None:
            return None  # no inference result: evaluated by the wrapped strategy, not scored
        if point.size != length:
            return "shape"
        return None if np.isfinite(point).all() else "non-finite"

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
        return (f"ClusterEvaluation({self.strategy!r}, eval_type={self.eval_type}, "
                f"privacy_eval_type={self.privacy_eval_type}, laplace_eval_eps={self.laplace_eval_eps})")


__all__ = ["ClusterEvaluation", "EVAL_TYPES", "PRIVACY_EVAL_TYPES", "RUN_CONFIG_KEYS"]
