"""Empirical privacy audit: a lower bound on ε from output histograms on neighbours.

For neighbouring inputs D, D' and an output event S, any ε-DP mechanism has
P[M(D) ∈ S] ≤ e^ε·P[M(D') ∈ S]. From n samples on each side we take a
Clopper–Pearson lower bound on P[M(D) ∈ S] and an upper bound on P[M(D') ∈ S]
(each at 1e-4) and get ε_lower = log(p_low/p'_high), a valid lower bound on
the true ε with high probability. The test asserts ε_lower ≤ claimed ε (the
mechanism is not leakier than claimed) and the point estimate ≥ claimed ε/2
(for these tight mechanisms, so an over-noised one is caught too). Events S
are the classic worst-case sets for each mechanism.
"""

import math

import numpy as np
from scipy import stats

from flwr_dp_strategies.privacy import (
    binary_randomized_response,
    exponential_mechanism,
    kary_randomized_response,
    laplace_mechanism,
)

CONF = 1e-4


def _cp(k: int, n: int) -> tuple[float, float]:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * CONF, method="exact")
    return ci.low, ci.high


def _audit(in_s: np.ndarray, in_s_prime: np.ndarray) -> tuple[float, float]:
    """(ε lower bound, point estimate) from membership indicators on both sides."""
    n, n2 = len(in_s), len(in_s_prime)
    k, k2 = int(in_s.sum()), int(in_s_prime.sum())
    low, _ = _cp(k, n)
    _, high2 = _cp(k2, n2)
    return math.log(low / high2), math.log((k / n) / (k2 / n2))


def _check(eps_claimed: float, lower: float, point: float) -> None:
    assert lower <= eps_claimed, (lower, eps_claimed)
    assert point >= eps_claimed / 2, (point, eps_claimed)


def test_audit_laplace():
    eps, delta1, n = 1.0, 1.0, 400_000
    out0 = laplace_mechanism(np.zeros(n), epsilon=eps, sensitivity=delta1, rng=10).value
    out1 = laplace_mechanism(np.full(n, delta1), epsilon=eps, sensitivity=delta1, rng=11).value
    lower, point = _audit(out0 < 0, out1 < 0)  # P0 = 1/2, P1 = e^{-eps}/2
    _check(eps, lower, point)


def test_audit_laplace_vector_l1():
    # Two coordinates sharing the L1 budget: shift (0.5, 0.5); S = {both coordinates < 0}.
    eps, n = 1.0, 400_000
    out0 = laplace_mechanism(np.zeros((n, 2)), epsilon=eps, sensitivity=1.0, rng=12).value
    out1 = laplace_mechanism(np.full((n, 2), 0.5), epsilon=eps, sensitivity=1.0, rng=13).value
    lower, point = _audit(np.all(out0 < 0, axis=1), np.all(out1 < 0, axis=1))
    _check(eps, lower, point)


def test_audit_binary_rr():
    eps, n = 1.0, 200_000
    out0 = binary_randomized_response(np.zeros(n, dtype=int), epsilon=eps, rng=14).value
    out1 = binary_randomized_response(np.ones(n, dtype=int), epsilon=eps, rng=15).value
    lower, point = _audit(out0 == 0, out1 == 0)
    _check(eps, lower, point)


def test_audit_kary_rr():
    eps, k, n = 1.5, 10, 200_000
    out0 = kary_randomized_response(np.zeros(n, dtype=int), epsilon=eps, num_classes=k, rng=16).value
    out1 = kary_randomized_response(np.ones(n, dtype=int), epsilon=eps, num_classes=k, rng=17).value
    lower, point = _audit(out0 == 0, out1 == 0)
    _check(eps, lower, point)


def test_audit_exponential_mechanism():
    # u = 0 everywhere vs u' = (+Δ, −Δ, …, −Δ): P'[0]/P[0] = m·e^ε/(e^ε + m − 1) → e^ε.
    eps, m, n = 1.0, 40, 60_000
    u = np.zeros(m)
    u_prime = np.full(m, -1.0)
    u_prime[0] = 1.0
    gen = np.random.default_rng(18)
    pick = np.array([exponential_mechanism(u, epsilon=eps, rng=gen).value[0] for _ in range(n)])
    pick_p = np.array([exponential_mechanism(u_prime, epsilon=eps, rng=gen).value[0] for _ in range(n)])
    lower, point = _audit(pick_p == 0, pick == 0)
    _check(eps, lower, point)
