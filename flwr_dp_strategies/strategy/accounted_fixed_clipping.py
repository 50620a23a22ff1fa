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
a bound (one client reporting :math:`n = 10^{308}` made the old effective noise
multiplier inf/inf = NaN and ε read 0). Before this version the class booked
:math:`z\sum n/(m \max n)` under an add/remove label, which covers only the
zero-out relation (z = 1, 50 rounds: 54.4 booked where the doubled sensitivity
gives 159.5); the replace-one ledger it offered as "conservative" was not
conservative either, for the same reason. Uniform weights over the public m are
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
* Only a ``FedAvg`` whose ``aggregate_train`` is not overridden is accepted: a
  server optimiser or a robust aggregator changes the analysis above.
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
(``error``, server log). With Flower's own ``accountant`` (which assumes exactly
``num_sampled_clients`` equally weighted replies) a round with fewer valid replies
releases nothing, as in Flower.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Optional

from dp_accounting.dp_event import DpEvent, GaussianDpEvent, NonPrivateDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg, Strategy
from flwr.serverapp.strategy.dp_fixed_clipping import validate_replies
from flwr.supercore.differential_privacy import add_gaussian_noise_inplace
from flwr.supercore.privacy_accounting import PrivacyAccountant

from ..privacy import PrivacyLedger
from ..privacy.relations import ADD_OR_REMOVE_ONE, convert_event
from ..privacy.rng import RngLike, RngSource
from ..privacy.validation import check_int, check_positive
from ..rounds.central_release import NON_PRIVATE_METRICS_LABEL, fixed_denominator_release, secure_release_event
from ..rounds.client_accounting import ClientAccountingMixin
from ..rounds.metrics import aggregate_reply_metrics
from ..rounds.reply_screening import DEFAULT_MAX_WEIGHT, array_spec, reply_arrays, screen_train_content
from ..rounds.streaming_aggregation import ClippedSum, npy_view, to_array, single_threaded_blas

NOISE_SAMPLERS = ("os-entropy", "secure", "flower")

EVENT_LABEL = "central-gaussian/server-side-fixed-clipping"


