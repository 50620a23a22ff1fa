"""Statistics of an empirical privacy audit with random canaries (no Flower; numpy/scipy only).

A canary is a pseudorandom unit vector that a (simulated) client submits as its model delta. After
training, the server measures how strongly each canary shows in the final model delta (its cosine
with the delta) and compares inserted canaries with canaries that were never submitted. Three
statistics turn those scores into privacy figures:

* :func:`estimate_epsilon` — the one-shot *estimate* of Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar,
  "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024: fit a Gaussian to the
  inserted and to the unseen (null) cosines and report the ε at which the two Gaussians are
  (ε, δ)-indistinguishable (:func:`epsilon_from_gaussians`). A point estimate, not a bound.
* :func:`epsilon_lower_bound` — a threshold membership attack with Clopper–Pearson confidence bounds
  (Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning: How Private is Private
  SGD?", NeurIPS 2020): a high-confidence *lower bound* on ε when the scores are independent trials.
* :func:`shift_lower_bound` — the same threshold attack under the additive-shift model of canary cosines
  (the inserted cosine is the exact null law shifted by the canary's contribution, whatever the noise):
  the false-positive rate is exact and the true-positive rate follows from a confidence limit on the mean
  shift, so it needs far fewer canaries than Clopper–Pearson to reach a given ε (Clopper–Pearson cannot
  exceed about log k with k canaries; this bound is limited by the signal).
* :func:`one_run_lower_bound` — the lower bound of Steinke, Nasr, Jagielski, "Privacy Auditing with One
  (1) Training Run", NeurIPS 2023, valid for many canaries inserted at random into a single run.

The null distribution of a cosine against an unseen canary is known in closed form
(:func:`cosine_null_sf`): the cosine between a fixed vector and a uniformly random unit vector.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import optimize, stats

from ..validation import as_finite_array, check_int, check_positive

__all__ = [
    "EpsilonEstimate",
    "ShiftAuditBound",
    "ThresholdAuditBound",
    "canary_cosines",
    "canary_vectors",
    "cosine_null_sf",
    "epsilon_from_gaussians",
    "epsilon_lower_bound",
    "estimate_epsilon",
    "shift_lower_bound",
    "one_run_lower_bound",
]

# ε search interval of the bisections; past it the pair is reported as not (ε, δ)-indistinguishable (ε = inf)
_EPS_MAX = 1e4
_BISECT_STEPS = 200
_BISECT_TOL = 1e-10


# -- validation helpers -------------------------------------------------------------------------------------------


def _check_open_unit(name: str, value: object) -> float:
    v = check_positive(name, value)
    if not v < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return v


def _check_half_open_unit(name: str, value: object) -> float:
    """A value in [0, 1) (δ of an audit may be 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number in [0, 1), got {value!r}")
    v = float(value)
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return v


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return v


def _scores(name: str, values: object, minimum: int) -> np.ndarray:
    arr = as_finite_array(name, values)
    if arr.ndim != 1 or arr.size < minimum:
        raise ValueError(f"{name} must be a 1-D array with at least {minimum} finite values, got shape {arr.shape}")
    return arr


# -- canaries -----------------------------------------------------------------------------------------------------


def canary_vectors(canary_ids: object, dim: int, seed: int) -> np.ndarray:
    """Unit canary vectors in ℝ^dim, one row per id, each a function of ``(seed, id)`` alone.

    Row i is ``g / ‖g‖`` with ``g = np.random.default_rng([seed, canary_ids[i]]).standard_normal(dim)``,
    so it is uniformly distributed on the unit sphere, canaries with different ids are independent,
    and the server can regenerate any canary from its id without storing it (Andrew et al., ICLR 2024,
    Sec. 3: random canary directions are nearly orthogonal to each other and to the true updates).

    ``canary_ids``: a 1-D sequence of integers in [0, inf) (an int gives one row); ``dim``: an integer
    in [1, inf); ``seed``: an integer in [0, inf). Returns a float64 array of shape (len(ids), dim).
    """
    d = check_int("dim", dim, minimum=1)
    s = check_int("seed", seed, minimum=0)
    ids = np.atleast_1d(np.asarray(canary_ids))
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)) or ids.dtype == np.bool_:
        raise ValueError(f"canary_ids must be a 1-D sequence of integers in [0, inf), got {canary_ids!r}")
    if ids.size and int(ids.min()) < 0:
        raise ValueError(f"canary_ids must be integers in [0, inf), got minimum {int(ids.min())}")
    out = np.empty((ids.size, d), dtype=np.float64)
    for row, cid in enumerate(ids.tolist()):
        g = np.random.default_rng([s, int(cid)]).standard_normal(d)
        norm = float(np.linalg.norm(g))
        while norm == 0.0:  # probability zero; kept so a row is a unit vector whatever happens
            g = np.random.default_rng([s, int(cid), 1]).standard_normal(d)
            norm = float(np.linalg.norm(g))
        out[row] = g / norm
    return out


