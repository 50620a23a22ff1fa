"""Statistical tests: each mechanism's noise scale / flip probability / selection law.

Every test checks the sample against the claimed law (must not reject at
p = 1e-3) *and* against the law with the parameter 10 % off in either
direction (must reject at p = 1e-3), so a mis-scaled mechanism fails.
Seeds are fixed; sample sizes are chosen so the 10 % alternatives sit many
standard errors away (numbers in each test).
"""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import stats

from flwr_dp_strategies.privacy import (
    ExponentialMechanismDpEvent,
    binary_randomized_response,
    exponential_mechanism,
    gaussian_mechanism,
    kary_randomized_response,
    laplace_mechanism,
)
from flwr_dp_strategies.privacy.mechanisms.laplace import secure_grid

ALPHA = 1e-3
OFF = (0.9, 1.1)


def _ks_p(sample, cdf):
    return stats.kstest(sample, cdf).pvalue


@pytest.mark.parametrize("epsilon,sensitivity", [(0.5, 1.0), (2.0, 3.0)])
def test_laplace_scale_is_sensitivity_over_epsilon(epsilon, sensitivity):
    # n = 50 000: KS critical value at 1e-3 is ~0.0087; a 10 % scale error moves the CDF by ~0.017.
    n = 50_000
    rel = laplace_mechanism(np.zeros(n), epsilon=epsilon, sensitivity=sensitivity, rng=1)
    b = sensitivity / epsilon
    assert _ks_p(rel.value, stats.laplace(scale=b).cdf) > ALPHA
    for f in OFF:
        assert _ks_p(rel.value, stats.laplace(scale=f * b).cdf) < ALPHA
    assert rel.event == dp_event.LaplaceDpEvent(noise_multiplier=b / sensitivity)


def test_laplace_noise_is_centred_on_the_input():
    x = np.linspace(-5, 5, 40_000)
    rel = laplace_mechanism(x, epsilon=1.0, rng=2)
    assert _ks_p(rel.value - x, stats.laplace(scale=1.0).cdf) > ALPHA
    assert rel.value.shape == x.shape


def test_secure_laplace_scale_grid_and_event():
    n, eps, bound = 50_000, 1.0, 1.0
    rel = laplace_mechanism(np.full(n, 0.3), epsilon=eps, rng=3, secure=True, value_bound=bound)
    gamma = secure_grid(1.0 / eps, bound)
    noise = rel.value - 0.3
    assert _ks_p(noise, stats.laplace(scale=1.0 / eps).cdf) > ALPHA
    for f in OFF:
        assert _ks_p(noise, stats.laplace(scale=f / eps).cdf) < ALPHA
    # Every output is an exact multiple of the data-independent grid.
    assert np.all(rel.value / gamma == np.rint(rel.value / gamma))
    ev = rel.event
    assert isinstance(ev, dp_event.DiscreteLaplaceDpEvent)
    eff_eps = ev.noise_parameter * ev.sensitivity
    assert eps <= eff_eps <= eps * (1 + 1e-6)


def test_secure_laplace_clamps_to_the_public_bound():
    rel = laplace_mechanism(np.array([100.0] * 20_000), epsilon=1.0, rng=4, secure=True, value_bound=1.0)
    assert abs(np.median(rel.value) - 1.0) < 0.05


@pytest.mark.parametrize("z,sensitivity", [(1.0, 1.0), (0.7, 2.5)])
def test_gaussian_std_is_noise_multiplier_times_sensitivity(z, sensitivity):
    # n = 50 000: a 10 % std error moves the normal CDF by ~0.024 > 0.0087.
    n = 50_000
    rel = gaussian_mechanism(np.zeros(n), noise_multiplier=z, sensitivity=sensitivity, rng=5)
    sigma = z * sensitivity
    assert _ks_p(rel.value, stats.norm(scale=sigma).cdf) > ALPHA
    for f in OFF:
        assert _ks_p(rel.value, stats.norm(scale=f * sigma).cdf) < ALPHA
    assert rel.event == dp_event.GaussianDpEvent(noise_multiplier=z)


