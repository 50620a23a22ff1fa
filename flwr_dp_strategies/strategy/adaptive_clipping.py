r"""Central (user-level) DP-FedAvg with adaptive clipping, correct and accounted.

A drop-in for Flower's ``DifferentialPrivacyServerSideAdaptiveClipping`` (same
arguments in the same order and meaning; new ones keyword-only), implementing
Andrew, Thakkar, McMahan and Ramaswamy, "Differentially private learning with
adaptive clipping", NeurIPS 2021 (arXiv:1905.03871), Algorithm 1, with TF
Privacy's ``QuantileEstimatorQuery`` as reference implementation.

What Flower's wrapper gets wrong, and this one does not:

* it counts *clipped* updates but applies the paper's update for the *unclipped*
  fraction, so C moves away from the target quantile (more clipping than
  wanted shrinks C further);
* it updates C before adding the noise, so the round's noise is calibrated to
  the next round's C, not to the C the updates were clipped to;
* it splits the noise with the formula for centred bits (sensitivity ½) while
  counting uncentred bits (sensitivity 1), and divides by the number of replies
  (data dependent) instead of a public m;
* an all-zero update divides by a zero norm;
* it books nothing (no accountant accepts the round).

Round t, with public expected sample size m and clipping norm :math:`C_t`:

1. each accepted reply gives its update :math:`\Delta_i = w_i - w` and the bit
   :math:`b_i = \mathbb 1[\lVert\Delta_i\rVert_2 \le C_t]` (*unclipped*; a zero
   update has :math:`b_i = 1` and is added as zero);
2. the model release, with the **round's own** :math:`C_t` and the fixed public
   denominator m (:func:`.central_release.fixed_denominator_release`):

   .. math:: \tilde w = w + \frac1m\sum_{i\in S} \bar\Delta_i
             + \mathcal N\!\big(0, (z_\Delta C_t/m)^2 I\big),
             \qquad \bar\Delta_i = \Delta_i \min(1, C_t/\lVert\Delta_i\rVert_2);

3. the noisy unclipped fraction from the **centred** count:

   .. math:: \bar b = \operatorname{clip}_{[0,1]}\Big(\frac{\sum_{i\in S}(b_i - \tfrac12)
             + \mathcal N(0, \sigma_b^2)}{m} + \tfrac12\Big);

4. then, and only then, the geometric update towards the target *unclipped*
   quantile :math:`\gamma`:

   .. math:: C_{t+1} = C_t \exp\!\big(-\eta\,(\bar b - \gamma)\big).

Target quantile. Flower's ``target_clipped_quantile`` is, as Flower documents
it, the fraction of updates that should be **clipped**; the paper's target is
the fraction left **unclipped**, so :math:`\gamma = 1 -` ``target_clipped_quantile``
(the default 0.5 gives the median either way). At the fixed point
:math:`E[\bar b] = \gamma`: :math:`C` tracks the :math:`\gamma`-quantile of the
update norms, and ``target_clipped_quantile`` of them are clipped.

Privacy. Neighbouring federations differ by one client's whole data
(``add_or_remove_one``, user-level DP). One round releases the pair
:math:`(\sum\bar\Delta_i + N_\Delta,\ \sum(b_i - \frac12) + N_b)` with
:math:`N_\Delta \sim \mathcal N(0, z_\Delta^2 C_t^2 I)`,
:math:`N_b \sim \mathcal N(0,\sigma_b^2)` (the division by the public m and the
clamp are post-processing). Adding or removing client k moves the sum by
:math:`\bar\Delta_k` (L2 norm :math:`\le C_t`) and the centred count by
:math:`b_k - \frac12 = \pm\frac12` (centring makes that ½ rather than 1). Scaling
each coordinate by its noise std gives a Gaussian mechanism with unit noise and
L2 sensitivity

.. math:: \sqrt{\Big(\frac{C_t}{z_\Delta C_t}\Big)^2 + \Big(\frac{1/2}{\sigma_b}\Big)^2}
          = \sqrt{z_\Delta^{-2} + (2\sigma_b)^{-2}} = \frac1z,

so the round is a Gaussian mechanism with noise multiplier exactly the user's
``noise_multiplier`` z when (Andrew et al., Theorem 1)

.. math:: z_\Delta = \big(z^{-2} - (2\sigma_b)^{-2}\big)^{-1/2},

which exists only for :math:`z < 2\sigma_b` (else ``ValueError`` at construction,
naming ``noise_multiplier`` and ``clipped_count_stddev``). Default
:math:`\sigma_b = m/20` (the paper's recommendation). Each client's contribution
to the normalised pair has norm at most 1/z whatever it sends, so the sum over a
Poisson sample is a sampled Gaussian mechanism: with ``sampling="poisson"``
(each node asked independently with :math:`q = m/N` from OS entropy,
:func:`.central_release.poisson_sample`) the round is booked as
``PoissonSampledDpEvent(q, GaussianDpEvent(z))``; with ``sampling="fixed"``
(the wrapped FedAvg's fixed-size sample, as in Flower) as ``GaussianDpEvent(z)``
(no amplification claimed). :math:`C_t` is a function of earlier releases only
(post-processing), so rounds compose adaptively (RDP/PLD in the
:class:`~flwr_dp_strategies.privacy.PrivacyLedger`); training stops before a
round would exceed ``ledger.max_epsilon``.

Published next to each release: ``dp/clipping-norm`` (:math:`C_t`, the norm this
round's release was clipped and noised with), ``dp/unclipped-fraction``
(:math:`\bar b`, noisy), the ledger's figures and the screening counts; nothing
un-noised (not the sample size, not the raw count, not the clients' train
metrics unless ``publish_client_metrics=True``, which books the round as
non-private). Replies go through the shared screening and identity rules
(:class:`~.client_accounting.ClientAccountingMixin`); a reply holding NaN/inf is
rejected (``non-finite``) before any of it is added, and the round goes on.

:class:`AdaptiveClippingMixin` holds all of this; the server-side
:class:`AccountedAdaptiveClipping` (clips on the server) and
:class:`~.client_side_adaptive_clipping.AccountedClientSideAdaptiveClipping`
(clients clip and send their bit) differ only in how a reply is added.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable
from logging import INFO
from typing import Optional, Union

import numpy as np
from dp_accounting.dp_event import DpEvent, GaussianDpEvent, NonPrivateDpEvent, PoissonSampledDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg

from ..privacy import PrivacyLedger
from ..privacy.ledger_file import LedgerFileError
from ..privacy.relations import ADD_OR_REMOVE_ONE, convert_event
from ..privacy.rng import RngLike, RngSource
from ..privacy.validation import check_bool, check_int, check_positive, check_probability
from ..rounds.central_release import (NON_PRIVATE_METRICS_LABEL, fixed_denominator_release, log_budget_stop,
                              poisson_sample, require_configured, sampled_train_instructions)
from ..rounds.client_accounting import ClientAccountingMixin
from ..rounds.metrics import aggregate_reply_metrics
from ..rounds.reply_screening import DEFAULT_MAX_WEIGHT, array_spec, reply_arrays, screen_train_content
from ..rounds.streaming_aggregation import ClippedSum, npy_view, single_threaded_blas

EVENT_LABEL = "central-gaussian/adaptive-clipping"
SAMPLING = ("poisson", "fixed")
CLIPPING_NORM_METRIC = "dp/clipping-norm"
UNCLIPPED_FRACTION_METRIC = "dp/unclipped-fraction"
#: C is kept in [MIN_CLIPPING_NORM, MAX_CLIPPING_NORM] (post-processing: no privacy cost), so a
#: run of thousands of rounds at an extreme target never underflows C to 0 or overflows it to inf.
MIN_CLIPPING_NORM = 1e-300
MAX_CLIPPING_NORM = 1e300
STATE_NAME = "adaptive-clipping"  # the learnt C, public, saved in the ledger file's signed envelope


# ---------------------------------------------------------------------------------------------- the maths
def update_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float) -> float:
    r""":math:`z_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}`, the multiplier of the update sum's noise that
    makes the (sum, centred count) pair a Gaussian mechanism with multiplier z (Andrew et al., Thm 1).

    Raises ValueError (naming both parameters) when :math:`z \ge 2\sigma_b`: the count alone would
    then already cost more than z allows.
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    sigma_b = check_positive("clipped_count_stddev", clipped_count_stddev)
    if z >= 2.0 * sigma_b:
        raise ValueError(
            f"noise_multiplier must be < 2 * clipped_count_stddev (the count's noise multiplier, sensitivity 1/2), "
            f"got noise_multiplier={z!r} and clipped_count_stddev={sigma_b!r}; raise clipped_count_stddev "
            f"(default num_sampled_clients/20) or lower noise_multiplier")
    ratio = z / (2.0 * sigma_b)  # z_Δ = z / sqrt(1 - ratio²): the same number, no overflow for a tiny z
    return float(z / math.sqrt((1.0 - ratio) * (1.0 + ratio)))


