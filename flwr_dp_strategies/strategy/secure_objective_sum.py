r"""The DELM server-side solve with the noise added once, under secure aggregation.

:class:`~.noisy_objective_sum.NoisyObjectiveSum` sums m noisy FM objectives, one per
client: m noise draws. Here each client (``client_mods.secure_objective``) sends its
*exact* coefficients, scaled, randomly rounded, with a Skellam share Sk(μ/m′) and
SecAgg+ masks; the server learns only the sum, which carries the noise of **one**
release (√m times less noise at the same record-level ε). One round:

1. FedAvg samples the nodes; ``configure_train`` calibrates the round
   (:func:`~flwr_dp_strategies.privacy.mechanisms.secure_objective.calibrate_secure_objective`:
   s from ``bits`` and ``max_records``, μ from ``epsilon`` or ``noise_multiplier``), runs
   the SecAgg+ setup and key sharing (:class:`~flwr_dp_strategies.secure_aggregation.SecureAggregationRound`,
   as :class:`~.distributed_dp_fedavg.DistributedDpFedAvg` does) and sends the collect
   messages with the public parameters (q, c, loss, s, μ/m′);
2. ``aggregate_train`` (the accounted round) screens the replies; the release adds the masked
   vectors, unmasks, decodes
   the summed objective (count included), repairs it once and solves it in closed form
   (:func:`~flwr_dp_strategies.privacy.mechanisms.functional_mechanism.solve_noisy_sum`, the solve
   NoisyObjectiveSum uses, with the ridge adapted to the revealed sum's noise
   √(|U₃|μ/m′)/s), and books the event.

Later rounds send nothing and keep the head (a second sum would be a second release).
A round that aborts (fewer than m′ survivors, unrecoverable shares) reveals and books
nothing, and the next round tries again.

Privacy (derivation in :mod:`flwr_dp_strategies.privacy.mechanisms.secure_objective`). Mechanism: the
Skellam mechanism on the integer sum; neighbouring relation: one record of any client added
or removed (or replaced, for a replace-one ledger); integer sensitivity Δ₂ = sΔ + √D (the
record's coefficient vector, norm ≤ Δ, plus the randomized rounding, by a shared-uniform
coupling), Δ₁ = min(⌊Δ₂²⌋, √D·Δ₂); noise at least Sk(μ) (|U₃| ≥ m′ clients each add μ/m′);
event ``SkellamDpEvent(Δ₁, Δ₂, μ)`` (RDP, Agarwal et al. 2021 Thm 3.5), booked once, centrally
(``client=None``: it covers every record of every client) and **record-level** (``unit="record"``), under
``add_or_remove_one`` with its replace-one form; composition: the ledger's. Decoding, repair and the solve are
post-processing. The booked figure is a record-level ε: ``privacy/epsilon-record-level`` is the Skellam event's ε
(the clients book nothing of their own), and ``privacy/epsilon-client-level`` is ∞ (the sum is calibrated for one
record, and a client holds many: nothing bounds what a client's whole data changes in the head).

Trust model: as :class:`~flwr_dp_strategies.DistributedDpFedAvg`'s (the same SecAgg+ and client rules): ε
holds against an active server with up to c colluding clients, for clients with an operator-signed
roster that require the booked z, and for the released head; c colluders remove their own shares
(the noise is calibrated for m′ − c).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import INFO
from typing import Optional, Unpack

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..rounds.options import AccountingOptions
from ..privacy.mechanisms.functional_mechanism import LOSSES, QuadraticStatistics, solve_noisy_sum
from ..privacy.mechanisms.secure_objective import (
    DEFAULT_BITS,
    DEFAULT_OVERFLOW_SIGMAS,
    SecureObjectiveCalibration,
    calibrate_secure_objective,
    decode_objective,
)
from ..privacy.validation import check_epsilon, check_int, check_nonnegative, check_positive
from ..secure_aggregation.masks import check_bits
from .accounted_fedavg import MetricsAggregationFn, fedavg_arguments
from ..rounds.secure_aggregation import ProtocolSizes, SecureAggregationMixin
from ..rounds.template import Booking, RoundRelease, Screened

EVENT_LABEL = "secure objective sum: Skellam sum of FM coefficients under secure aggregation"


class SecureObjectiveSum(SecureAggregationMixin, FedAvg):
    """Solve the FM objective summed under SecAgg+ with Skellam noise added once; clients run
    ``client_mods.secure_objective.SecureObjectiveTrainer``.

    Args:
        fraction_train ... evaluate_metrics_aggr_fn: :class:`flwr.serverapp.strategy.FedAvg`'s, in
            FedAvg's order (``weighted_by_key`` is unused: the count travels inside the sum).
        num_classes: c ≥ 2 of the head (``loss="logistic"``: c = 2, head (q, 1)); required.
        max_records: N ≥ 1, a public upper bound on the records of all sampled clients together
            (sizes the modular range; a larger true total may wrap the sum: wrong head, same privacy); required.
        epsilon: target record-level ε at the ledger's δ for the single release; or
        noise_multiplier: z = √μ/Δ₂ instead (exactly one of the two).
        loss: ``"softmax"`` or ``"logistic"``. ridge, ridge_fraction, psd_floor: as
            :class:`~.noisy_objective_sum.NoisyObjectiveSum` (the noise-adapted ridge is always on).
        weights_key: the head's key (the only key of the arrays).
        bits: b of the modulus 2^b, in [2, 62] (upload ⌈D·b/8⌉ bytes, D = qc + q(q+1)/2 + 1).
        num_shares ... stage_timeout: as :class:`~.distributed_dp_fedavg.DistributedDpFedAvg` (num_shares,
            reconstruction_threshold, min_survivors, max_colluding_clients, dropout_rate,
            failure_probability, stage_timeout: the same trust model; the noise is split over the m − c
            honest survivors).
        overflow_sigmas: noise standard deviations of headroom in the modular range.
        **accounting: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`); a new
            ledger is add/remove, record level.
    """

    # pylint: disable=too-many-arguments,too-many-locals,too-many-instance-attributes
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
        max_records: int,
        epsilon: Optional[float] = None,
        noise_multiplier: Optional[float] = None,
        loss: str = "softmax",
        ridge: float = 0.0,
        ridge_fraction: float = 0.5,
        psd_floor: float = 0.0,
        weights_key: str = "head.weight",
        bits: int = DEFAULT_BITS,
        num_shares: Optional[int | float] = None,
        reconstruction_threshold: Optional[int | float] = None,
        min_survivors: int | float = 0.8,
        max_colluding_clients: int = 0,
        dropout_rate: float = 0.05,
        failure_probability: float = 1e-6,
        overflow_sigmas: float = DEFAULT_OVERFLOW_SIGMAS,
        stage_timeout: Optional[float] = None,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        super().__init__(**fedavg_arguments(locals()))
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if loss == "logistic" and self.num_classes != 2:
            raise ValueError(f"num_classes must be 2 for loss='logistic', got {num_classes!r}")
        self.loss = loss
        self.max_records = check_int("max_records", max_records, minimum=1)
        if (epsilon is None) == (noise_multiplier is None):
            raise ValueError("epsilon or noise_multiplier must be given, exactly one of them")
        self.epsilon = None if epsilon is None else check_epsilon(epsilon)
        self.noise_multiplier = (
            None if noise_multiplier is None else check_positive("noise_multiplier", noise_multiplier)
        )
        self.ridge = check_nonnegative("ridge", ridge)
        self.ridge_fraction = check_nonnegative("ridge_fraction", ridge_fraction)
        self.psd_floor = check_nonnegative("psd_floor", psd_floor)
        self.weights_key = weights_key
        self.bits = check_bits(bits)
        self.overflow_sigmas = check_positive("overflow_sigmas", overflow_sigmas)
        self._init_secure_aggregation(
            num_shares,
            reconstruction_threshold,
            min_survivors,
            stage_timeout,
            max_colluding_clients=max_colluding_clients,
            dropout_rate=dropout_rate,
            failure_probability=failure_probability,
        )
        self.init_accounted_round(
            neighboring_relation='add_or_remove_one',
            **accounting,
        )
        self._spec: Optional[ArrayRecord] = None
        self._calibration: Optional[SecureObjectiveCalibration] = None
        self._head_dtype = np.dtype(np.float64)
        self.head: Optional[np.ndarray] = None
        self.objective: Optional[QuadraticStatistics] = None
        self.last_ridge: Optional[float] = None

    # ------------------------------------------------------------------ calibration
    def round_parameters(self, dim: int, sizes: ProtocolSizes) -> SecureObjectiveCalibration:
        """The calibration of a round of ``sizes`` and q = ``dim`` features (noise split over m − c)."""
        return calibrate_secure_objective(
            dim=dim,
            num_classes=self.num_classes,
            max_records=self.max_records,
            n_clients=sizes.n_sampled,
            min_survivors=sizes.honest,
            epsilon=self.epsilon,
            noise_multiplier=self.noise_multiplier,
            delta=self.ledger.target_delta,
            loss=self.loss,
            neighboring_relation=self.ledger.neighboring_relation,
            bits=self.bits,
            overflow_sigmas=self.overflow_sigmas,
        )

    # ------------------------------------------------------------------ train
    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's sample; SecAgg+ setup and key sharing; the collect messages with the public parameters."""
        self.begin_round(grid)
        self._spec = arrays
        if list(arrays.keys()) != [self.weights_key]:
            raise ValueError(f"arrays must hold exactly the head {self.weights_key!r}, got keys {list(arrays.keys())}")
        head = arrays[self.weights_key]
        width = 1 if self.loss == "logistic" else self.num_classes
        if len(head.shape) != 2 or int(head.shape[1]) != width:
            raise ValueError(f"{self.weights_key} must be a (q, {width}) matrix, got shape {tuple(head.shape)}")
        self._head_dtype = np.dtype(str(head.dtype))
        if self.head is not None:
            log(
                INFO,
                "SecureObjectiveSum: the objective was summed in an earlier round; round %d sends nothing",
                server_round,
            )
            return []
        if self.budget_exhausted:
            return []
        planned = list(FedAvg.configure_train(self, server_round, arrays, config, grid))
        if not self.enough_nodes(server_round, planned):
            return []
        sizes = self.plan_sizes(server_round, len(planned))
        if sizes is None:
            return []
        calibration = self.round_parameters(int(head.shape[0]), sizes)
        params = calibration.params
        public = {
            "fm-dim": params.dim,
            "fm-num-classes": params.num_classes,
            "fm-loss": params.loss,
            "fm-scale": params.scale,
            "fm-noise-share": calibration.local_mu,
        }
        self._calibration = calibration
        return self.open_secure_round(
            server_round,
            grid,
            planned,
            sizes=sizes,
            bits=self.bits,
            length=params.length,
            event=calibration.add_remove_event,
            public=public,
            replace_one_event=calibration.replace_one_event,
        )

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """Add the masked vectors, unmask, decode, repair and solve once; the release's Skellam event (add/remove,
        with its replace-one form) is booked when the sum is revealed, nothing but the un-noised records replies
        carried when the round aborts."""
        revealed = self.revealed(screened)  # the collect stage's unmask
        total, secure = revealed.total, revealed.secure
        if total is None or secure is None:
            return RoundRelease()
        calibration = self._calibration
        assert calibration is not None
        event = Booking(
            calibration.add_remove_event,
            EVENT_LABEL,
            neighboring_relation="add_or_remove_one",
            replace_one_event=calibration.replace_one_event,
            unit="record",  # one record of any client: a record-level event, booked for every client
        )
        self.objective = decode_objective(total, calibration.params)
        noise_std = math.sqrt(len(secure.survivors) * calibration.local_mu) / calibration.params.scale
        head, self.last_ridge = solve_noisy_sum(
            self.objective,
            ridge=self.ridge,
            noise_std=noise_std,
            ridge_fraction=self.ridge_fraction,
            floor=self.psd_floor,
        )
        self.head = head
        metrics = MetricRecord(
            {
                "objective/noise-std": float(noise_std),
                "objective/ridge": float(self.last_ridge),
                "objective/noisy-count": float(self.objective.count),
            }
        )
        # the noise std is a function of the exact survivor count, the ridge adapts to it
        return RoundRelease(
            ArrayRecord({self.weights_key: Array(head.astype(self._head_dtype))}), metrics, [event]
        ).keep_on_server("objective/noise-std", "objective/ridge")

    def summary(self) -> None:
        """The ledger so far, the trust model, then FedAvg's summary."""
        report = self.ledger.report()
        log(
            INFO,
            "\t├──> Privacy ledger: epsilon=%.4f at delta=%g (%s); secure objective sum: %s bits, min survivors %s",
            report.epsilon,
            report.delta,
            report.method,
            self.bits,
            self.min_survivors,
        )
        for line in self.trust_lines():
            log(INFO, "\t├──> %s", line)
        super().summary()

    def __repr__(self) -> str:
        target = f"epsilon={self.epsilon}" if self.epsilon is not None else f"z={self.noise_multiplier}"
        return (
            f"SecureObjectiveSum({target}, c={self.num_classes}, max_records={self.max_records}, "
            f"bits={self.bits}, min_survivors={self.min_survivors})"
        )


__all__ = ["EVENT_LABEL", "SecureObjectiveSum"]
