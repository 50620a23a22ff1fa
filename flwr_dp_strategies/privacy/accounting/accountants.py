"""dp-accounting's RDP and PLD accountants, taught this package's extra events.

The subclasses only add cases to ``_maybe_compose`` (the extension point of
``dp_accounting.PrivacyAccountant``); every native event is composed by
dp-accounting itself, and every :class:`~.custom_events.CustomDpEvent` by its own
``rdp`` / ``approx_dp`` / ``pld`` rules (no case per class here). The rules of this
package's events, with their derivations in the events' docstrings:

RDP (Mironov 2017), per order α:

* ``ExponentialMechanismDpEvent(ε)``: ε-bounded-range ⇒ ε²/8-zCDP (Cesar &
  Rogers 2021) and ε-DP ⇒ D_α ≤ ε, so RDP(α) = min(ε, α·ε²/8).
* ``PureDpEvent(ε)`` and ``DiscreteLaplaceDpEvent`` (ε = parameter·sensitivity):
  ε-DP ⇒ ε²/2-zCDP (Bun & Steinke 2016, Prop. 3.3), so RDP(α) = min(ε, α·ε²/2).
* ``ApproxDpEvent(ε, δ)``: RDP cannot express δ > 0; these are kept aside and
  added by basic composition: ε_total = ε_RDP(δ − Σδᵢ) + Σεᵢ.
* ``SkellamDpEvent(Δ₁, Δ₂, μ)``: Agarwal, Kairouz & Liu 2021, Thm 3.5
  (:func:`~.skellam.skellam_rdp`). Not known to PLD (ε_PLD = ∞, the ledger's
  ``"best"`` mode takes RDP) and never amplified by sampling (refused by
  :mod:`.event_validation`; dp-accounting's RDP only amplifies Gaussians).

PLD (Meiser & Mohammadi 2018; Doroshenko et al. 2022), pessimistic estimates:

* ``ExponentialMechanismDpEvent`` / ``PureDpEvent``: the PLD of an (ε, 0)
  mechanism (``from_privacy_parameters``), i.e. binary randomized response,
  which dominates every ε-DP mechanism (Kairouz, Oh & Viswanath 2015). This is
  looser than the bounded-range PLD that dp-accounting's main branch has.
* ``ApproxDpEvent(ε, δ)``: the pessimistic (ε, δ) PLD (mass δ at +∞).

A Poisson-sampled Gaussian (the central strategies' event of every round) is composed exactly as dp-accounting
composes it, from a per-process cache of its RDP curve and its PLD keyed by every argument (q, z, the orders or
the discretisation, the relation, the count): a ledger that re-composes its history on every report then pays for
each distinct (q, z) once, not once per round and report.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

from .custom_events import CustomDpEvent


def pure_epsilon(event: dp_event.DpEvent) -> Optional[float]:
    """ε of an event known only as pure ε-DP (EM, Pure, discrete Laplace), else None."""
    if isinstance(event, CustomDpEvent):
        return event.pure_epsilon()
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return float(event.noise_parameter) * float(event.sensitivity)
    return None


def basic_pure_epsilon(event: dp_event.DpEvent) -> Optional[float]:
    """ε of an event that is pure ε-DP as a whole (Laplace ε = 1/b, EM, Pure, discrete Laplace,
    and self-/compositions of these, by basic composition), else None.

    A sum of pure ε is a valid (ε, 0) bound; the ledger takes it when it beats the
    RDP conversion (e.g. one Laplace release: exactly ε instead of ε + 0.003).
    """
    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_event.LaplaceDpEvent):
        return 1.0 / float(event.noise_multiplier) if event.noise_multiplier > 0 else None
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = basic_pure_epsilon(event.event)
        return None if inner is None else inner * int(event.count)
    if isinstance(event, dp_event.ComposedDpEvent):
        parts = [basic_pure_epsilon(e) for e in event.events]
        return None if any(p is None for p in parts) else float(sum(parts))
    return pure_epsilon(event)


def _sampled_gaussian(event: dp_event.DpEvent) -> Optional[tuple[float, float]]:
    """``(q, z)`` of a ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` with 0 < q and z > 0, else None (every
    other form is left to dp-accounting)."""
    if not isinstance(event, dp_event.PoissonSampledDpEvent) or not isinstance(event.event, dp_event.GaussianDpEvent):
        return None
    q, z = float(event.sampling_probability), float(event.event.noise_multiplier)
    return (q, z) if q > 0 and z > 0 else None


@lru_cache(maxsize=512)
def _sampled_gaussian_rdp(q: float, z: float, orders: tuple[float, ...]) -> np.ndarray:
    """dp-accounting's RDP curve of the Poisson-sampled Gaussian (Mironov, Talwar & Zhang 2019), read-only."""
    curve = np.asarray(
        rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(
            q=q, noise_multiplier=z, orders=np.asarray(orders)
        ),
        dtype=float,
    )
    curve.setflags(write=False)
    return curve


@lru_cache(maxsize=512)
def _sampled_gaussian_pld(q: float, z: float, interval: float, relation: NeighboringRelation, count: int):
    """dp-accounting's PLD of ``count`` compositions of the Poisson-sampled Gaussian, built as its PLDAccountant
    builds it (PLDs are immutable: composing returns a new one)."""
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=z, value_discretization_interval=interval, sampling_prob=q, neighboring_relation=relation
    ).self_compose(count)


class LedgerRdpAccountant(rdp_privacy_accountant.RdpAccountant):
    """RdpAccountant that also composes EM, pure-ε, discrete-Laplace and (ε, δ) events."""

    def __init__(self, orders=None, neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE):
        super().__init__(orders, neighboring_relation)
        self.approx_epsilon = 0.0
        self.approx_delta = 0.0

    def _maybe_compose(self, event, count, do_compose):
        sampled = _sampled_gaussian(event)
        if sampled is not None and self._neighboring_relation in (
            NeighboringRelation.ADD_OR_REMOVE_ONE,
            NeighboringRelation.REPLACE_SPECIAL,
        ):
            if do_compose:
                self._rdp += count * _sampled_gaussian_rdp(*sampled, tuple(float(a) for a in self._orders))
            return None
        if isinstance(event, CustomDpEvent):
            curve, approx = event.rdp(self._orders), event.approx_dp()
            if curve is None and approx is None:
                return super()._maybe_compose(event, count, do_compose)  # unsupported: refused
            if do_compose:
                if curve is not None:
                    self._rdp += count * np.asarray(curve, dtype=float)
                if approx is not None:
                    self.approx_epsilon += count * float(approx[0])
                    self.approx_delta += count * float(approx[1])
            return None
        if isinstance(event, dp_event.DiscreteLaplaceDpEvent):  # ε-DP: ε²/2-zCDP (Bun & Steinke 2016, 3.3)
            if do_compose:
                eps = float(event.noise_parameter) * float(event.sensitivity)
                self._rdp += count * np.minimum(eps, self._orders * eps * eps / 2.0)
            return None
        return super()._maybe_compose(event, count, do_compose)

    def get_epsilon(self, target_delta: float) -> float:
        return epsilon_from_rdp(self._orders, self._rdp, target_delta, self.approx_epsilon, self.approx_delta)


def epsilon_from_rdp(orders, rdp, delta: float, approx_epsilon: float = 0.0, approx_delta: float = 0.0) -> float:
    """ε at δ from an RDP curve (Balle et al. 2020 conversion, as dp-accounting), plus (ε, δ) events."""
    if approx_delta >= delta:
        return float("inf")
    if not np.any(rdp):
        return float(approx_epsilon)
    eps, _ = rdp_privacy_accountant.compute_epsilon(orders, rdp, delta - approx_delta)
    return float(eps) + float(approx_epsilon)


class LedgerPldAccountant(pld_privacy_accountant.PLDAccountant):
    """PLDAccountant that also composes EM, pure-ε and (ε, δ) events.

    Gaussian events under ``REPLACE_ONE``: this package's convention is
    ``GaussianDpEvent(z)`` with z = σ/Δ₂ and Δ₂ the L2 sensitivity *under the
    ledger's relation* (e.g. FM's and Analyze Gauss' replace-one Δ₂). The privacy
    loss of N(f(D), σ²) against N(f(D'), σ²) with ‖f(D) − f(D')‖ ≤ Δ₂ is that of a
    unit shift at standard deviation z, whatever the relation; dp-accounting's PLD
    instead reads z against the add/remove sensitivity and doubles the shift for
    ``REPLACE_ONE`` (its RDP accountant does not), which would overstate ε (2.15
    instead of 1.0 for a Gaussian calibrated to (1, 1e-5)). So a non-sampled
    Gaussian is composed here as the unit-shift PLD at z/√count.
    """

    def _maybe_compose(self, event, count, do_compose):
        sampled = _sampled_gaussian(event)
        if sampled is not None:
            if do_compose:
                pld = _sampled_gaussian_pld(
                    *sampled, float(self._value_discretization_interval), self.neighboring_relation, int(count)
                )
                self._pld = self._pld.compose(pld)
            return None
        if isinstance(event, dp_event.GaussianDpEvent) and self.neighboring_relation == NeighboringRelation.REPLACE_ONE:
            if do_compose:
                if event.noise_multiplier == 0:
                    self._contains_non_dp_event = True
                else:
                    self._pld = self._pld.compose(
                        pld_lib.from_gaussian_mechanism(
                            standard_deviation=float(event.noise_multiplier) / np.sqrt(count),
                            value_discretization_interval=self._value_discretization_interval,
                            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                        )
                    )
            return None
        if isinstance(event, CustomDpEvent):
            pld = event.pld(self._value_discretization_interval)
            if pld is None:
                return super()._maybe_compose(event, count, do_compose)  # unknown to PLD: its epsilon is inf
            if do_compose:
                self._pld = self._pld.compose(pld.self_compose(count) if count > 1 else pld)
            return None
        return super()._maybe_compose(event, count, do_compose)
