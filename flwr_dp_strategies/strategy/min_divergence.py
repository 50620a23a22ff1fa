r"""ε-DP minimum-divergence exponential sampling aggregation (DELM enhanced scheme, §5.3;
Cao, Chen, Tang & Su, Chinese Journal of Computers 2023).

Per round, for every layer j (the ArrayRecord's keys grouped by ``layer_of``) and
every accepted reply i, the server computes the layer's *divergence* (eq. 14)

.. math::
    dvg_i^j = \frac{1}{size_j} \#\{l \in j : \operatorname{sign}(w_t^{(j)(l)}) \ne
              \operatorname{sign}(w_i^{(j)(l)})\} \in [0, 1],

the fraction of the layer's parameters whose sign the client's new weights
:math:`w_i = w_t - \eta g_i` flip (0 counts as positive: a value is negative iff
it is < 0). Flower replies carry :math:`w_i` itself, so η is not needed. Then
(Algorithm 3, lines 13-17) it picks ``num_selected`` = k replies per layer and
sets each layer of the new global model to the weighted mean (FedAvg's
``weighted_by_key`` weights; the paper's :math:`\frac1k\sum` is the equal-weight
case) of the picked replies' arrays for that layer.

Selection (eqs. 15-16). With ``epsilon`` = ε > 0: k draws without replacement,
each with :math:`P_i^j \propto \exp(-\varepsilon\, dvg_i^j / (2\Delta))`, Δ = 1
(dvg ∈ [0, 1], and replacing one client's update changes only its own utility,
by at most 1). Drawn by Gumbel top-k, which is distributed as k sequential ε-EM
draws (:func:`~flwr_dp_strategies.privacy.mechanisms.exponential.gumbel_top_k`). The paper writes
ε/(2nΔ): its extra 1/n is the same as passing ``epsilon / n`` here. With
``epsilon=None``: the paper's "non-sampling" variant, the k lowest divergences
(ties broken by reply order). With fewer than k accepted replies, all are used
(``selection/k`` < ``selection/k-requested``; ``selection/k`` is in the server log).

Privacy accounting. The selection is computed from the updates the clients
released to the server, so *against the server* it is post-processing of those
releases and adds nothing to :attr:`ledger` (which books, per client, what the
clients declare, as :class:`AccountedFedAvg` does). Its own guarantee is the
paper's ε3 threat model: w.r.t. replacing one client's whole update, protecting
*which replies are picked* from other clients who see the new global model.

Each draw is ε/2-DP and ε/2-bounded-range, not merely ε: replacing client j's
update changes only j's own utility :math:`u_j = -dvg_j^j` (by at most Δ = 1),
never another client's. With :math:`P(i) = e^{\varepsilon u_i/2}/Z`, for an
outcome i ≠ j the numerator is unchanged and :math:`Z'/Z \in [e^{-\varepsilon/2},
e^{\varepsilon/2}]`; for i = j numerator and Z move in the same direction, so
:math:`|\ln P(j)/P'(j)| \le \varepsilon/2`. The privacy loss is the constant
:math:`\ln(Z'/Z)` on every outcome but j, where it differs by
:math:`\varepsilon (u_j - u_j')/2`: its range is at most ε/2 (ε/2-bounded range,
Durfee & Rogers 2019), hence ε²/32-zCDP (Cesar & Rogers 2021). The draws without
replacement (Gumbel top-k) are k sequential draws of the same mechanism on the
remaining replies, each with this property. Per round there are m layers × k
such draws, adaptively composed:
``SelfComposedDpEvent(ExponentialMechanismDpEvent(ε/2), k·m)`` is recorded centrally
in :attr:`selection_ledger` (default ``PrivacyLedger(1e-5,
neighboring_relation="replace_one")``) every round with label ``"selection"``
(k is the requested count, so the booking does not depend on the data; fewer
draws cost less). Over T rounds that is T·k·m draws, composed by the ledger
(RDP via ε-bounded range, ε²/8-zCDP per draw, or PLD), never more than the basic
bound T·k·m·ε/2 (k = 5, m = 4, T = 50, ε = 1: 67.4 at δ = 1e-5; booking each draw at
ε, as this class did before, gave 198.5). The paper instead claims ε3 for the whole run, and even ε3/m via
shuffling; neither follows from the mechanism as written. ``epsilon=None`` is not
DP: it records ``NonPrivateDpEvent`` (``selection/epsilon`` = inf).

Caveat: ε_sel bounds what the *choice* reveals. The new global model also
contains the picked updates themselves; their content is protected only by what
the clients released (:attr:`ledger`), not by this selection.

Round metrics: FedAvg's aggregate of all accepted replies' metrics, plus the public
``selection/k-requested`` and ``selection/layers``, ``selection/epsilon`` (the selection
ledger's ε), and the ``privacy/*`` entries of the base class. ``selection/k``,
``selection/candidates`` (the number of accepted replies), ``selection/mean-divergence`` (all
candidates) and ``selection/mean-divergence-selected`` (un-noised statistics of the updates) stay in
the server log and :attr:`~.template.AccountedRound.server_figures` (:data:`SERVER_ONLY`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from logging import WARNING
from typing import Optional, Unpack

import numpy as np
from dp_accounting.dp_event import DpEvent, NonPrivateDpEvent, SelfComposedDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..rounds.options import AccountingOptions
from ..privacy import ExponentialMechanismDpEvent, PrivacyLedger
from ..privacy.mechanisms.exponential import gumbel_top_k
from ..privacy.rng import RngLike, RngSource
from ..privacy.validation import check_epsilon, check_int
from .accounted_fedavg import AccountedFedAvg, MetricsAggregationFn, fedavg_arguments
from ..rounds.template import Booking, RoundRelease, Screened
from ..rounds.metrics import aggregate_reply_metrics
from ..rounds.reply_screening import reply_arrays, reply_weight
from ..rounds.streaming_aggregation import NonFiniteReplies, WeightedMean, all_finite, npy_view
from ..wire import default_layer_of, layer_groups as group_layers

_SIGN_BLOCK = 1 << 16  # reply entries checked for NaN/inf and compared in sign while in cache

SELECTION_LABEL = "selection"
Layers = dict[str, list[str]]


def flip_count(global_negative: np.ndarray, reply: np.ndarray, out: Optional[np.ndarray] = None) -> int:
    """How many entries change sign: ``global_negative`` is ``w_global < 0`` (0 counts as positive).

    ``out``: an optional bool buffer of the same size, reused instead of two temporaries.
    """
    flat = np.asarray(reply).reshape(-1)
    negative = np.less(flat, 0, out=None if out is None else out.reshape(-1))
    return int(np.count_nonzero(np.not_equal(global_negative.reshape(-1), negative, out=negative)))


def finite_flip_count(global_negative: np.ndarray, reply: np.ndarray, scratch: np.ndarray) -> Optional[int]:
    """:func:`flip_count`, or None if ``reply`` holds NaN/inf: one pass over the reply, block by block.

    Each block of the reply (``scratch.size`` entries) is read from memory once and, while
    it is in cache, checked for NaN/inf (:func:`~.streaming_aggregation.all_finite`) and
    compared with the global signs: the finiteness screen costs no extra pass over the
    payload.
    """
    flat, negative = np.asarray(reply).reshape(-1), global_negative.reshape(-1)
    step, flips = scratch.size, 0
    for start in range(0, flat.size, step):
        block = flat[start : start + step]
        if not all_finite(block):
            return None
        flips += flip_count(negative[start : start + step], block, scratch[: block.size])
    return flips


def layer_divergence(global_arrays: Sequence[np.ndarray], reply_arrays: Sequence[np.ndarray]) -> float:
    """Eq. 14 for one layer: the fraction of its parameters whose sign the reply flips (0 if empty)."""
    size = sum(int(np.size(a)) for a in global_arrays)
    flips = sum(flip_count(np.asarray(g) < 0, r) for g, r in zip(global_arrays, reply_arrays, strict=True))
    return flips / size if size else 0.0


def select_low_divergence(
    divergences: np.ndarray, k: int, epsilon: Optional[float], rng: np.random.Generator
) -> np.ndarray:
    """Indices of min(k, n) candidates of one layer, in selection order.

    ``epsilon`` > 0: Gumbel top-k, i.e. sequential draws without replacement with
    P ∝ exp(−ε·dvg/2) (eq. 16 with Δ = 1). ``epsilon=None``: the k smallest
    divergences, ties broken by index (stable sort).
    """
    dvg = np.asarray(divergences, dtype=np.float64)
    picks = min(k, dvg.size)
    if epsilon is None:
        return np.argsort(dvg, kind="stable")[:picks]
    return gumbel_top_k(-epsilon * dvg / 2.0, picks, rng)


def selection_event(epsilon: Optional[float], k: int, num_layers: int) -> DpEvent:
    """One round's selection: k·m EM draws at ε/2 each (one client moves only its own utility:
    see the module docstring), or ``NonPrivateDpEvent`` for the deterministic variant."""
    if epsilon is None:
        return NonPrivateDpEvent()
    return SelfComposedDpEvent(ExponentialMechanismDpEvent(epsilon / 2.0), k * num_layers)


SERVER_ONLY = (
    "selection/k",
    "selection/candidates",
    "selection/mean-divergence",
    "selection/mean-divergence-selected",
)
"""Figures of the selection kept in the server log (:attr:`~.template.AccountedRound.server_figures`), never
published: the number of candidates is the number of accepted replies, and the divergences are un-noised
statistics of the clients' updates."""


