"""Skellam noise and its accounting (issue 19): sampler, RDP bound, SkellamDpEvent in the ledger.

Tolerances come from the sample sizes (stated at each test); seeds are fixed, so
every statistical test is deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event as d
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.special import gammaln, logsumexp

from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.accounting.accountants import LedgerRdpAccountant
from flwr_dp_strategies.privacy.accounting.event_validation import validate_event
from flwr_dp_strategies.privacy.accounting.events import event_from_dict, event_to_dict
from flwr_dp_strategies.privacy.mechanisms.skellam import SkellamDpEvent, sample_skellam, skellam_event, skellam_rdp


# ---------------------------------------------------------------- sampler
@pytest.mark.parametrize("mu", [0.4, 5.0, 1000.0])
def test_sampler_has_mean_zero_and_variance_mu(mu):
    n = 200_000
    z = sample_skellam(mu, n, rng=11)
    assert z.dtype == np.int64 and z.shape == (n,)
    # mean: std sqrt(mu/n); variance: Var(S^2) ~ (mu4 - mu^2)/n with mu4 = mu + 3 mu^2 (Skellam's even cumulants are all mu)
    mean_tol = 5.0 * math.sqrt(mu / n)
    var_tol = 5.0 * math.sqrt((mu + 2.0 * mu * mu) / n)
    assert abs(z.mean()) < mean_tol
    assert abs(z.var() - mu) < var_tol
    assert var_tol < 0.1 * mu / 2  # the test has the power to see a scale 10% off (variance off by >= 19%)


def _chi_square_p(samples: np.ndarray, mu: float) -> float:
    """Chi-square goodness of fit of integer samples against Sk(mu) (tails merged so every bin expects >= 5)."""
    n = samples.size
    dist = stats.skellam(mu / 2, mu / 2)
    half = int(math.ceil(mu + 12 * math.sqrt(mu) + 10))
    ks = np.arange(-half, half + 1)
    expected = n * dist.pmf(ks)
    keep = expected >= 5
    lo, hi = ks[keep][0], ks[keep][-1]
    inner = np.arange(lo, hi + 1)
    counts = np.array([np.sum(samples < lo)] + [np.sum(samples == k) for k in inner] + [np.sum(samples > hi)])
    exp = np.concatenate([[n * dist.cdf(lo - 1)], n * dist.pmf(inner), [n * dist.sf(hi)]])
    return float(stats.chisquare(counts, exp * n / exp.sum()).pvalue)


@pytest.mark.parametrize("mu", [0.7, 6.0, 40.0])
def test_empirical_pmf_matches_scipy_skellam_and_a_10_percent_scale_error_is_caught(mu):
    samples = sample_skellam(mu, 100_000, rng=3)
    assert _chi_square_p(samples, mu) > 1e-4
    for wrong in (0.9 * mu, 1.1 * mu):  # the same samples read against a scale 10% off are rejected
        assert _chi_square_p(samples, wrong) < 1e-6


def test_sum_of_client_shares_is_skellam_of_the_total():
    """n clients adding Sk(mu/n) give Sk(mu): the property distributed DP rests on."""
    mu, n_clients = 9.0, 7
    gen = np.random.default_rng(5)
    total = sum(sample_skellam(mu / n_clients, 100_000, gen) for _ in range(n_clients))
    assert _chi_square_p(total, mu) > 1e-4
    assert _chi_square_p(total, 1.1 * mu) < 1e-6


def test_sampler_defaults_to_os_entropy_and_accepts_shapes():
    a, b = sample_skellam(50.0, 64), sample_skellam(50.0, 64)
    assert not np.array_equal(a, b)
    assert np.array_equal(sample_skellam(3.0, (4, 5), rng=1), sample_skellam(3.0, (4, 5), rng=1))
    assert sample_skellam(3.0, (4, 5), rng=1).shape == (4, 5)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"mu": 0.0, "size": 3}, "mu"),
        ({"mu": -1.0, "size": 3}, "mu"),
        ({"mu": float("nan"), "size": 3}, "mu"),
        ({"mu": float("inf"), "size": 3}, "mu"),
        ({"mu": 1e19, "size": 3}, "mu"),
        ({"mu": 1.0, "size": -1}, "size"),
        ({"mu": 1.0, "size": 2.5}, "size"),
        ({"mu": 1.0, "size": 3, "rng": -2}, "rng"),
    ],
)
def test_sampler_arguments_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        sample_skellam(**kwargs)


# ---------------------------------------------------------------- RDP bound vs the exact divergence
def _skellam_logpmf(k: np.ndarray, mu: float) -> np.ndarray:
    """log P[Sk(mu) = k] as log sum_j Pois(j + |k|) Pois(j) (exact in log space, also far in the tails)."""
    lam = mu / 2.0
    kk = np.abs(np.asarray(k))[:, None]
    j = np.arange(int(lam + 40 * math.sqrt(lam) + 100))[None, :]
    log_pois = lambda m: m * math.log(lam) - lam - gammaln(m + 1)  # noqa: E731
    return logsumexp(log_pois(j) + log_pois(j + kk), axis=1)


def _exact_renyi(alpha: float, mu: float, shift: int) -> float:
    """D_alpha(Sk(mu) + shift || Sk(mu)) by summing over the pmf (the sum's support covers all non-negligible mass)."""
    half = int(shift + 40 * math.sqrt(mu) + 60 + 4 * alpha * shift)
    ks = np.arange(-half, half + 1)
    lp, lq = _skellam_logpmf(ks - shift, mu), _skellam_logpmf(ks, mu)
    return float(logsumexp(alpha * lp + (1 - alpha) * lq) / (alpha - 1))


def test_exact_logpmf_agrees_with_scipy_skellam():
    for mu in (0.5, 10.0, 300.0):
        ks = np.arange(-int(mu + 10 * math.sqrt(mu) + 10), int(mu + 10 * math.sqrt(mu) + 11))
        ref = stats.skellam.logpmf(ks, mu / 2, mu / 2)
        ok = ref > -600  # scipy underflows to -inf far out; compare where it is finite
        np.testing.assert_allclose(_skellam_logpmf(ks[ok], mu), ref[ok], rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("mu", [0.5, 2.0, 10.0, 100.0, 1000.0])
@pytest.mark.parametrize("shift", [1, 3, 10])
def test_rdp_bound_dominates_the_exact_one_dimensional_divergence(mu, shift):
    alphas = [1.5, 2, 2.5, 3, 4.5, 8, 32]
    bound = skellam_rdp(alphas, shift, shift, mu)
    for alpha, b in zip(alphas, bound):
        exact = _exact_renyi(alpha, mu, shift)
        assert exact > 0
        assert b >= exact, (alpha, b, exact)
        if alpha != int(alpha):  # charged at 2 below 2, by a chord above: looser than at integer orders
            continue
        if mu >= 100 and alpha <= 8:  # the Gaussian term dominates: tight
            assert b <= 1.2 * exact, (alpha, b, exact)
        if mu >= 1000:
            assert b <= 1.05 * exact, (alpha, b, exact)


def test_rdp_bound_dominates_a_multi_dimensional_shift():
    """Shift (1, -2, 3): the divergence of a product is the sum of the 1-D ones; Δ1 = 6, Δ2 = √14."""
    mu, shift = 20.0, (1, -2, 3)
    for alpha in (2, 4, 16):
        exact = sum(_exact_renyi(alpha, mu, abs(s)) for s in shift)
        bound = skellam_rdp([alpha], 6.0, math.sqrt(14.0), mu)[0]
        assert exact <= bound <= 2.0 * exact


def test_non_integer_orders_use_monotonicity_below_2_and_the_convexity_chord_above():
    l1, l2, mu = 2.0, 1.0, 5.0
    at = {a: skellam_rdp([a], l1, l2, mu)[0] for a in (2, 3, 4)}
    np.testing.assert_allclose(skellam_rdp([1.1, 1.9], l1, l2, mu), [at[2], at[2]])
    chord = (0.5 * 2 * at[3] + 0.5 * 3 * at[4]) / 2.5  # (α−1)ε(α) interpolated between 3 and 4, at 3.5
    np.testing.assert_allclose(skellam_rdp([3.5], l1, l2, mu), [chord])
    assert at[3] <= chord <= at[4]
    with pytest.raises(ValueError, match="orders"):
        skellam_rdp([1.0, 2.0], 1.0, 1.0, 1.0)


# ---------------------------------------------------------------- the event in the ledger
def test_event_round_trips_and_the_rdp_accountant_uses_the_bound():
    event = SkellamDpEvent(l1_sensitivity=12.0, l2_sensitivity=4.0, mu=250.0)
    assert event_from_dict(event_to_dict(event)) == event
    acc = LedgerRdpAccountant()
    acc.compose(d.SelfComposedDpEvent(event, 3))
    np.testing.assert_allclose(acc._rdp, 3 * skellam_rdp(acc._orders, 12.0, 4.0, 250.0))


def test_ledger_books_the_event_with_finite_epsilon_that_decreases_as_mu_grows():
    epsilons = []
    for mu in (10.0, 100.0, 1_000.0, 10_000.0):
        ledger = PrivacyLedger(1e-5)
        ledger.record(SkellamDpEvent(50.0, 10.0, mu), server_round=1)
        ledger.record(SkellamDpEvent(50.0, 10.0, mu), server_round=2)
        report = ledger.report()
        assert math.isfinite(report.epsilon) and report.epsilon > 0
        assert report.epsilon == report.epsilon_rdp and report.epsilon_pld == math.inf  # RDP only
        epsilons.append(report.epsilon)
        restored = PrivacyLedger.from_json(ledger.to_json())
        assert restored.report().epsilon == report.epsilon
    assert all(a > b for a, b in zip(epsilons, epsilons[1:]))


def test_large_mu_skellam_costs_about_what_the_gaussian_costs():
    """μ = (zΔ₂)²: the Gaussian part of the bound is that of GaussianDpEvent(z); the discrete part is O(1/μ²)."""
    gaussian, skellam = PrivacyLedger(1e-5, accounting="rdp"), PrivacyLedger(1e-5)
    gaussian.record(d.SelfComposedDpEvent(d.GaussianDpEvent(5.0), 50), server_round=1)
    skellam.record(d.SelfComposedDpEvent(skellam_event(300.0, (5.0 * 300.0) ** 2, dim=4096), 50), server_round=1)
    assert 1.0 < gaussian.epsilon() <= skellam.epsilon() <= 1.01 * gaussian.epsilon()


def test_a_sampled_skellam_event_is_refused_with_a_clear_error():
    event = SkellamDpEvent(10.0, 5.0, 100.0)
    ledger = PrivacyLedger(1e-5)
    for wrapped in (
        d.PoissonSampledDpEvent(0.1, event),
        d.PoissonSampledDpEvent(0.1, d.ComposedDpEvent([d.GaussianDpEvent(1.0), d.SelfComposedDpEvent(event, 2)])),
        d.SampledWithoutReplacementDpEvent(100, 10, event),
        d.SampledWithReplacementDpEvent(100, 10, event),
    ):
        with pytest.raises(ValueError, match="amplification"):
            validate_event(wrapped)
        with pytest.raises(ValueError, match="amplification"):
            ledger.record(wrapped, server_round=1)
    assert ledger.epsilon() == 0.0 and ledger.rounds() == []


def test_skellam_event_helper_uses_the_integer_l1_bound():
    assert skellam_event(3.0, 10.0, dim=1024).l1_sensitivity == 9.0  # ⌊Δ₂²⌋ < √D·Δ₂ = 96
    assert skellam_event(100.0, 10.0, dim=16).l1_sensitivity == 400.0  # √D·Δ₂ < Δ₂² = 1e4


# ---------------------------------------------------------------- property: bad parameters never booked
_reals = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.floats(min_value=0.05, max_value=1e4),
    st.integers(min_value=-3, max_value=5),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
)


def _valid(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _forge(l1: object, l2: object, mu: object) -> SkellamDpEvent:
    """An instance that skipped the constructor's checks (as a buggy or hostile client could build one)."""
    event = object.__new__(SkellamDpEvent)
    for name, value in (("l1_sensitivity", l1), ("l2_sensitivity", l2), ("mu", mu)):
        object.__setattr__(event, name, value)
    return event


@settings(
    max_examples=120, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(l1=_reals, l2=_reals, mu=_reals)
def test_out_of_domain_skellam_parameters_are_never_booked(l1, l2, mu):
    valid = _valid(l1) and _valid(l2) and _valid(mu) and mu <= 1e18
    ledger = PrivacyLedger(1e-5)
    ledger.record(d.GaussianDpEvent(2.0), server_round=1)  # a central event every client shares
    ledger.record(d.GaussianDpEvent(3.0), server_round=1, client="a")
    before = (ledger.epsilon(), ledger.epsilon("a"))
    forged = _forge(l1, l2, mu)
    description = {"type": "SkellamDpEvent", "l1_sensitivity": l1, "l2_sensitivity": l2, "mu": mu}
    if valid:
        event = SkellamDpEvent(l1, l2, mu)
        assert validate_event(forged) is forged
        assert event_from_dict(description) == event
        ledger.record(event, server_round=2, client="a")
        assert ledger.epsilon("a") >= before[1]
        return
    with pytest.raises(ValueError):
        SkellamDpEvent(l1, l2, mu)
    with pytest.raises(ValueError):
        event_from_dict(description)
    with pytest.raises(ValueError, match="l1_sensitivity|l2_sensitivity|mu"):
        validate_event(forged)
    for call in (
        lambda: ledger.record(forged, server_round=2, client="a"),
        lambda: ledger.record(forged, server_round=2),
        lambda: ledger.record_clients(forged, server_round=2, clients=["a", "b"]),
        lambda: ledger.check_accountable(forged),
        lambda: ledger.record(d.SelfComposedDpEvent(forged, 2), server_round=2, client="a"),
    ):
        with pytest.raises(ValueError):
            call()
    assert (ledger.epsilon(), ledger.epsilon("a")) == before
    assert ledger.clients == ["a"]


def test_a_replace_one_ledger_books_an_add_remove_skellam_event_at_twice_the_sensitivities():
    """Replacing one client moves the integer sum by x − x': at most 2·L2 in L2 and 2·L1 in L1."""
    from flwr_dp_strategies.privacy.accounting.relations import convert_event
    from flwr_dp_strategies.privacy.mechanisms.skellam import SkellamDpEvent

    event = SkellamDpEvent(30.0, 3.0, 400.0)
    converted = convert_event(event, "add_or_remove_one", "replace_one")
    assert (converted.l1_sensitivity, converted.l2_sensitivity, converted.mu) == (60.0, 6.0, 400.0)
    replace = PrivacyLedger(1e-5, accounting="rdp", neighboring_relation="replace_one")
    add_remove = PrivacyLedger(1e-5, accounting="rdp")
    replace.record(event, server_round=1, neighboring_relation="add_or_remove_one")
    add_remove.record(event, server_round=1, neighboring_relation="add_or_remove_one")
    assert replace.epsilon() > add_remove.epsilon()


def test_numpys_poisson_is_trusted_only_where_it_is_accurate_and_larger_variances_are_split():
    """At λ = MAX_POISSON_LAMBDA one NumPy draw matches its normal limit (2e5 draws: variance within
    5 s.e., parity balanced); Sk(2e16), i.e. λ = 1e16 where a single NumPy draw is always even, is drawn
    in pieces and takes odd values; Sk(2e14), in 1000 pieces, has variance μ (a 10 % error would be seen)."""
    from flwr_dp_strategies.privacy.mechanisms.skellam import MAX_POISSON_LAMBDA

    n = 200_000
    lam = MAX_POISSON_LAMBDA
    x = np.random.default_rng(11).poisson(lam, n).astype(np.float64)
    se = math.sqrt(2 / n)
    assert abs(x.var() / lam - 1) < 5 * se
    assert abs(np.mean(x.astype(np.int64) % 2) - 0.5) < 5 * math.sqrt(0.25 / n)
    y = sample_skellam(2e16, 64, rng=np.random.default_rng(12))
    assert np.any(y % 2 == 1)  # one NumPy draw per Poisson would give only even values here
    mu, size = 2e14, 20_000  # λ = 1e14 in 1000 pieces
    z = sample_skellam(mu, size, rng=np.random.default_rng(13)).astype(np.float64) / math.sqrt(mu)
    tolerance = 5 * math.sqrt(2 / size)
    assert abs(z.var() - 1) < tolerance
    assert abs(1.21 * z.var() - 1) > tolerance and abs(0.81 * z.var() - 1) > tolerance  # 10 % off is seen
