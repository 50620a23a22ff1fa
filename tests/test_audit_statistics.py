"""Statistics of the canary audit (:mod:`flwr_dp_strategies.privacy.analyses.audit`), checked against closed forms,
dp-accounting, numerical integration and simulation. Fixed seeds; every tolerance comes from a sample size
(k standard errors) or from the numerical method it checks.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting import gaussian_mechanism as analytic_gaussian
from dp_accounting.pld import pld_privacy_accountant
from scipy import stats

from flwr_dp_strategies.privacy.analyses.audit import (
    canary_cosines,
    canary_vectors,
    cosine_null_sf,
    epsilon_from_gaussians,
    epsilon_lower_bound,
    estimate_epsilon,
    shift_lower_bound,
    one_run_lower_bound,
)

DELTA = 1e-5


# -- canaries -----------------------------------------------------------------------------------------------------


def test_canary_vectors_are_unit_and_regenerable_from_seed_and_id():
    rows = canary_vectors([3, 7, 11], dim=50, seed=42)
    assert rows.shape == (3, 50) and rows.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-12)
    # a canary depends on (seed, id) only: regenerated alone it is identical
    np.testing.assert_array_equal(canary_vectors([7], dim=50, seed=42)[0], rows[1])
    g = np.random.default_rng([42, 11]).standard_normal(50)
    np.testing.assert_allclose(rows[2], g / np.linalg.norm(g), rtol=1e-12)
    assert not np.allclose(canary_vectors([7], dim=50, seed=43)[0], rows[1])
    assert canary_vectors([], dim=4, seed=0).shape == (0, 4)


def test_canary_cosines_known_values_and_zero_delta():
    canaries = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 1.0, 0.0]])
    cos = canary_cosines(np.array([3.0, 0.0, 0.0]), canaries)
    assert cos.dtype == np.float64
    np.testing.assert_allclose(cos, [1.0, 0.0, 1.0 / math.sqrt(2.0)], rtol=1e-12)
    np.testing.assert_allclose(canary_cosines(np.array([-1.0, 0.0, 0.0]), canaries), [-1.0, 0.0, -1.0 / math.sqrt(2.0)])
    np.testing.assert_array_equal(canary_cosines(np.zeros(3), canaries), np.zeros(3))
    np.testing.assert_allclose(canary_cosines(np.float32([0.0, 5.0, 0.0]), canaries[1]), [1.0])


# -- the null distribution ----------------------------------------------------------------------------------------


def test_cosine_null_sf_closed_forms():
    t = np.linspace(-0.99, 0.99, 23)
    np.testing.assert_allclose(cosine_null_sf(t, 3), (1.0 - t) / 2.0, atol=1e-12)  # dim 3: uniform (Archimedes)
    np.testing.assert_allclose(cosine_null_sf(t, 2), np.arccos(t) / np.pi, atol=1e-12)  # dim 2: uniform angle
    assert cosine_null_sf(0.0, 17) == pytest.approx(0.5, abs=1e-12)
    assert cosine_null_sf(-2.0, 5) == 1.0 and cosine_null_sf(2.0, 5) == 0.0


@pytest.mark.parametrize("dim", [4, 10, 100])
def test_cosine_null_sf_matches_monte_carlo(dim):
    n = 200_000
    g = np.random.default_rng(1234 + dim).standard_normal((n, dim))
    cos = g[:, 0] / np.linalg.norm(g, axis=1)  # a fixed vector (e_1) against uniform random directions
    t = np.linspace(-2.0, 2.0, 41) / math.sqrt(dim)
    empirical = (cos[:, None] >= t[None, :]).mean(axis=0)
    sf = cosine_null_sf(t, dim)
    se = np.sqrt(sf * (1.0 - sf) / n)
    assert np.all(np.abs(empirical - sf) <= 5.0 * se + 1e-12), np.max(np.abs(empirical - sf) / se)
    # the wrong dimension is detectable at this sample size (the test can fail)
    wrong = cosine_null_sf(t, dim + max(2, dim // 5))
    assert np.any(np.abs(empirical - wrong) > 5.0 * se)


def test_unseen_canary_cosines_follow_the_null():
    dim, seed = 256, 7
    delta = canary_vectors(range(0, 20), dim, seed).sum(axis=0)  # a model delta built from canaries 0..19
    delta += np.random.default_rng(0).normal(scale=0.3, size=dim)
    unseen = canary_cosines(delta, canary_vectors(range(1000, 3000), dim, seed))
    ks = stats.kstest(unseen, lambda x: 1.0 - cosine_null_sf(x, dim))
    assert ks.pvalue > 1e-3, ks
    inserted = canary_cosines(delta, canary_vectors(range(0, 20), dim, seed))
    # each inserted cosine is ≈ 1/‖Δ‖ (its own contribution) plus null-sized noise: their mean stands
    # 5 standard errors of the null mean (σ = 1/√dim over 20 canaries) above 0
    assert inserted.mean() > 5.0 / math.sqrt(dim) / math.sqrt(inserted.size)
    assert abs(inserted.mean() - 1.0 / np.linalg.norm(delta)) < 5.0 / math.sqrt(dim) / math.sqrt(inserted.size)


# -- ε of a pair of Gaussians -------------------------------------------------------------------------------------


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0, 4.0])
def test_equal_variance_matches_gaussian_mechanism(z):
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_event.GaussianDpEvent(noise_multiplier=z))
    reference = accountant.get_epsilon(DELTA)
    got = epsilon_from_gaussians(mu_in=1.0 / z, sigma_in=1.0, mu_out=0.0, sigma_out=1.0, delta=DELTA)
    assert got == pytest.approx(reference, abs=1e-3)  # PLD discretisation error is below 1e-3 here
    assert got == pytest.approx(analytic_gaussian.get_epsilon_gaussian(z, DELTA), rel=1e-7)
    # location/scale invariance and symmetry in the two distributions
    shifted = epsilon_from_gaussians(mu_in=3.0, sigma_in=0.5 * z, mu_out=3.5, sigma_out=0.5 * z, delta=DELTA)
    assert shifted == pytest.approx(got, rel=1e-7)


def _hockey_stick_numeric(p, q, eps, grid):
    return np.trapezoid(np.maximum(0.0, p.pdf(grid) - math.exp(eps) * q.pdf(grid)), grid)


@pytest.mark.parametrize("mu_in,sigma_in", [(1.0, 1.5), (1.0, 0.7), (0.0, 1.3), (2.0, 1.0)])
def test_unequal_variance_epsilon_solves_the_hockey_stick_equation(mu_in, sigma_in):
    delta = 1e-3
    eps = epsilon_from_gaussians(mu_in, sigma_in, 0.0, 1.0, delta)
    p, q = stats.norm(mu_in, sigma_in), stats.norm(0.0, 1.0)
    grid = np.linspace(-40.0, 40.0, 800_001)

    def divergence(e):
        return max(_hockey_stick_numeric(p, q, e, grid), _hockey_stick_numeric(q, p, e, grid))

    assert divergence(eps) == pytest.approx(delta, rel=1e-4)  # the smallest ε: δ is attained ...
    assert divergence(0.99 * eps) > delta  # ... and not met just below it


def test_wider_inserted_distribution_costs_more_than_equal_variance():
    equal = epsilon_from_gaussians(1.0, 1.0, 0.0, 1.0, DELTA)
    assert epsilon_from_gaussians(1.0, 1.1, 0.0, 1.0, DELTA) > equal
    assert epsilon_from_gaussians(0.0, 1.0, 0.0, 1.0, DELTA) == 0.0


# -- the one-shot estimate ----------------------------------------------------------------------------------------


def _tolerance(mu_in, sigma_in, mu_out, sigma_out, n_in, n_out, k=4.0):
    """|ε(θ') − ε(θ)| over the corners of a box of ±k standard errors of the four fitted parameters
    (se(mean) = σ/√n, se(std) ≈ σ/√(2(n−1)))."""
    center = epsilon_from_gaussians(mu_in, sigma_in, mu_out, sigma_out, DELTA)
    se = [
        sigma_in / math.sqrt(n_in),
        sigma_in / math.sqrt(2 * (n_in - 1)),
        sigma_out / math.sqrt(n_out),
        sigma_out / math.sqrt(2 * (n_out - 1)),
    ]
    worst = 0.0
    for signs in itertools.product((-1.0, 1.0), repeat=4):
        p = [x + s * k * e for x, s, e in zip((mu_in, sigma_in, mu_out, sigma_out), signs, se)]
        worst = max(worst, abs(epsilon_from_gaussians(p[0], p[1], p[2], p[3], DELTA) - center))
    return center, worst


def _simulate(z, n, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(1.0 / z, 1.0, n), rng.normal(0.0, 1.0, n)  # inserted, null (1-D Gaussian mechanism)


def test_estimator_recovers_gaussian_mechanism_epsilon_and_sees_half_the_noise():
    n, z = 20_000, 2.0
    results = {}
    for noise in (z, z / 2):
        inserted, null = _simulate(noise, n, seed=int(10 * noise))
        est = estimate_epsilon(inserted, null, DELTA)
        truth, tol = _tolerance(1.0 / noise, 1.0, 0.0, 1.0, n, n)
        assert truth == pytest.approx(analytic_gaussian.get_epsilon_gaussian(noise, DELTA), rel=1e-6)
        assert abs(est.epsilon - truth) <= tol, (noise, est, truth, tol)
        assert est.num_inserted == n and est.num_null == n
        results[noise] = (est.epsilon, tol)
    (eps_z, tol_z), (eps_half, tol_half) = results[z], results[z / 2]
    assert eps_half - tol_half > eps_z + tol_z  # half the noise is clearly larger, beyond both tolerances


def test_estimator_fits_each_sample_separately():
    rng = np.random.default_rng(11)
    inserted, null = rng.normal(0.3, 0.05, 400), rng.normal(0.01, 0.1, 300)
    est = estimate_epsilon(inserted, null, DELTA)
    assert (est.mu_in, est.sigma_in) == pytest.approx((inserted.mean(), inserted.std(ddof=1)), rel=1e-12)
    assert (est.mu_out, est.sigma_out) == pytest.approx((null.mean(), null.std(ddof=1)), rel=1e-12)
    assert est.epsilon == epsilon_from_gaussians(est.mu_in, est.sigma_in, est.mu_out, est.sigma_out, DELTA)
    assert (est.num_inserted, est.num_null, est.delta) == (400, 300, DELTA)


def test_estimator_with_analytic_null():
    dim, n = 10_000, 5_000
    rng = np.random.default_rng(3)
    sigma = 1.0 / math.sqrt(dim)
    inserted = rng.normal(2.0 * sigma, sigma, n)  # z = 1/2 in units of the null's standard deviation
    est = estimate_epsilon(inserted, None, DELTA, dim=dim)
    assert est.mu_out == 0.0 and est.sigma_out == pytest.approx(sigma) and est.num_null == 0
    truth, tol = _tolerance(2.0 * sigma, sigma, 0.0, sigma, n, 10**9)
    assert abs(est.epsilon - truth) <= tol
    assert estimate_epsilon(np.ones(3), np.ones(3), DELTA).epsilon == 0.0
    assert estimate_epsilon(np.ones(3), np.array([0.0, 1.0]), DELTA).epsilon == math.inf


# -- Clopper–Pearson threshold attack -----------------------------------------------------------------------------


def _naive_max_log_ratio(inserted, null, delta):
    """max over thresholds of log((TPR − δ)/FPR) with the empirical rates: no confidence bound."""
    thresholds = np.concatenate([inserted, null])
    tpr = (inserted[None, :] >= thresholds[:, None]).mean(axis=1)
    fpr = (null[None, :] >= thresholds[:, None]).mean(axis=1)
    ok = (fpr > 0) & (tpr > delta)
    return float(np.max(np.log((tpr[ok] - delta) / fpr[ok])))


def test_clopper_pearson_bound_covers_true_epsilon():
    z, n, audits, confidence = 2.0, 1000, 200, 0.95
    true_eps = analytic_gaussian.get_epsilon_gaussian(z, DELTA)
    rng = np.random.default_rng(2024)
    covered = naive_covered = positive = 0
    for _ in range(audits):
        inserted, null = rng.normal(1.0 / z, 1.0, n), rng.normal(0.0, 1.0, n)
        bound = epsilon_lower_bound(inserted, null, DELTA, confidence)
        covered += bound.epsilon <= true_eps
        positive += bound.epsilon > 0.0
        naive_covered += _naive_max_log_ratio(inserted, null, DELTA) <= true_eps
    assert covered >= confidence * audits
    assert positive >= 0.9 * audits  # not vacuous: the bound is informative at this size
    # the sizes can reveal an unsound bound: the uncorrected empirical ratio exceeds the truth far too often
    assert naive_covered < confidence * audits


def test_clopper_pearson_bound_detects_weak_mechanism_and_reports_its_counts():
    z, n = 0.5, 2000
    inserted, null = _simulate(z, n, seed=5)
    bound = epsilon_lower_bound(inserted, null, DELTA)
    assert 1.0 < bound.epsilon <= analytic_gaussian.get_epsilon_gaussian(z, DELTA)
    assert bound.true_positives == int(np.sum(inserted >= bound.threshold))
    assert bound.false_positives == int(np.sum(null >= bound.threshold))
    assert bound.epsilon == pytest.approx(math.log((bound.tpr_lower - DELTA) / bound.fpr_upper))
    # the reported rates are Clopper-Pearson bounds at the Bonferroni level α/(2n)
    level = 0.05 / (2 * n)
    assert bound.tpr_lower == pytest.approx(stats.beta.ppf(level, bound.true_positives, n - bound.true_positives + 1))
    assert bound.fpr_upper == pytest.approx(stats.beta.isf(level, bound.false_positives + 1, n - bound.false_positives))


def test_clopper_pearson_bound_refutes_a_noiseless_mechanism_claimed_at_eps_8():
    n = 50_000
    rng = np.random.default_rng(8)
    inserted = np.full(n, 1.0)  # no noise: the canary always shows with cosine 1
    null = rng.normal(0.0, 1.0 / math.sqrt(1000), n)
    bound = epsilon_lower_bound(inserted, null, DELTA)
    assert bound.epsilon > 8.0 and bound.false_positives == 0 and bound.true_positives == n


def test_clopper_pearson_bound_is_zero_without_signal():
    rng = np.random.default_rng(9)
    bound = epsilon_lower_bound(rng.normal(size=500), rng.normal(size=500), DELTA)
    assert bound.epsilon == 0.0 and bound.threshold is None


# -- the additive-shift bound -------------------------------------------------------------------------------------


def _shifted(mu: float, n: int, dim: int, rng: np.random.Generator, exposure=None) -> np.ndarray:
    """Inserted cosines under the additive-shift model, simulated exactly: the canary c is uniform, the release is
    x·c + R with R ⟂-independent of c (here Gaussian noise of norm ~ 1), and x = μ·e_i·‖R‖/√dim (μ null sds)."""
    e = np.ones(n) if exposure is None else np.asarray(exposure, dtype=np.float64)
    c = rng.normal(size=(n, dim))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    r = rng.normal(size=(n, dim)) / math.sqrt(dim)  # one independent "rest of the release" per canary
    norm_r = np.linalg.norm(r, axis=1)
    delta = (mu * e * norm_r / math.sqrt(dim))[:, None] * c + r
    return np.einsum("ij,ij->i", c, delta) / np.linalg.norm(delta, axis=1)


@pytest.mark.parametrize("mu,n", [(0.5, 300), (1.5, 300), (3.0, 500)])
def test_shift_bound_covers_the_true_epsilon(mu, n):
    """Gaussian mechanism (constant exposure, μ = 1/z): the bound is below the true ε(δ) in ≥ 95 % of audits (the
    misses of 100 are Bin(100, ≤ 0.05): 12 or more has probability < 1.2 % for a valid bound)."""
    dim, audits = 256, 100
    true_eps = analytic_gaussian.get_epsilon_gaussian(1.0 / mu, DELTA)
    rng = np.random.default_rng(int(mu * 10) + n)
    bounds = np.array([shift_lower_bound(_shifted(mu, n, dim, rng), DELTA, dim=dim).epsilon for _ in range(audits)])
    assert np.sum(bounds > true_eps) < 12
    assert np.median(bounds) > 0.5 * true_eps  # informative at this size, not vacuous


def test_shift_bound_misses_too_often_without_the_confidence_margin():
    """The coverage test can fail: the same bound at confidence 0.5 (the plug-in mean) exceeds the true ε in about
    half the audits."""
    mu, n, dim, audits = 1.5, 300, 256, 100
    true_eps = analytic_gaussian.get_epsilon_gaussian(1.0 / mu, DELTA)
    rng = np.random.default_rng(3)
    plug_in = [shift_lower_bound(_shifted(mu, n, dim, rng), DELTA, 0.5, dim=dim).epsilon for _ in range(audits)]
    assert np.sum(np.array(plug_in) > true_eps) > 0.2 * audits  # a valid 95 % bound exceeds it in ≤ 5 %


def test_shift_bound_approaches_the_true_epsilon_with_more_canaries():
    """The gap to ε(δ) is the mean's margin, ∝ 1/√n."""
    mu, dim = 1.0, 4096
    true_eps = analytic_gaussian.get_epsilon_gaussian(1.0 / mu, DELTA)
    rng = np.random.default_rng(11)
    medians = []
    for n in (100, 1000, 10_000):
        x = [mu + rng.normal(size=n) for _ in range(20)]  # the shift model with a Gaussian null, in null sds
        medians.append(np.median([shift_lower_bound(v / math.sqrt(dim), DELTA, dim=dim).epsilon for v in x]))
    assert medians[0] < medians[1] < medians[2] < true_eps
    assert true_eps - medians[2] < 0.5 * (true_eps - medians[1])


def test_shift_bound_with_random_exposure_covers_the_subsampled_release():
    """Poisson participation: canary i is in B_i ~ Bin(T, q) of T rounds, each adding the same shift a. The true ε
    of the final-model test (a mixture of shifts against the null) is computed by dp-accounting's PLD of the
    mixture as a privacy loss distribution; the bound, told the exposures B_i, covers it, and assuming every
    canary exposed alike (the mean shift everywhere) is a different, wrong model that can overshoot."""
    rounds, q, a, n, dim = 10, 0.3, 0.6, 300, 256
    # true ε of the test statistic: P = Σ_b Bin(b; T, q) N(a·b, 1) against Q = N(0, 1), by numerical integration
    x = np.linspace(-12, 12 + a * rounds, 40001)
    p = sum(stats.binom.pmf(b, rounds, q) * stats.norm.pdf(x, a * b) for b in range(rounds + 1))
    qd = stats.norm.pdf(x)
    dx = x[1] - x[0]

    def hockey(eps: float) -> float:
        return float(np.sum(np.maximum(p - math.exp(eps) * qd, 0.0)) * dx)

    lo, hi = 0.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if hockey(mid) > DELTA else (lo, mid)
    true_eps = hi
    rng = np.random.default_rng(7)
    misses = 0
    for _ in range(40):
        exposure = rng.binomial(rounds, q, n).astype(float)
        cos = _shifted(a, n, dim, rng, exposure=exposure)
        misses += shift_lower_bound(cos, DELTA, dim=dim, exposure=exposure).epsilon > true_eps
    assert misses < 7  # Bin(40, ≤ 0.05) ≥ 7 has probability < 1.5 %


def test_shift_bound_goes_past_the_count_bound_cap_and_refutes_eps_8():
    """With 100 canaries Clopper–Pearson counts cannot exceed ≈ log(100) − 2.4 whatever the leak; the shift bound
    is limited by the signal: a release with μ = 6 claimed at ε = 8 is refuted."""
    n, dim = 100, 4096
    rng = np.random.default_rng(6)
    ins = (6.0 + rng.normal(size=n)) / math.sqrt(dim)
    null = rng.normal(size=n) / math.sqrt(dim)
    counts = epsilon_lower_bound(ins, null, DELTA).epsilon
    bound = shift_lower_bound(ins, DELTA, dim=dim)
    assert counts < math.log(n)
    assert 8.0 < bound.epsilon <= analytic_gaussian.get_epsilon_gaussian(1.0 / 6.0, DELTA)
    # the reported threshold attains the bound: with the shift at its lower limit r, the in-world cosine
    # (r + u)/√(1 + 2ru + r²) is ≥ t exactly when u ≥ u* = −r(1 − t²) + t√(1 − r²(1 − t²))
    r, t = bound.shift_lower, bound.threshold
    u_star = -r * (1 - t * t) + t * math.sqrt(1 - r * r * (1 - t * t))
    tpr = cosine_null_sf(u_star, dim)
    assert bound.epsilon == pytest.approx(math.log((tpr - DELTA) / cosine_null_sf(t, dim)), rel=1e-6)  # tabulated
    # r's lower limit reproduces the mean cosine's lower limit (to first order the mean cosine is r)
    margin = stats.t.ppf(0.95, n - 1) * ins.std(ddof=1) / math.sqrt(n)
    assert r == pytest.approx(ins.mean() - margin, rel=0.01)


def test_shift_bound_is_zero_without_signal():
    dim = 1000
    rng = np.random.default_rng(9)
    assert shift_lower_bound(_shifted(0.0, 500, dim, rng), DELTA, dim=dim).epsilon == 0.0
    assert shift_lower_bound(np.full(50, -0.5), DELTA, dim=dim).threshold is None  # below the null: no leak


# -- one training run (Steinke, Nasr, Jagielski 2023) -------------------------------------------------------------


@pytest.mark.parametrize("r", [10, 100, 1000])
def test_one_run_all_correct_closed_form(r):
    # P[Bin(r, p) ≥ r] = p^r = α  ⇒  p = α^(1/r), ε = log(p / (1 − p))
    p = 0.05 ** (1.0 / r)
    assert one_run_lower_bound(r, r, r) == pytest.approx(math.log(p / (1.0 - p)), rel=1e-8)


def test_one_run_bound_monotonicity():
    by_r = [one_run_lower_bound(r, r, 1000) for r in (10, 30, 100, 300, 1000)]
    assert all(a < b for a, b in zip(by_r, by_r[1:]))
    by_v = [one_run_lower_bound(v, 200, 1000) for v in (110, 130, 150, 170, 190)]
    assert all(a < b for a, b in zip(by_v, by_v[1:]))
    by_conf = [one_run_lower_bound(170, 200, 1000, confidence=c) for c in (0.5, 0.9, 0.95, 0.99)]
    assert all(a > b for a, b in zip(by_conf, by_conf[1:]))
    assert one_run_lower_bound(100, 200, 1000) == 0.0  # chance accuracy proves nothing
    assert one_run_lower_bound(0, 0, 10) == 0.0


def test_one_run_bound_is_the_binomial_quantile():
    v, r, alpha = 170, 200, 0.05
    eps = one_run_lower_bound(v, r, 1000)
    p = 1.0 / (1.0 + math.exp(-eps))
    assert stats.binom.sf(v - 1, r, p) == pytest.approx(alpha, rel=1e-6)


def _theorem_5_2_p_value(m, r, v, eps, delta):
    """Steinke et al.'s approximate-DP p-value, written out term by term."""
    q = 1.0 / (1.0 + math.exp(-eps))
    window = max((stats.binom.cdf(v - 1, r, q) - stats.binom.cdf(v - 1 - i, r, q)) / i for i in range(1, v + 1))
    return stats.binom.sf(v - 1, r, q) + 2.0 * m * delta * window


def test_one_run_approximate_dp_bound_is_smaller_and_attains_the_level():
    pure = one_run_lower_bound(170, 200, 1000)
    approx = one_run_lower_bound(170, 200, 1000, delta=1e-5)
    assert 0.0 < approx < pure
    assert one_run_lower_bound(170, 200, 1000, delta=1e-3) < approx  # a larger δ explains more correct guesses
    assert _theorem_5_2_p_value(1000, 200, 170, approx, 1e-5) <= 0.05 + 1e-12
    assert _theorem_5_2_p_value(1000, 200, 170, approx + 1e-3, 1e-5) > 0.05  # and is the largest such ε


@pytest.mark.parametrize("delta", [0.0, 1e-3])
def test_one_run_bound_coverage_on_randomized_response(delta):
    """A tight (ε, δ) mechanism: with probability δ the bit is revealed, else ε-randomized response. The
    bound may exceed the true ε in at most 1 − confidence of the audits (plus 3 binomial standard errors)."""
    eps, m, audits, alpha = 1.0, 400, 200, 0.05
    rng = np.random.default_rng(77)
    keep = math.exp(eps) / (1.0 + math.exp(eps))
    exceed = 0
    bounds = []
    for _ in range(audits):
        bits = rng.random(m) < 0.5
        reveal = rng.random(m) < delta
        guesses = np.where(reveal, bits, np.where(rng.random(m) < keep, bits, ~bits))
        correct = int(np.sum(guesses == bits))
        b = one_run_lower_bound(correct, m, m, delta=delta)
        bounds.append(b)
        exceed += b > eps
    assert exceed <= audits * (alpha + 3.0 * math.sqrt(alpha * (1 - alpha) / audits))
    assert np.median(bounds) > 0.5 * eps  # informative, not trivially zero


# -- validation ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,param",
    [
        (lambda: canary_vectors([1], dim=0, seed=0), "dim"),
        (lambda: canary_vectors([1], dim=3, seed=-1), "seed"),
        (lambda: canary_vectors([-1], dim=3, seed=0), "canary_ids"),
        (lambda: canary_vectors([1.5], dim=3, seed=0), "canary_ids"),
        (lambda: canary_cosines(np.array([1.0, np.nan]), np.eye(2)), "delta"),
        (lambda: canary_cosines(np.ones(3), np.eye(2)), "canaries"),
        (lambda: canary_cosines(np.ones(2), np.zeros((1, 2))), "canaries"),
        (lambda: cosine_null_sf(0.1, 1), "dim"),
        (lambda: cosine_null_sf(np.inf, 5), "t"),
        (lambda: epsilon_from_gaussians(1.0, 0.0, 0.0, 1.0, DELTA), "sigma_in"),
        (lambda: epsilon_from_gaussians(1.0, 1.0, 0.0, -1.0, DELTA), "sigma_out"),
        (lambda: epsilon_from_gaussians(np.nan, 1.0, 0.0, 1.0, DELTA), "mu_in"),
        (lambda: epsilon_from_gaussians(1.0, 1.0, "0", 1.0, DELTA), "mu_out"),
        (lambda: epsilon_from_gaussians(1.0, 1.0, 0.0, 1.0, 0.0), "delta"),
        (lambda: estimate_epsilon([1.0], [0.0, 1.0], DELTA), "inserted_cosines"),
        (lambda: estimate_epsilon([1.0, 2.0], [0.0], DELTA), "null_cosines"),
        (lambda: estimate_epsilon([1.0, 2.0], None, DELTA), "dim"),
        (lambda: estimate_epsilon([1.0, 2.0], [0.0, 1.0], DELTA, dim=10), "dim"),
        (lambda: estimate_epsilon([1.0, 2.0], [0.0, 1.0], 1.0), "delta"),
        (lambda: epsilon_lower_bound([], [0.0], DELTA), "inserted_scores"),
        (lambda: epsilon_lower_bound([1.0], [[0.0]], DELTA), "null_scores"),
        (lambda: epsilon_lower_bound([1.0], [0.0], -0.1), "delta"),
        (lambda: epsilon_lower_bound([1.0], [0.0], DELTA, confidence=1.0), "confidence"),
        (lambda: shift_lower_bound([0.1, 0.2], DELTA, dim=10), "inserted_cosines"),
        (lambda: shift_lower_bound([0.1, 0.2, 1.5], DELTA, dim=10), "inserted_cosines"),
        (lambda: shift_lower_bound([0.1, 0.2, 0.3], DELTA, dim=1), "dim"),
        (lambda: shift_lower_bound([0.1, 0.2, 0.3], DELTA, dim=10, exposure=[1.0, 2.0]), "exposure"),
        (lambda: shift_lower_bound([0.1, 0.2, 0.3], DELTA, dim=10, exposure=[1.0, -1.0, 0.0]), "exposure"),
        (lambda: shift_lower_bound([0.1, 0.2, 0.3], DELTA, dim=10, exposure=[0.0, 0.0, 0.0]), "exposure"),
        (lambda: shift_lower_bound([0.1, 0.2, 0.3], 1.0, dim=10), "delta"),
        (lambda: shift_lower_bound([0.1, 0.2, 0.3], DELTA, 1.5, dim=10), "confidence"),
        (lambda: shift_lower_bound([0.1, 0.2, 0.3], DELTA, dim=10, grid_points=5), "grid_points"),
        (lambda: one_run_lower_bound(5, 4, 10), "guesses_correct"),
        (lambda: one_run_lower_bound(4, 11, 10), "guesses_made"),
        (lambda: one_run_lower_bound(1, 1, 0), "num_canaries"),
        (lambda: one_run_lower_bound(-1, 1, 1), "guesses_correct"),
        (lambda: one_run_lower_bound(1, 1, 1, delta=1.0), "delta"),
        (lambda: one_run_lower_bound(1, 1, 1, confidence=0.0), "confidence"),
        (lambda: one_run_lower_bound(True, 1, 1), "guesses_correct"),
    ],
)
def test_arguments_are_validated(call, param):
    with pytest.raises(ValueError, match=param):
        call()