def canary_cosines(delta: object, canaries: object) -> np.ndarray:
    """Cosine of each canary (row of ``canaries``) with the model delta ``delta``, in float64.

    cos_i = ⟨c_i, Δ⟩ / (‖c_i‖·‖Δ‖); a zero delta gives 0 for every canary (it carries no canary).
    ``delta``: a finite 1-D array of length dim; ``canaries``: a finite (k, dim) array with nonzero rows
    (a 1-D array is one canary). Results are clipped to [−1, 1] against rounding.
    """
    d = as_finite_array("delta", delta)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"delta must be a non-empty 1-D array, got shape {d.shape}")
    c = as_finite_array("canaries", canaries)
    if c.ndim == 1:
        c = c[None, :]
    if c.ndim != 2 or c.shape[1] != d.size:
        raise ValueError(f"canaries must have shape (k, {d.size}) to match delta, got {c.shape}")
    c_norm = np.linalg.norm(c, axis=1)
    if np.any(c_norm == 0.0):
        raise ValueError("canaries must have nonzero rows (a zero canary has no direction)")
    d_norm = float(np.linalg.norm(d))
    if d_norm == 0.0:
        return np.zeros(c.shape[0], dtype=np.float64)
    return np.clip((c @ d) / (c_norm * d_norm), -1.0, 1.0)


def cosine_null_sf(t: object, dim: int) -> np.ndarray | float:
    """P[cos ≥ t] for the cosine between a fixed vector and a uniformly random unit vector in ℝ^dim.

    The cosine has density ∝ (1 − t²)^((dim−3)/2) on [−1, 1], i.e. (cos + 1)/2 ~ Beta((dim−1)/2,
    (dim−1)/2); its mean is 0 and its variance 1/dim, so for large dim it is close to N(0, 1/dim). This is
    the exact null distribution of an unseen canary's cosine with any model delta that does not depend on
    it (Andrew et al., ICLR 2024). ``t``: finite real(s) (values outside [−1, 1] give 1 or 0); ``dim``: an
    integer in [2, inf). Returns a float for a scalar ``t``, else an array of its shape.
    """
    d = check_int("dim", dim, minimum=2)
    arr = as_finite_array("t", t)
    a = (d - 1) / 2.0
    out = stats.beta.sf((arr + 1.0) / 2.0, a, a)
    return float(out) if np.ndim(out) == 0 else out


# -- the one-shot estimate (Andrew et al.) ------------------------------------------------------------------------


def _log_mass(mu: float, sigma: float, lo: float, hi: float) -> float:
    """log P[lo < X < hi] for X ~ N(mu, sigma²), accurate deep in either tail."""
    if lo >= hi:
        return -math.inf
    a, b = (lo - mu) / sigma, (hi - mu) / sigma
    if a >= 0.0:  # both above the mean: difference of survival functions
        la, lb = stats.norm.logsf(a), stats.norm.logsf(b)
    elif b <= 0.0:  # both below the mean: difference of cdfs
        la, lb = stats.norm.logcdf(b), stats.norm.logcdf(a)
    else:  # straddles the mean: the mass is at least min(cdf(b) − 1/2, 1/2 − cdf(a)) > 0, no cancellation
        return math.log(float(stats.norm.cdf(b) - stats.norm.cdf(a)))
    if lb == -math.inf:
        return float(la)
    diff = lb - la
    return float(la + math.log(-math.expm1(diff))) if diff < 0.0 else -math.inf