def noisy_unclipped_fraction(centred_count: float, stddev: float, denominator: int,
                             generator: np.random.Generator) -> float:
    r""":math:`\bar b = \operatorname{clip}_{[0,1]}\big((\sum_i (b_i - \frac12) + \mathcal N(0, \sigma_b^2))/m
    + \frac12\big)`, from the centred count :math:`\sum_i (b_i - \frac12)`."""
    noisy = (centred_count + float(generator.normal(0.0, stddev))) / denominator + 0.5
    return min(1.0, max(0.0, noisy))


def geometric_update(clipping_norm: float, unclipped_fraction: float, target_unclipped_quantile: float,
                     learning_rate: float) -> float:
    r""":math:`C_{t+1} = C_t \exp(-\eta(\bar b - \gamma))`, kept in [MIN_CLIPPING_NORM, MAX_CLIPPING_NORM]."""
    updated = clipping_norm * math.exp(-learning_rate * (unclipped_fraction - target_unclipped_quantile))
    return min(MAX_CLIPPING_NORM, max(MIN_CLIPPING_NORM, updated))


def _check_ledger_args(ledger: object, ledger_path: object, sampling: str) -> None:
    """``ledger``: None or a PrivacyLedger (add/remove-one under Poisson sampling: dp-accounting has no
    replace-one form of the sampled Gaussian); ``ledger_path``: None, a str or a path."""
    if ledger is not None and not isinstance(ledger, PrivacyLedger):
        raise ValueError(f"ledger must be None or a PrivacyLedger, got {type(ledger).__name__}")
    if sampling == "poisson" and ledger is not None and ledger.neighboring_relation != ADD_OR_REMOVE_ONE:
        raise ValueError("ledger must use neighboring_relation='add_or_remove_one' with sampling='poisson' "
                         f"(got {ledger.neighboring_relation!r}); use sampling='fixed' for a replace_one ledger")
    if ledger_path is not None and not isinstance(ledger_path, (str, os.PathLike)):
        raise ValueError(f"ledger_path must be None, a str or an os.PathLike, got {type(ledger_path).__name__}")