class MinDivergenceExpSampling(AccountedFedAvg):
    """Per layer, the weighted mean of k replies drawn by the ε exponential mechanism on −divergence.

    Args:
        fraction_train ... evaluate_metrics_aggr_fn: FedAvg's, in FedAvg's order. Every other
            argument is keyword-only.
        num_selected: k, replies aggregated per layer (integer ≥ 1); required.
        epsilon: ε per draw in (0, inf), or None for the deterministic lowest-k variant (not DP);
            required (no default: the choice between DP and non-DP selection is the caller's).
        layer_of: maps an array key to its layer (default :func:`default_layer_of`).
        selection_ledger: where the selection's events are booked (default:
            ``PrivacyLedger(1e-5, neighboring_relation="replace_one")``).
        rng: None (fresh OS entropy for every draw), an int seed or a numpy Generator.
        **accounting: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`).
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
        num_selected: int,
        epsilon: Optional[float],
        layer_of: Optional[Callable[[str], str]] = None,
        selection_ledger: Optional[PrivacyLedger] = None,
        rng: RngLike = None,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        super().__init__(
            **fedavg_arguments(locals()),
            **accounting,
        )
        self.num_selected = check_int("num_selected", num_selected, minimum=1)
        self.epsilon = None if epsilon is None else check_epsilon(epsilon, "epsilon")
        self.layer_of = layer_of if layer_of is not None else default_layer_of
        self.selection_ledger = self.ledger_store.claim(  # persisted with the main ledger, in ledger_path
            SELECTION_LABEL, selection_ledger, lambda: PrivacyLedger(1e-5, neighboring_relation="replace_one")
        )
        self._rng = RngSource(rng)
        self._layers: Layers = {}
        self._global_negative: dict[str, np.ndarray] = {}
        self._global_meta: Optional[dict[str, tuple[tuple[int, ...], np.dtype]]] = None

    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's configuration; remembers the layers and the signs of the global weights (eq. 14)."""
        self._layers = group_layers(arrays.keys(), self.layer_of)
        values = {key: npy_view(arr) for key, arr in arrays.items()}
        self._global_negative = {key: v.reshape(-1) < 0 for key, v in values.items()}
        self._global_meta = {key: (v.shape, v.dtype) for key, v in values.items()}
        return super().instruct_train(server_round, arrays, config, grid)

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """Divergences, per-layer selection, per-layer weighted mean; the selection's event is booked in
        ``selection_ledger`` (replies holding NaN/inf are rejected before anything is selected)."""
        result, replies = screened.finite(lambda accepted: self._select(server_round, accepted))
        if result is None:
            return RoundRelease()
        arrays, metrics = result
        event = selection_event(self.epsilon, self.num_selected, len(self._layers))
        return RoundRelease(
            arrays,
            metrics,
            [Booking(event, SELECTION_LABEL, ledger=self.selection_ledger)],
            ledger_figures=self._selection_epsilon,
        ).keep_on_server(*SERVER_ONLY)

    def _select(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        if self._global_meta is None:
            raise RuntimeError("MinDivergenceExpSampling: call configure_train before aggregate_train")
        dvg = self._divergences(replies)
        selected = [
            select_low_divergence(dvg[:, j], self.num_selected, self.epsilon, self._rng()) for j in range(dvg.shape[1])
        ]
        if len(replies) < self.num_selected:
            log(
                WARNING,
                "Round %d: %d accepted replies < num_selected=%d; every layer uses all of them",
                server_round,
                len(replies),
                self.num_selected,
            )
        arrays = self._aggregate_layers(replies, selected)
        metrics = aggregate_reply_metrics(
            self.train_metrics_aggr_fn, [r.content for r in replies], self.weighted_by_key
        )
        for key, value in self._selection_metrics(dvg, selected).items():
            metrics[key] = value
        return arrays, metrics

    def _divergences(self, replies: list[Message]) -> np.ndarray:
        """``dvg[i, j]`` (eq. 14) for reply i and layer j, each payload read zero-copy once.

        Raises :class:`NonFiniteReplies` (nothing selected, nothing booked) naming the replies
        that hold NaN/inf, found in the same pass (:func:`finite_flip_count`).
        """
        sizes = [sum(self._global_negative[k].size for k in keys) for keys in self._layers.values()]
        scratch = np.empty(_SIGN_BLOCK, dtype=bool)
        out = np.zeros((len(replies), len(self._layers)), dtype=np.float64)
        bad = []
        for i, reply in enumerate(replies):
            record = reply_arrays(reply)
            for j, keys in enumerate(self._layers.values()):
                counts = [finite_flip_count(self._global_negative[k], npy_view(record[k]), scratch) for k in keys]
                if None in counts:
                    bad.append(i)
                    break
                out[i, j] = sum(counts) / sizes[j] if sizes[j] else 0.0
        if bad:
            raise NonFiniteReplies(bad)
        return out

    def _aggregate_layers(self, replies: list[Message], selected: list[np.ndarray]) -> ArrayRecord:
        """Each layer: Σ_{i selected} n_i w_i / Σ n_i, streamed in place (integer arrays rounded back)."""
        chosen = [set(idx.tolist()) for idx in selected]
        mean = WeightedMean()
        for i, reply in enumerate(replies):
            record, weight = reply_arrays(reply), reply_weight(reply, self.weighted_by_key)
            for keys, picks in zip(self._layers.values(), chosen):
                if i in picks:
                    for key in keys:
                        mean.add(key, record[key], weight)
        mean.is_finite()  # replies are pre-scanned: this only marks keys that overflowed for the safe recompute
        return mean.result(list(self._global_meta), round_integers=True)

    def _selection_metrics(self, dvg: np.ndarray, selected: list[np.ndarray]) -> dict[str, float]:
        picked = np.concatenate([dvg[idx, j] for j, idx in enumerate(selected)]) if selected else np.zeros(0)
        return {
            "selection/k": float(min(self.num_selected, dvg.shape[0])),
            "selection/k-requested": float(self.num_selected),
            "selection/candidates": float(dvg.shape[0]),
            "selection/layers": float(dvg.shape[1]),
            "selection/mean-divergence": float(dvg.mean()) if dvg.size else 0.0,
            "selection/mean-divergence-selected": float(picked.mean()) if picked.size else 0.0,
        }

    def _selection_epsilon(self) -> dict[str, float]:
        """``selection/epsilon``: the selection ledger's ε, read once the round's selection is booked."""
        return {"selection/epsilon": float(self.selection_ledger.epsilon())}


__all__ = [
    "MinDivergenceExpSampling",
    "SELECTION_LABEL",
    "default_layer_of",
    "flip_count",
    "group_layers",
    "layer_divergence",
    "select_low_divergence",
    "selection_event",
]
