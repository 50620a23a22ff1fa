r"""Sum the clients' noisy functional-mechanism objectives and solve the sum once, on the server.

DELM (Cao, Chen, Tang & Su, Chinese Journal of Computers 2023, Algorithm 1) has every client descend on its *own* noisy Taylor
objective and the server average the heads. Each client must then repair its
noisy quadratic :math:`\tilde S_i = S_i + E_i` (clip negative eigenvalues, else
its objective is unbounded below), and FedAvg's fixed point minimises the
objective with :math:`\sum_i \operatorname{repair}(\tilde S_i)`. Each repair adds a
positive semi-definite matrix, the negative part of :math:`S_i + E_i` (eigenvalues up
to :math:`\approx 2\sigma\sqrt q` in about half of the directions when the noise
dominates), so the sum is inflated in every direction by a bias that grows like m (clients),
while the noise of the plain sum :math:`\sum_i E_i` only grows like :math:`\sqrt m`
(``tests/test_noisy_objective_sum.py`` measures both). The bias acts as a ridge
of that size: harmless when the signal is strong, costly when q and m are large.

This strategy receives the noisy coefficients themselves
(:class:`client_mods.FunctionalMechanismTrainer` with ``upload="objective"``):
:math:`(\tilde A_i, \tilde S_i)` and the client's count, sums them
(:func:`~flwr_dp_strategies.privacy.mechanisms.functional_mechanism.sum_statistics`; the Taylor
objective is a sum over records, so the sum is the federation's objective),
repairs the sum once and returns its ridge-regularised minimiser in closed form
(:func:`~flwr_dp_strategies.privacy.mechanisms.functional_mechanism.solve_objective`) as the
new head, with a ridge the user sets, e.g. from the public noise level
(:func:`~flwr_dp_strategies.privacy.mechanisms.functional_mechanism.noise_adapted_ridge`).
Measured (``examples/delm/results/RESULTS.md``): IID MNIST, q = 196, 100 clients,
ε = 1: about +2 points over client-side repair with FedAvg; on the embedded
digits (q = 64, 20-40 clients) the two are within ±2 points of each other. One
round suffices: later rounds re-send the same objectives.

**Privacy.** Unchanged from DELM's basic scheme: each client releases its noisy
coefficients once (its ε, declared and booked per client in :attr:`ledger`);
everything the server computes from them is post-processing. The coefficients
are a larger release *surface* than a head (q² + qc numbers instead of qc), but
not a larger privacy loss: a head computed by the client is itself a function of
them. Each node's objective is summed once: a node's later replies (identical,
since the trainer releases once) are ignored, so re-sampled clients are not
counted twice (``objective/clients``, in the server log only, counts the contributors so far).

Replies are screened as in :class:`~.accounted_fedavg.AccountedFedAvg`, against
the arrays the server expects back (``linear_key`` of shape (q, c') and
``quadratic_key`` of shape (q, q), float64): NaN/inf, wrong shapes, extra keys and
oversized payloads, and coefficients beyond ±1e100 (:data:`MAX_COEFFICIENT_ABS`, which would
overflow the sum or the solve), are rejected and counted. Not robust to a client that sends a
well-formed but adversarial objective (as FedAvg is not robust to such updates).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Optional, Unpack

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from ..rounds.options import AccountingOptions
from ..npy_codec import npy_view
from ..privacy.mechanisms.functional_mechanism import LOSSES, QuadraticStatistics, noisy_sum_ridge, solve_noisy_sum
from ..privacy.validation import check_int, check_nonnegative, check_positive
from .accounted_fedavg import AccountedFedAvg, MetricsAggregationFn, fedavg_arguments
from ..rounds.metrics import aggregate_reply_metrics
from ..rounds.reply_screening import array_spec, records_of, reply_weight
from ..rounds.streaming_aggregation import NonFiniteReplies
from ..rounds.template import RoundRelease, Screened
from ..wire import LINEAR_KEY, QUADRATIC_KEY

MAX_COEFFICIENT_ABS = 1e100
"""Bound on |coefficient| of an accepted objective: a sum of 10^9 of them and the products of the solve stay
finite (honest coefficients are counts of at most ``max_weight`` = 1e9 records times bounded features, plus noise)."""


class NoisyObjectiveSum(AccountedFedAvg):
    """Server-side solve of the summed noisy FM objectives (one head key in, the head out).

    Args:
        fraction_train ... evaluate_metrics_aggr_fn: FedAvg's, in FedAvg's order; every other
            argument is keyword-only, the accounting options too
            (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`).
        num_classes: c ≥ 2 of the head (``loss="logistic"``: c = 2, head of shape (q, 1)); required.
        ridge: λ ≥ 0 of the solved objective f̄/n + ½λ‖W‖² (n = the summed
            ``weighted_by_key`` of the contributors).
        client_noise_std: the per-coefficient noise std of one client's release
            (:func:`~flwr_dp_strategies.privacy.mechanisms.functional_mechanism.fm_noise_std`, public),
            > 0, or None. If given, every solve adds
            :func:`~flwr_dp_strategies.privacy.mechanisms.functional_mechanism.noise_adapted_ridge` for
            the m contributors so far (summed noise std σ√m) to ``ridge``.
        ridge_fraction: that ridge's fraction of the summed noise's spectral edge, ≥ 0.
        psd_floor: eigenvalue floor of the repaired summed quadratic, ≥ 0.
        loss: ``"softmax"`` or ``"logistic"``, as the clients' trainer.
        weights_key: the head's key in the arrays the server sends (the only key).
    """

    screens_values = True  # a reply's coefficients are read for NaN/inf before the sum, not found by it

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
        num_classes: int,
        ridge: float = 0.0,
        client_noise_std: Optional[float] = None,
        ridge_fraction: float = 0.5,
        psd_floor: float = 0.0,
        loss: str = "softmax",
        weights_key: str = "head.weight",
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        super().__init__(
            **fedavg_arguments(locals()),
            **accounting,
        )
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        self.loss = loss
        self.ridge = check_nonnegative("ridge", ridge)
        self.client_noise_std = (
            None if client_noise_std is None else check_positive("client_noise_std", client_noise_std)
        )
        self.ridge_fraction = check_nonnegative("ridge_fraction", ridge_fraction)
        self.last_ridge: Optional[float] = None
        self.psd_floor = check_nonnegative("psd_floor", psd_floor)
        self.weights_key = weights_key
        self._total: Optional[QuadraticStatistics] = None
        self._contributors: set[int] = set()
        self._head_dtype = np.dtype(np.float64)
        self._head: Optional[np.ndarray] = None

    @property
    def contributors(self) -> frozenset[int]:
        """Node ids whose objective is in the sum."""
        return frozenset(self._contributors)

    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's messages carrying the head; replies are screened against the objective's arrays."""
        if list(arrays.keys()) != [self.weights_key]:
            raise ValueError(f"arrays must hold exactly the head {self.weights_key!r}, got keys {list(arrays.keys())}")
        messages = super().instruct_train(server_round, arrays, config, grid)
        head = arrays[self.weights_key]
        if len(head.shape) != 2:
            raise ValueError(f"{self.weights_key} must be a (q, c) matrix, got shape {tuple(head.shape)}")
        q, width = (int(v) for v in head.shape)
        self._head_dtype = np.dtype(str(head.dtype))
        self._spec = array_spec(
            ArrayRecord({LINEAR_KEY: Array(np.zeros((q, width))), QUADRATIC_KEY: Array(np.zeros((q, q)))})
        )
        return messages

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """The head solved from the running sum of the contributors' noisy objectives (post-processing of
        their declared releases, booked by screening)."""
        result, _ = screened.finite(self._sum_and_solve)
        if result is None:
            return RoundRelease()
        arrays, metrics = result
        # the contributor counts move with who replied; the ridge adapts to the noise of that many objectives
        return RoundRelease(arrays, metrics).keep_on_server(
            "objective/clients", "objective/new-clients", "objective/ridge"
        )

    def _sum_and_solve(self, replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Add the new contributors' objectives to the running sum, solve, return the head.

        Raises :class:`~.streaming_aggregation.NonFiniteReplies` (the replies are then rejected as
        ``non-finite`` and the others summed) for replies holding a coefficient beyond
        ±:data:`MAX_COEFFICIENT_ABS`, judged each alone and before anything is added.
        """
        huge = [i for i, reply in enumerate(replies) if not _bounded(records_of(reply.content, ArrayRecord)[0])]
        if huge:
            raise NonFiniteReplies(huge)
        new = 0
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            if node in self._contributors:
                continue
            self._add(reply)
            self._contributors.add(node)
            new += 1
        assert self._total is not None  # replies is non-empty and screened
        if new or self._head is None:  # the sum changed: solve again (one q×q eigendecomposition)
            self._head, self.last_ridge = solve_noisy_sum(
                self._total,
                ridge=self.ridge,
                noise_std=self._summed_noise_std(),
                ridge_fraction=self.ridge_fraction,
                floor=self.psd_floor,
            )
        head = self._head
        metrics = aggregate_reply_metrics(
            self.train_metrics_aggr_fn, [r.content for r in replies], self.weighted_by_key
        )
        metrics["objective/clients"] = len(self._contributors)
        metrics["objective/new-clients"] = new
        metrics["objective/ridge"] = self.last_ridge
        return ArrayRecord({self.weights_key: Array(head.astype(self._head_dtype))}), metrics

    def solve_ridge(self) -> float:
        """``ridge``, plus the noise-adapted ridge of the current sum when ``client_noise_std`` is set."""
        if self._total is None:
            return self.ridge
        return noisy_sum_ridge(
            self._total, ridge=self.ridge, noise_std=self._summed_noise_std(), ridge_fraction=self.ridge_fraction
        )

    def _summed_noise_std(self) -> Optional[float]:
        """σ√m of the m contributors' releases, or None without ``client_noise_std``."""
        if self.client_noise_std is None:
            return None
        return self.client_noise_std * math.sqrt(len(self._contributors))

    def _add(self, reply: Message) -> None:
        arrays = records_of(reply.content, ArrayRecord)[0]
        weight = reply_weight(reply, self.weighted_by_key)
        linear, quadratic = npy_view(arrays[LINEAR_KEY]), npy_view(arrays[QUADRATIC_KEY])
        if self._total is None:
            self._total = QuadraticStatistics(
                np.array(linear, dtype=np.float64),
                np.array(quadratic, dtype=np.float64),
                0,
                self.loss,
                self.num_classes,
            )
        else:
            np.add(self._total.linear, linear, out=self._total.linear)
            np.add(self._total.quadratic, quadratic, out=self._total.quadratic)
        self._total = replace(self._total, count=self._total.count + max(1, int(round(weight))))


def _bounded(arrays: ArrayRecord) -> bool:
    """Every coefficient of the reply's (finite, screened) arrays is within ±MAX_COEFFICIENT_ABS."""
    return all(
        np.abs(npy_view(arrays[key])).max(initial=0.0) <= MAX_COEFFICIENT_ABS for key in (LINEAR_KEY, QUADRATIC_KEY)
    )


__all__ = ["LINEAR_KEY", "MAX_COEFFICIENT_ABS", "NoisyObjectiveSum", "QUADRATIC_KEY"]
