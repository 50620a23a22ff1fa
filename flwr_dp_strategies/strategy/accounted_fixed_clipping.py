r"""Flower's server-side fixed-clipping DP wrapper, accounted by a :class:`PrivacyLedger`.

What Flower does (``DifferentialPrivacyServerSideFixedClipping``), per round:

* each reply's update :math:`\Delta_i = w_i - w` is clipped in L2 to
  :math:`\bar\Delta_i = \Delta_i \cdot \min(1, C / \lVert\Delta_i\rVert_2)`;
* the wrapped FedAvg averages the clipped models, i.e. releases
  :math:`w + \sum_i a_i \bar\Delta_i` with :math:`a_i = n_i / \sum_j n_j`
  (``n_i`` = the ``weighted_by_key`` value of reply i);
* Gaussian noise :math:`\mathcal N(0, \sigma^2 I)` with
  :math:`\sigma = z\,C/m` is added to every coordinate, where ``z`` is the
  noise multiplier and ``m = num_sampled_clients``.

Why each round is a Gaussian mechanism with noise multiplier ``z`` (user-level DP).
Neighbouring datasets differ by adding or removing *one client's whole data*
(``add_or_remove_one``); the set of participating clients, their weights and the
denominator are treated as public and fixed (the "fixed-denominator" estimator of
McMahan et al. 2018). Precisely, the proof below is for the *zero-out* relation
(Kairouz et al. 2021): client k's clipped update is replaced by 0 while the weights
stay as they were. FedAvg's data-dependent denominator Σn over the replies that
arrived is not covered by it (a truly removed client also changes the others'
weights, which can up to double the sensitivity); Flower's own accountant makes the
same assumption. Use ``replace_one`` on the ledger for the conservative 2× figure. Removing client k replaces its contribution
:math:`a_k \bar\Delta_k` by 0, so the L2 sensitivity of the released mean is

.. math::  S = C \cdot \max_k a_k = C \max_k n_k / \textstyle\sum_j n_j ,

which is :math:`C/m` for ``m`` equally weighted replies. A Gaussian mechanism
with std :math:`\sigma` and sensitivity :math:`S` has noise multiplier
:math:`\sigma / S`; here

.. math::  z_\text{eff} = \frac{z C / m}{C \max_k a_k}
                       = z \cdot \frac{\sum_j n_j}{m \cdot \max_k n_k},

which equals ``z`` when ``m`` equally weighted replies arrive. Fewer replies than
``num_sampled_clients`` or unequal weights give :math:`z_\text{eff} < z`; the
wrapper records the effective value (and warns), never the nominal one. Under
``replace_one`` the sensitivity doubles (:math:`2 C \max_k a_k`) and the recorded
noise multiplier is halved.

Scope of the guarantee.

* Every client takes part in every round it is sampled for; no amplification by
  sampling is claimed (the event is a plain ``GaussianDpEvent``).
* Rounds compose adaptively in the ledger (RDP and PLD accountants; the tighter
  ε is reported, see :mod:`flwr_dp_strategies.privacy.ledger`).
* Only the released model is accounted. Client-reported train/evaluate metrics
  (losses, accuracies, example counts) are not privatised.
* Only a ``FedAvg`` whose ``aggregate_train`` is not overridden is accepted
  (e.g. ``FedAvg``, ``FedProx``): a server optimiser (FedAdam, FedAvgM ...) or a
  robust aggregator changes the sensitivity analysis above.
* Noise comes from Flower's ``np.random.normal`` (not a CSPRNG; floating-point
  attacks on the Gaussian sampler are out of scope).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from logging import INFO, WARNING

from dp_accounting.dp_event import GaussianDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg, Strategy
from flwr.supercore.privacy_accounting import PrivacyAccountant

from ..privacy import PrivacyLedger
from .client_accounting import resolve_ledger
from .metrics import with_privacy_metrics

EVENT_LABEL = "central-gaussian/server-side-fixed-clipping"


class AccountedServerSideFixedClipping(DifferentialPrivacyServerSideFixedClipping):
    """Central DP with server-side fixed clipping whose releases are composed in a ledger.

    Same arguments as :class:`DifferentialPrivacyServerSideFixedClipping`, plus:

    Args:
        ledger: the :class:`PrivacyLedger` that records one central
            ``GaussianDpEvent`` per released aggregate (default: a new
            ``PrivacyLedger(1e-5)``). Its ``max_epsilon`` is the budget.
        ledger_path: optional JSON file. If it exists at construction the ledger
            is restored from it (its settings win over ``ledger``) and round
            numbers continue after the last recorded round; after every recorded
            round the ledger is saved there atomically.

    Behaviour per round:

    * ``configure_train``: if one more release with noise multiplier ``z`` would
      exceed ``ledger.max_epsilon``, log it and send nothing; the remaining rounds
      then neither train nor evaluate, and the run ends normally.
    * ``aggregate_train``: Flower clips, averages and adds noise; only if an
      aggregate was released, record ``GaussianDpEvent(z_eff)`` (see the module
      docstring) and merge ``ledger.metrics()`` (``privacy/epsilon``,
      ``privacy/delta``, ...) into the returned MetricRecord. If fewer or unequal
      replies make ``z_eff`` push the ledger over budget, the aggregate is
      discarded (``None, None``) instead of released.
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
    ) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, num_sampled_clients, accountant=accountant)
        _check_accountable(strategy, noise_multiplier)
        self.ledger_path = None if ledger_path is None else os.fspath(ledger_path)
        self.ledger = resolve_ledger(ledger, self.ledger_path)
        self.round_offset = max(self.ledger.rounds(), default=0)
        self.budget_exhausted = False
        self._skipped_rounds: set[int] = set()

    def __repr__(self) -> str:
        """Compute a string representation of the strategy."""
        return "Accounted Differential Privacy Strategy Wrapper (Server-Side Fixed Clipping)"

    # ------------------------------------------------------------------ noise multipliers
    @property
    def sensitivity_factor(self) -> float:
        """1 under add/remove-one, 2 under replace-one (sensitivity in units of C·max a_k)."""
        return 2.0 if self.ledger.neighboring_relation == "replace_one" else 1.0

    def nominal_event(self) -> GaussianDpEvent:
        """The event of a round where ``num_sampled_clients`` equally weighted replies arrive."""
        return GaussianDpEvent(noise_multiplier=self.noise_multiplier / self.sensitivity_factor)

    def effective_noise_multiplier(self, weights: Sequence[float]) -> float:
        """z_eff = z · Σn / (m · max n) / factor for the weights of the aggregated replies."""
        if not weights or min(weights) <= 0 or not all(math.isfinite(w) for w in weights):
            raise ValueError(f"accounted aggregation needs positive finite client weights, got {list(weights)}")
        ratio = sum(weights) / (self.num_sampled_clients * max(weights))
        return self.noise_multiplier * ratio / self.sensitivity_factor

    def _reply_weights(self, replies: Iterable[Message]) -> list[float]:
        """The ``weighted_by_key`` value of every reply without error."""
        key = self.strategy.weighted_by_key  # type: ignore[attr-defined]
        weights = []
        for reply in replies:
            if reply.has_error():
                continue
            record = next(iter(reply.content.metric_records.values()))
            weights.append(float(record[key]))  # type: ignore[arg-type]
        return weights

    # ------------------------------------------------------------------ rounds
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure training, or send nothing if the next release would exceed the budget."""
        if self.ledger.would_exceed(central_events=[self.nominal_event()]):
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

    def aggregate_train(
        self,
        server_round: int,
        replies: Iterable[Message],
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Clip, average and noise (Flower), then record the release and attach the privacy metrics."""
        replies = list(replies)
        if server_round in self._skipped_rounds:
            return None, None
        arrays, metrics = super().aggregate_train(server_round, replies)
        if not arrays:  # no noise was added: nothing was released, nothing to record
            return arrays, metrics
        event = GaussianDpEvent(noise_multiplier=self.effective_noise_multiplier(self._reply_weights(replies)))
        if not self._admit(event, server_round):
            return None, None
        self.ledger.record(event, server_round=server_round + self.round_offset, label=EVENT_LABEL)
        self._save()
        return arrays, with_privacy_metrics(metrics, self.ledger)

    def _admit(self, event: GaussianDpEvent, server_round: int) -> bool:
        """Warn if the effective z is below nominal; refuse a release that would exceed the budget."""
        nominal = self.nominal_event().noise_multiplier
        if event.noise_multiplier < nominal * (1 - 1e-12):
            log(
                WARNING,
                "Round %d: fewer or unequally weighted replies; the effective noise multiplier is %.4f "
                "(nominal %.4f) and is what the ledger records.",
                server_round, event.noise_multiplier, nominal,
            )
        if self.ledger.would_exceed(central_events=[event]):
            log(WARNING, "Round %d: this aggregate would exceed max_epsilon=%s; it is discarded, not released.",
                server_round, self.ledger.max_epsilon)
            return False
        return True

    def _save(self) -> None:
        """Persist the ledger to ``ledger_path`` (atomic), if configured."""
        if self.ledger_path is not None:
            self.ledger.save(self.ledger_path)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure federated evaluation; nothing once the budget is exhausted."""
        if self.budget_exhausted:
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def summary(self) -> None:
        """Log the DP settings and the privacy spent so far."""
        super().summary()
        report = self.ledger.report()
        log(INFO, "\t├──> Privacy ledger: epsilon=%.4f at delta=%g (%s), %d central releases",
            report.epsilon, report.delta, report.method, len(self.ledger.rounds()))


def _check_accountable(strategy: Strategy, noise_multiplier: float) -> None:
    """Refuse set-ups the Gaussian-mechanism analysis does not cover."""
    if noise_multiplier <= 0:
        raise ValueError("AccountedServerSideFixedClipping needs noise_multiplier > 0 (z = 0 gives epsilon = inf).")
    if not isinstance(strategy, FedAvg) or type(strategy).aggregate_train is not FedAvg.aggregate_train:
        raise ValueError(
            "AccountedServerSideFixedClipping needs a FedAvg whose aggregate_train is not overridden "
            f"(got {type(strategy).__name__}): the sensitivity C·max(a_k) holds for the weighted mean only."
        )


__all__ = ["AccountedServerSideFixedClipping", "EVENT_LABEL"]
