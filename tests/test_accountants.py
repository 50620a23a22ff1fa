"""Accountant values against closed forms and published / dp-accounting test vectors.

Vectors: ../shared/reference/anchors.md §10 (dp-accounting 0.6.0, δ = 1e-5 unless noted).
The ledger reports min(RDP, PLD); both are checked separately.
"""

import numpy as np
import pytest
from dp_accounting import dp_event

from flwr_dp_strategies.privacy.accounting.accountants import LedgerRdpAccountant
from flwr_dp_strategies.privacy import (
    ExponentialMechanismDpEvent,
    PrivacyLedger,
    PureDpEvent,
    ApproxDpEvent,
)

Gauss = dp_event.GaussianDpEvent
Poisson = dp_event.PoissonSampledDpEvent

VECTORS = [
    # (name, event, count, delta, relation, rdp, pld)
    (
        "mnist dp-sgd q=256/60k z=1.1 60 epochs",
        Poisson(256 / 60000, Gauss(1.1)),
        14062,
        1e-5,
        "add_or_remove_one",
        2.597,
        2.382,
    ),
    ("opacus z=1.3 15 epochs", Poisson(240 / 60000, Gauss(1.3)), 3750, 1e-5, "add_or_remove_one", 0.922, 0.834),
    (
        "cross-device q=100/3400 z=1 1500 rounds",
        Poisson(100 / 3400, Gauss(1.0)),
        1500,
        1e-5,
        "add_or_remove_one",
        8.16,
        7.46,
    ),
    ("cross-silo Gaussian z=1 x100", Gauss(1.0), 100, 1e-5, "add_or_remove_one", 96.12, 91.82),
    ("LocalDpMod eps=1 (z=4.845) x100", Gauss(4.845), 100, 1e-5, "add_or_remove_one", 11.15, 10.39),
    ("Laplace b=1 x100", dp_event.LaplaceDpEvent(1.0), 100, 1e-5, "add_or_remove_one", 70.78, 68.25),
    ("fl-dp-sa Gaussian z=0.2 x3", Gauss(0.2), 3, 1e-5, "add_or_remove_one", 77.37, 73.62),
    ("10-ary RR p=0.8534", dp_event.RandomizedResponseDpEvent(0.8534, 10), 1, 1e-9, "replace_one", 1.011, 1.000),
]


@pytest.mark.parametrize("name,event,count,delta,relation,rdp,pld", VECTORS, ids=[v[0] for v in VECTORS])
def test_ledger_matches_published_vectors(name, event, count, delta, relation, rdp, pld):
    ledger = PrivacyLedger(delta, neighboring_relation=relation)
    for r in range(count):
        ledger.record(event, server_round=r)
    rep = ledger.report()
    assert rep.epsilon_rdp == pytest.approx(rdp, rel=2e-3, abs=1e-3)
    assert rep.epsilon_pld == pytest.approx(pld, rel=2e-3, abs=1e-3)
    assert rep.epsilon == min(rep.epsilon_rdp, rep.epsilon_pld)


@pytest.mark.parametrize("z", [0.5, 1.0, 3.0])
def test_gaussian_rdp_curve_is_alpha_over_two_sigma_squared(z):
    acc = LedgerRdpAccountant()
    acc.compose(Gauss(z))
    np.testing.assert_allclose(acc.rdp, acc.orders / (2 * z * z), rtol=1e-10)


def test_exponential_mechanism_rdp_is_bounded_range_zcdp():
    eps = 0.7
    acc = LedgerRdpAccountant()
    acc.compose(ExponentialMechanismDpEvent(eps), 3)
    np.testing.assert_allclose(acc.rdp, 3 * np.minimum(eps, acc.orders * eps**2 / 8))


def test_pure_dp_rdp_is_bun_steinke_bound():
    eps = 0.7
    acc = LedgerRdpAccountant()
    acc.compose(PureDpEvent(eps))
    np.testing.assert_allclose(acc.rdp, np.minimum(eps, acc.orders * eps**2 / 2))


def test_single_pure_event_reports_its_epsilon():
    # One ε-DP release is (ε, 0)-DP, and neither accountant may report more than ε.
    ledger = PrivacyLedger(1e-6)
    ledger.record(ExponentialMechanismDpEvent(2.0), server_round=1)
    assert ledger.epsilon() <= 2.0 + 1e-3
    assert ledger.report().epsilon_pld == pytest.approx(2.0, abs=1e-3)


