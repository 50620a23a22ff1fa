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
from scipy import stats

from .validation import as_finite_array, check_int, check_positive

__all__ = [
    "EpsilonEstimate",
    "ThresholdAuditBound",
    "canary_cosines",
    "canary_vectors",
    "cosine_null_sf",
    "epsilon_from_gaussians",
    "epsilon_lower_bound",
    "estimate_epsilon",
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
