"""Privacy amplification by shuffling (Feldman, McMillan, Talwar 2021).

Setting: each of ``n`` users applies an ε₀-LDP (pure) local randomizer to its
own data and the ``n`` reports are uniformly shuffled before release. The
shuffled output is (ε, δ)-DP for some ε ≪ ε₀ ("Hiding Among the Clones: A
Simple and Nearly Optimal Analysis of Privacy Amplification by Shuffling",
V. Feldman, A. McMillan, K. Talwar, FOCS 2021, arXiv:2012.12803; "FMT" below).

Two bounds are offered:

* :func:`fmt_closed_form_epsilon`: the closed form of FMT Theorem 3.1, exactly
  as implemented in Apple's reference code
  (``apple/ml-shuffling-amplification``, ``computeamplification.py::
  closedformanalysis``), with its validity condition
  :func:`fmt_closed_form_valid`.
* :func:`fmt_numerical_delta` / :func:`fmt_numerical_epsilon`: the numerical
  bound of FMT (Theorem 3.2 reduction, Appendix E), computed here exactly
  (up to an explicitly added, negligible truncated tail mass) rather than by
  Apple's stepped upper bound, so it is at or slightly below Apple's numbers.

:func:`shuffle_amplified_epsilon` picks one of them or their minimum.

Not used here: the DELM paper's appendix divides the local ε by the number of
shuffled messages m (an "ε/m" amplification). That 1/m factor is not a valid
shuffle bound (shuffling cannot improve a pure ε₀-LDP report to ε₀/m; FMT's
bounds are ≈ ε₀-dependent · √(ln(1/δ)/n)) and it is never used in this module.

This module is pure numpy / scipy / math; it imports nothing from flwr.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ..accounting.events import ApproxDpEvent
from ..validation import check_delta, check_int, check_nonnegative, check_positive

__all__ = [
    "fmt_closed_form_valid",
    "fmt_closed_form_epsilon",
    "fmt_numerical_delta",
    "fmt_numerical_epsilon",
    "shuffle_amplified_epsilon",
    "shuffle_amplified_event",
    "SHUFFLE_METHODS",
]

SHUFFLE_METHODS: tuple[str, ...] = ("numerical", "closed_form", "best")

# Half-width of the window of C ~ Bin(n-1, e^{-ε₀}) values evaluated exactly,
# in standard deviations plus a constant; the mass outside is added to δ.
_WINDOW_SDS = 12.0
_WINDOW_PAD = 30.0


def _check_epsilon0(value: object, name: str = "epsilon0") -> float:
    return check_positive(name, value)


def _check_epsilon(value: object) -> float:
    return check_nonnegative("epsilon", value)


def _check_delta(value: object) -> float:
    return check_delta(value)


def _check_n(value: object) -> int:
    return check_int("n", value, minimum=1)


# --------------------------------------------------------------- closed form


def _closed_form_limit(n: int, delta: float) -> float:
    """ln(n / (16 ln(4/δ))): the largest ε₀ for which the closed form is used."""
    return math.log(n / (16.0 * math.log(4.0 / delta)))


def fmt_closed_form_valid(epsilon0: float, n: int, delta: float) -> bool:
    """Whether the FMT closed form applies: ε₀ ≤ ln(n / (16 ln(4/δ))).

    This is the condition checked by Apple's reference code
    (``computeamplification.py::closedformanalysis``). FMT Theorem 3.1 states
    it with ln(2/δ) instead of ln(4/δ); the ln(4/δ) version is stricter (it
    accepts a subset of the (ε₀, n, δ) the paper accepts), hence conservative.
    """
    eps0 = _check_epsilon0(epsilon0)
    n_ = _check_n(n)
    dlt = _check_delta(delta)
    return eps0 <= _closed_form_limit(n_, dlt)


def fmt_closed_form_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """Closed-form shuffled ε of FMT Theorem 3.1 (Apple's code variant).

    Paper (FMT, Theorem 3.1): for ε₀ ≤ ln(n / (16 ln(2/δ))), shuffling n
    ε₀-LDP reports is (ε, δ)-DP with

        ε = ln(1 + (e^ε₀ − 1)/(e^ε₀ + 1) · (8 √(e^ε₀ ln(4/δ)) / √n + 8 e^ε₀ / n)).

    Implemented (``apple/ml-shuffling-amplification``,
    ``computeamplification.py::closedformanalysis``)::

        a  = 8 √(e^ε₀ ln(4/δ)) / √n,   c = 8 e^ε₀ / n,
        ε' = ln(1 + a + c),
        ε  = ln(1 + (1 − e^{−ε₀}) / (1 + e^{−ε₀−ε'}) · (a + c)),

    valid for ε₀ ≤ ln(n / (16 ln(4/δ))). The factor
    (1 − e^{−ε₀})/(1 + e^{−ε₀−ε'}) ≥ (1 − e^{−ε₀})/(1 + e^{−ε₀}) =
    (e^ε₀ − 1)/(e^ε₀ + 1) since ε' ≥ 0, and the validity region is smaller,
    so the code variant is slightly more conservative than the theorem
    statement; it is used here because it is the published reference
    implementation and matches the numbers in Apple's README.

    Raises:
        ValueError: on out-of-domain parameters, or when the validity
            condition fails (use :func:`fmt_numerical_epsilon` then).
    """
    eps0 = _check_epsilon0(epsilon0)
    n_ = _check_n(n)
    dlt = _check_delta(delta)
    limit = _closed_form_limit(n_, dlt)
    if eps0 > limit:
        raise ValueError(
            "the FMT closed form requires epsilon0 <= ln(n / (16 ln(4/delta))) "
            f"= {limit:.6g} for n={n_}, delta={dlt:g}, got epsilon0={eps0:g}; "
            "use the numerical bound (fmt_numerical_epsilon) instead"
        )
    a = 8.0 * math.sqrt(math.exp(eps0) * math.log(4.0 / dlt)) / math.sqrt(n_)
    c = 8.0 * math.exp(eps0) / n_
    eps_prime = math.log1p(a + c)
    factor = -math.expm1(-eps0) / (1.0 + math.exp(-eps0 - eps_prime))
    return math.log1p(factor * (a + c))


# ----------------------------------------------------------------- numerical


def _c_window(n: int, p: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Values c of C ~ Bin(n−1, p) evaluated exactly, their pmf, and the mass left out.

    The window is mean ± (12 sd + 30) clipped to [0, n−1]; the probability of
    the c values outside it (≈ 1e-25 or less) is returned so that callers can
    add it to δ (the per-c divergence is at most 1).
    """
    trials = n - 1
    mean = trials * p
    half = _WINDOW_SDS * math.sqrt(trials * p * (1.0 - p)) + _WINDOW_PAD
    lo = max(0, int(math.floor(mean - half)))
    hi = min(trials, int(math.ceil(mean + half)))
    cs = np.arange(lo, hi + 1, dtype=np.int64)
    weights = stats.binom.pmf(cs, trials, p)
    left_out = 0.0
    if lo > 0:
        left_out += float(stats.binom.cdf(lo - 1, trials, p))
    if hi < trials:
        left_out += float(stats.binom.sf(hi, trials, p))
    return cs, weights, left_out


def _conditional_divergence(cs: np.ndarray, epsilon: float, epsilon0: float) -> np.ndarray:
    """D_{e^ε}(P_c ‖ Q_c) = Σ_a max(0, P(a|c) − e^ε Q(a|c)) for every c in ``cs``.

    P(a|c) = α b_c(a−1) + (1−α) b_c(a),  Q(a|c) = (1−α) b_c(a−1) + α b_c(a),
    with b_c the Bin(c, 1/2) pmf and α = e^ε₀/(e^ε₀+1). The likelihood ratio
    P/Q = (α r + 1 − α)/((1 − α) r + α), r = b_c(a−1)/b_c(a) = a/(c+1−a), is
    increasing in a, so the positive part is a suffix {a ≥ t} and the sum is
    max_t S(t), where (telescoping the binomial tails, X ~ Bin(c, 1/2))

        S(t) = A·b_c(t−1) − (e^ε − 1)·P[X ≥ t],   A = α − e^ε (1 − α).

    The optimal t is ⌊B (c+1)/(A+B)⌋ + 1 with B = e^ε α − (1 − α); S is
    evaluated at that t and its two neighbours (robust to rounding) and the
    maximum (with 0) is taken. Requires ε < ε₀ (else A ≤ 0 and D = 0).
    """
    alpha = 1.0 / (1.0 + math.exp(-epsilon0))
    e_eps = math.exp(epsilon)
    coef_a = alpha - e_eps * (1.0 - alpha)
    coef_b = e_eps * alpha - (1.0 - alpha)
    em1 = math.expm1(epsilon)
    c = cs.astype(np.float64)
    t = np.floor(coef_b * (c + 1.0) / (coef_a + coef_b)).astype(np.int64) + 1
    pmf_m2 = stats.binom.pmf(t - 2, cs, 0.5)
    pmf_m1 = stats.binom.pmf(t - 1, cs, 0.5)
    pmf_0 = stats.binom.pmf(t, cs, 0.5)
    sf_t = stats.binom.sf(t - 1, cs, 0.5)  # P[X >= t]
    s_mid = coef_a * pmf_m1 - em1 * sf_t
    s_low = coef_a * pmf_m2 - em1 * (sf_t + pmf_m1)
    s_high = coef_a * pmf_0 - em1 * np.maximum(sf_t - pmf_0, 0.0)
    return np.maximum(np.maximum(s_mid, s_low), np.maximum(s_high, 0.0))


def _numerical_delta(epsilon: float, epsilon0: float, window: tuple[np.ndarray, np.ndarray, float]) -> float:
    """δ(ε) from a precomputed C window (see :func:`fmt_numerical_delta`)."""
    if epsilon >= epsilon0:
        return 0.0
    cs, weights, left_out = window
    total = float(np.dot(weights, _conditional_divergence(cs, epsilon, epsilon0))) + left_out
    return min(1.0, max(0.0, total))


def fmt_numerical_delta(epsilon: float, epsilon0: float, n: int) -> float:
    """δ(ε) of n shuffled ε₀-LDP reports by the FMT reduction (Theorem 3.2).

    FMT Theorem 3.2 (with its proof, Lemma 3.3, and Appendix E): let
    p = e^{−ε₀}, C ~ Bin(n−1, p), A ~ Bin(C, 1/2), Δ ~ Bern(α) with
    α = e^ε₀/(e^ε₀+1), and

        P = (A + Δ, C − A + 1 − Δ),   Q = (A + 1 − Δ, C − A + Δ).

    The shuffled output on neighbouring datasets is a post-processing of P
    versus Q, so the protocol is (ε, δ(ε))-DP with the hockey-stick divergence

        δ(ε) = Σ_c Pr[C = c] Σ_{a=0}^{c+1} max(0, P(a|c) − e^ε Q(a|c)),

    P(a|c) = α b_c(a−1) + (1−α) b_c(a), Q(a|c) = (1−α) b_c(a−1) + α b_c(a),
    b_c the Bin(c, 1/2) pmf. The divergence is symmetric in (P, Q) through
    a ↔ c+1−a (checked by brute force in the tests). Each inner sum is O(1)
    via binomial tails (see :func:`_conditional_divergence`); c ranges over
    mean ± (12 sd + 30) of C and the mass of the other c values (≤ ~1e-25) is
    added, so the result is an upper bound that is exact up to that term and
    float rounding (~1e-16 absolute). For ε ≥ ε₀ it returns 0: the shuffled
    protocol is ε₀-DP by post-processing of the one changed ε₀-LDP report.
    """
    eps = _check_epsilon(epsilon)
    eps0 = _check_epsilon0(epsilon0)
    n_ = _check_n(n)
    if eps >= eps0:
        return 0.0
    return _numerical_delta(eps, eps0, _c_window(n_, math.exp(-eps0)))


def fmt_numerical_epsilon(epsilon0: float, n: int, delta: float, tol: float = 1e-4) -> float:
    """Smallest ε (to within ``tol``, rounded up) with δ(ε) ≤ δ, by bisection on [0, ε₀].

    δ(ε) is :func:`fmt_numerical_delta` (FMT Theorem 3.2, Appendix E), which
    is non-increasing in ε. The upper end of the final bracket is returned,
    so the result is a valid ε for the target δ and at most ``tol`` above the
    optimum. δ(ε₀) = 0 (pure ε₀-DP), so without amplification the result is
    ε₀. Mirrors Apple's ``numericalanalysis`` but with an exact δ(ε).
    """
    eps0 = _check_epsilon0(epsilon0)
    n_ = _check_n(n)
    dlt = _check_delta(delta)
    tol_ = check_positive("tol", tol)
    window = _c_window(n_, math.exp(-eps0))
    if _numerical_delta(0.0, eps0, window) <= dlt:
        return 0.0
    lo, hi = 0.0, eps0
    while hi - lo > tol_:
        mid = 0.5 * (lo + hi)
        if _numerical_delta(mid, eps0, window) <= dlt:
            hi = mid
        else:
            lo = mid
    return hi


# ------------------------------------------------------------------ dispatch


def shuffle_amplified_epsilon(epsilon0: float, n: int, delta: float, method: str = "best") -> float:
    """Shuffled ε for n ε₀-LDP reports at target δ (FMT 2021).

    ``method``: ``"numerical"`` (:func:`fmt_numerical_epsilon`),
    ``"closed_form"`` (:func:`fmt_closed_form_epsilon`; raises ValueError
    outside its validity region) or ``"best"``: the minimum of the numerical
    bound and, when valid, the closed form. The result never exceeds ε₀.
    """
    if method not in SHUFFLE_METHODS:
        raise ValueError(f"method must be one of {SHUFFLE_METHODS}, got {method!r}")
    eps0 = _check_epsilon0(epsilon0)
    n_ = _check_n(n)
    dlt = _check_delta(delta)
    if method == "closed_form":
        return min(eps0, fmt_closed_form_epsilon(eps0, n_, dlt))
    best = min(eps0, fmt_numerical_epsilon(eps0, n_, dlt))
    if method == "best" and fmt_closed_form_valid(eps0, n_, dlt):
        best = min(best, fmt_closed_form_epsilon(eps0, n_, dlt))
    return best


def shuffle_amplified_event(epsilon0: float, n: int, delta: float, method: str = "best") -> ApproxDpEvent:
    """The ledger event of one user's report in a shuffled batch of n ε₀-LDP reports.

    The shuffler's output is (ε, δ)-DP with ε = :func:`shuffle_amplified_epsilon`;
    record it as a central event when the shuffler is trusted (its trust
    assumption is the caller's to document), and the client's ε₀-LDP release as
    that client's own event when it is not. ε = 0 (possible for huge n) is
    recorded as 1e-9 because ApproxDpEvent needs ε > 0.
    """
    eps = shuffle_amplified_epsilon(epsilon0, n, delta, method)
    return ApproxDpEvent(epsilon=max(eps, 1e-9), delta=delta)
