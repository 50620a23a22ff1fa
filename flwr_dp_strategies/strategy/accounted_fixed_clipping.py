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

Implementation. The released model is computed as Flower's wrapper + FedAvg
would, but streamed (:class:`~.streaming_aggregation.ClippedSum`): per reply,
:math:`\Delta_i = x_i - w` is written into one model-sized buffer, the norm is
taken from per-key ``dot`` products, and :math:`n_i \min(1, C/\lVert\Delta_i\rVert_2)
\Delta_i` is added in place to one accumulator per key (payloads read zero-copy,
replies left untouched); the model is :math:`w + \sum_i n_i \bar\Delta_i / \sum_i n_i`
in FedAvg's dtypes, then Flower's ``add_gaussian_noise_inplace`` adds the noise.
The wrapped FedAvg's reply consistency checks and metric aggregation are used.

Failed replies. Flower's wrapper releases nothing in a round where one reply is
an error. This one goes on with the valid replies (a SuperNode that dies
mid-round is a client that did not reply: the ledger records the smaller
:math:`z_\text{eff}` of the replies aggregated, as above) and reports the count
as the int ``replies/failed`` in the round's train and evaluate metrics. A reply
holding NaN/inf is dropped likewise (``rejected/non-finite``). With Flower's own
``accountant`` (which assumes exactly ``num_sampled_clients`` equally weighted
replies) a failed or dropped reply still releases nothing, as in Flower.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from logging import INFO, WARNING

from typing import Optional

import numpy as np
from dp_accounting.dp_event import GaussianDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg, Strategy
from flwr.serverapp.strategy.dp_fixed_clipping import validate_replies
from flwr.serverapp.strategy.strategy_utils import validate_message_reply_consistency
from flwr.supercore.differential_privacy import add_gaussian_noise_inplace, compute_stdv
from flwr.supercore.privacy_accounting import PrivacyAccountant

from ..privacy import PrivacyLedger
from .accounted_fedavg import reply_arrays, reply_weight
from .client_accounting import open_ledgers
from .metrics import aggregate_reply_metrics, failed_replies, with_failed_replies, with_privacy_metrics
from .streaming_aggregation import ClippedSum, mean_dtype, npy_view, to_array

EVENT_LABEL = "central-gaussian/server-side-fixed-clipping"


