r"""The one central-Gaussian round, with its sampler and clip policy chosen by configuration.

Every central-DP strategy of this package releases, per round,

.. math:: \tilde w = w + \frac1m \sum_{i \in S} \bar\Delta_i + \mathcal N\!\big(0, \sigma^2 I\big),
          \qquad \bar\Delta_i = \Delta_i \min(1, C_t/\lVert\Delta_i\rVert_2),

over a public denominator m (:mod:`.central_release`), and books its event under ``add_or_remove_one``
(user-level DP). Three settings select the variant (as Opacus chooses an optimizer variant by
configuration), and every check (screening, clipping, the budget stop, the public denominator) is made
once, here:

* ``sampling`` (participation): ``"fixed"`` (the wrapped FedAvg's fixed-size sample, booked as
  ``GaussianDpEvent(z)``: no amplification claimed), ``"poisson"`` (each node asked
  independently with q = m/N from OS entropy, :func:`.central_release.poisson_sample`,
  booked as ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``: the contribution of one
  client is bounded whatever the sample, so the round is a sampled Gaussian mechanism;
  Mironov, Talwar & Zhang 2019), or ``"cyclic"`` / ``"cyclic-poisson"`` (b-min-separated groups with a
  participation cap, for a banded factorisation:
  :mod:`flwr_dp_strategies.strategy.banded_matrix_factorization`, which implements :meth:`choose_nodes`,
  :meth:`admit` and the event). Either way the wrapped strategy's ``configure_train`` makes the
  instruction (config, records); the participation rule chooses only the nodes.
* ``noise_sampler`` (noise): i.i.d. Gaussian from OS entropy (``"os-entropy"``), the discrete Gaussian
  on a grid (``"secure"``, booked as ``ZCDpEvent``), Flower's NumPy helper (``"flower"``), or a
  correlated stream (``"banded"``: :meth:`noise_row` gives row t of :math:`C_b^{-1}Z`).
* ``clipping``: ``"fixed"`` (C constant, σ = zC/m) or ``"adaptive"`` (Andrew et al.,
  NeurIPS 2021, Algorithm 1: the round releases the pair (clipped sum, centred unclipped
  count) with noise :math:`z_\Delta C_t` and :math:`\sigma_b`, a Gaussian mechanism of
  multiplier exactly z when :math:`z_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}`; then
  :math:`C_{t+1} = C_t \exp(-\eta(\bar b - \gamma))`, post-processing). With adaptive
  clipping the clip happens on the server (``clipping_side="server"``) or the clients clip
  and send their bit (``"client"``; the server re-clips and rejects out-of-range bits and
  norms, :mod:`flwr_dp_strategies.strategy.client_side_adaptive_clipping`).

The round runs through :class:`~.template.AccountedRound`: screening, then
:meth:`CentralGaussianRound.release_train` (clip, sum, noise, the event as a booking),
then booking, saving (the learnt C is saved with the ledger: public, it costs nothing)
and publishing (the ledger's figures; ``dp/clipping-norm`` and ``dp/unclipped-fraction``
with adaptive clipping; the clients' train metrics only with
``publish_client_metrics=True``, which books the round as non-private). Training stops
before a round would exceed ``ledger.max_epsilon`` (or a Flower accountant's). A user's Flower
``PrivacyAccountant`` is driven through its public protocol only (``would_exceed``, ``compose``,
``get_privacy_spent``; :meth:`CentralGaussianRound.compose_flower`), never through the private
bookkeeping of Flower's wrappers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any, Optional

import numpy as np
from dp_accounting.dp_event import DpEvent, GaussianDpEvent, NonPrivateDpEvent, PoissonSampledDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.supercore.differential_privacy import add_gaussian_noise_inplace

from ..privacy.accounting.relations import ADD_OR_REMOVE_ONE, convert_event
from ..privacy.rng import RngSource
from ..privacy.validation import check_int, check_positive
from .central_release import (
    NON_PRIVATE_METRICS_LABEL,
    fixed_denominator_release,
    log_budget_stop,
    poisson_sample,
    require_configured,
    sampled_train_instructions,
    secure_release_event,
    server_step,
)
from .client_accounting import ContentCheck, check_ledger_types
from .metrics import aggregate_reply_metrics
from .reply_screening import array_spec, screen_train_content
from .streaming_aggregation import ClippedSum, npy_view, to_array
from .template import AccountedRound, Booking, RoundRelease, Screened

SAMPLING = ("poisson", "fixed")
#: every participation rule of the round: SAMPLING (a user's choice) and the cyclic schedules of a banded
#: factorisation (b-min-separation, :class:`~flwr_dp_strategies.privacy.accounting.participation.CyclicParticipation`)
PARTICIPATION = SAMPLING + ("cyclic", "cyclic-poisson", "window-allocation")
CLIPPING = ("fixed", "adaptive")
NOISE_SAMPLERS = ("os-entropy", "secure", "flower")
#: the round's noise: NOISE_SAMPLERS (i.i.d., a user's choice) and "banded" (correlated across rounds)
NOISES = NOISE_SAMPLERS + ("banded",)
CLIPPING_NORM_METRIC = "dp/clipping-norm"
UNCLIPPED_FRACTION_METRIC = "dp/unclipped-fraction"
#: C is kept in [MIN_CLIPPING_NORM, MAX_CLIPPING_NORM] (post-processing: no privacy cost), so a
#: run of thousands of rounds at an extreme target never underflows C to 0 or overflows it to inf.
MIN_CLIPPING_NORM = 1e-300
MAX_CLIPPING_NORM = 1e300


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
            f"(default num_sampled_clients/20) or lower noise_multiplier"
        )
    ratio = z / (2.0 * sigma_b)  # z_Δ = z / sqrt(1 - ratio²): the same number, no overflow for a tiny z
    return float(z / math.sqrt((1.0 - ratio) * (1.0 + ratio)))


def noisy_unclipped_fraction(
    centred_count: float, stddev: float, denominator: int, generator: np.random.Generator
) -> float:
    r""":math:`\bar b = \operatorname{clip}_{[0,1]}\big((\sum_i (b_i - \frac12) + \mathcal N(0, \sigma_b^2))/m
    + \frac12\big)`, from the centred count :math:`\sum_i (b_i - \frac12)`."""
    noisy = (centred_count + float(generator.normal(0.0, stddev))) / denominator + 0.5
    return min(1.0, max(0.0, noisy))


def geometric_update(
    clipping_norm: float, unclipped_fraction: float, target_unclipped_quantile: float, learning_rate: float
) -> float:
    r""":math:`C_{t+1} = C_t \exp(-\eta(\bar b - \gamma))`, kept in [MIN_CLIPPING_NORM, MAX_CLIPPING_NORM]."""
    updated = clipping_norm * math.exp(-learning_rate * (unclipped_fraction - target_unclipped_quantile))
    return min(MAX_CLIPPING_NORM, max(MIN_CLIPPING_NORM, updated))


def check_ledger_arguments(ledger: object, ledger_path: object, sampling: str) -> None:
    """``ledger``: None or a PrivacyLedger (add/remove-one under Poisson sampling: dp-accounting has no
    replace-one form of the sampled Gaussian); ``ledger_path``: None, a str or a path."""
    check_ledger_types(ledger, ledger_path)
    if sampling == "poisson" and ledger is not None and ledger.neighboring_relation != ADD_OR_REMOVE_ONE:
        raise ValueError(
            "ledger must use neighboring_relation='add_or_remove_one' with Poisson sampling "
            f"(got {ledger.neighboring_relation!r}); sample a fixed number of clients for a replace_one "
            "ledger"
        )


class CentralGaussianRound(AccountedRound):
    """The central-Gaussian round (module docstring) for a Flower DP wrapper of a FedAvg (``self.strategy``).

    A public strategy sets, in its constructor, Flower's attributes (``strategy``, ``noise_multiplier``,
    ``clipping_norm``, ``num_sampled_clients``; with adaptive clipping ``target_unclipped_quantile``,
    ``clip_norm_lr``, ``update_noise_multiplier``, ``clipped_count_stddev``) and calls
    :meth:`_init_central` with its configuration; it implements nothing of the round.
    """

    sampling: str = "fixed"
    clipping: str = "fixed"
    clipping_side: str = "server"
    #: every accepted reply reaches the model only clipped, summed and noised by the booked central event
    central_covers_replies = True
    noise_sampler: str = "os-entropy"
    event_label: str = "central-gaussian"
    state_name: Optional[str] = None  # the name the learnt C is saved under in the ledger file (adaptive)
    strategy: Any
    noise_multiplier: float
    clipping_norm: float
    num_sampled_clients: int
    accountant: Any = None

    def _init_central(
        self,
        *,
        sampling: str,
        clipping: str,
        num_clients: Optional[int],
        rng: Any,
        publish_client_metrics: bool,
        event_label: str,
        noise_sampler: str = "os-entropy",
        clipping_side: str = "server",
    ) -> None:
        """The configuration of the round (after the ledger is open: ``_init_accounting``)."""
        if sampling not in PARTICIPATION:
            raise ValueError(f"sampling must be one of {PARTICIPATION}, got {sampling!r}")
        if clipping not in CLIPPING:
            raise ValueError(f"clipping must be one of {CLIPPING}, got {clipping!r}")
        if noise_sampler not in NOISES:
            raise ValueError(f"noise_sampler must be one of {NOISES}, got {noise_sampler!r}")
        cls = type(self)
        if sampling not in SAMPLING and cls.choose_nodes is CentralGaussianRound.choose_nodes:
            raise TypeError(f"{cls.__name__}: sampling={sampling!r} needs a choose_nodes that implements it")
        if noise_sampler == "banded" and cls.noise_row is CentralGaussianRound.noise_row:
            raise TypeError(f"{cls.__name__}: noise_sampler='banded' needs a noise_row that draws the stream")
        self.sampling, self.clipping, self.clipping_side = sampling, clipping, clipping_side
        self.noise_sampler, self.event_label = noise_sampler, event_label
        self.num_clients = (
            None if num_clients is None else check_int("num_clients", num_clients, minimum=self.num_sampled_clients)
        )
        self.rng = RngSource(rng)
        self.publish_client_metrics = bool(publish_client_metrics)
        self.round_offset = max(self.ledger.rounds(), default=0)  # a restored ledger: round numbers continue
        self.budget_exhausted = False
        self.current_arrays = ArrayRecord()
        self._spec: Optional[dict] = None
        self._idle_round: Optional[int] = None
        self._dimension = 0
        self._secure_bound = self.clipping_norm

    # ------------------------------------------------------------------ accounting
    @property
    def sampling_rate(self) -> Optional[float]:
        """q = m/N under Poisson sampling (None until N is known, or with fixed-size sampling)."""
        if self.sampling != "poisson" or self.num_clients is None:
            return None
        return self.num_sampled_clients / self.num_clients

    def add_remove_event(self) -> DpEvent:
        """One round under ``add_or_remove_one``: the Gaussian of multiplier z (the discrete Gaussian's
        ``ZCDpEvent`` with ``noise_sampler="secure"``), Poisson(q)-sampled under Poisson sampling."""
        event: DpEvent = GaussianDpEvent(self.noise_multiplier)
        if self.noise_sampler == "secure":
            event = secure_release_event(
                self.noise_multiplier, self.clipping_norm, self.num_sampled_clients, self._dimension, self._secure_bound
            )
        if self.sampling == "poisson":
            event = PoissonSampledDpEvent(self.sampling_rate, event)
        return event

    def round_event(self) -> DpEvent:
        """One round in the ledger's relation (a replace-one ledger, fixed-size sampling only, books the
        event converted: replacing a client moves the release by twice as much)."""
        return convert_event(self.add_remove_event(), ADD_OR_REMOVE_ONE, self.ledger.neighboring_relation)

    nominal_event = round_event

    def flower_event(self) -> Any:
        """The round for a user's Flower ``PrivacyAccountant`` (None without one), through its public protocol
        only: ``GaussianPrivacyEvent(z, sample_size=m, population_size=N)``, which the accountant reads as
        the plain Gaussian (``NO_AMPLIFICATION``, fixed-size sampling) or the Poisson(m/N)-sampled one
        (``POISSON``, Poisson sampling). Composed once per release (:meth:`compose_flower`)."""
        if self.accountant is None:
            return None
        from flwr.supercore.privacy_accounting import GaussianPrivacyEvent

        return GaussianPrivacyEvent(
            noise_multiplier=self.noise_multiplier,
            sample_size=self.num_sampled_clients,
            population_size=self.accountant.config.population_size,
        )

    def compose_flower(self) -> None:
        """Compose this release into the user's Flower accountant (if any) and log what it has spent."""
        event = self.flower_event()
        if event is None:
            return
        self.accountant.compose(event)
        spent = self.accountant.get_privacy_spent()
        log(
            INFO,
            "Privacy spent: epsilon=%.6f at delta=%g after %d releases",
            spent.epsilon,
            spent.delta,
            spent.num_releases,
        )

    def _ledger_would_exceed(self) -> bool:
        return self.ledger.would_exceed(
            central_events=[self.add_remove_event()], neighboring_relation=ADD_OR_REMOVE_ONE
        )

    def _would_exceed(self) -> bool:
        """One more round would exceed the ledger's ``max_epsilon`` (or, Poisson, the Flower accountant's)."""
        if self._ledger_would_exceed():
            return True
        flower = self.flower_event()
        return (
            flower is not None
            and self.accountant.config.max_epsilon is not None
            and self.accountant.would_exceed(flower)
        )

    def budget_spent(self) -> bool:
        """After a round: the plan is done or the next round's event would exceed the ledger's (or the Flower
        accountant's) budget, from the ledger and the configuration only."""
        if self.budget_exhausted or self.plan_exhausted():
            return True
        if self.sampling == "poisson" and self.num_clients is None:
            return False  # q is fixed at the first round's configure
        return self._would_exceed()

    def _stop(self, server_round: int) -> None:
        """Mark the budget as exhausted from ``server_round`` on and say so (once)."""
        if not self.budget_exhausted:
            if self._ledger_would_exceed():
                log_budget_stop(server_round, self.ledger)
            else:
                log(
                    WARNING,
                    "Privacy budget: round %d would exceed the Flower accountant's max_epsilon=%s; "
                    "no further training.",
                    server_round,
                    self.accountant.config.max_epsilon,
                )
        self.budget_exhausted = True

    # ------------------------------------------------------------------ configure
    def train_config(self, config: ConfigRecord) -> ConfigRecord:
        """The config sent with the model (clients that clip get this round's C under Flower's key)."""
        if self.clipping_side == "client":
            from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

            config[KEY_CLIPPING_NORM] = float(self.clipping_norm)
        return config

    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Choose the nodes (:meth:`choose_nodes`) and send them the wrapped strategy's instruction; nothing once
        the plan is done (:meth:`plan_exhausted`) or one more round would exceed the budget, nor in a round the
        wrapped strategy configures no training (then nothing is released nor booked)."""
        nodes = sorted(grid.get_node_ids())
        self.start_round(arrays, nodes)
        if self.budget_exhausted or self.plan_exhausted():
            self.budget_exhausted = True
            return []
        if self._would_exceed():
            self._stop(server_round)
            return []
        config = self.train_config(config)
        chosen = self.choose_nodes(server_round, nodes)
        if chosen is None:
            messages = list(self.strategy.configure_train(server_round, arrays, config, grid)) or None
        else:
            messages = sampled_train_instructions(self.strategy, server_round, arrays, config, grid, chosen)
        self._idle_round = server_round if messages is None else None
        if messages is None:
            log(INFO, "configure_train: the wrapped strategy configures no training in round %d", server_round)
        if self.clipping == "adaptive":
            log(INFO, "configure_train: clipping norm %.6g, %s sampling", self.clipping_norm, self.sampling)
        return messages or []

    def start_round(self, arrays: ArrayRecord, nodes: list[int]) -> None:
        """Fix the round's model (the reference every update is clipped against) and, under Poisson sampling,
        N from the first round's nodes."""
        if self.sampling == "poisson" and self.num_clients is None:
            self.num_clients = check_int("num_clients", len(nodes), minimum=self.num_sampled_clients)
        self.current_arrays = arrays
        self._spec = array_spec(arrays)
        self._dimension = sum(math.prod(shape) for shape, _, _ in self._spec.values())
        self._secure_bound = self.clipping_norm * max(1, len(nodes)) / self.num_sampled_clients

    def plan_exhausted(self) -> bool:
        """True once the planned releases are made (a participation schedule's end; never for the i.i.d. rounds)."""
        return False

    def choose_nodes(self, server_round: int, nodes: list[int]) -> Optional[list[int]]:
        """The participation rule: None keeps the wrapped strategy's fixed-size choice (``"fixed"``); a list (the
        nodes to train) replaces it: each node independently with q = m/N (``"poisson"``)."""
        if self.sampling != "poisson":
            return None
        chosen = poisson_sample(nodes, self.sampling_rate, self.rng())
        log(
            INFO,
            "configure_train: Poisson sample of %d nodes (q=%.4f, N=%d)",
            len(chosen),
            self.sampling_rate,
            len(nodes),
        )
        return chosen

    def instruct_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's evaluation; nothing once the budget is spent."""
        if self.budget_exhausted:
            return []
        messages = list(self.strategy.configure_evaluate(server_round, arrays, config, grid))
        return messages

    # ------------------------------------------------------------------ the round
    def skip_train(self, server_round: int) -> bool:
        require_configured(self)
        return self.budget_exhausted or server_round == self._idle_round

    def booking_round(self, server_round: int) -> int:
        return server_round + self.round_offset

    def train_check(self) -> ContentCheck:
        """Identity, structure and weight of a train reply (NaN/inf are found while its update is added)."""
        key = self.strategy.weighted_by_key
        return lambda content: screen_train_content(
            content, self._spec, key, check_values=False, max_weight=self.max_weight
        )

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """Admit (:meth:`admit`), clip and add the updates, divide by m, add the noise (:meth:`noise_row` for a
        correlated stream); with adaptive clipping also the noisy unclipped fraction and the next C. The round's
        event (:meth:`release_event`) is booked even for an empty sample (it is a release: w + noise), except
        with fixed clipping and fixed-size sampling, where a round without a valid reply releases nothing
        (Flower's wrapper does the same). :meth:`released` then records what the round used."""
        self.admit(server_round, screened)
        clipping_norm = self.clipping_norm
        summed = ClippedSum({k: npy_view(a) for k, a in self.current_arrays.items()}, clipping_norm)
        unclipped = self.add_updates(server_round, summed, screened)
        accepted = screened.accepted
        if self.clipping == "fixed" and self.sampling == "fixed" and not accepted:
            return RoundRelease()
        m = self.num_sampled_clients
        generator = self.noise_generator(server_round)
        metrics: Optional[MetricRecord] = None
        if self.clipping == "adaptive":
            arrays = fixed_denominator_release(summed, m, self.update_noise_multiplier * clipping_norm / m, generator)
            fraction = noisy_unclipped_fraction(
                unclipped - len(accepted) / 2.0, self.clipped_count_stddev, m, generator
            )
            self.clipping_norm = geometric_update(
                clipping_norm, fraction, self.target_unclipped_quantile, self.clip_norm_lr
            )
            metrics = MetricRecord(
                {CLIPPING_NORM_METRIC: float(clipping_norm), UNCLIPPED_FRACTION_METRIC: float(fraction)}
            )
            if self.state_name is not None:
                self.ledger_store.set_state(self.state_name, {"clipping_norm": float(self.clipping_norm)})
        else:
            arrays = self._fixed_release(summed, generator)
        event = self.release_event()
        bookings = [] if event is None else [Booking(event, self.event_label, neighboring_relation=ADD_OR_REMOVE_ONE)]
        self.compose_flower()
        self.released(server_round, screened)
        if self.publish_client_metrics:
            bookings.append(Booking(NonPrivateDpEvent(), NON_PRIVATE_METRICS_LABEL))
            published = (
                aggregate_reply_metrics(
                    self.strategy.train_metrics_aggr_fn, [r.content for r in accepted], self.strategy.weighted_by_key
                )
                if accepted
                else MetricRecord()
            )
            metrics = published if metrics is None else _merged(published, metrics)
        return RoundRelease(arrays, metrics, bookings)

    def admit(self, server_round: int, screened: Screened) -> None:
        """Reject the screened replies the participation rule refuses (none for ``"fixed"`` and ``"poisson"``)."""

    def released(self, server_round: int, screened: Screened) -> None:
        """Record what the release used (a participation schedule, a noise stream's position): nothing here."""

    def release_event(self) -> Optional[DpEvent]:
        """The event this release books under ``add_or_remove_one`` (None: nothing, e.g. past a participation cap)."""
        return self.add_remove_event()

    def noise_generator(self, server_round: int) -> np.random.Generator:
        """The generator of the round's noise: a fresh OS-entropy one (a seed or Generator only in tests)."""
        return self.rng()

    def noise_row(self, generator: np.random.Generator) -> Optional[np.ndarray]:
        """The round's correlated noise as d standard-normal-scale values (the flattened keys in order), or None
        for i.i.d. noise: a banded matrix factorisation's row of :math:`C_b^{-1}Z` (:mod:`..privacy.mechanisms.matrix_factorization`)."""
        return None

    def server_step(self, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        """The wrapped strategy's server update on the DP release (:func:`.central_release.server_step`:
        FedAvgM, FedAdam, FedYogi, FedAdagrad step on the noised mean; FedAvg and FedProx keep it)."""
        return server_step(self.strategy, server_round, arrays)

    def add_updates(self, server_round: int, summed: ClippedSum, screened: Screened) -> int:
        """Clip and add every accepted update to ``summed`` (NaN/inf: rejected as ``non-finite``); the number
        of updates left unscaled (the unclipped bits :math:`b_i = 1`)."""
        screened.add_clipped(summed)
        return summed.count - summed.clipped

    def _fixed_release(self, summed: ClippedSum, generator: np.random.Generator) -> ArrayRecord:
        """w + S/m + N(0, (zC/m)² I) from OS entropy (the discrete Gaussian with ``noise_sampler="secure"``,
        Flower's NumPy sampler with ``"flower"``)."""
        m = self.num_sampled_clients
        sigma = self.noise_multiplier * self.clipping_norm / m
        log(INFO, "aggregate_fit: parameters are clipped by value: %.4f.", self.clipping_norm)
        if self.noise_sampler == "flower":
            arrays = fixed_denominator_release(summed, m, 0.0, generator)
            values = [a.numpy() for a in arrays.values()]
            add_gaussian_noise_inplace(values, sigma)
            arrays = ArrayRecord({key: to_array(v) for key, v in zip(arrays.keys(), values)})
        else:
            bound = self._secure_bound if self.noise_sampler == "secure" else None
            row = self.noise_row(generator)
            arrays = fixed_denominator_release(summed, m, sigma, generator, secure_bound=bound, correlated=row)
        log(INFO, "aggregate_fit: central DP noise with %.4f stdev added", sigma)
        return arrays


def _merged(first: MetricRecord, second: MetricRecord) -> MetricRecord:
    out = MetricRecord(dict(first.items()))
    for key, value in second.items():
        out[key] = value
    return out


__all__ = [
    "CLIPPING",
    "CLIPPING_NORM_METRIC",
    "CentralGaussianRound",
    "check_ledger_arguments",
    "MAX_CLIPPING_NORM",
    "MIN_CLIPPING_NORM",
    "NOISE_SAMPLERS",
    "SAMPLING",
    "UNCLIPPED_FRACTION_METRIC",
    "geometric_update",
    "noisy_unclipped_fraction",
    "update_noise_multiplier",
]