def test_em_composition_uses_the_tighter_bounded_range_bound():
    ledger = PrivacyLedger(1e-5)
    for r in range(100):
        ledger.record(ExponentialMechanismDpEvent(1.0), server_round=r)
    rep = ledger.report()
    assert rep.epsilon == rep.epsilon_rdp < rep.epsilon_pld < 100


def test_approx_events_add_by_basic_composition_in_rdp():
    ledger = PrivacyLedger(1e-5, accounting="rdp")
    ledger.record(ApproxDpEvent(0.5, 1e-7), server_round=1)
    ledger.record(ApproxDpEvent(0.5, 1e-7), server_round=2)
    assert ledger.epsilon() == pytest.approx(1.0)
    too_much = PrivacyLedger(1e-5, accounting="rdp")
    too_much.record(ApproxDpEvent(0.5, 2e-5), server_round=1)
    assert too_much.epsilon() == float("inf")


@pytest.mark.parametrize("rounds", [1, 4])
def test_replace_one_gaussian_is_read_against_the_relations_own_sensitivity(rounds):
    """z = σ/Δ₂ with Δ₂ the replace-one sensitivity: the ledger's ε equals the add/remove one
    (the analytic calibration for one round), not dp-accounting's doubled-shift reading."""
    from dp_accounting.dp_event import GaussianDpEvent

    from flwr_dp_strategies.privacy import PrivacyLedger
    from flwr_dp_strategies.privacy.mechanisms.gaussian import gaussian_sigma

    z = gaussian_sigma(1.0, 1e-5, 1.0)
    epsilons = {}
    for relation in ("add_or_remove_one", "replace_one"):
        ledger = PrivacyLedger(1e-5, neighboring_relation=relation)
        for r in range(rounds):
            ledger.record(GaussianDpEvent(z), server_round=r, client="a")
        epsilons[relation] = ledger.epsilon()
    assert epsilons["replace_one"] == pytest.approx(epsilons["add_or_remove_one"], rel=1e-6)
    if rounds == 1:
        assert epsilons["replace_one"] == pytest.approx(1.0, rel=1e-3)
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(GaussianDpEvent(0.9 * z), server_round=0, client="a")
    assert ledger.epsilon() > 1.08  # 10 % less noise is visible


@pytest.mark.parametrize("relation", ["add_or_remove_one", "replace_special"])
def test_the_cached_sampled_gaussian_composes_exactly_as_dp_accounting(relation):
    """The per-process cache of the Poisson-sampled Gaussian's RDP curve and PLD changes no figure: the ledger's
    accountants give dp-accounting's own ε, bit for bit, for a mixed history with repeats (and a cache hit is
    served for the repeats: each (q, z, count) is built once)."""
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    from flwr_dp_strategies.privacy.accounting import accountants

    rel = NeighboringRelation[relation.upper()]
    history = [
        dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.3)),
        dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.3)), 3),
        dp_event.PoissonSampledDpEvent(0.25, dp_event.GaussianDpEvent(0.9)),
        dp_event.GaussianDpEvent(4.0),
        dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.3)),
    ]
    ours, theirs = LedgerRdpAccountant(neighboring_relation=rel), RdpAccountant(neighboring_relation=rel)
    for event in history:
        ours.compose(event)
        theirs.compose(event)
    np.testing.assert_array_equal(ours._rdp, theirs._rdp)
    assert ours.get_epsilon(1e-5) == theirs.get_epsilon(1e-5)
    if rel is NeighboringRelation.ADD_OR_REMOVE_ONE:  # dp-accounting's PLD: add/remove (and replace-one) only
        before = accountants._sampled_gaussian_pld.cache_info()
        pld_ours = accountants.LedgerPldAccountant(neighboring_relation=rel, value_discretization_interval=1e-3)
        pld_theirs = PLDAccountant(neighboring_relation=rel, value_discretization_interval=1e-3)
        for event in history:
            pld_ours.compose(event)
            pld_theirs.compose(event)
        assert pld_ours.get_epsilon(1e-5) == pld_theirs.get_epsilon(1e-5)
        after = accountants._sampled_gaussian_pld.cache_info()
        assert after.hits > before.hits  # the repeated (0.1, 1.3, count 1) was served from the cache
    with pytest.raises(ValueError):  # read-only: a cached curve cannot be changed by a caller
        accountants._sampled_gaussian_rdp(0.1, 1.3, tuple(float(a) for a in ours._orders))[0] = 0.0
