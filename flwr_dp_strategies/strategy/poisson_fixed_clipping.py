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

  with the sum streamed in place (:class:`~.streaming_aggregation.ClippedSum`:
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

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Optional

from dp_accounting.dp_event import GaussianDpEvent, NonPrivateDpEvent, PoissonSampledDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, PrivacyAccountant, SamplingMethod

from ..privacy import PrivacyLedger
from ..privacy.rng import RngLike, RngSource
from ..privacy.validation import check_int, check_positive
from ..rounds.central_release import (NON_PRIVATE_METRICS_LABEL, fixed_denominator_release, log_budget_stop,
                              poisson_sample, require_configured, sampled_train_instructions)
from ..rounds.client_accounting import ClientAccountingMixin
from ..rounds.metrics import aggregate_reply_metrics
from ..rounds.reply_screening import DEFAULT_MAX_WEIGHT, array_spec, reply_arrays, screen_train_content
from ..rounds.streaming_aggregation import ClippedSum, npy_view, single_threaded_blas

EVENT_LABEL = "central-gaussian/poisson-fixed-clipping"


class AccountedPoissonFixedClipping(ClientAccountingMixin, DifferentialPrivacyServerSideFixedClipping):
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
        ledger, ledger_path, resume, high_water_path, per_client_metrics: as :class:`AccountedFedAvg`.
        rng: sampling and noise generator (default: OS entropy).
        publish_client_metrics: also publish FedAvg's aggregate of the clients' train metrics,
            booking every such round as non-private (default False: un-noised client metrics
            next to a DP release would void it).
        max_weight: replies whose weight is not in (0, max_weight] are rejected (``weight``).
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
        ledger: Optional[PrivacyLedger] = None,
        ledger_path: Optional[str] = None,
        resume: bool = False,
        high_water_path: Optional[str] = None,
        per_client_metrics: bool = False,
        rng: RngLike = None,
        publish_client_metrics: bool = False,
        max_weight: float = DEFAULT_MAX_WEIGHT,
    ) -> None:
        if not isinstance(strategy, FedAvg):
            raise ValueError(f"strategy must be a FedAvg (or subclass), got {type(strategy).__name__}")
        check_positive("noise_multiplier", noise_multiplier)
        check_positive("clipping_norm", clipping_norm)
        m = check_int("num_sampled_clients", num_sampled_clients, minimum=1)
        super().__init__(strategy, noise_multiplier, clipping_norm, m)  # not accountant: Flower refuses POISSON ones
        if accountant is not None:
            num_clients = _check_poisson_accountant(accountant, num_clients)
        self.accountant = accountant
        self.num_clients = None if num_clients is None else check_int("num_clients", num_clients, minimum=m)
        self._init_accounting(ledger, ledger_path, per_client_metrics, None, "add_or_remove_one",
                              resume=resume, high_water_path=high_water_path)
        self._init_screening(max_weight)
        self.publish_client_metrics = bool(publish_client_metrics)
        self.rng = RngSource(rng)
        self.budget_exhausted = False

    @property
    def sampling_rate(self) -> Optional[float]:
        """q = m/N (None until N is known)."""
        return None if self.num_clients is None else self.num_sampled_clients / self.num_clients

    def round_event(self) -> PoissonSampledDpEvent:
        """The event of one round: Poisson(q)-sampled Gaussian with noise multiplier z."""
        return PoissonSampledDpEvent(self.sampling_rate, GaussianDpEvent(self.noise_multiplier))

    def flower_event(self) -> Optional[GaussianPrivacyEvent]:
        """The same round for Flower's accountant (None without one): q = m/N as sample/population."""
        if self.accountant is None:
            return None
        return GaussianPrivacyEvent(noise_multiplier=self.noise_multiplier, sample_size=self.num_sampled_clients,
                                    population_size=self.accountant.config.population_size)

    def _would_exceed(self) -> bool:
        """One more round would exceed the ledger's ``max_epsilon`` or the Flower accountant's."""
        if self.ledger.would_exceed(central_events=[self.round_event()],
                                     neighboring_relation="add_or_remove_one"):
            return True
        flower = self.flower_event()
        return flower is not None and self.accountant.config.max_epsilon is not None \
            and self.accountant.would_exceed(flower)

    # ------------------------------------------------------------------ train
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Poisson-sample the nodes (rate q) and send them the wrapped strategy's instruction; nothing once the
        budget is spent, nor in a round the wrapped strategy configures no training (then nothing is released).

        The wrapped strategy's ``configure_train`` makes the instruction (its config, e.g. a learning-rate
        schedule, its records); only its choice of nodes is replaced
        (:func:`.central_release.sampled_train_instructions`).
        """
        nodes = sorted(grid.get_node_ids())
        if self.num_clients is None:
            self.num_clients = check_int("num_clients", len(nodes), minimum=self.num_sampled_clients)
        self.current_arrays = arrays
        self._spec = array_spec(arrays)
        if self._would_exceed():
            self._stop(server_round)
            return []
        chosen = poisson_sample(nodes, self.sampling_rate, self.rng())
        messages = sampled_train_instructions(self.strategy, server_round, arrays, config, grid, chosen)
        self._idle_round = server_round if messages is None else None
        if messages is None:
            log(INFO, "configure_train: the wrapped strategy configures no training in round %d", server_round)
            messages = []
        else:
            log(INFO, "configure_train: Poisson sample of %d nodes (q=%.4f, N=%d)", len(chosen),
                self.sampling_rate, len(nodes))
        self.remember_instructions("train", server_round, messages)
        return messages

    def _stop(self, server_round: int) -> None:
        if not self.budget_exhausted:
            if self.ledger.would_exceed(central_events=[self.round_event()],
                                     neighboring_relation="add_or_remove_one"):
                log_budget_stop(server_round, self.ledger)
            else:
                log(WARNING, "Privacy budget: round %d would exceed the Flower accountant's max_epsilon=%s; "
                    "no further training.", server_round, self.accountant.config.max_epsilon)
        self.budget_exhausted = True

    @single_threaded_blas
    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Clip, sum in place, divide by m, add N(0, (zC/m)²), record the sampled-Gaussian event.

        Published next to the release: the ledger's figures only (no count of replies, see the module
        docstring).
        Not the sample size (amplification assumes the sample is secret: publishing |S| alone
        costs ε = 1.31 over 100 rounds at N = 100, q = 0.1), and not the clients' train
        metrics unless ``publish_client_metrics=True`` (then booked as non-private).
        """
        require_configured(self)
        if self.budget_exhausted or server_round == getattr(self, "_idle_round", None):
            return None, None
        accepted, rejected = self.screen_and_book(
            server_round, replies,
            lambda c: screen_train_content(c, self._spec, self.strategy.weighted_by_key, check_values=False,
                                           max_weight=self.max_weight),
            phase="train")
        summed = ClippedSum({k: npy_view(a) for k, a in self.current_arrays.items()}, self.clipping_norm)
        accepted = self.drop_rejected(server_round, accepted, summed.add_records([reply_arrays(r) for r in accepted]),
                                      "non-finite", rejected)
        sigma = self.noise_multiplier * self.clipping_norm / self.num_sampled_clients
        arrays = fixed_denominator_release(summed, self.num_sampled_clients, sigma, self.rng())
        self.ledger.record(self.round_event(), server_round=server_round, label=EVENT_LABEL,
                           neighboring_relation="add_or_remove_one")
        self._compose_release(self.flower_event())  # Flower's accountant, if any (logs as Flower does)
        metrics = None
        if self.publish_client_metrics:
            self.ledger.record(NonPrivateDpEvent(), server_round=server_round, label=NON_PRIVATE_METRICS_LABEL)
            metrics = aggregate_reply_metrics(self.strategy.train_metrics_aggr_fn, [r.content for r in accepted],
                                              self.strategy.weighted_by_key) if accepted else MetricRecord()
        self.save_ledger()
        return arrays, self.round_metrics(metrics, rejected)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        """Screened evaluate replies and the wrapped FedAvg's metric aggregation."""
        return self.screened_evaluate(server_round, replies, self.strategy)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The wrapped strategy's evaluation; nothing once the budget is spent."""
        if self.budget_exhausted:
            return []
        messages = list(self.strategy.configure_evaluate(server_round, arrays, config, grid))
        self.remember_instructions("evaluate", server_round, messages)
        return messages

    def summary(self) -> None:
        """Log the privacy spent so far, then Flower's DP settings and the wrapped FedAvg's summary."""
        report = self.ledger.report()
        rate = "m/N, N = the nodes at round 1" if self.sampling_rate is None else f"{self.sampling_rate:.4g}"
        log(INFO, "\t├──> Privacy ledger: epsilon=%.4f at delta=%g (%s), %d Poisson-sampled releases (q=%s)",
            report.epsilon, report.delta, report.method, len(self.ledger.rounds()), rate)
        super().summary()

    def __repr__(self) -> str:
        return (f"AccountedPoissonFixedClipping(z={self.noise_multiplier}, C={self.clipping_norm}, "
                f"m={self.num_sampled_clients}, q={self.sampling_rate})")


def _check_poisson_accountant(accountant: PrivacyAccountant, num_clients: Optional[int]) -> int:
    """N from a Flower accountant configured for this sampling; ValueError naming what to change otherwise."""
    config = accountant.config
    if config.sampling_method is not SamplingMethod.POISSON:
        raise ValueError(
            "AccountedPoissonFixedClipping samples clients by Poisson sampling: give it a Flower accountant "
            f"configured with sampling_method=SamplingMethod.POISSON (got {config.sampling_method.value!r}), "
            "or use AccountedServerSideFixedClipping for Flower's fixed-size, no-amplification accounting")
    if num_clients is not None and num_clients != config.population_size:
        raise ValueError(f"num_clients={num_clients} differs from the accountant's population_size="
                         f"{config.population_size}: both are N, the population sampled with q = m/N")
    return int(config.population_size)


__all__ = ["AccountedPoissonFixedClipping", "EVENT_LABEL"]
