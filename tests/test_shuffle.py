"""Tests for privacy amplification by shuffling (Feldman, McMillan, Talwar 2021).

Reference values come from a re-computation of Apple's public code
(apple/ml-shuffling-amplification, computeamplification.py):

* closed form: ``closedformanalysis`` (printed to 4 decimals);
* numerical: ``numericalanalysis`` with 12 bisection iterations and step 1.
  Its "upper bound" mode adds the whole not-yet-visited mass of C to δ once
  that mass drops below the accumulated δ, which can double δ; it is therefore
  3-5 % above the exact value at these parameters. Its "lower bound" mode and
  its exact mode (step 1, no early exit, 20 iterations) agree with this module
  to within the bisection tolerance; both are recorded below.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict

import numpy as np
import pytest

from flwr_dp_strategies.privacy.analyses.shuffle import (
    fmt_closed_form_epsilon,
    fmt_closed_form_valid,
    fmt_numerical_delta,
    fmt_numerical_epsilon,
    shuffle_amplified_epsilon,
)

# ------------------------------------------------------------- closed form


@pytest.mark.parametrize(
    ("n", "eps0", "delta", "expected"),
    [
        (100_000, 4.0, 1e-6, 0.5378),
        (10_000, 2.0, 1e-6, 0.5236),
        (1_000, 1.0, 1e-5, 0.6088),
    ],
)
def test_closed_form_matches_apple(n: int, eps0: float, delta: float, expected: float) -> None:
    assert fmt_closed_form_valid(eps0, n, delta)
    assert fmt_closed_form_epsilon(eps0, n, delta) == pytest.approx(expected, abs=1e-3)


def test_closed_form_below_paper_statement_only_by_conservatism() -> None:
    # Theorem 3.1 as stated in the paper: factor (e^eps0-1)/(e^eps0+1) <= code's factor.
    n, eps0, delta = 100_000, 4.0, 1e-6
    x = 8 * math.sqrt(math.exp(eps0) * math.log(4 / delta)) / math.sqrt(n) + 8 * math.exp(eps0) / n
    paper = math.log1p((math.exp(eps0) - 1) / (math.exp(eps0) + 1) * x)
    code = fmt_closed_form_epsilon(eps0, n, delta)
    assert paper <= code <= paper + 0.01


def test_closed_form_validity() -> None:
    assert not fmt_closed_form_valid(1.0, 100, 1e-5)
    with pytest.raises(ValueError, match="numerical"):
        fmt_closed_form_epsilon(1.0, 100, 1e-5)
    assert fmt_closed_form_valid(1.0, 1000, 1e-5)
    limit = math.log(1000 / (16 * math.log(4 / 1e-5)))
    assert limit == pytest.approx(1.58, abs=0.005)
    assert fmt_closed_form_valid(limit - 1e-9, 1000, 1e-5)
    assert not fmt_closed_form_valid(limit + 1e-9, 1000, 1e-5)


# --------------------------------------------------------------- numerical

# (n, eps0, delta, apple_upper_bound_12_iter, apple_exact_or_lower_bound)
NUMERICAL_VECTORS = [
    (10_000, 2.0, 1e-6, 0.1605, 0.15505),
    (1_000, 1.0, 1e-5, 0.1616, 0.15405),
    (100, 1.0, 1e-5, 0.5781, 0.55319),
    (100, 2.0, 1e-5, 1.9893, 1.98825),
]


def test_numerical_apple_readme_bracket() -> None:
    # Apple's README brackets the true value for n=1e5, eps0=4, delta=1e-6.
    eps = fmt_numerical_epsilon(4.0, 100_000, 1e-6)
    assert 0.1675 <= eps <= 0.1730


@pytest.mark.parametrize(("n", "eps0", "delta", "upper", "exact"), NUMERICAL_VECTORS)
def test_numerical_matches_recomputation(n: int, eps0: float, delta: float, upper: float, exact: float) -> None:
    eps = fmt_numerical_epsilon(eps0, n, delta)
    assert eps <= upper * 1.005
    assert eps >= upper * 0.95
    # Exact value of Apple's sum (step 1, no early exit): ours is the upper end of a 1e-4 bracket.
    assert exact - 2e-4 <= eps <= exact + 2e-4


def test_numerical_epsilon_is_valid_upper_bound() -> None:
    eps0, n, delta, tol = 2.0, 10_000, 1e-6, 1e-4
    eps = fmt_numerical_epsilon(eps0, n, delta, tol=tol)
    assert fmt_numerical_delta(eps, eps0, n) <= delta
    assert fmt_numerical_delta(eps - tol, eps0, n) > delta


def test_numerical_monotone_in_n_and_eps0() -> None:
    by_n = [fmt_numerical_epsilon(1.0, n, 1e-6) for n in (100, 1_000, 10_000, 100_000)]
    assert all(a > b for a, b in zip(by_n, by_n[1:]))
    by_eps0 = [fmt_numerical_epsilon(e0, 10_000, 1e-6) for e0 in (0.5, 1.0, 2.0, 4.0)]
    assert all(a < b for a, b in zip(by_eps0, by_eps0[1:]))


def test_numerical_delta_decreasing_in_epsilon() -> None:
    eps_grid = np.linspace(0.0, 2.0, 41)
    deltas = [fmt_numerical_delta(float(e), 2.0, 1_000) for e in eps_grid]
    assert all(a > b for a, b in zip(deltas[:-1], deltas[1:-1]))
    assert deltas[-1] == 0.0  # eps = eps0: pure eps0-DP
    assert fmt_numerical_delta(3.0, 2.0, 1_000) == 0.0


def test_no_amplification_returns_eps0() -> None:
    # n = 1 is binary randomized response: delta(eps) = alpha - e^eps (1 - alpha) for
    # eps < eps0, so a tiny target delta leaves eps within the bisection tolerance of eps0.
    eps = fmt_numerical_epsilon(1.0, 1, 1e-12)
    assert 1.0 - 1e-4 <= eps <= 1.0
    assert shuffle_amplified_epsilon(0.01, 2, 1e-9) <= 0.01


def _brute_force_delta(epsilon: float, epsilon0: float, n: int) -> tuple[float, float]:
    """Enumerate C ~ Bin(n-1, e^-eps0), A ~ Bin(C, 1/2), Delta ~ Bern(alpha) (FMT Thm 3.2)."""
    p = math.exp(-epsilon0)
    alpha = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    prob_p: dict[tuple[int, int], float] = defaultdict(float)
    prob_q: dict[tuple[int, int], float] = defaultdict(float)
    for c in range(n):
        pc = math.comb(n - 1, c) * p**c * (1 - p) ** (n - 1 - c)
        for a, d in itertools.product(range(c + 1), (0, 1)):
            w = pc * math.comb(c, a) * 0.5**c * (alpha if d == 1 else 1 - alpha)
            prob_p[(a + d, c - a + 1 - d)] += w
            prob_q[(a + 1 - d, c - a + d)] += w
    keys = set(prob_p) | set(prob_q)
    e = math.exp(epsilon)
    d_pq = sum(max(0.0, prob_p[k] - e * prob_q[k]) for k in keys)
    d_qp = sum(max(0.0, prob_q[k] - e * prob_p[k]) for k in keys)
    return d_pq, d_qp


@pytest.mark.parametrize(("n", "eps0"), [(5, 1.0), (7, 0.3), (4, 3.0), (1, 1.0)])
def test_numerical_delta_matches_brute_force(n: int, eps0: float) -> None:
    for eps in (0.0, 0.05, 0.2, 0.5, 0.9 * eps0):
        d_pq, d_qp = _brute_force_delta(eps, eps0, n)
        assert d_pq == pytest.approx(d_qp, abs=1e-12)  # symmetric in (P, Q)
        assert fmt_numerical_delta(eps, eps0, n) == pytest.approx(d_pq, abs=1e-12)


# --------------------------------------------------------------- dispatch


def test_shuffle_amplified_epsilon_methods() -> None:
    n, eps0, delta = 100_000, 4.0, 1e-6
    num = shuffle_amplified_epsilon(eps0, n, delta, method="numerical")
    cf = shuffle_amplified_epsilon(eps0, n, delta, method="closed_form")
    best = shuffle_amplified_epsilon(eps0, n, delta)
    assert best == min(num, cf) == num
    # closed form invalid: best falls back to numerical; closed_form raises.
    assert shuffle_amplified_epsilon(1.0, 100, 1e-5) == fmt_numerical_epsilon(1.0, 100, 1e-5)
    with pytest.raises(ValueError):
        shuffle_amplified_epsilon(1.0, 100, 1e-5, method="closed_form")
    assert shuffle_amplified_epsilon(2.0, 100, 1e-5) <= 2.0


def test_runtime_n_1e5() -> None:
    start = time.perf_counter()
    fmt_numerical_epsilon(1.0, 100_000, 1e-6)
    assert time.perf_counter() - start < 1.0


# -------------------------------------------------------------- bad inputs

BAD_EPS0 = [0.0, -1.0, math.inf, math.nan, "1", True]
BAD_N = [0, -5, 10.0, 1.5, True, "100"]
BAD_DELTA = [0.0, 1.0, -1e-6, 2.0, math.nan]


@pytest.mark.parametrize("eps0", BAD_EPS0)
def test_bad_epsilon0(eps0: object) -> None:
    for fn in (fmt_closed_form_valid, fmt_closed_form_epsilon, fmt_numerical_epsilon, shuffle_amplified_epsilon):
        with pytest.raises(ValueError, match="epsilon0"):
            fn(eps0, 1000, 1e-5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epsilon0"):
        fmt_numerical_delta(0.1, eps0, 1000)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", BAD_N)
def test_bad_n(n: object) -> None:
    for fn in (fmt_closed_form_valid, fmt_closed_form_epsilon, fmt_numerical_epsilon, shuffle_amplified_epsilon):
        with pytest.raises(ValueError, match=r"n must be an integer in \[1, inf\)"):
            fn(1.0, n, 1e-5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be"):
        fmt_numerical_delta(0.1, 1.0, n)  # type: ignore[arg-type]


@pytest.mark.parametrize("delta", BAD_DELTA)
def test_bad_delta(delta: float) -> None:
    for fn in (fmt_closed_form_valid, fmt_closed_form_epsilon, fmt_numerical_epsilon, shuffle_amplified_epsilon):
        with pytest.raises(ValueError, match="delta"):
            fn(1.0, 1000, delta)


def test_bad_epsilon_tol_method() -> None:
    with pytest.raises(ValueError, match=r"epsilon must be in \[0, inf\)"):
        fmt_numerical_delta(-0.1, 1.0, 100)
    with pytest.raises(ValueError, match="tol"):
        fmt_numerical_epsilon(1.0, 100, 1e-5, tol=0.0)
    with pytest.raises(ValueError, match="method"):
        shuffle_amplified_epsilon(1.0, 100, 1e-5, method="eps_over_m")


def test_error_message_names_range() -> None:
    with pytest.raises(ValueError, match=r"epsilon0 must be in \(0, inf\), got -1"):
        fmt_numerical_epsilon(-1, 100, 1e-5)
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\), got 1\.5"):
        fmt_numerical_epsilon(1.0, 100, 1.5)