# ---------------------------------------------------------------------------------------------- the strategy
class AdaptiveClippingMixin(ClientAccountingMixin):
    """Adaptive clipping, its release and its accounting, shared by the server-side and client-side wrappers.

    Args (Flower's, in Flower's order and meaning):
        strategy: a FedAvg (its record keys, fixed-size sampling, metric aggregation and evaluation are used;
            its ``aggregate_train`` is not: the release is the clipped sum over m above).
        noise_multiplier: z in (0, 2·clipped_count_stddev), the multiplier of the whole round (model sum
            and count together); the model sum gets :math:`z_\\Delta` (``update_noise_multiplier``).
        num_sampled_clients: m >= 1, the public denominator (expected sample size under Poisson sampling).
        initial_clipping_norm: C₀ in (0, inf).
        target_clipped_quantile: in [0, 1], the fraction of updates that should be **clipped**;
            the target unclipped quantile is γ = 1 − target_clipped_quantile.
        clip_norm_lr: η in (0, inf).
        clipped_count_stddev: σ_b in (0, inf), std of the noise on the count (default m/20).

    Keyword-only:
        num_clients: N >= m (default: the nodes connected at round 1); q = m/N (``sampling="poisson"``).
        sampling: ``"poisson"`` (default, amplified accounting) or ``"fixed"`` (the wrapped FedAvg's
            sample, booked without amplification).
        ledger, ledger_path, resume, high_water_path, per_client_metrics: as
            :class:`AccountedServerSideFixedClipping` (a ledger
            restored from ``ledger_path`` continues its round numbers and the learnt C, saved with it: public,
            it costs nothing; C₀ applies only to a new run).
        rng: sampling and noise generator (default: fresh OS entropy per use).
        publish_client_metrics: also publish the clients' aggregated train metrics, booking every such
            round as non-private.
        max_weight: replies whose weight is not in (0, max_weight] are rejected (``weight``).
    """

    event_label = EVENT_LABEL

    def __init__(
        self,
        strategy: FedAvg,
        noise_multiplier: float,
        num_sampled_clients: int,
        initial_clipping_norm: float = 0.1,
        target_clipped_quantile: float = 0.5,
        clip_norm_lr: float = 0.2,
        clipped_count_stddev: Optional[float] = None,
        *,
        num_clients: Optional[int] = None,
        sampling: str = "poisson",
        ledger: Optional[PrivacyLedger] = None,
        ledger_path: Union[str, "os.PathLike[str]", None] = None,
        resume: bool = False,
        high_water_path: Union[str, "os.PathLike[str]", None] = None,
        per_client_metrics: bool = False,
        rng: RngLike = None,
        publish_client_metrics: bool = False,
        max_weight: float = DEFAULT_MAX_WEIGHT,
    ) -> None:
        if not isinstance(strategy, FedAvg):
            raise ValueError(f"strategy must be a FedAvg (or subclass), got {type(strategy).__name__}")
        z = check_positive("noise_multiplier", noise_multiplier)
        m = check_int("num_sampled_clients", num_sampled_clients, minimum=1)
        initial = check_positive("initial_clipping_norm", initial_clipping_norm)
        clipped_target = check_probability("target_clipped_quantile", target_clipped_quantile)
        learning_rate = check_positive("clip_norm_lr", clip_norm_lr)
        sigma_b = m / 20.0 if clipped_count_stddev is None else check_positive(
            "clipped_count_stddev", clipped_count_stddev)
        z_update = update_noise_multiplier(z, sigma_b)
        if sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")
        super().__init__(strategy, z, m, initial, clipped_target, learning_rate, sigma_b)  # type: ignore[call-arg]
        self.noise_multiplier = z  # Flower stores z_Δ here; this class books z (see update_noise_multiplier)
        self.update_noise_multiplier = z_update
        self.clipped_count_stddev = sigma_b
        self.target_unclipped_quantile = 1.0 - clipped_target
        self.sampling = sampling
        self.num_clients = None if num_clients is None else check_int("num_clients", num_clients, minimum=m)
        _check_ledger_args(ledger, ledger_path, sampling)
        self._init_accounting(ledger, None if ledger_path is None else os.fspath(ledger_path),
                              check_bool("per_client_metrics", per_client_metrics), None, ADD_OR_REMOVE_ONE,
                              resume=resume, high_water_path=high_water_path)
        self.round_offset = max(self.ledger.rounds(), default=0)  # a restored ledger: round numbers continue
        self._restore_clipping_norm()
        self._init_screening(max_weight)
        self.publish_client_metrics = check_bool("publish_client_metrics", publish_client_metrics)
        self.rng = RngSource(rng)
        self.budget_exhausted = False
        self.current_arrays = ArrayRecord()
        self._spec: Optional[dict] = None

    def _restore_clipping_norm(self) -> None:
        """Continue with the C learnt before a restart, if the ledger file holds one (checked: the file's
        HMAC authenticates it only with a key, so its domain is validated like an argument's)."""
        state = self.ledger_store.get_state(STATE_NAME)
        if state is None:
            return
        norm = state.get("clipping_norm")
        if list(state) != ["clipping_norm"] or isinstance(norm, bool) or not isinstance(norm, (int, float)) \
                or not MIN_CLIPPING_NORM <= norm <= MAX_CLIPPING_NORM:
            raise LedgerFileError(self.ledger_store.path, f"state {STATE_NAME!r} must be {{'clipping_norm': C}} with C "
                                  f"in [{MIN_CLIPPING_NORM}, {MAX_CLIPPING_NORM}], got {state!r}")
        self.clipping_norm = float(norm)
        log(INFO, "Adaptive clipping: clipping norm %.6g restored from %s (initial_clipping_norm applies to new runs)",
            self.clipping_norm, self.ledger_store.path)

    # ------------------------------------------------------------------ accounting
    @property
    def sampling_rate(self) -> Optional[float]:
        """q = m/N under Poisson sampling (None until N is known, or with ``sampling="fixed"``)."""
        if self.sampling != "poisson" or self.num_clients is None:
            return None
        return self.num_sampled_clients / self.num_clients

    def round_event(self) -> DpEvent:
        """One round, add/remove-one: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (Poisson) or
        ``GaussianDpEvent(z)`` (fixed); in the ledger's relation (a replace-one ledger, ``sampling="fixed"``
        only, books ``GaussianDpEvent(z/2)``: replacing a client moves the pair by twice as much)."""
        gaussian = GaussianDpEvent(self.noise_multiplier)
        event = gaussian if self.sampling == "fixed" else PoissonSampledDpEvent(self.sampling_rate, gaussian)
        return convert_event(event, ADD_OR_REMOVE_ONE, self.ledger.neighboring_relation)

    # ------------------------------------------------------------------ train
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Sample (Poisson at rate q, or the wrapped FedAvg's sample) and send the wrapped strategy's instruction;
        nothing once one more round would exceed the budget, nor in a round the wrapped strategy configures
        no training (then nothing is released nor booked).

        The wrapped strategy's ``configure_train`` makes the instruction (its config, e.g. a learning-rate
        schedule, its records); Poisson sampling replaces only its choice of nodes
        (:func:`.central_release.sampled_train_instructions`)."""
        if self.sampling == "poisson" and self.num_clients is None:
            self.num_clients = check_int("num_clients", len(grid.get_node_ids()), minimum=self.num_sampled_clients)
        self.current_arrays = arrays
        self._spec = array_spec(arrays)
        if self.ledger.would_exceed(central_events=[self.round_event()]):
            if not self.budget_exhausted:
                log_budget_stop(server_round, self.ledger)
            self.budget_exhausted = True
            return []
        config = self.train_config(config)
        if self.sampling == "poisson":
            chosen = poisson_sample(grid.get_node_ids(), self.sampling_rate, self.rng())
            messages = sampled_train_instructions(self.strategy, server_round, arrays, config, grid, chosen)
        else:
            messages = list(self.strategy.configure_train(server_round, arrays, config, grid)) or None
        self._idle_round = server_round if messages is None else None
        messages = messages or []
        log(INFO, "configure_train: clipping norm %.6g, %s sampling", self.clipping_norm, self.sampling)
        self.remember_instructions("train", server_round, messages)
        return messages

    def train_config(self, config: ConfigRecord) -> ConfigRecord:
        """The config sent with the model (the client-side variant adds the clipping norm)."""
        return config

    @single_threaded_blas
    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Screen, add the clipped updates and bits, release with this round's C, then update C and book."""
        require_configured(self)
        if self.budget_exhausted or server_round == getattr(self, "_idle_round", None):
            return None, None
        accepted, rejected = self.screen_and_book(
            server_round, replies,
            lambda c: screen_train_content(c, self._spec, self.strategy.weighted_by_key,  # type: ignore[attr-defined]
                                           check_values=False, max_weight=self.max_weight),
            phase="train")
        clipping_norm = self.clipping_norm
        summed = ClippedSum({k: npy_view(a) for k, a in self.current_arrays.items()}, clipping_norm)
        accepted, unclipped = self.add_updates(server_round, summed, accepted, rejected)
        generator = self.rng()
        m = self.num_sampled_clients
        arrays = fixed_denominator_release(summed, m, self.update_noise_multiplier * clipping_norm / m, generator)
        fraction = noisy_unclipped_fraction(unclipped - len(accepted) / 2.0, self.clipped_count_stddev, m, generator)
        self.clipping_norm = geometric_update(clipping_norm, fraction, self.target_unclipped_quantile,
                                              self.clip_norm_lr)
        self.ledger.record(self.round_event(), server_round=server_round + self.round_offset, label=self.event_label)
        metrics = self._published_metrics(server_round, accepted)
        metrics[CLIPPING_NORM_METRIC] = float(clipping_norm)
        metrics[UNCLIPPED_FRACTION_METRIC] = float(fraction)
        self.ledger_store.set_state(STATE_NAME, {"clipping_norm": float(self.clipping_norm)})
        self.save_ledger()
        return arrays, self.round_metrics(metrics, rejected)

    def add_updates(self, server_round: int, summed: ClippedSum, replies: list[Message],
                    rejected: Counter[str]) -> tuple[list[Message], int]:
        """Add each reply's clipped update to ``summed``; the replies added and their number of unclipped bits."""
        raise NotImplementedError

    def _published_metrics(self, server_round: int, accepted: list[Message]) -> MetricRecord:
        """Nothing, or (``publish_client_metrics``) the clients' aggregated train metrics, booked non-private."""
        if not self.publish_client_metrics:
            return MetricRecord()
        self.ledger.record(NonPrivateDpEvent(), server_round=server_round + self.round_offset,
                           label=NON_PRIVATE_METRICS_LABEL)
        if not accepted:
            return MetricRecord()
        return aggregate_reply_metrics(self.strategy.train_metrics_aggr_fn,  # type: ignore[attr-defined]
                                       [r.content for r in accepted], self.strategy.weighted_by_key)

    # ------------------------------------------------------------------ evaluate
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The wrapped strategy's evaluation (remembered for the identity check); nothing once the budget is spent."""
        if self.budget_exhausted:
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """Screened evaluate replies and the wrapped FedAvg's metric aggregation."""
        return self.screened_evaluate(server_round, replies, self.strategy)

    def summary(self) -> None:
        """The split of z and the privacy spent, then Flower's DP settings and the wrapped strategy's
        summary (whose ``└──>`` line closes the tree, as in Flower)."""
        log(INFO, "\t├──> z=%s split into z_update=%.4g and count std %.4g; target unclipped quantile %.3g; "
            "epsilon=%.4f at delta=%g", self.noise_multiplier, self.update_noise_multiplier,
            self.clipped_count_stddev, self.target_unclipped_quantile, self.ledger.epsilon(), self.ledger.target_delta)
        super().summary()  # type: ignore[misc]


