r"""Central (user-level) DP-FedAvg with Poisson client sampling, accounted with amplification.

Flower's server-side fixed-clipping wrapper samples a fixed number of clients and
divides by the weights that arrived; its accountant therefore refuses client
sampling (``NO_AMPLIFICATION`` only). This wrapper keeps Flower's clipping and
noise (it subclasses ``DifferentialPrivacyServerSideFixedClipping``) and changes
the two things amplification by sampling needs (McMahan et al. 2018, "Learning
differentially private recurrent language models", the fixed-denominator
estimator):

* **Poisson sampling**: in every round each of the ``N`` connected nodes is
  asked to train independently with probability :math:`q = m/N`, ``m`` =
  ``num_sampled_clients`` (the expected number), from a generator seeded from OS
  entropy; the sample is never resampled or topped up.
* **Fixed denominator**: the released model is

  .. math:: \tilde w = w + \frac1m \sum_{i \in S} \bar\Delta_i + \mathcal N\!\big(0, (zC/m)^2 I\big),
            \qquad \bar\Delta_i = \Delta_i \min(1, C/\lVert\Delta_i\rVert_2),

  with the sum streamed in place (:class:`~flwr_dp_strategies.rounds.streaming_aggregation.ClippedSum`:
  per reply, :math:`\Delta_i` is written into one model-sized buffer, its norm
  is the square root of the per-key ``dot`` products summed, and
  :math:`\min(1, C/\lVert\Delta_i\rVert_2)\,\Delta_i` is added to one
  accumulator per key by one ``axpy``; payloads are read zero-copy). Adding or
  removing one client changes the sum by at most C, so the sensitivity is C/m
  whatever the sample size, and the noise multiplier is exactly ``z``. An empty
  sample releases :math:`w` + noise. The noise is drawn in float64 from ``rng``
  and added in place, chunk by chunk, in each array's accumulator dtype.

Per round the ledger records ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
for the federation (every client is a potential participant), under the
add-or-remove-one-client relation; rounds compose adaptively (RDP/PLD). Weights
are uniform (client example counts are not used: weighting by them would make
the sensitivity data dependent). ``q`` is fixed from the first round's node
count ``N`` (or ``num_clients``). The guarantee needs only that each client's
inclusion probability is q and the denominator is m, so nodes joining or leaving
later do not weaken it (they change only the expected number of participants).

Published next to each release: the ledger's figures and the screening counts,
nothing else. The sample size is not published (amplification by sampling assumes
the sample is secret: |S| alone costs ε = 1.31 over 100 rounds at N = 100, q = 0.1
and is unbounded at N = 20, q = 0.5), nor the clients' un-noised train metrics
(``publish_client_metrics=True`` publishes them and books the rounds as
non-private). Which replies are accepted depends on each reply alone (the shared
screening), so one client cannot change which others are aggregated.

Failed replies (a sampled SuperNode that died mid-round) contribute nothing, are
counted in the server's log only (reason ``error``; any count of replies would bound
the secret sample size from below) and the round is still
released and booked: a sampled client that drops out is, for the analysis, a
client that was not sampled, and the denominator stays m. A reply holding NaN/inf
is rejected (``non-finite``) before any of it is added.
"""

from __future__ import annotations

from logging import INFO
from typing import Optional, Unpack

from flwr.common.logger import log
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from flwr.supercore.privacy_accounting import PrivacyAccountant, SamplingMethod

from ..rounds.options import AccountingOptions
from ..rounds.central_release import check_mean_based
from ..privacy.accounting.relations import ADD_OR_REMOVE_ONE
from ..privacy.rng import RngLike
from ..privacy.validation import check_int, check_positive
from ..rounds.central_gaussian import CentralGaussianRound

EVENT_LABEL = "central-gaussian/poisson-fixed-clipping"


