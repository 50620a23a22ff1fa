r"""FedAvg with distributed DP under secure aggregation: the server never sees an update.

Each round (Kairouz, Liu & Steinke 2021; Agarwal, Kairouz & Liu 2021; Bell et al. 2020):

1. FedAvg samples the nodes (``fraction_train``, ``min_train_nodes``, as Flower's FedAvg);
2. ``configure_train`` runs the first two SecAgg+ stages
   (:class:`~flwr_dp_strategies.secure_aggregation.SecureAggregationRound`: key
   agreement, encrypted Shamir shares) and returns FedAvg's train messages with the
   protocol record and the public DP parameters; Flower's ``Strategy.start`` sends them;
3. each client (``client_mods.distributed_dp_mod``) trains, clips its update
   :math:`\Delta_u` to C, rotates, scales by s, rounds (conditionally, to
   :math:`\lVert k_u\rVert_2 \le \tilde\Delta_2`), adds :math:`\mathrm{Sk}(\mu/m)`
   per coordinate, masks and uploads :math:`\lceil Db/8\rceil` bytes;
4. ``aggregate_train`` (the accounted round,
   :class:`~flwr_dp_strategies.rounds.template.AccountedRound`) screens the replies
   against the open protocol round; the release adds the masked vectors, runs the
   unmask stage, decodes :math:`\sum_{u\in U_3} k_u + \mathrm{Sk}(|U_3|\mu/m)`, and
   applies FedAvg's update with uniform weights,

   .. math:: w_{t+1} = w_t + \frac{1}{|U_3|}\,\mathrm{decode}\Bigl(\sum_{u \in U_3} k_u + \xi\Bigr).

Privacy (derivation). Mechanism: the Skellam mechanism on the integer sum. Each client
adds :math:`\mathrm{Sk}(\mu/(m - c))` per coordinate, c = ``max_colluding_clients``; a
revealed sum holds :math:`|U_3| \ge m` clients (the round aborts with fewer survivors, or
when the survivors' graph has a component of fewer than m: that part could be unmasked
alone), of which at least m − c are honest, so the noise the adversary cannot subtract
has variance at least μ per coordinate; a larger variance is post-processing of μ
(Skellam is closed under sums). Sensitivity: add or
remove one client's data (the "zero-out" form: the client's update becomes 0 and its
noise share stays), integer L2 sensitivity :math:`\tilde\Delta_2` enforced by the
conditional rounding (KLS21 §4.1; includes the rounding's norm inflation), L1
:math:`\min(\lfloor\tilde\Delta_2^2\rfloor, \sqrt D\tilde\Delta_2)`. Event:
``SkellamDpEvent(Δ₁, Δ₂, μ)`` with :math:`\mu = (z\tilde\Delta_2)^2`, RDP of Agarwal et
al. 2021 Thm 3.5 (:mod:`flwr_dp_strategies.privacy.mechanisms.skellam`), booked once per
round in which the sum is revealed, under ``add_or_remove_one`` (a replace-one ledger
doubles both sensitivities), composed by the ledger's RDP accountant. No
amplification by sampling: the server chooses the sample, so it is not secret from
it. Rounds that abort reveal nothing and book nothing. Decoding, dividing by
:math:`|U_3|` (public) and adding to the model are post-processing.

Trust model (stated in :meth:`DistributedDpFedAvg.summary`; ``docs/distributed-dp.md``
has the table the tests check). The ε holds against an active server (any field of any
message) with up to c = ``max_colluding_clients`` colluding clients, for every client
whose mod authenticates its peers with an operator-signed roster and requires the booked
z (``min_noise_multiplier``). Clients enforce, whatever the server does
(:mod:`flwr_dp_strategies.secure_aggregation.client_protocol`): one setup per round,
2t > h + c, their neighbourhood in a graph committed before the keys, signed peer keys,
and the survivor-set rule (:func:`~flwr_dp_strategies.secure_aggregation.protocol.survivor_set_flaw`)
with the survivors' signatures demanded at unmask: any sum holding an honest client that
any server can unmask holds n_h = m − c honest shares. A client without a roster counts
only its own share (its floor then holds against invented peers too).
Compare: central DP (``AccountedPoissonFixedClipping``) trusts the server with every raw
update; local DP (``LocalUpdateNoiseMod``) trusts no one and needs :math:`\sqrt{n}`
times the noise.

In the clear: the protocol's keys, identity keys and signatures, ciphertexts, node lists,
the survivor set and shares, and the packed masked vector; never a metric of the client (the mod drops them; a reply carrying
one is rejected as ``structure`` and booked as a non-private release of that client).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Optional, Unpack

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..rounds.options import AccountingOptions
from ..npy_codec import npy_view, to_array
from ..privacy.mechanisms.distributed_dp import (
    DEFAULT_BETA,
    DEFAULT_OVERFLOW_SIGMAS,
    DistributedDpParams,
    SkellamCalibration,
    calibrate_skellam,
    decode_sum,
    scale_for_bits,
)
from ..privacy.validation import check_int, check_positive
from ..secure_aggregation.masks import check_bits, packed_size
from .accounted_fedavg import MetricsAggregationFn, fedavg_arguments
from ..rounds.secure_aggregation import ProtocolSizes, SecureAggregationMixin
from ..rounds.template import Booking, RoundRelease, Screened

EVENT_LABEL = "distributed DP: Skellam sum under secure aggregation"


class DistributedDpFedAvg(SecureAggregationMixin, FedAvg):
    """FedAvg + SecAgg+ + Skellam distributed DP; clients must run ``client_mods.distributed_dp_mod``.

    Its booked release (one client's clipped update added or removed) covers every reply at the client level
    (:attr:`central_covers_replies`; not so ``SecureObjectiveSum``, whose noise is calibrated for one record).

    Args:
        fraction_train ... evaluate_metrics_aggr_fn: :class:`flwr.serverapp.strategy.FedAvg`'s, in
            FedAvg's order and meaning (``weighted_by_key`` is not used for training: under DP
            every client's clipped update weighs the same).
        noise_multiplier: z, the noise std over the L2 sensitivity of the integer sum (> 0).
        clipping_norm: C, the L2 bound of each client's update (> 0).
        bits: b, the modulus 2^b of the secure sum (the upload is ⌈d·b/8⌉ bytes for d model values: the
            rotation pads nothing), in [2, 62].
        num_shares: SecAgg+ ring parameter k: an int ≥ 2, a fraction of the sampled nodes (1.0:
            SecAgg's complete graph), or None (default): the smallest k whose failure bound at
            ``dropout_rate`` is at most ``failure_probability`` (Bell et al. 2020).
        reconstruction_threshold: t, shares needed to rebuild a secret: None (default) for the least
            the clients accept, 2t > h + c for neighbourhoods of h nodes; an int, or a fraction of h in
            (0.5, 1]. A round whose t falls outside [that least, h] is skipped with a WARNING.
        min_survivors: m, the fewest clients whose noise a revealed sum holds (an int, or a fraction
            of the sampled nodes; raised to t): each client adds μ/(m − c), a round with fewer aborts.
        max_colluding_clients: c, the clients that may pool their shares and noise with the server
            (default 0); t and the noise share follow from it, and m must exceed it.
        dropout_rate, failure_probability: the per-client dropout rate the graph is sized for and the
            probability, at that rate, that a round cannot unmask (defaults 0.05 and 1e-6).
        rotation_seed: the public seed of the random rotation (default: drawn from OS entropy);
            round r uses ``rotation_seed + r``.
        beta: conditional-rounding β. overflow_sigmas: k of :func:`scale_for_bits`.
        stage_timeout: seconds each extra protocol stage (setup, share-keys, unmask) waits for
            replies; default: the ``timeout`` given to ``Strategy.start`` (3600 s by default), which
            also bounds the collect stage (Flower's own train round). A node that misses a stage
            is dropped from the round.
        **accounting: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`).
    """

    central_covers_replies = True

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
        noise_multiplier: float,
        clipping_norm: float,
        bits: int = 20,
        num_shares: Optional[int | float] = None,
        reconstruction_threshold: Optional[int | float] = None,
        min_survivors: int | float = 0.8,
        max_colluding_clients: int = 0,
        dropout_rate: float = 0.05,
        failure_probability: float = 1e-6,
        rotation_seed: Optional[int] = None,
        beta: float = DEFAULT_BETA,
        overflow_sigmas: float = DEFAULT_OVERFLOW_SIGMAS,
        stage_timeout: Optional[float] = None,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        super().__init__(**fedavg_arguments(locals()))
        self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self.clipping_norm = check_positive("clipping_norm", clipping_norm)
        self.bits = check_bits(bits)
        self.rotation_seed = (
            secrets.randbits(62) if rotation_seed is None else check_int("rotation_seed", rotation_seed, minimum=0)
        )
        self.beta = DistributedDpParams(1, 1.0, 1.0, 2, 0, beta).beta  # validated as the clients will
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
        self._current: Optional[ArrayRecord] = None
        self._spec: Optional[ArrayRecord] = None
        self._params: Optional[DistributedDpParams] = None
        self._calibration: Optional[SkellamCalibration] = None

    # ------------------------------------------------------------------ calibration
    def round_parameters(
        self, server_round: int, dim: int, sizes: ProtocolSizes
    ) -> tuple[DistributedDpParams, SkellamCalibration]:
        """(params, calibration) of a round of ``sizes`` and a model of ``dim`` values: the noise μ is
        split over the m − c honest survivors (:attr:`ProtocolSizes.honest`)."""
        scale = scale_for_bits(
            bits=self.bits,
            clip_norm=self.clipping_norm,
            dim=dim,
            n_clients=sizes.n_sampled,
            noise_multiplier=self.noise_multiplier,
            min_survivors=sizes.honest,
            beta=self.beta,
            overflow_sigmas=self.overflow_sigmas,
        )
        params = DistributedDpParams(
            dim=dim,
            clip_norm=self.clipping_norm,
            scale=scale,
            bits=self.bits,
            rotation_seed=(self.rotation_seed + server_round) % (1 << 62),
            beta=self.beta,
        )
        return params, calibrate_skellam(params, noise_multiplier=self.noise_multiplier, n_clients=sizes.honest)

    # ------------------------------------------------------------------ train
    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's sample; SecAgg+ setup and key sharing; the collect messages (FedAvg's content +
        the protocol record + the public DP parameters)."""
        self.begin_round(grid)
        self._current = self._spec = arrays  # the round's model: aggregate_train needs it
        if self.budget_exhausted:
            return []
        planned = list(FedAvg.configure_train(self, server_round, arrays, config, grid))
        if not self.enough_nodes(server_round, planned):
            return []
        sizes = self.plan_sizes(server_round, len(planned))
        if sizes is None:
            return []
        dim = int(sum(npy_view(a).size for a in arrays.values()))
        params, calibration = self.round_parameters(server_round, dim, sizes)
        public = {
            "dp-dim": params.dim,
            "dp-clip-norm": params.clip_norm,
            "dp-scale": params.scale,
            "dp-rotation-seed": params.rotation_seed,
            "dp-beta": params.beta,
            "dp-noise-share": calibration.local_mu,
        }
        messages = self.open_secure_round(
            server_round,
            grid,
            planned,
            sizes=sizes,
            bits=self.bits,
            length=params.padded_dim,
            event=calibration.event,
            public=public,
        )
        self._params, self._calibration = params, calibration
        return messages

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """Add the masked vectors, unmask, decode, apply FedAvg's (uniform) update; the round's Skellam event
        (add/remove) is booked when the sum is revealed, nothing but the un-noised records replies carried when
        the round aborts."""
        revealed = self.revealed(screened)  # the collect stage's unmask
        total, secure = revealed.total, revealed.secure
        if total is None or secure is None:
            return RoundRelease()
        assert self._params is not None and self._calibration is not None
        peak = peak_fraction(total, self._params.bits)
        if peak > WRAP_WARNING:
            log(
                WARNING,
                "Round %d, distributed DP: the revealed sum reaches %.0f%% of the range of %d bits; "
                "coordinates may have wrapped (the update would be wrong, not less private): raise bits",
                server_round,
                100 * peak,
                self._params.bits,
            )
        mean = decode_sum(total, self._params) / len(secure.survivors)
        arrays = _add_update(self._current, mean)
        metrics = MetricRecord(
            {"dp/noise-multiplier": float(self._calibration.effective_noise_multiplier), "secagg/peak-fraction": peak}
        )
        event = Booking(self._calibration.event, EVENT_LABEL, neighboring_relation="add_or_remove_one")
        return RoundRelease(arrays, metrics, [event])

    def summary(self) -> None:
        """The ledger so far, the trust model, then FedAvg's summary."""
        report = self.ledger.report()
        log(
            INFO,
            "\t├──> Privacy ledger: epsilon=%.4f at delta=%g (%s); distributed DP: z=%s, C=%s, %d bits, "
            "min survivors %s, max colluding clients %d",
            report.epsilon,
            report.delta,
            report.method,
            self.noise_multiplier,
            self.clipping_norm,
            self.bits,
            self.min_survivors,
            self.max_colluding_clients,
        )
        for line in self.trust_lines():
            log(INFO, "\t├──> %s", line)
        super().summary()

    def upload_bytes(self, dim: int) -> int:
        """Bytes of one client's masked vector for a model of ``dim`` values."""
        return packed_size(DistributedDpParams(dim, 1.0, 1.0, self.bits, 0).padded_dim, self.bits)

    def __repr__(self) -> str:
        return (
            f"DistributedDpFedAvg(z={self.noise_multiplier}, C={self.clipping_norm}, bits={self.bits}, "
            f"num_shares={self.num_shares}, threshold={self.reconstruction_threshold}, "
            f"min_survivors={self.min_survivors}, max_colluding_clients={self.max_colluding_clients})"
        )


WRAP_WARNING = 0.5
"""A revealed sum whose largest centred coordinate passes this fraction of 2^(b−1) (3 of the 6 planned
standard deviations of a fully aligned sum) is logged as a wrap risk."""


def peak_fraction(total: np.ndarray, bits: int) -> float:
    """max |centred coordinate| of a revealed sum mod 2^b, over 2^(b−1): the share of the range the sum uses.
    :func:`scale_for_bits` plans 6 standard deviations of a sum whose updates all point the same way; a
    sum of updates in random directions uses about 4/(6√n) of the range, and a wrapped coordinate lands
    anywhere in it, so a high value flags a risk, not a certainty. Post-processing of the released
    noisy sum, so it costs no privacy."""
    half = 1 << (bits - 1)
    signed = total.astype(np.int64)
    signed = np.where(signed >= half, signed - (1 << bits), signed)
    return float(np.abs(signed).max() / half) if signed.size else 0.0


def _add_update(current: Optional[ArrayRecord], mean: np.ndarray) -> ArrayRecord:
    """``current`` + ``mean`` (flattened in the record's key order), each array in its own dtype."""
    assert current is not None
    out, offset = {}, 0
    for key, array in current.items():
        reference = npy_view(array)
        part = mean[offset : offset + reference.size].reshape(reference.shape)
        offset += reference.size
        out[key] = to_array((reference.astype(np.float64) + part).astype(reference.dtype))
    return ArrayRecord(out)


__all__ = ["DistributedDpFedAvg", "EVENT_LABEL", "WRAP_WARNING", "peak_fraction"]