class AccountedServerSideFixedClipping(DifferentialPrivacyServerSideFixedClipping):
    """Central DP with server-side fixed clipping whose releases are composed in a ledger.

    Same arguments as :class:`DifferentialPrivacyServerSideFixedClipping`, plus:

    Args:
        ledger: the :class:`PrivacyLedger` that records one central
            ``GaussianDpEvent`` per released aggregate (default: a new
            ``PrivacyLedger(1e-5)``). Its ``max_epsilon`` is the budget.
        ledger_path: optional ledger file (locked while the strategy lives). If it exists
            at construction the ledger is restored from it (into ``ledger``, which must then
            be empty with the same delta and relation; see ``open_ledgers``) and round
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
        self.ledger_store, self.ledger = open_ledgers(ledger, self.ledger_path, "add_or_remove_one")
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
        """Clip, average and noise the valid replies (streamed), then record the release with its metrics."""
        replies = list(replies)
        if server_round in self._skipped_rounds:
            return None, None
        failed = failed_replies(replies, server_round)
        flower_event = self._pop_pending_event(server_round)
        valid = self._checked([r for r in replies if not r.has_error()])
        arrays, kept, weights = self._clipped_mean(server_round, valid) if valid else (None, [], [])
        dropped = len(valid) - len(kept)
        if arrays is None or (self.accountant is not None and dropped):
            return None, _round_metrics(None, failed, dropped)
        event = GaussianDpEvent(noise_multiplier=self.effective_noise_multiplier(weights))
        if not self._admit(event, server_round):
            return None, None
        self._compose_release(flower_event)
        self.ledger.record(event, server_round=server_round + self.round_offset, label=EVENT_LABEL)
        self._save()
        metrics = aggregate_reply_metrics(self.strategy.train_metrics_aggr_fn,  # type: ignore[attr-defined]
                                          [r.content for r in kept], self._weight_key)
        return arrays, _round_metrics(with_privacy_metrics(metrics, self.ledger), failed, dropped)

    @property
    def _weight_key(self) -> str:
        return self.strategy.weighted_by_key  # type: ignore[attr-defined]

    def _checked(self, valid: list[Message]) -> list[Message]:
        """The valid replies if Flower's checks pass (count with its accountant, weights, consistency), else []."""
        if not valid or not validate_replies(valid, self.num_sampled_clients, strict=self.accountant is not None):
            return []
        self._validate_uniform_weights(valid)
        validate_message_reply_consistency([r.content for r in valid], self._weight_key, check_arrayrecord=True)
        return valid

    def _clipped_mean(
        self, server_round: int, replies: list[Message]
    ) -> tuple[Optional[ArrayRecord], list[Message], list[float]]:
        """w + Σ n_i Δ̄_i / Σ n_i + N(0, (zC/m)² I), streamed; also the replies and weights used.

        Arrays pair with the current model by position (as in Flower's wrapper) and
        take the replies' keys; a reply with NaN/inf is dropped (logged).
        """
        summed = ClippedSum({k: npy_view(a) for k, a in self.current_arrays.items()}, self.clipping_norm)
        kept, weights = [], []
        for reply in replies:
            weight = reply_weight(reply, self._weight_key)
            if summed.add(list(reply_arrays(reply).values()), weight) is None:
                log(WARNING, "Round %d: reply from node %s holds NaN/inf; dropped", server_round,
                    reply.metadata.src_node_id)
                continue
            kept.append(reply)
            weights.append(weight)
        if not kept:
            return None, kept, weights
        log(INFO, "aggregate_fit: parameters are clipped by value: %.4f.", self.clipping_norm)
        return self._noised(summed, reply_arrays(kept[0]), sum(weights)), kept, weights

    def _noised(self, summed: ClippedSum, first: ArrayRecord, total_weight: float) -> ArrayRecord:
        """Per key w + S/Σn in FedAvg's dtype, plus Flower's Gaussian noise of std zC/m."""
        out = {}
        for name, (key, total), values in zip(first.keys(), summed.result().items(), first.values()):
            reference = summed.reference[key]
            np.divide(total, total_weight, out=total)
            np.add(total, reference, out=total, casting="same_kind")
            out[name] = total.astype(mean_dtype(np.result_type(reference, npy_view(values))), copy=False)
        stdv = compute_stdv(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients)
        add_gaussian_noise_inplace(list(out.values()), stdv)
        log(INFO, "aggregate_fit: central DP noise with %.4f stdev added", stdv)
        return ArrayRecord({name: to_array(values) for name, values in out.items()})

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
        self.ledger_store.save()

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure federated evaluation; nothing once the budget is exhausted."""
        if self.budget_exhausted:
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The wrapped strategy's evaluation, plus ``replies/failed``."""
        replies = list(replies)
        failed = failed_replies(replies, server_round)
        metrics = self.strategy.aggregate_evaluate(server_round, replies)
        return with_failed_replies(metrics, failed) if metrics is not None or failed else None

    def summary(self) -> None:
        """Log the DP settings and the privacy spent so far."""
        super().summary()
        report = self.ledger.report()
        log(INFO, "\t├──> Privacy ledger: epsilon=%.4f at delta=%g (%s), %d central releases",
            report.epsilon, report.delta, report.method, len(self.ledger.rounds()))


def _round_metrics(metrics: Optional[MetricRecord], failed: int, non_finite: int) -> Optional[MetricRecord]:
    """``metrics`` plus ``replies/failed`` and ``rejected/non-finite``; None when there is nothing to say."""
    if metrics is None and not failed and not non_finite:
        return None
    merged = with_failed_replies(metrics, failed)
    merged["rejected/non-finite"] = float(non_finite)
    return merged


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