def _binom_p(k, n, p):
    return stats.binomtest(int(k), n, p).pvalue


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_binary_rr_flip_rate(epsilon):
    # n = 200 000; f = 1/(1+e^eps). The 10 % alternatives are >= 9 standard errors away.
    n = 200_000
    bits = np.arange(n) % 2
    rel = binary_randomized_response(bits, epsilon=epsilon, rng=6)
    flips = int(np.sum(rel.value != bits))
    f = 1.0 / (1.0 + math.exp(epsilon))
    assert _binom_p(flips, n, f) > ALPHA
    for off in OFF:
        assert _binom_p(flips, n, off * f) < ALPHA
    assert rel.event.num_buckets == 2
    assert rel.event.noise_parameter == pytest.approx(2 * f)


@pytest.mark.parametrize("epsilon,k", [(1.0, 10), (2.0, 4)])
def test_kary_rr_histogram(epsilon, k):
    # Chi-square over the k output labels for true label 1; n = 200 000.
    n = 200_000
    rel = kary_randomized_response(np.ones(n, dtype=int), epsilon=epsilon, num_classes=k, rng=7)
    counts = np.bincount(rel.value, minlength=k)

    def expected(keep):
        probs = np.full(k, (1 - keep) / (k - 1))
        probs[1] = keep
        return probs * n

    keep = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
    assert stats.chisquare(counts, expected(keep)).pvalue > ALPHA
    for off in OFF:
        assert stats.chisquare(counts, expected(off * keep)).pvalue < ALPHA
    assert rel.event.noise_parameter == pytest.approx(k / (math.exp(epsilon) + k - 1))


def _em_freqs(utilities, epsilon, sensitivity, n, seed, k=1):
    gen = np.random.default_rng(seed)
    return [
        tuple(exponential_mechanism(utilities, epsilon=epsilon, sensitivity=sensitivity, k=k, rng=gen).value)
        for _ in range(n)
    ]


def test_exponential_mechanism_selection_frequencies():
    # 40 000 draws over 5 candidates; the eps*1.1 and eps*0.9 laws are rejected.
    u = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    eps, delta_u, n = 1.0, 2.0, 40_000
    draws = np.array([d[0] for d in _em_freqs(u, eps, delta_u, n, 8)])
    counts = np.bincount(draws, minlength=5)

    def expected(e):
        w = np.exp(e * u / (2 * delta_u))
        return n * w / w.sum()

    assert stats.chisquare(counts, expected(eps)).pvalue > ALPHA
    for off in OFF:
        assert stats.chisquare(counts, expected(off * eps)).pvalue < ALPHA


def test_gumbel_top_k_equals_sequential_draws():
    # Ordered pairs from k=2 of 4 must follow P(i)·P(j | not i) of sequential EM draws.
    u = np.array([0.0, 1.0, 2.0, 4.0])
    eps, n = 1.5, 40_000
    pairs = _em_freqs(u, eps, 1.0, n, 9, k=2)
    w = np.exp(eps * u / 2)
    p = w / w.sum()
    keys = [(i, j) for i in range(4) for j in range(4) if i != j]
    exp = np.array([p[i] * w[j] / (w.sum() - w[i]) for i, j in keys]) * n
    obs = np.array([sum(1 for pr in pairs if pr == key) for key in keys])
    assert stats.chisquare(obs, exp).pvalue > ALPHA
    # The "independent with replacement" law (a wrong implementation) is rejected.
    wrong = np.array([p[i] * p[j] for i, j in keys])
    assert stats.chisquare(obs, wrong / wrong.sum() * n).pvalue < ALPHA


def test_exponential_mechanism_event():
    rel = exponential_mechanism([1.0, 2.0, 3.0], epsilon=0.5, k=2, rng=0)
    assert rel.event == dp_event.SelfComposedDpEvent(ExponentialMechanismDpEvent(0.5), 2)
    assert len(set(rel.value.tolist())) == 2
    single = exponential_mechanism([1.0, 2.0, 3.0], epsilon=0.5, rng=0)
    assert single.event == ExponentialMechanismDpEvent(0.5)
