r"""SignDS dimension selection: the exponential mechanism over output index sets, in log space.

Notation (MindSpore spec §1.1): ``d`` parameters, top-k set :math:`S` of size
:math:`K = \lfloor k d \rfloor`, ``h`` output indices, privacy parameter ε.
For an output set :math:`J` (:math:`|J| = h`) let :math:`\tau = |J \cap S|`;

.. math::  \omega_\tau = \binom{K}{\tau}\binom{d-K}{h-\tau}

counts the sets with overlap τ. The mechanism outputs J with probability
:math:`\propto \exp(\varepsilon\,\mathbb 1[|J\cap S| \ge \nu])`, i.e. it draws
:math:`v` with :math:`P(v) = \omega_v e^{\varepsilon 1[v \ge \nu]}/D`,
:math:`D = \sum_\tau \omega_\tau e^{\varepsilon 1[\tau\ge\nu]}`, then J uniformly
among the :math:`\omega_v` sets with that overlap (v indices from S, h − v from
the rest).

Privacy. D depends only on (d, K, h, ν, ε), never on the data, so for any two
updates (top-k sets S, S') :math:`P(J|S)/P(J|S') = e^{\varepsilon(u_S(J) - u_{S'}(J))}
\le e^\varepsilon`: the selection is ε-LDP (any two inputs are neighbours). The
privacy loss takes the values −ε, 0 and ε, so it is 2ε-bounded-range, **not**
ε-bounded-range: it is accounted as ``PureDpEvent(ε)``, not as an
``ExponentialMechanismDpEvent``.

Threshold ν (``calcOptThr``) and output dimension h (``findOptOutputDim``) follow
MindSpore's code (spec §1.5–1.6): ν maximises :math:`E_t[v]` over t = 1..h,
taking the first local maximum; h is the largest value whose
:math:`E_\nu[v]/h \ge` ``sign_thr_ratio`` (at least 1). MindSpore evaluates them in
double arithmetic, where :math:`e^\varepsilon\omega_\tau` overflows at large ε and
its search for h stops on a NaN by accident; here everything is in log space
(``gammaln``, ``logaddexp``), exact for every ε in the domain, and h is capped by
``max_dim_out`` (100 by default: what MindSpore's server accepts).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import gammaln

from ..privacy.validation import check_int, check_probability

MAX_DIM_OUT = 100


def topk_size(d: int, sign_k: float) -> int:
    """K = ⌊sign_k · d⌋ (MindSpore: float product, then truncation)."""
    return int(sign_k * d)


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    """log C(n, k) elementwise; −inf where k < 0 or k > n."""
    k = np.asarray(k, dtype=np.float64)
    out = np.full(k.shape, -np.inf)
    ok = (k >= 0) & (k <= n)
    kk = k[ok]
    out[ok] = gammaln(n + 1) - (gammaln(kk + 1) + gammaln(n - kk + 1))
    return out


def log_omega(d: int, k_top: int, h: int) -> np.ndarray:
    """log ω_τ for τ = 0..h."""
    tau = np.arange(h + 1)
    return _log_comb(k_top, tau) + _log_comb(d - k_top, h - tau)


def _logcumsumexp(x: np.ndarray) -> np.ndarray:
    return np.logaddexp.accumulate(x)


def expected_overlaps(log_w: np.ndarray, epsilon: float) -> np.ndarray:
    """E_t[v] for every threshold t = 1..h (index t−1), computed with cumulative log-sums."""
    h = len(log_w) - 1
    v = np.arange(h + 1)
    with np.errstate(divide="ignore"):
        log_vw = np.where(v > 0, np.log(np.maximum(v, 1)) + log_w, -np.inf)
    lo_w = np.concatenate([[-np.inf], _logcumsumexp(log_w)[:-1]])  # Σ_{τ<t} ω
    hi_w = _logcumsumexp(log_w[::-1])[::-1]  # Σ_{τ≥t} ω
    lo_vw = np.concatenate([[-np.inf], _logcumsumexp(log_vw)[:-1]])
    hi_vw = _logcumsumexp(log_vw[::-1])[::-1]
    t = np.arange(1, h + 1)
    num = np.logaddexp(lo_vw[t], epsilon + hi_vw[t])
    den = np.logaddexp(lo_w[t], epsilon + hi_w[t])
    return np.exp(num - den)


def optimal_threshold(d: int, k_top: int, h: int, epsilon: float) -> tuple[int, float]:
    r"""(ν, E_ν[v]): the first local maximum of E_t[v] over t = 1..h (MindSpore ``calcOptThr``).

    Moving the term v = t out of the boosted set raises the mean iff t < E_t, so
    :math:`E_{t+1} > E_t \iff t < E_t`: E_t is unimodal and its first local maximum
    is ν = min{t : t ≥ E_t} (h if none). Testing t ≥ E_t instead of comparing
    E_{t+1} with E_t avoids the rounding noise of increments as small as e^−ε
    (which stop a float comparison at t = 1 for large ε).
    """
    e = expected_overlaps(log_omega(d, k_top, h), epsilon)
    t = np.arange(1, h + 1)
    reached = np.nonzero(t >= e)[0]
    best = int(reached[0]) if len(reached) else h - 1
    return best + 1, float(e[best])


@lru_cache(maxsize=256)
def optimal_output_dim(
    d: int, sign_k: float, sign_eps: float, sign_thr_ratio: float, max_dim_out: int = MAX_DIM_OUT
) -> int:
    """h when ``sign_dim_out = 0``: the largest h with E_ν[v]/h ≥ ``sign_thr_ratio`` (≥ 1, ≤ ``max_dim_out``)."""
    d = check_int("d", d, minimum=1)
    check_probability("sign_thr_ratio", sign_thr_ratio)
    max_dim_out = check_int("max_dim_out", max_dim_out, minimum=1)
    k_top = topk_size(d, sign_k)
    h = 1
    while h <= max_dim_out and h <= d:
        _, expected = optimal_threshold(d, k_top, h, sign_eps)
        if not expected / h >= sign_thr_ratio:
            break
        h += 1
    return max(1, min(h - 1, max_dim_out))


def overlap_log_probabilities(d: int, k_top: int, h: int, nu: int, epsilon: float) -> np.ndarray:
    """log P(v) for v = 0..h: ω_v e^{ε·1[v ≥ ν]} / D."""
    log_w = log_omega(d, k_top, h)
    boosted = log_w + np.where(np.arange(h + 1) >= nu, epsilon, 0.0)
    return boosted - np.logaddexp.reduce(boosted)


def sample_overlap(log_p: np.ndarray, rng: np.random.Generator) -> int:
    """One v from log-probabilities (inverse CDF on exact probabilities; v ≤ h by construction)."""
    p = np.exp(log_p - log_p.max())
    return int(rng.choice(len(p), p=p / p.sum()))


__all__ = [
    "MAX_DIM_OUT",
    "expected_overlaps",
    "log_omega",
    "optimal_output_dim",
    "optimal_threshold",
    "overlap_log_probabilities",
    "sample_overlap",
    "topk_size",
]