class AccountedAdaptiveClipping(AdaptiveClippingMixin, DifferentialPrivacyServerSideAdaptiveClipping):
    """Server-side adaptive clipping (Andrew et al. 2021), correct and accounted: see the module docstring.

    Drop-in for Flower's ``DifferentialPrivacyServerSideAdaptiveClipping``; arguments as
    :class:`AdaptiveClippingMixin`. The server clips each reply's update to :math:`C_t` and computes
    its bit :math:`b_i = \\mathbb 1[\\lVert\\Delta_i\\rVert_2 \\le C_t]` itself.
    """

    def add_updates(self, server_round: int, summed: ClippedSum, replies: list[Message],
                    rejected: Counter[str]) -> tuple[list[Message], int]:
        """Clip and add every update (NaN/inf: rejected); b_i = 1 for every update not scaled down."""
        added = self.drop_rejected(server_round, replies, summed.add_records([reply_arrays(r) for r in replies]),
                                   "non-finite", rejected)
        return added, summed.count - summed.clipped

    def __repr__(self) -> str:
        return (f"AccountedAdaptiveClipping(z={self.noise_multiplier}, C={self.clipping_norm:.6g}, "
                f"m={self.num_sampled_clients}, gamma={self.target_unclipped_quantile}, sampling={self.sampling!r})")


__all__ = [
    "AccountedAdaptiveClipping", "AdaptiveClippingMixin", "CLIPPING_NORM_METRIC", "EVENT_LABEL", "SAMPLING",
    "UNCLIPPED_FRACTION_METRIC", "geometric_update", "noisy_unclipped_fraction", "update_noise_multiplier",
]