def _region(mu_p: float, s_p: float, mu_q: float, s_q: float, eps: float) -> list[tuple[float, float]]:
    """The intervals where p(x) > e^ε q(x), for p = N(mu_p, s_p²), q = N(mu_q, s_q²).

    log p − log q − ε = a x² + b x + c with the coefficients below; the set where it is positive is a
    half-line (equal variances), the complement of an interval (p wider), or an interval (p narrower).
    """
    a = 0.5 / s_q**2 - 0.5 / s_p**2
    b = mu_p / s_p**2 - mu_q / s_q**2
    c = mu_q**2 / (2 * s_q**2) - mu_p**2 / (2 * s_p**2) + math.log(s_q / s_p) - eps
    inf = math.inf
    if a == 0.0:
        if b == 0.0:
            return [(-inf, inf)] if c > 0.0 else []
        root = -c / b
        return [(root, inf)] if b > 0.0 else [(-inf, root)]
    disc = b * b - 4.0 * a * c
    if disc <= 0.0:
        return [(-inf, inf)] if a > 0.0 else []
    q = -0.5 * (b + math.copysign(math.sqrt(disc), b))  # stable roots: q/a and c/q
    roots = sorted((q / a, c / q)) if q != 0.0 else sorted((math.sqrt(disc) / (2 * a), -math.sqrt(disc) / (2 * a)))
    lo, hi = roots
    return [(-inf, lo), (hi, inf)] if a > 0.0 else [(lo, hi)]


def _hockey_stick(mu_p: float, s_p: float, mu_q: float, s_q: float, eps: float) -> float:
    """H_ε(P‖Q) = ∫ max(0, p − e^ε q) dx = P(A) − e^ε Q(A) over A = {p > e^ε q}, exact for Gaussians."""
    total = 0.0
    for lo, hi in _region(mu_p, s_p, mu_q, s_q, eps):
        log_p = _log_mass(mu_p, s_p, lo, hi)
        if log_p == -math.inf:
            continue
        log_q = _log_mass(mu_q, s_q, lo, hi)
        total += math.exp(log_p) - (math.exp(eps + log_q) if log_q > -math.inf else 0.0)
    return max(total, 0.0)


def epsilon_from_gaussians(mu_in: float, sigma_in: float, mu_out: float, sigma_out: float, delta: float) -> float:
    """The smallest ε ≥ 0 at which N(mu_in, sigma_in²) and N(mu_out, sigma_out²) are (ε, δ)-indistinguishable.

    That is the smallest ε with max(H_ε(P‖Q), H_ε(Q‖P)) ≤ δ, where H_ε(P‖Q) = ∫ max(0, p − e^ε q) is
    the hockey-stick divergence (Balle & Wang 2018): any test telling the inserted-canary distribution from the
    null one then has TPR ≤ e^ε·FPR + δ. This is the estimator of Andrew et al., ICLR 2024 (Sec. 4), applied
    to Gaussians fitted to canary cosines. H_ε is exact (normal cdfs over the at most two intervals where
    p > e^ε q); ε is found by bisection (H_ε is nonincreasing in ε). With sigma_in = sigma_out = σ it equals
    the analytic Gaussian-mechanism ε for noise multiplier σ/|mu_in − mu_out| (Balle & Wang 2018).

    ``mu_in``, ``mu_out``: finite reals; ``sigma_in``, ``sigma_out``: in (0, inf); ``delta``: in (0, 1).
    Returns ``math.inf`` when no ε ≤ 1e4 suffices.
    """
    m_in, m_out = _check_real("mu_in", mu_in), _check_real("mu_out", mu_out)
    s_in, s_out = check_positive("sigma_in", sigma_in), check_positive("sigma_out", sigma_out)
    dlt = _check_open_unit("delta", delta)

    def divergence(eps: float) -> float:
        return max(_hockey_stick(m_in, s_in, m_out, s_out, eps), _hockey_stick(m_out, s_out, m_in, s_in, eps))

    if divergence(0.0) <= dlt:
        return 0.0
    hi = 1.0
    while divergence(hi) > dlt:
        hi *= 2.0
        if hi > _EPS_MAX:
            return math.inf
    lo = 0.0
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        if divergence(mid) > dlt:
            lo = mid
        else:
            hi = mid
        if hi - lo <= _BISECT_TOL * max(1.0, hi):
            break
    return hi


@dataclass(frozen=True)
class EpsilonEstimate:
    """The one-shot ε estimate and the Gaussian fits it comes from (``num_null`` is 0 for the analytic null)."""

    epsilon: float
    delta: float
    mu_in: float
    sigma_in: float
    mu_out: float
    sigma_out: float
    num_inserted: int
    num_null: int