class AccountedServerSideFixedClipping(ClientAccountingMixin, DifferentialPrivacyServerSideFixedClipping):
    """Central DP with server-side fixed clipping over a fixed denominator, composed in a ledger.

    Same arguments as :class:`DifferentialPrivacyServerSideFixedClipping`, plus (keyword-only):

    Args:
        ledger: the :class:`PrivacyLedger` that records one central ``GaussianDpEvent(z)``
            (add/remove-one client) per released aggregate (default: a new add/remove
            ``PrivacyLedger(1e-5)``). Its ``max_epsilon`` is the budget.
        ledger_path: optional ledger file (locked while the strategy lives). If it exists
            at construction the ledger is restored from it (into ``ledger``, which must then
            be empty with the same delta and relation; see ``open_ledgers``) and round
            numbers continue after the last recorded round; after every recorded
            round the ledger is saved there atomically.
        rng: the noise generator: None (fresh OS entropy, the default), a seed or a Generator (tests).
        noise_sampler: ``"os-entropy"`` (default), ``"secure"`` (the floating-point-safe discrete
            Gaussian on a grid, CKS 2020, booked as ``ZCDpEvent`` with the rounding included; the
            public bound on |S/m| is C·N/m with N the connected nodes) or ``"flower"`` (Flower's
            ``np.random`` helper).
        publish_client_metrics: also publish FedAvg's aggregate of the clients' train metrics,
            booking every such round as non-private (default False).
        max_weight: replies whose ``weighted_by_key`` value is not in (0, max_weight] are rejected.
        per_client_metrics, max_reply_bytes: as :class:`AccountedFedAvg`.

    Behaviour per round:

    * ``configure_train``: if one more release would exceed ``ledger.max_epsilon``, log it
      and send nothing; the remaining rounds then neither train nor evaluate.
    * ``aggregate_train``: screen, clip, sum over m, add noise, record
      ``GaussianDpEvent(z)`` and merge ``ledger.metrics()`` into the returned MetricRecord.
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
        ledger: PrivacyLedger | None = None,
        ledger_path: str | os.PathLike[str] | None = None,
        resume: bool = False,
        high_water_path: str | os.PathLike[str] | None = None,
        rng: RngLike = None,
        noise_sampler: str = "os-entropy",
        publish_client_metrics: bool = False,
        max_weight: float = DEFAULT_MAX_WEIGHT,
        per_client_metrics: bool = False,
        max_reply_bytes: Optional[int] = None,
    ) -> None:
        check_positive("noise_multiplier", noise_multiplier)
        check_positive("clipping_norm", clipping_norm)
        check_int("num_sampled_clients", num_sampled_clients, minimum=1)
        if noise_sampler not in NOISE_SAMPLERS:
            raise ValueError(f"noise_sampler must be one of {NOISE_SAMPLERS}, got {noise_sampler!r}")
        _check_accountable(strategy)
        super().__init__(strategy, noise_multiplier, clipping_norm, num_sampled_clients, accountant=accountant)
        self._init_accounting(ledger, None if ledger_path is None else os.fspath(ledger_path), per_client_metrics,
                              max_reply_bytes, ADD_OR_REMOVE_ONE, resume=resume, high_water_path=high_water_path)
        self._init_screening(max_weight)
        self.rng = RngSource(rng)
        self.noise_sampler = noise_sampler
        if noise_sampler == "flower":
            log(WARNING, "noise_sampler='flower': central noise from NumPy's global generator (reproducible by "
                "anyone who seeds it); use the default OS-entropy sampler for a real deployment.")
        self.publish_client_metrics = bool(publish_client_metrics)
        self.round_offset = max(self.ledger.rounds(), default=0)
        self.budget_exhausted = False
        self._skipped_rounds: set[int] = set()
        self._spec: Optional[dict] = None
        self._dimension = 0
        self._secure_bound = self.clipping_norm

    def __repr__(self) -> str:
        """Compute a string representation of the strategy."""
        return "Accounted Differential Privacy Strategy Wrapper (Server-Side Fixed Clipping)"

    # ------------------------------------------------------------------ events
    def round_event(self) -> DpEvent:
        """One release, in the ledger's relation: ``GaussianDpEvent(z)`` (add/remove; z/2 under replace-one),
        or with ``noise_sampler="secure"`` the discrete Gaussian's ``ZCDpEvent`` (4ρ under replace-one)."""
        event: DpEvent = GaussianDpEvent(self.noise_multiplier)
        if self.noise_sampler == "secure":
            event = secure_release_event(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients,
                                         self._dimension, self._secure_bound)
        return convert_event(event, ADD_OR_REMOVE_ONE, self.ledger.neighboring_relation)

    nominal_event = round_event

    # ------------------------------------------------------------------ rounds
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure training, or send nothing if the next release would exceed the budget."""
        self._spec = array_spec(arrays)
        self._dimension = sum(math.prod(shape) for shape, _, _ in self._spec.values())
        self._secure_bound = self.clipping_norm * max(1, len(grid.get_node_ids())) / self.num_sampled_clients
        if self.ledger.would_exceed(central_events=[self.round_event()]):
            self._stop(server_round)
            return []
        return super().configure_train(server_round, arrays, config, grid)

    def _stop(self, server_round: int) -> None:
        """Mark the budget as exhausted from ``server_round`` on and say so."""
        self._skipped_rounds.add(server_round)
        if not self.budget_exhausted:
            log(
                WARNING,
                "Privacy budget: one more release (noise multiplier %s) would exceed max_epsilon=%s "
                "at delta=%g (spent: epsilon=%.4f). No further training: round %d and later release nothing.",
                self.noise_multiplier, self.ledger.max_epsilon, self.ledger.target_delta,
                self.ledger.epsilon(), server_round,
            )
        self.budget_exhausted = True

    @single_threaded_blas
    def aggregate_train(
        self,
        server_round: int,
        replies: Iterable[Message],
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen, clip, sum over m, add noise; record the release and return it with the ledger's figures."""
        if server_round in self._skipped_rounds:
            return None, None
        flower_event = self._pop_pending_event(server_round)
        accepted, rejected = self.screen_and_book(
            server_round, replies,
            lambda c: screen_train_content(c, self._spec, self._weight_key, self.max_reply_bytes, check_values=False,
                                           max_weight=self.max_weight),
            phase="train")
        summed = ClippedSum({k: npy_view(a) for k, a in self.current_arrays.items()}, self.clipping_norm)
        accepted = self.drop_rejected(server_round, accepted, summed.add_records([reply_arrays(r) for r in accepted]),
                                      "non-finite", rejected)
        if not accepted or (self.accountant is not None
                            and not validate_replies(accepted, self.num_sampled_clients, strict=True)):
            return None, self.round_metrics(None, rejected)
        arrays = self._release(summed)
        self._compose_release(flower_event)
        self.ledger.record(self.round_event(), server_round=server_round + self.round_offset, label=EVENT_LABEL)
        metrics = None
        if self.publish_client_metrics:
            self.ledger.record(NonPrivateDpEvent(), server_round=server_round + self.round_offset,
                               label=NON_PRIVATE_METRICS_LABEL)
            metrics = aggregate_reply_metrics(self.strategy.train_metrics_aggr_fn,  # type: ignore[attr-defined]
                                              [r.content for r in accepted], self._weight_key)
        self.save_ledger()
        return arrays, self.round_metrics(metrics, rejected)

    def _release(self, summed: ClippedSum) -> ArrayRecord:
        """w + S/m + N(0, (zC/m)² I), noise from OS entropy (or Flower's sampler if asked)."""
        m, sigma = self.num_sampled_clients, self.noise_multiplier * self.clipping_norm / self.num_sampled_clients
        log(INFO, "aggregate_fit: parameters are clipped by value: %.4f.", self.clipping_norm)
        if self.noise_sampler == "flower":
            arrays = fixed_denominator_release(summed, m, 0.0, self.rng())
            values = [a.numpy() for a in arrays.values()]
            add_gaussian_noise_inplace(values, sigma)
            arrays = ArrayRecord({key: to_array(v) for key, v in zip(arrays.keys(), values)})
        else:
            bound = self._secure_bound if self.noise_sampler == "secure" else None
            arrays = fixed_denominator_release(summed, m, sigma, self.rng(), secure_bound=bound)
        log(INFO, "aggregate_fit: central DP noise with %.4f stdev added", sigma)
        return arrays

    @property
    def _weight_key(self) -> str:
        return self.strategy.weighted_by_key  # type: ignore[attr-defined]

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure federated evaluation; nothing once the budget is exhausted."""
        if self.budget_exhausted:
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Screened evaluate replies and the wrapped FedAvg's metric aggregation."""
        return self.screened_evaluate(server_round, replies, self.strategy)

    def summary(self) -> None:
        """Log the privacy spent so far, then Flower's DP settings and the wrapped strategy's summary
        (whose ``└──>`` line closes the tree, as in Flower)."""
        report = self.ledger.report()
        log(INFO, "\t├──> Privacy ledger: epsilon=%.4f at delta=%g (%s), %d central releases",
            report.epsilon, report.delta, report.method, len(self.ledger.rounds()))
        super().summary()


def _check_accountable(strategy: Strategy) -> None:
    """Refuse set-ups the Gaussian-mechanism analysis does not cover."""
    if not isinstance(strategy, FedAvg) or type(strategy).aggregate_train is not FedAvg.aggregate_train:
        raise ValueError(
            "AccountedServerSideFixedClipping needs a FedAvg whose aggregate_train is not overridden "
            f"(got {type(strategy).__name__}): the analysis covers the clipped sum over m only."
        )


__all__ = ["AccountedServerSideFixedClipping", "EVENT_LABEL", "NOISE_SAMPLERS"]