class AccountedPoissonFixedClipping(CentralGaussianRound, DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side fixed clipping with Poisson client sampling and a fixed denominator.

    Drop-in for Flower's ``DifferentialPrivacyServerSideFixedClipping``: its arguments in its order
    (``strategy, noise_multiplier, clipping_norm, num_sampled_clients``, then the keyword-only
    ``accountant``); ``num_sampled_clients`` is here the *expected* sample size m. Every other
    argument is keyword-only.

    Args:
        strategy: a FedAvg (its config/metrics handling and evaluation are used).
        noise_multiplier: z in (0, inf).
        clipping_norm: C in (0, inf).
        num_sampled_clients: m, the expected number of clients per round (>= 1).
        accountant: optional Flower ``PrivacyAccountant``, configured with
            ``sampling_method=SamplingMethod.POISSON`` and ``population_size`` N (Flower's other
            sampling methods do not describe this sampling): every released round is also composed
            there as ``GaussianPrivacyEvent(z, sample_size=m, population_size=N)``, i.e. the same
            Poisson(q = m/N)-sampled Gaussian, and its ``max_epsilon`` stops training like the ledger's.
        num_clients: N (default: the accountant's ``population_size``, else the nodes connected
            at round 1); q = m/N.
        rng: sampling and noise generator (default: OS entropy).
        publish_client_metrics: also publish FedAvg's aggregate of the clients' train metrics,
            booking every such round as non-private (default False: un-noised client metrics
            next to a DP release would void it).
        **accounting: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`).
    """

    def __init__(
        self,
        strategy: FedAvg,
        noise_multiplier: float,
        clipping_norm: float,
        num_sampled_clients: int,
        *,
        accountant: Optional[PrivacyAccountant] = None,
        num_clients: Optional[int] = None,
        rng: RngLike = None,
        publish_client_metrics: bool = False,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        check_mean_based(strategy, 'AccountedPoissonFixedClipping')
        check_positive("noise_multiplier", noise_multiplier)
        check_positive("clipping_norm", clipping_norm)
        m = check_int("num_sampled_clients", num_sampled_clients, minimum=1)
        super().__init__(strategy, noise_multiplier, clipping_norm, m)  # not accountant: Flower refuses POISSON ones
        if accountant is not None:
            num_clients = _check_poisson_accountant(accountant, num_clients)
        self.accountant = accountant
        self.init_accounted_round(
            neighboring_relation=ADD_OR_REMOVE_ONE,
            **accounting,
        )
        self._init_central(
            sampling="poisson",
            clipping="fixed",
            num_clients=num_clients,
            rng=rng,
            publish_client_metrics=publish_client_metrics,
            event_label=EVENT_LABEL,
        )

    def summary(self) -> None:
        """Log the privacy spent so far, then Flower's DP settings and the wrapped FedAvg's summary."""
        report = self.ledger.report()
        rate = "m/N, N = the nodes at round 1" if self.sampling_rate is None else f"{self.sampling_rate:.4g}"
        log(
            INFO,
            "\t├──> Privacy ledger: epsilon=%.4f at delta=%g (%s), %d Poisson-sampled releases (q=%s)",
            report.epsilon,
            report.delta,
            report.method,
            len(self.ledger.rounds()),
            rate,
        )
        super().summary()

    def __repr__(self) -> str:
        return (
            f"AccountedPoissonFixedClipping(z={self.noise_multiplier}, C={self.clipping_norm}, "
            f"m={self.num_sampled_clients}, q={self.sampling_rate})"
        )


def _check_poisson_accountant(accountant: PrivacyAccountant, num_clients: Optional[int]) -> int:
    """N from a Flower accountant configured for this sampling; ValueError naming what to change otherwise."""
    config = accountant.config
    if config.sampling_method is not SamplingMethod.POISSON:
        raise ValueError(
            "AccountedPoissonFixedClipping samples clients by Poisson sampling: give it a Flower accountant "
            f"configured with sampling_method=SamplingMethod.POISSON (got {config.sampling_method.value!r}), "
            "or use AccountedServerSideFixedClipping for Flower's fixed-size, no-amplification accounting"
        )
    if num_clients is not None and num_clients != config.population_size:
        raise ValueError(
            f"num_clients={num_clients} differs from the accountant's population_size="
            f"{config.population_size}: both are N, the population sampled with q = m/N"
        )
    return int(config.population_size)


__all__ = ["AccountedPoissonFixedClipping", "EVENT_LABEL"]