def estimate_epsilon(
    inserted_cosines: object, null_cosines: object, delta: float, *, dim: Optional[int] = None
) -> EpsilonEstimate:
    """Andrew et al.'s one-shot ε estimate (ICLR 2024, Algorithm 1, final-model variant) from canary cosines.

    Fits N(mu_in, sigma_in²) to the inserted canaries' cosines and N(mu_out, sigma_out²) to the null: the
    cosines of canaries that were never inserted (sample mean, standard deviation with ddof=1), or, with
    ``null_cosines=None`` and ``dim`` given, the analytic null N(0, 1/dim) of a random unit vector's cosine
    (:func:`cosine_null_sf`). Returns the ε at which the two fitted Gaussians are (ε, δ)-indistinguishable
    (:func:`epsilon_from_gaussians`). Assumptions: the cosines are close to Gaussian (true for the null in
    high dimension and, by the paper's argument, for inserted canaries under Gaussian noise), and the
    canaries are independent of each other and of the data. It is an *estimate* — neither a bound nor
    conservative; a degenerate fit (a zero standard deviation) gives ε = inf unless both samples are the
    same point mass (ε = 0).

    ``inserted_cosines``: finite 1-D array, at least 2 values; ``null_cosines``: the same or ``None``;
    ``delta``: in (0, 1); ``dim``: an integer in [2, inf), required exactly when ``null_cosines`` is None.
    """
    ins = _scores("inserted_cosines", inserted_cosines, 2)
    dlt = _check_open_unit("delta", delta)
    if null_cosines is None:
        if dim is None:
            raise ValueError("dim must be an integer in [2, inf) when null_cosines is None (analytic null)")
        d = check_int("dim", dim, minimum=2)
        mu_out, sigma_out, n_null = 0.0, 1.0 / math.sqrt(d), 0
    else:
        if dim is not None:
            raise ValueError("dim must be None when null_cosines is given (the null is fitted from them)")
        null = _scores("null_cosines", null_cosines, 2)
        mu_out, sigma_out, n_null = float(null.mean()), float(null.std(ddof=1)), int(null.size)
    mu_in, sigma_in = float(ins.mean()), float(ins.std(ddof=1))
    if sigma_in == 0.0 or sigma_out == 0.0:
        same = sigma_in == sigma_out and mu_in == mu_out
        eps = 0.0 if same else math.inf
    else:
        eps = epsilon_from_gaussians(mu_in, sigma_in, mu_out, sigma_out, dlt)
    return EpsilonEstimate(eps, dlt, mu_in, sigma_in, mu_out, sigma_out, int(ins.size), n_null)


# -- Clopper–Pearson threshold attack (Jagielski, Ullman, Oprea 2020) ----------------------------------------------


