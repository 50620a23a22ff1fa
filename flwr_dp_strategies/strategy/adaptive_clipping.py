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

from logging import INFO
from typing import Any, Optional, Unpack, cast

from flwr.common.logger import log
from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg

from ..rounds.options import AccountingOptions
from ..rounds.central_release import check_mean_based
from ..privacy.accounting.ledger_file import LedgerFileError
from ..privacy.accounting.relations import ADD_OR_REMOVE_ONE
from ..privacy.rng import RngLike
from ..privacy.validation import check_bool, check_int, check_positive, check_probability
from ..rounds.central_gaussian import (
    CLIPPING_NORM_METRIC,
    MAX_CLIPPING_NORM,
    MIN_CLIPPING_NORM,
    SAMPLING,
    UNCLIPPED_FRACTION_METRIC,
    CentralGaussianRound,
    check_ledger_arguments,
    geometric_update,
    noisy_unclipped_fraction,
    update_noise_multiplier,
)

EVENT_LABEL = "central-gaussian/adaptive-clipping"
STATE_NAME = "adaptive-clipping"  # the learnt C, public, saved in the ledger file's signed envelope


# ---------------------------------------------------------------------------------------------- the strategy
class AdaptiveClippingMixin(CentralGaussianRound):
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
        **accounting: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`); a
            ledger restored from ``ledger_path`` continues its round numbers and the learnt C, saved with it: public, it
            costs nothing; C₀ applies only to a new run.
        rng: sampling and noise generator (default: fresh OS entropy per use).
        publish_client_metrics: also publish the clients' aggregated train metrics, booking every such
            round as non-private.
    """

    event_label = EVENT_LABEL
    state_name = STATE_NAME

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
        rng: RngLike = None,
        publish_client_metrics: bool = False,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        check_mean_based(strategy, type(self).__name__)
        z = check_positive("noise_multiplier", noise_multiplier)
        m = check_int("num_sampled_clients", num_sampled_clients, minimum=1)
        initial = check_positive("initial_clipping_norm", initial_clipping_norm)
        clipped_target = check_probability("target_clipped_quantile", target_clipped_quantile)
        learning_rate = check_positive("clip_norm_lr", clip_norm_lr)
        sigma_b = (
            m / 20.0 if clipped_count_stddev is None else check_positive("clipped_count_stddev", clipped_count_stddev)
        )
        z_update = update_noise_multiplier(z, sigma_b)
        if sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")
        cast(Any, super()).__init__(strategy, z, m, initial, clipped_target, learning_rate, sigma_b)  # Flower's wrapper
        self.noise_multiplier = z  # Flower stores z_Δ here; this class books z (see update_noise_multiplier)
        self.update_noise_multiplier = z_update
        self.clipped_count_stddev = sigma_b
        self.target_unclipped_quantile = 1.0 - clipped_target
        check_ledger_arguments(accounting.get("ledger"), accounting.get("ledger_path"), sampling)
        self.init_accounted_round(
            neighboring_relation=ADD_OR_REMOVE_ONE,
            **accounting,
        )
        self._init_central(
            sampling=sampling,
            clipping="adaptive",
            num_clients=num_clients,
            rng=rng,
            publish_client_metrics=check_bool("publish_client_metrics", publish_client_metrics),
            event_label=self.event_label,
            clipping_side=self.clipping_side,
        )
        self._restore_clipping_norm()

    def _restore_clipping_norm(self) -> None:
        """Continue with the C learnt before a restart, if the ledger file holds one (checked: the file's
        HMAC authenticates it only with a key, so its domain is validated like an argument's)."""
        state = self.ledger_store.get_state(STATE_NAME)
        if state is None:
            return
        norm = state.get("clipping_norm")
        if (
            list(state) != ["clipping_norm"]
            or isinstance(norm, bool)
            or not isinstance(norm, (int, float))
            or not MIN_CLIPPING_NORM <= norm <= MAX_CLIPPING_NORM
        ):
            raise LedgerFileError(
                self.ledger_store.path,
                f"state {STATE_NAME!r} must be {{'clipping_norm': C}} with C "
                f"in [{MIN_CLIPPING_NORM}, {MAX_CLIPPING_NORM}], got {state!r}",
            )
        self.clipping_norm = float(norm)
        log(
            INFO,
            "Adaptive clipping: clipping norm %.6g restored from %s (initial_clipping_norm applies to new runs)",
            self.clipping_norm,
            self.ledger_store.path,
        )

    def summary(self) -> None:
        """The split of z and the privacy spent, then Flower's DP settings and the wrapped strategy's
        summary (whose ``└──>`` line closes the tree, as in Flower)."""
        log(
            INFO,
            "\t├──> z=%s split into z_update=%.4g and count std %.4g; target unclipped quantile %.3g; "
            "epsilon=%.4f at delta=%g",
            self.noise_multiplier,
            self.update_noise_multiplier,
            self.clipped_count_stddev,
            self.target_unclipped_quantile,
            self.ledger.epsilon(),
            self.ledger.target_delta,
        )
        cast(Any, super()).summary()


class AccountedAdaptiveClipping(AdaptiveClippingMixin, DifferentialPrivacyServerSideAdaptiveClipping):
    """Server-side adaptive clipping (Andrew et al. 2021), correct and accounted: see the module docstring.

    Drop-in for Flower's ``DifferentialPrivacyServerSideAdaptiveClipping``; arguments as
    :class:`AdaptiveClippingMixin`. The server clips each reply's update to :math:`C_t` and computes
    its bit :math:`b_i = \\mathbb 1[\\lVert\\Delta_i\\rVert_2 \\le C_t]` itself.
    """

    def __repr__(self) -> str:
        return (
            f"AccountedAdaptiveClipping(z={self.noise_multiplier}, C={self.clipping_norm:.6g}, "
            f"m={self.num_sampled_clients}, gamma={self.target_unclipped_quantile}, sampling={self.sampling!r})"
        )


__all__ = [
    "AccountedAdaptiveClipping",
    "AdaptiveClippingMixin",
    "CLIPPING_NORM_METRIC",
    "EVENT_LABEL",
    "MAX_CLIPPING_NORM",
    "MIN_CLIPPING_NORM",
    "SAMPLING",
    "UNCLIPPED_FRACTION_METRIC",
    "geometric_update",
    "noisy_unclipped_fraction",
    "update_noise_multiplier",
]
