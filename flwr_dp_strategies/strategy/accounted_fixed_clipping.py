r"""Flower's server-side fixed-clipping DP wrapper, accounted by a :class:`PrivacyLedger`.

A drop-in for Flower's ``DifferentialPrivacyServerSideFixedClipping`` (same
arguments in the same order, new ones keyword-only). Per round:

* each reply's update :math:`\Delta_i = w_i - w` is clipped in L2 to
  :math:`\bar\Delta_i = \Delta_i \cdot \min(1, C / \lVert\Delta_i\rVert_2)`;
* the released model is
  :math:`\tilde w = w + \frac1m\sum_i \bar\Delta_i + \mathcal N(0, \sigma^2 I)`,
  :math:`\sigma = zC/m`, with ``m = num_sampled_clients`` a **public, fixed
  denominator** (:mod:`flwr_dp_strategies.rounds.central_release`).

Why each round is a Gaussian mechanism with noise multiplier exactly ``z``
(user-level DP, ``add_or_remove_one``: neighbouring federations differ by one
client's whole data). Adding or removing client k adds or removes one clipped
update :math:`\bar\Delta_k/m`, of L2 norm at most C/m, and changes nothing else;
the noise std is zC/m, so the noise multiplier is z whatever number of replies
arrives or whatever weights clients report.

What this class does *not* do, and why. Flower's wrapper averages with FedAvg's
weights :math:`a_i = n_i/\sum_j n_j` over the replies that arrived. That
denominator is data dependent: removing client k also rescales every other
client's weight, which up to doubles the sensitivity (:math:`2C\max_k a_k`), and
the :math:`n_i` are reported by the clients themselves, so even that bound is not
a bound (one client reporting :math:`n = 10^{308}` makes the effective noise
multiplier of such an average inf/inf = NaN). Booking :math:`z\sum n/(m \max n)`
for it covers only the zero-out relation (z = 1, 50 rounds: 54.4 where the doubled
sensitivity gives 159.5), under add/remove and replace-one alike. Uniform weights over the public m are
the sound estimator; with equally sized clients it equals FedAvg's mean when m
replies arrive.

Scope of the guarantee.

* No amplification by sampling is claimed (a plain ``GaussianDpEvent(z)``
  per round; see :class:`AccountedPoissonFixedClipping` for that).
* Rounds compose adaptively in the ledger (RDP and PLD; the tighter ε is reported).
  A ``replace_one`` ledger books the event converted (sensitivity 2C/m: z/2).
* Nothing un-noised and data dependent is published next to the release: the
  clients' train metrics (losses, example counts) are not aggregated into the
  round's metrics unless ``publish_client_metrics=True``, which books the round
  as non-private (ε = ∞), the truth about publishing them.
* The wrapped strategy's server update must be a function of the mean update
  (FedAvg, FedAvgM, FedAdam, FedYogi, FedAdagrad, FedProx): it runs on the DP
  release, as post-processing; a robust aggregator is refused.
* Noise from OS entropy (``rng``); ``noise_sampler="secure"`` draws the discrete
  Gaussian on a data-independent grid (floating-point safe, booked as ``ZCDpEvent``;
  :class:`AccountedPoissonFixedClipping` has no such option: dp-accounting bounds
  Poisson amplification for the continuous Gaussian only). Flower's ``np.random`` sampler only with
  ``noise_sampler="flower"`` (explicit, logged: it is reproducible by anyone who
  seeds NumPy's global generator).

Replies go through the shared screening (:mod:`flwr_dp_strategies.rounds.reply_screening` via
:class:`~.client_accounting.ClientAccountingMixin`) in both phases: malformed,
duplicate or unexpected replies are rejected and counted per reason (server log)
while the round goes on; a reply whose update holds NaN/inf is rejected
(``non-finite``) before any of it is added. Failed replies are counted
(``error``, server log).

Flower's own ``accountant`` (``SamplingMethod.NO_AMPLIFICATION``) is driven through its
public protocol only (``would_exceed``, ``compose``, ``get_privacy_spent``): every release
composes ``GaussianPrivacyEvent(z, m, N)`` into it, the same Gaussian of multiplier z the
ledger books (the denominator is the public m, so a round with fewer replies is the same
mechanism; Flower's own wrapper, which divides by the replies' weights, needs exactly m
equal ones), and its ``max_epsilon`` stops training cleanly before a release would exceed it,
as the ledger's does.
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Optional, Unpack

from flwr.common.logger import log
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, Strategy
from flwr.supercore.privacy_accounting import PrivacyAccountant, SamplingMethod

from ..rounds.options import AccountingOptions
from ..rounds.central_release import check_mean_based
from ..privacy.accounting.relations import ADD_OR_REMOVE_ONE
from ..privacy.rng import RngLike
from ..privacy.validation import check_int, check_positive
from ..rounds.central_gaussian import NOISE_SAMPLERS, CentralGaussianRound

EVENT_LABEL = "central-gaussian/server-side-fixed-clipping"


class AccountedServerSideFixedClipping(CentralGaussianRound, DifferentialPrivacyServerSideFixedClipping):
    """Central DP with server-side fixed clipping over a fixed denominator, composed in a ledger.

    Same arguments as :class:`DifferentialPrivacyServerSideFixedClipping`, plus (keyword-only):

    Args:
        rng: the noise generator: None (fresh OS entropy, the default), a seed or a Generator (tests).
        noise_sampler: ``"os-entropy"`` (default), ``"secure"`` (the floating-point-safe discrete
            Gaussian on a grid, CKS 2020, booked as ``ZCDpEvent`` with the rounding included; the
            public bound on |S/m| is C·N/m with N the connected nodes) or ``"flower"`` (Flower's
            ``np.random`` helper).
        publish_client_metrics: also publish FedAvg's aggregate of the clients' train metrics,
            booking every such round as non-private (default False).
        **accounting: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`); a new
            ledger is add/remove-one and records one central ``GaussianDpEvent(z)`` per released aggregate; its
            ``max_epsilon`` is the budget; one restored from ``ledger_path`` continues its round numbers.

    Behaviour per round:

    * ``configure_train``: if one more release would exceed ``ledger.max_epsilon``, log it
      and send nothing; the remaining rounds then neither train nor evaluate.
    * ``aggregate_train``: the accounted round (:mod:`flwr_dp_strategies.rounds.template`) with the
      central-Gaussian release (:mod:`flwr_dp_strategies.rounds.central_gaussian`, fixed-size
      sampling, fixed clipping): screen, clip, sum over m, add noise, book ``GaussianDpEvent(z)``.
    """

    # pylint: disable=too-many-arguments
    def __init__(
        self,
        strategy: Strategy,
        noise_multiplier: float,
        clipping_norm: float,
        num_sampled_clients: int,
        *,
        accountant: PrivacyAccountant | None = None,
        rng: RngLike = None,
        noise_sampler: str = "os-entropy",
        publish_client_metrics: bool = False,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        check_positive("noise_multiplier", noise_multiplier)
        check_positive("clipping_norm", clipping_norm)
        check_int("num_sampled_clients", num_sampled_clients, minimum=1)
        if noise_sampler not in NOISE_SAMPLERS:
            raise ValueError(f"noise_sampler must be one of {NOISE_SAMPLERS}, got {noise_sampler!r}")
        _check_accountable(strategy)
        _check_fixed_accountant(accountant, num_sampled_clients, noise_sampler)
        # Flower's wrapper gets no accountant: this class composes into it (its public protocol), on the DP release
        super().__init__(strategy, noise_multiplier, clipping_norm, num_sampled_clients)
        self.accountant = accountant
        self.init_accounted_round(
            neighboring_relation=ADD_OR_REMOVE_ONE,
            **accounting,
        )
        self._init_central(
            sampling="fixed",
            clipping="fixed",
            num_clients=None,
            rng=rng,
            publish_client_metrics=publish_client_metrics,
            event_label=EVENT_LABEL,
            noise_sampler=noise_sampler,
        )
        if noise_sampler == "flower":
            log(
                WARNING,
                "noise_sampler='flower': central noise from NumPy's global generator (reproducible by "
                "anyone who seeds it); use the default OS-entropy sampler for a real deployment.",
            )

    def __repr__(self) -> str:
        """Compute a string representation of the strategy."""
        return "Accounted Differential Privacy Strategy Wrapper (Server-Side Fixed Clipping)"

    def summary(self) -> None:
        """Log the privacy spent so far, then Flower's DP settings and the wrapped strategy's summary
        (whose ``└──>`` line closes the tree, as in Flower)."""
        report = self.ledger.report()
        log(
            INFO,
            "\t├──> Privacy ledger: epsilon=%.4f at delta=%g (%s), %d central releases",
            report.epsilon,
            report.delta,
            report.method,
            len(self.ledger.rounds()),
        )
        super().summary()


def _check_accountable(strategy: Strategy) -> None:
    """Refuse set-ups the Gaussian-mechanism analysis does not cover: a server update that is not a function of
    the released mean (:func:`~flwr_dp_strategies.rounds.central_release.check_mean_based`)."""
    check_mean_based(strategy, "AccountedServerSideFixedClipping")


def _check_fixed_accountant(accountant: Optional[PrivacyAccountant], m: int, noise_sampler: str) -> None:
    """A Flower accountant must describe this release: fixed-size sampling without amplification, m <= N, and
    the continuous Gaussian (the discrete one of ``noise_sampler="secure"`` is a ``ZCDpEvent`` it has no form
    for); ValueError naming what to change otherwise."""
    if accountant is None:
        return
    config = accountant.config
    if config.sampling_method is not SamplingMethod.NO_AMPLIFICATION:
        raise ValueError(
            "accountant must be configured with sampling_method=SamplingMethod.NO_AMPLIFICATION for fixed-size "
            f"sampling (got {config.sampling_method.value!r}); use AccountedPoissonFixedClipping for Poisson "
            "sampling with amplification"
        )
    if m > config.population_size:
        raise ValueError(f"num_sampled_clients={m} exceeds the accountant's population_size={config.population_size}")
    if noise_sampler == "secure":
        raise ValueError(
            "accountant must be None with noise_sampler='secure': the discrete Gaussian's cost (a ZCDpEvent, "
            "rounding included) has no GaussianPrivacyEvent form; the ledger books it"
        )


__all__ = ["AccountedServerSideFixedClipping", "EVENT_LABEL", "NOISE_SAMPLERS"]