@functools.lru_cache(maxsize=32)
def _cp_tables(n: int, level: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper–Pearson bounds at error ``level`` for k = 0..n successes out of n:
    lower[k] = Beta quantile level (k, n−k+1) (0 for k = 0), upper[k] = Beta quantile 1−level (k+1, n−k)
    (1 for k = n)."""
    k = np.arange(n + 1, dtype=np.float64)
    lower = np.zeros(n + 1)
    upper = np.ones(n + 1)
    lower[1:] = stats.beta.ppf(level, k[1:], n - k[1:] + 1.0)
    upper[:-1] = stats.beta.isf(level, k[:-1] + 1.0, n - k[:-1])
    lower.flags.writeable = False
    upper.flags.writeable = False
    return lower, upper


@dataclass(frozen=True)
class ThresholdAuditBound:
    """A Clopper–Pearson ε lower bound from a threshold attack, with the threshold and counts that give it.

    ``threshold`` is None and the counts 0 when no threshold gives a positive bound (``epsilon`` = 0).
    """

    epsilon: float
    threshold: Optional[float]
    true_positives: int
    num_inserted: int
    false_positives: int
    num_null: int
    tpr_lower: float
    fpr_upper: float
    confidence: float


def epsilon_lower_bound(
    inserted_scores: object, null_scores: object, delta: float, confidence: float = 0.95
) -> ThresholdAuditBound:
    """A lower bound on ε that holds with probability ≥ ``confidence``, from a threshold membership attack.

    The attack guesses "inserted" when a score is ≥ t. For every threshold t among the pooled scores it
    counts TP(t) = #inserted ≥ t and FP(t) = #null ≥ t and bounds the true rates with one-sided
    Clopper–Pearson intervals (Jagielski, Ullman, Oprea, NeurIPS 2020): TPR ≥ TPR_lo(t), FPR ≤ FPR_hi(t).
    An (ε, δ)-DP mechanism has TPR ≤ e^ε·FPR + δ for every test, so ε ≥ log((TPR_lo − δ)/FPR_hi); the bound
    is the maximum over thresholds, floored at 0.

    Error split (so that the maximum over data-chosen thresholds is valid): α = 1 − confidence is split
    α/2 to the inserted side and α/2 to the null side, and on each side Bonferroni over the n possible
    counts: every TPR_lo uses level α/(2·n_inserted), every FPR_hi level α/(2·n_null). For continuous
    scores the set of thresholds with count k is an interval between order statistics, and the bound for
    count k fails somewhere on it exactly when it fails at the interval's end, whose true rate is a
    Beta order statistic — an event of probability exactly that level. The union bound over the counts
    and the two sides therefore makes all the bounds hold *simultaneously for every threshold in ℝ* with
    probability ≥ confidence, and choosing the best threshold from the same data keeps the guarantee.
    No held-out half is needed.

    Assumptions: the scores are independent trials — each inserted score from the mechanism run with the
    canary, each null score from a run without it (e.g. one canary per independent run, or canaries whose
    scores are independent). For many canaries in one run use :func:`one_run_lower_bound`.

    ``inserted_scores``, ``null_scores``: finite 1-D arrays, at least 1 value each; ``delta``: in [0, 1);
    ``confidence``: in (0, 1).
    """
    ins = _scores("inserted_scores", inserted_scores, 1)
    null = _scores("null_scores", null_scores, 1)
    dlt = _check_half_open_unit("delta", delta)
    conf = _check_open_unit("confidence", confidence)
    alpha = 1.0 - conf
    n_in, n_null = int(ins.size), int(null.size)
    tpr_lo_table, _ = _cp_tables(n_in, alpha / (2.0 * n_in))
    _, fpr_hi_table = _cp_tables(n_null, alpha / (2.0 * n_null))
    thresholds = np.unique(np.concatenate([ins, null]))
    tp = n_in - np.searchsorted(np.sort(ins), thresholds, side="left")
    fp = n_null - np.searchsorted(np.sort(null), thresholds, side="left")
    tpr_lo = tpr_lo_table[tp]
    fpr_hi = fpr_hi_table[fp]
    with np.errstate(divide="ignore", invalid="ignore"):
        bounds = np.where(tpr_lo > dlt, np.log(np.maximum(tpr_lo - dlt, 1e-300) / fpr_hi), -np.inf)
    best = int(np.argmax(bounds))
    if not bounds[best] > 0.0:
        return ThresholdAuditBound(0.0, None, 0, n_in, 0, n_null, 0.0, 1.0, conf)
    return ThresholdAuditBound(
        float(bounds[best]),
        float(thresholds[best]),
        int(tp[best]),
        n_in,
        int(fp[best]),
        n_null,
        float(tpr_lo[best]),
        float(fpr_hi[best]),
        conf,
    )


# -- the additive-shift bound --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShiftAuditBound:
    """A lower bound on ε from a threshold attack under the additive-shift model (:func:`shift_lower_bound`).

    ``threshold`` is the cosine at which the bound is attained (None and ``epsilon`` = 0 when no threshold gives a
    positive bound); ``shift_lower`` the lower confidence limit a_lo of the shift ratio r = x/‖R‖ of the most
    exposed canary (a canary with exposure e has r = a_lo·e/max exposure).
    """

    epsilon: float
    threshold: Optional[float]
    shift_lower: float
    num_inserted: int
    confidence: float


_MAX_LEVELS = 256  # distinct exposure levels kept by shift_lower_bound


def _null_nodes(dim: int, points: int = 801) -> tuple[np.ndarray, np.ndarray]:
    """Quadrature of the null cosine law: nodes over ±12 null sds (clipped to (−1, 1)) and their weights."""
    sd = 1.0 / math.sqrt(dim)
    u = np.linspace(max(-1.0 + 1e-12, -12.0 * sd), min(1.0 - 1e-12, 12.0 * sd), points)
    a = (dim - 1) / 2.0
    w = stats.beta.pdf((u + 1.0) / 2.0, a, a)
    return u, w / w.sum()


@functools.lru_cache(maxsize=8)
def _null_sf_table(dim: int) -> Callable[[np.ndarray], np.ndarray]:
    """:func:`cosine_null_sf` for many points at once. For dim ≥ 1 000: log-linear interpolation in a table of
    40 001 exact values from −12 null sds up to where the tail falls below 1e-300 (relative error below 1e-5;
    1 below the table, 0 above); for smaller dim the exact function."""
    if dim < 1000:
        return lambda u: np.asarray(cosine_null_sf(u, dim), dtype=np.float64)
    sd = 1.0 / math.sqrt(dim)
    a = (dim - 1) / 2.0
    lo = max(-1.0, -12.0 * sd)
    hi = 1.0
    # the tail of (1 + u)/2 ~ Beta(a, a) reaches 1e-300 well before u = 1 for large dim: cut the table there
    if stats.beta.sf(1.0 - 1e-12, a, a) < 1e-300:
        hi = float(2.0 * stats.beta.isf(1e-300, a, a) - 1.0)
    grid = np.linspace(lo, hi, 40001)
    with np.errstate(divide="ignore"):
        log_sf = np.log(stats.beta.sf((grid + 1.0) / 2.0, a, a))

    def sf(u: np.ndarray) -> np.ndarray:
        out = np.exp(np.interp(u, grid, log_sf, left=0.0, right=-np.inf))
        return np.where(u < lo, 1.0, out)

    return sf


def _cosine_given_shift(r: np.ndarray, u: np.ndarray) -> np.ndarray:
    """cos(c, x·c + R) for r = x/‖R‖ and u = cos(c, R): (r + u)/√(1 + 2ru + r²)."""
    return (r + u) / np.sqrt(1.0 + 2.0 * r * u + r * r)


def _u_needed(t: np.ndarray, r: float) -> np.ndarray:
    """The smallest u with cos(c, x·c + R) ≥ t (t in (−1, 1), r ≥ 0): the root of (r + u)² = t²(1 + 2ru + r²) on
    r + u ≥ 0, u* = −r(1 − t²) + t·√(1 − r²(1 − t²)); below −1 for t ≤ −r/√(1 + r²)… clipped to [−1, 1]."""
    one = 1.0 - t * t
    root = np.sqrt(np.maximum(1.0 - r * r * one, 0.0))
    return np.clip(-r * one + t * root, -1.0, 1.0)


def shift_lower_bound(
    inserted_cosines: object,
    delta: float,
    confidence: float = 0.95,
    *,
    dim: int,
    exposure: object = None,
    grid_points: int = 2001,
) -> ShiftAuditBound:
    """A lower bound on ε, valid with probability ≈ ``confidence`` under the additive-shift model of canary cosines.

    **The model.** A canary c (uniform on the unit sphere of ℝ^dim, independent of everything else) enters the
    release additively: with the canary the release is Δ = x·c + R, without it R, where x ≥ 0 is the canary's
    (clipped, aggregated) contribution and R, the rest of the release (other clients, other canaries, the
    noise of *any* distribution), does not depend on c. Then u = cos(c, R) has *exactly* the law of an unseen
    canary's cosine (:func:`cosine_null_sf`) whatever R is, because c is uniform and independent of R; that is
    the out-world's score. The in-world's score is cos(c, Δ) = (r + u)/√(1 + 2ru + r²) with r = x/‖R‖: a known
    increasing function of u (for r < 1), so TPR(t) = P[u ≥ u*(t; r)] in closed form from the null law.
    Neither the noise nor the scores need to be Gaussian. The canary's ratio is r_i = a·e_i for a known
    exposure e_i ≥ 0 (the rounds it took part in, or a weighted sum of them — :class:`~flwr_dp_strategies.audit.
    CanaryAudit` passes it) and an unknown scale a > 0 (the per-round contribution over ‖R‖, assumed the same in
    every round: a fixed clipping norm and aggregation weight; under adaptive clipping it varies and the bound
    is approximate), with ‖R‖ the same for every canary (one canary changes it by O(r²)).

    **The bound.** The attack guesses "inserted" when the cosine is ≥ t. An (ε, δ)-DP release has
    TPR(t) ≤ e^ε·FPR(t) + δ for every t, so ε ≥ log((TPR(t) − δ)/FPR(t)). FPR(t) is the exact null tail.
    TPR(t) = mean_i P[u ≥ u*(t; a·e_i)] (averaging over the canaries' exposures, as the sampling draws them)
    increases with a. The mean inserted cosine has expectation h(a) = mean_i E[cos(r = a·e_i)], increasing
    in a (computed by quadrature over the null law); a_lo solves h(a_lo) = mean − t_{confidence, n−1}·sd/√n
    (one-sided Student t; by the central limit theorem its level is ≈ ``confidence`` for a few dozen canaries
    and more). With a ≥ a_lo every TPR_lo(t) holds at once, so the best t may be chosen from the data (a grid
    of ``grid_points`` thresholds: a grid maximum only loses tightness). The bound is the maximum over t of
    log((TPR_lo(t) − δ)/FPR(t)), floored at 0.

    **Why.** With a constant exposure and a large dim, the threshold test is the Neyman–Pearson test of the
    shift, so with a_lo = a the bound equals the (ε, δ) of a Gaussian mechanism with μ = r·√dim (Dong, Roth,
    Su 2022); the only loss is the mean's confidence margin, ∝ 1/√n. Clopper–Pearson counts
    (:func:`epsilon_lower_bound`) cannot exceed about log(n) − 2.4 with n canaries and need no model; read the
    two together.

    ``inserted_cosines``: finite 1-D array in [−1, 1], at least 3 values; ``delta``: in [0, 1); ``confidence``:
    in (0, 1); ``dim``: integer ≥ 2; ``exposure``: None (every canary exposed alike) or a finite array of
    the same length, ≥ 0, not all 0; ``grid_points``: integer ≥ 101.
    """
    ins = _scores("inserted_cosines", inserted_cosines, 3)
    if np.any(np.abs(ins) > 1.0):
        raise ValueError("inserted_cosines must lie in [-1, 1]")
    dlt = _check_half_open_unit("delta", delta)
    conf = _check_open_unit("confidence", confidence)
    d = check_int("dim", dim, minimum=2)
    points = check_int("grid_points", grid_points, minimum=101)
    if exposure is None:
        expo = np.ones(ins.size)
    else:
        expo = as_finite_array("exposure", exposure)
        if expo.shape != ins.shape or np.any(expo < 0) or not np.any(expo > 0):
            raise ValueError(f"exposure must be None or {ins.size} finite values >= 0, not all 0")
    n = int(ins.size)
    margin = float(stats.t.ppf(conf, n - 1)) * float(ins.std(ddof=1)) / math.sqrt(n)
    mean_lo = float(ins.mean()) - margin
    scaled = expo / float(expo.max())
    if np.unique(scaled).size > _MAX_LEVELS:  # continuous exposures: bin them (each to its bin's mean)
        edges = np.quantile(scaled, np.linspace(0.0, 1.0, _MAX_LEVELS + 1))
        which = np.clip(np.searchsorted(edges, scaled, side="right") - 1, 0, _MAX_LEVELS - 1)
        means = np.bincount(which, weights=scaled, minlength=_MAX_LEVELS) / np.maximum(
            np.bincount(which, minlength=_MAX_LEVELS), 1
        )
        scaled = means[which]
    levels, counts = np.unique(scaled, return_counts=True)
    weights = counts / float(n)
    nodes, node_w = _null_nodes(d)

    def mean_cos(a: float) -> float:
        r = a * levels[:, None]
        return float(weights @ (_cosine_given_shift(r, nodes[None, :]) @ node_w))

    if not mean_lo > mean_cos(0.0):
        return ShiftAuditBound(0.0, None, 0.0, n, conf)
    lo, hi = 0.0, 1.0  # a = 1 puts the most exposed canary at r = 1 (cos ≈ 0.7)
    while mean_cos(hi) < mean_lo and hi < 1e6:
        lo, hi = hi, 2.0 * hi
    if mean_cos(hi) < mean_lo:  # cosines beyond every shift's mean (≈ 1): the release is the canary itself
        a_lo = hi
    else:
        a_lo = float(optimize.brentq(lambda a: mean_cos(a) - mean_lo, lo, hi, xtol=1e-12, rtol=1e-10))
    # thresholds over (0, 1): FPR(t) > 0 needs t < 1; past the largest shift's cosine plus the δ tail nothing helps
    top = float(_cosine_given_shift(np.array(a_lo * levels.max()), np.array(0.0)))
    sd0 = 1.0 / math.sqrt(d)
    z_top = float(stats.norm.isf(max(dlt, 1e-300))) + 1.0
    t = np.linspace(0.0, min(top + z_top * sd0, 1.0 - 1e-12), points)
    null_sf = _null_sf_table(d)
    tpr = np.zeros(points)
    for lv, wt in zip(levels, weights):
        tpr += wt * null_sf(_u_needed(t, a_lo * lv))
    fpr = null_sf(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        bounds = np.where((tpr > dlt) & (fpr > 0), np.log(np.maximum(tpr - dlt, 1e-300) / fpr), -np.inf)
    best = int(np.argmax(bounds))
    if not bounds[best] > 0.0:
        return ShiftAuditBound(0.0, None, a_lo, n, conf)
    return ShiftAuditBound(float(bounds[best]), float(t[best]), a_lo, n, conf)


# -- one training run (Steinke, Nasr, Jagielski 2023) --------------------------------------------------------------


def _one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Upper bound on P[≥ v correct of r guesses] under (ε, δ)-DP (Steinke, Nasr, Jagielski 2023, Thm 5.2 as
    computed in their Appendix code): P[Bin(r, q) ≥ v] + 2m·δ·max_{1≤i≤v} P[v−i ≤ Bin(r, q) < v]/i,
    q = e^ε/(1 + e^ε)."""
    q = 1.0 / (1.0 + math.exp(-eps))
    tail = float(stats.binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[Bin = v−1], P[Bin = v−2], ..., P[Bin = 0]
    window = np.cumsum(pmf) / np.arange(1, v + 1)
    return min(tail + 2.0 * m * delta * float(window.max()), 1.0)


def one_run_lower_bound(
    guesses_correct: int, guesses_made: int, num_canaries: int, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """Steinke, Nasr, Jagielski (NeurIPS 2023) lower bound on ε from one training run.

    Setting: each of ``num_canaries`` (m) canaries is inserted independently with probability 1/2; after
    the run the auditor guesses in/out for ``guesses_made`` (r) of them (abstaining on the rest) and
    ``guesses_correct`` (v) guesses are right. Under pure ε-DP the number of correct guesses is
    stochastically dominated by Bin(r, p_ε), p_ε = e^ε/(1 + e^ε) (their Theorem 3.1), so
    p(ε) = P[Bin(r, p_ε) ≥ v] is a valid p-value for "the run is ε-DP". The bound is the largest ε with
    p(ε) ≤ 1 − confidence: every smaller ε is rejected at that level (p is increasing in ε, found by
    bisection), so P[bound > true ε] ≤ 1 − confidence.

    With δ > 0 (their Theorem 5.2) p(ε) gains the term 2m·δ·max_{1≤i≤v} P[v−i ≤ Bin(r, p_ε) < v]/i. That
    term need not be monotone in ε, so the bound is a point ε ≤ ε_pure (the δ = 0 bound, since the extra
    term only adds) at which p(ε) ≤ 1 − confidence, found by a grid scan down from ε_pure and a bisection
    that keeps p ≤ 1 − confidence at its reported end. Any such point is sound: the true ε is below it only
    if min over ε' ≥ ε_true of p(ε') — itself a valid tail bound on the guesses — is ≤ 1 − confidence.

    ``guesses_correct``, ``guesses_made``, ``num_canaries``: integers with 0 ≤ v ≤ r ≤ m, m ≥ 1;
    ``delta``: in [0, 1); ``confidence``: in (0, 1). Returns 0 when no ε > 0 is rejected.
    """
    m = check_int("num_canaries", num_canaries, minimum=1)
    r = check_int("guesses_made", guesses_made, minimum=0)
    v = check_int("guesses_correct", guesses_correct, minimum=0)
    if r > m:
        raise ValueError(f"guesses_made must be in [0, num_canaries={m}], got {r}")
    if v > r:
        raise ValueError(f"guesses_correct must be in [0, guesses_made={r}], got {v}")
    dlt = _check_half_open_unit("delta", delta)
    alpha = 1.0 - _check_open_unit("confidence", confidence)
    if v == 0 or _one_run_p_value(m, r, v, 0.0, 0.0) > alpha:
        return 0.0
    # pure-ε bound: P[Bin(r, p_ε) ≥ v] increases in ε (binomial stochastic order) from ≤ α to 1
    lo, hi = 0.0, 1.0
    while _one_run_p_value(m, r, v, hi, 0.0) <= alpha:
        lo, hi = hi, 2.0 * hi
        if hi > _EPS_MAX:
            return math.inf
    eps_pure = _bisect_keep_low(lambda e: _one_run_p_value(m, r, v, e, 0.0) <= alpha, lo, hi)
    if dlt == 0.0:
        return eps_pure

    def ok(e: float) -> bool:
        return _one_run_p_value(m, r, v, e, dlt) <= alpha

    grid = np.linspace(0.0, eps_pure, 257)
    for j in range(grid.size - 1, -1, -1):
        if ok(float(grid[j])):
            if j == grid.size - 1:
                return float(grid[j])
            return _bisect_keep_low(ok, float(grid[j]), float(grid[j + 1]))
    return 0.0


def _bisect_keep_low(ok: Callable[[float], bool], lo: float, hi: float) -> float:
    """Bisection on [lo, hi] with ok(lo) true and ok(hi) false; returns a point where ok holds."""
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= _BISECT_TOL * max(1.0, hi):
            break
    return lo
