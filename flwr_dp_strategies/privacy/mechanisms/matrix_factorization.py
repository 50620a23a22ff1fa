r"""DP-FTRL by matrix factorisation: banded strategy matrices, their min-separation sensitivity, the
correlated noise stream and what it costs (no Flower here).

The mechanism (Denisov et al. 2022; Choquette-Choo et al., ICML 2023 "Multi-epoch matrix
factorization" and NeurIPS 2023 "Amplified banded matrix factorization"; Kalinin & Lampert 2024
"Banded square root matrix factorization"). Let :math:`x_t \in \mathbb R^d` be the sum of the clipped
updates of round t (each of L2 norm at most :math:`C_{clip}`) and :math:`A` the :math:`T \times T`
lower-triangular all-ones matrix (prefix sums). For a factorisation :math:`A = BC` with :math:`C`
lower-triangular and invertible, the server releases

.. math:: \hat x_t = x_t + \sigma\,(C^{-1}Z)_t, \qquad Z \in \mathbb R^{T\times d},\ Z_{ij} \sim \mathcal N(0, 1),
          \ \sigma = z\,C_{clip},

so the model, which follows the prefix sums :math:`\sum_{s \le t} \hat x_s = (A x + \sigma B Z)_t`, is a
post-processing of :math:`Y = Cx + \sigma Z`. Because :math:`C` is lower-triangular, row t of
:math:`Y` depends on :math:`x_1..x_t` only, and the adaptive stream (each :math:`x_t` computed from the
model released before it) has the privacy of the non-adaptive Gaussian mechanism :math:`x \mapsto Cx + \sigma Z`
(Denisov et al. 2022, Theorem 2.1).

Sensitivity. Neighbouring federations differ by one client's whole data (``add_or_remove_one``,
user-level DP). The client contributes :math:`g_i` (:math:`\lVert g_i\rVert \le C_{clip}`) to the rounds
:math:`i \in \pi` it takes part in, so :math:`Y` moves by :math:`C G` with :math:`G` the matrix whose rows
:math:`i \in \pi` are :math:`g_i` and

.. math:: \lVert CG\rVert_F^2 = \sum_{i,j \in \pi} (C^\top C)_{ij}\,\langle g_i, g_j\rangle .

The participation rule (:mod:`.participation`) guarantees *b-min-separation* (two rounds of one client
are at least b apart) and at most k rounds. For a C with ``b`` bands (:math:`C_{ts} = 0` for
:math:`t - s \ge b`), columns i and j share no row when :math:`|i - j| \ge b`, so for every allowed
:math:`\pi` the cross terms vanish and

.. math:: \mathrm{sens}^2 = C_{clip}^2 \max_\pi \sum_{i \in \pi} \lVert C_{:,i}\rVert^2 .

For a banded *Toeplitz* C with coefficients :math:`c_0..c_{b-1}` restricted to its first t rows, column i
has energy :math:`P(\min(b, t-i+1))`, :math:`P(r) = \sum_{l<r} c_l^2`; any window of b-1 consecutive
rounds holds at most one participation, so at most one allowed participation has a partial column and

.. math:: \mathrm{sens}_t^2 / C_{clip}^2 = \min(k, n)\,\lVert c\rVert^2 + [k > n]\,P(r),
          \qquad t = nb + r,\ 0 \le r < b

(:func:`prefix_sensitivities`; attained by :math:`\pi = \{r, r+b, \dots\}` shifted to start at 1). Hence
:math:`\mathrm{sens}_T = \sqrt k\,\lVert c\rVert\,C_{clip}` once :math:`T \ge kb`: :math:`\sqrt k` times the
largest column norm. :func:`brute_force_sensitivity` is the maximum over every pattern, the tests' oracle;
:func:`min_sep_sensitivity` handles any banded C exactly (dynamic programme over column norms).

Booking (:func:`round_event`). After t rounds the release is *one* Gaussian mechanism of noise
multiplier :math:`z / (\mathrm{sens}_t / C_{clip})`. Round t books the increment
``GaussianDpEvent(z / sqrt(sens_t² − sens_{t−1}²))`` (in :math:`C_{clip}` units; nothing when the increment is
0): Gaussians compose exactly (:math:`\sum_i \sigma_i^{-2} = \mathrm{sens}_t^2/z^2`, exact in RDP, up to
discretisation in PLD), so the ledger's ε after round t is that of ``GaussianDpEvent(z / sens_t)``: exact for
every prefix, never an under-count. For a banded Toeplitz C the increment of round t is :math:`c_p^2` with
:math:`p = (t-1) \bmod b` while :math:`\lfloor (t-1)/b \rfloor < k`, then 0: b distinct events at most.

What the accounting assumes (un-amplified): every client's rounds are b-min-separated and at most k
(enforced by :class:`~.participation.CyclicParticipation` and the strategy's screening, not assumed), the
server's noise Z is secret (generated from a secret key drawn from OS entropy: computationally
indistinguishable from fresh Gaussian noise, see :func:`keyed_standard_normal`), and nothing is amplified: the cohort of each round may be
public. It does *not* assume Poisson sampling.

Amplified (:func:`amplified_round_event`): cyclic Poisson sampling within bands (Choquette-Choo et al.,
NeurIPS 2023, "Amplified banded matrix factorization", Theorem 4). The clients are split into b fixed groups;
release t draws each member of group (t − 1) mod b independently with probability q (from OS entropy), and
the cohort is secret (never published; the server's log is not the adversary's view). A client then has at
most one *slot* per epoch of b releases, its slots' columns of C share no row, and the run is dominated by
the composition of ⌈T/b⌉ Poisson-sampled Gaussians ``PoissonSampledDpEvent(q, GaussianDpEvent(z / max_col))``
with max_col the largest column norm of C (1 here), composed by dp-accounting (RDP and PLD). The ledger books
one such event at the first release of each epoch (t ≡ 1 mod b): before any client of that epoch has taken
part, so the ε of a run stopped inside an epoch is an over-count, never an under-count. Assumed in addition to
the un-amplified case: the groups are fixed before the run and independent of the data, q is fixed, each
member of the group is included independently with probability exactly q, and every column of C has norm at
most max_col (the cap k is not used by this bound).

Strategy matrices: :func:`banded_sqrt_coefficients` (the Toeplitz coefficients of :math:`(1-x)^{-1/2}`,
:math:`r_j = \binom{2j}{j}4^{-j}`, truncated to b bands: Kalinin & Lampert's banded square root),
:func:`optimal_banded_coefficients` (b Toeplitz coefficients minimising the prefix-sum error for T rounds,
a small L-BFGS run, cached) and :func:`binary_tree_factorization` (the tree aggregation baseline with
Honaker's least-squares decoder). Coefficients are normalised to :math:`\lVert c\rVert = 1`, so a band
matrix's largest column norm is 1 and :math:`\mathrm{sens}_T = \sqrt k\,C_{clip}`, as for DP-FedAvg over k
rounds: the noise multiplier z means the same in both.

Noise stream (:class:`BandedNoise`): row t of :math:`C^{-1}Z` is :math:`w_t = (z_t - \sum_{l=1}^{b-1} c_l
w_{t-l}) / c_0` (forward substitution in the banded system), so the server keeps the last b−1 output rows in
memory: O(b·d), float64. :math:`z_t` = :func:`keyed_standard_normal` (key, t), a pure function of a secret
256-bit key (:func:`noise_key`: OS entropy) and t, so the persistent state is the key and the number of
releases, O(1): :func:`save_noise_key` writes the key once to its own file (mode 0600, atomic), whose SHA-256
the caller keeps in the signed ledger file, and :meth:`BandedNoise.fast_forward` rebuilds the rows after a
restart. The key is secret: whoever reads it can subtract all the noise.

Two non-banded factorisations, streamed with O(log T) and O(n) rows of memory.

Binary tree (``"tree"``; Dwork et al. 2010, Chan et al. 2011, DP-FTRL of Kairouz et al. 2021), the *plain*
streaming tree, not Honaker's decoder (which reads nodes completed later). Its nodes are the dyadic intervals
:math:`[j2^h, (j+1)2^h)` of rounds that lie inside ``[0, T)``; C (:func:`tree_factorization`) has one row per node
(the sum of its interval's rounds), each node gets :math:`\sigma Z_{node}`, and the prefix sum after t rounds is
estimated from the nodes of the binary decomposition of t (B: :math:`B_{t,node} = 1` for them), so A = BC and the
prefix noise is :math:`N_t = \sum_{node \in dec(t)} Z_{node}` (popcount(t) nodes). Release t adds
:math:`w_t = N_t - N_{t-1}`: with r the number of trailing zero bits of t, :math:`w_t = Z_{(r, t)} - \sum_{h<r}
Z_{(h, \lfloor (t-1)/2^h\rfloor 2^h)}` (node named (level, 1-based end)), a pure function of the key and t:
no state at all (:class:`TreeNoise`), covariance :math:`A^{-1}BB^\top A^{-\top}`.

BLT (``"blt"``; Dvijotham, McKenna, Choquette-Choo, Kairouz et al. 2024, "Efficient and near-optimal noise
generation for streaming differential privacy"): the lower-triangular Toeplitz C with :math:`c_0 = 1`,
:math:`c_i = \sum_{j=1}^n \lambda_j \theta_j^{i-1}` (i ≥ 1), i.e. :math:`C(x) = 1 + \sum_j \lambda_j x/(1-\theta_j x)`.
Row t of :math:`C^{-1}Z` solves :math:`\sum_i c_i w_{t-i} = z_t`: with buffers :math:`S_{j,t} = \sum_{i\ge1}
\theta_j^{i-1} w_{t-i}`, :math:`w_t = z_t - \sum_j \lambda_j S_{j,t}` and :math:`S_{j,t+1} = \theta_j S_{j,t} + w_t`
(:class:`BltNoise`: n·d floats). Here :math:`\lambda_j > 0`, :math:`0 < \theta_j < 1` and :math:`\sum_j\lambda_j
\le 1`, so :math:`1 = c_0 \ge c_1 \ge c_2 \ge \dots > 0`: C ≥ 0 with non-increasing coefficients.

Sensitivity of a Toeplitz C ≥ 0 with non-increasing coefficients under b-min-separation and at most k
participations (:func:`toeplitz_prefix_sensitivities`). Restricted to its first t rows C is the t×t Toeplitz matrix
of the same coefficients, so it suffices to show that among the patterns of t rounds the earliest tight one,
:math:`\pi^* = \{0, b, 2b, \dots\}` (its first min(k, ⌈t/b⌉) rounds, 0-based), is the worst. The Gram matrix is ≥ 0,
so (Cauchy–Schwarz) :math:`\max_{\lVert g_i\rVert\le1} \lVert CG\rVert_F^2 = \lVert v_\pi\rVert^2` with
:math:`v_\pi = \sum_{i\in\pi} C_{:,i}`, :math:`v_\pi[r] = \sum_{i\in\pi} c_{r-i}` (c of a negative index is 0). (1)
Moving the whole pattern one round earlier never decreases :math:`\lVert v_\pi\rVert`: the entries are shifted up,
one more (non-negative) entry enters at the bottom, none leaves at the top (rows before min π are 0). (2) Closing a
gap wider than b, i.e. moving the participations after the gap one round earlier, never decreases it: with u the part
of v of the participations before the gap and w that of the ones after, :math:`\lVert u + w'\rVert^2 = \lVert
u\rVert^2 + \lVert w'\rVert^2 + 2\langle u, w'\rangle`, :math:`\lVert w'\rVert \ge \lVert w\rVert` by (1), and
:math:`\langle u, w'\rangle = \sum_r u[r-1] w[r] \ge \sum_r u[r] w[r]` because w ≥ 0 is zero before the first
participation p after the gap and u is non-increasing from the last participation before it (p − 1 ≥ that one: each
term :math:`c_{r-i}` is non-increasing in r once r ≥ i). (3) Adding a participation adds a non-negative vector.
Repeating (1)–(3) turns any allowed pattern into :math:`\pi^*` without decreasing the norm, so
:math:`\mathrm{sens}_t^2 = \sum_{r<t} v_{\pi^*}[r]^2` exactly (the tests check it against
:func:`brute_force_sensitivity`), and the increment of release t is :math:`v_{\pi^*}[t-1]^2`.

Sensitivity of the tree (:func:`tree_prefix_sensitivities`), an upper bound computed from the rule, valid for
every b-min-separated pattern with at most k participations (the cyclic groups are one such rule). The first t
releases reveal the nodes completed by round t: at level h the :math:`N_h = \lfloor t/2^h\rfloor` nodes covering
the first :math:`L_h = N_h 2^h` rounds. C ≥ 0 is 0/1 with :math:`(C^\top C)_{ij}` = the number of nodes holding i
and j, so by Cauchy–Schwarz :math:`\mathrm{sens}_t^2 = \max_\pi \sum_{node} n_{node}^2`, :math:`n_{node} = |\pi \cap
node|`. At level h each node holds at most :math:`m_h = \min(k, \lceil 2^h/b\rceil)` rounds of a pattern
(b-separated rounds in 2^h consecutive ones) and all of them together at most :math:`p_h = \min(k, \lceil
L_h/b\rceil)`; a sum of squares of :math:`N_h` integers in [0, m_h] with total ≤ p_h is largest when they are
filled greedily, :math:`q m_h^2 + r^2` (q = min(N_h, ⌊p_h/m_h⌋) full nodes, r = the rest, ≤ m_h, in one more
node if there is one). Summing over the levels bounds :math:`\mathrm{sens}_t^2`; the bound is non-decreasing in
t and exact for k = 1 and for b = 1 with k ≥ t; the tests compare it with the brute force.

Booking is as for the banded matrices: release t books ``GaussianDpEvent(z / sqrt(sens_t² − sens_{t−1}²))``
(:func:`increment_event`), the composition of the first t is exactly one Gaussian of multiplier z / sens_t.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import os
import secrets
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent

from ..accounting import bandmf_amplification as _window_allocation  # noqa: F401  (registers its event)
from ..rng import RngLike, resolve_rng
from ..validation import check_int, check_positive, check_probability

BANDED_FACTORIZATIONS = ("banded-sqrt", "banded-optimal")
FACTORIZATIONS = BANDED_FACTORIZATIONS + ("tree", "blt")
"""The strategy matrices :class:`~flwr_dp_strategies.AccountedBandedMatrixFactorization` streams: the banded
Toeplitz ones, the plain binary tree (:class:`TreeNoise`) and BLT (:class:`BltNoise`)."""


# ---------------------------------------------------------------------- strategy matrices
def _check_coefficients(coefficients: object) -> np.ndarray:
    c = np.asarray(coefficients, dtype=np.float64)
    if c.ndim != 1 or c.size < 1 or not np.all(np.isfinite(c)) or not c[0] > 0:
        raise ValueError(
            "coefficients must be a non-empty 1-D array of finite numbers with coefficients[0] in (0, inf), "
            f"got {coefficients!r}"
        )
    return c


def banded_sqrt_coefficients(num_bands: int) -> np.ndarray:
    r"""The first ``num_bands`` Toeplitz coefficients of :math:`A^{1/2}`, i.e. of :math:`(1-x)^{-1/2} =
    \sum_j \binom{2j}{j} 4^{-j} x^j` (:math:`r_0 = 1`, :math:`r_j = r_{j-1}(2j-1)/(2j)`), normalised to unit
    L2 norm. With ``num_bands`` ≥ T this is the exact square root, :math:`C^2 = A` up to the scale."""
    b = check_int("num_bands", num_bands, minimum=1)
    r = np.empty(b)
    r[0] = 1.0
    for j in range(1, b):
        r[j] = r[j - 1] * (2 * j - 1) / (2 * j)
    return r / np.linalg.norm(r)


def inverse_coefficients(coefficients: Sequence[float], length: int) -> np.ndarray:
    """The first ``length`` coefficients of the power series :math:`1/c(x)`: the first column of
    :math:`C^{-1}` for the lower-triangular Toeplitz C of ``coefficients``."""
    c = _check_coefficients(coefficients)
    n = check_int("length", length, minimum=1)
    v = np.zeros(n)
    v[0] = 1.0 / c[0]
    for t in range(1, n):
        m = min(t, c.size - 1)
        v[t] = -float(np.dot(c[1 : m + 1], v[t - 1 :: -1][:m])) / c[0]
    return v


def toeplitz_matrix(coefficients: Sequence[float], num_rounds: int) -> np.ndarray:
    """The T×T lower-triangular Toeplitz matrix with ``coefficients`` on its first diagonals."""
    c = _check_coefficients(coefficients)
    t = check_int("num_rounds", num_rounds, minimum=1)
    out = np.zeros((t, t))
    for lag, value in enumerate(c[:t]):
        out += np.diag(np.full(t - lag, value), -lag)
    return out


def prefix_sum_matrix(num_rounds: int) -> np.ndarray:
    """A: the T×T lower-triangular all-ones matrix (the workload of prefix sums)."""
    return np.tril(np.ones((check_int("num_rounds", num_rounds, minimum=1),) * 2))


def toeplitz_prefix_error(coefficients: Sequence[float], num_rounds: int) -> float:
    r""":math:`\lVert c\rVert \cdot \lVert A C^{-1}\rVert_F / \sqrt T`: the RMS over rounds of the prefix-sum noise's
    standard deviation per coordinate, for noise multiplier 1 on a run whose sensitivity is :math:`\lVert c\rVert`
    per participation. :math:`AC^{-1}` is Toeplitz with the partial sums s of :func:`inverse_coefficients`, so
    :math:`\lVert AC^{-1}\rVert_F^2 = \sum_j (T-j) s_j^2`, O(T·b)."""
    t = check_int("num_rounds", num_rounds, minimum=1)
    c = _check_coefficients(coefficients)
    s = np.cumsum(inverse_coefficients(c, t))
    return float(np.linalg.norm(c) * math.sqrt(np.dot(np.arange(t, 0, -1), s * s) / t))


@functools.lru_cache(maxsize=64)
def _optimal(num_rounds: int, num_bands: int) -> tuple[float, ...]:
    from scipy.optimize import minimize

    start = banded_sqrt_coefficients(num_bands)
    if num_bands == 1:
        return tuple(start)

    def objective(tail: np.ndarray) -> float:
        return toeplitz_prefix_error(np.concatenate(([1.0], tail)), num_rounds)

    result = minimize(objective, start[1:] / start[0], method="L-BFGS-B", options={"maxiter": 500})
    best = np.concatenate(([1.0], result.x)) if result.fun < objective(start[1:] / start[0]) else start
    return tuple(best / np.linalg.norm(best))


def optimal_banded_coefficients(num_rounds: int, num_bands: int) -> np.ndarray:
    """``num_bands`` Toeplitz coefficients (unit norm, :math:`c_0 > 0`) minimising the RMS prefix-sum error
    (:func:`toeplitz_prefix_error`) of a run of ``num_rounds`` rounds under b-min-separation, starting from
    the banded square root (never worse than it); computed once per (T, b) and cached. Raises ValueError
    naming the parameter for T < 1 or b < 1."""
    t = check_int("num_rounds", num_rounds, minimum=1)
    b = check_int("num_bands", num_bands, minimum=1)
    return np.array(_optimal(t, b))


def strategy_coefficients(factorization: str, num_bands: int, num_rounds: Optional[int] = None) -> np.ndarray:
    """The coefficients of ``factorization`` (``"banded-sqrt"`` or ``"banded-optimal"``, which needs T)."""
    if factorization == "banded-sqrt":
        return banded_sqrt_coefficients(num_bands)
    if factorization == "banded-optimal":
        if num_rounds is None:
            raise ValueError("num_rounds must be an integer in [1, inf) for factorization='banded-optimal'")
        return optimal_banded_coefficients(num_rounds, num_bands)
    raise ValueError(
        f"factorization must be one of {BANDED_FACTORIZATIONS} for banded coefficients, got {factorization!r}"
    )


def binary_tree_factorization(num_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Tree aggregation (Dwork et al. 2010; DP-FTRL of Kairouz et al. 2021) as a factorisation A = B C:
    C has one row per node of the dyadic tree over the T leaves (the sum of its interval's leaves), B is
    Honaker's least-squares decoder :math:`A C^+` (the smallest-variance linear estimate of the prefix sums
    from the noisy nodes; it reads later nodes, so it is a benchmark baseline, not a streaming mechanism)."""
    t = check_int("num_rounds", num_rounds, minimum=1)
    height = max(0, math.ceil(math.log2(t)))
    rows = []
    for level in range(height + 1):
        width = 2**level
        for start in range(0, t, width):
            row = np.zeros(t)
            row[start : start + width] = 1.0
            rows.append(row)
    c = np.array(rows)
    return prefix_sum_matrix(t) @ np.linalg.pinv(c), c


# ---------------------------------------------------------------------- sensitivity
def _check_participation(min_separation: object, max_participations: object) -> tuple[int, int]:
    return (
        check_int("min_separation", min_separation, minimum=1),
        check_int("max_participations", max_participations, minimum=1),
    )


def bandwidth(matrix: np.ndarray) -> int:
    """The number of bands of a lower-triangular matrix: 1 + the largest t − s with a non-zero entry."""
    rows, cols = np.nonzero(np.asarray(matrix))
    return int(np.max(rows - cols)) + 1 if rows.size else 1


def participation_patterns(num_rounds: int, min_separation: int, max_participations: int):
    """Every non-empty set of rounds (0-based, sorted) with gaps ≥ ``min_separation`` and at most
    ``max_participations`` elements."""

    def extend(start: int, chosen: tuple[int, ...]):
        if chosen:
            yield chosen
        if len(chosen) == max_participations:
            return
        for i in range(start, num_rounds):
            yield from extend(i + min_separation, chosen + (i,))

    yield from extend(0, ())


def brute_force_sensitivity(matrix: np.ndarray, min_separation: int, max_participations: int) -> float:
    r"""The min-separation sensitivity of ``matrix`` (unit clip) by enumerating every allowed pattern π:
    :math:`\max_\pi \max_{\lVert g_i\rVert \le 1} \lVert CG\rVert_F = \max_\pi \sqrt{\sum_{i,j\in\pi} |(C^\top C)_{ij}|}`
    when :math:`C^\top C \ge 0` entrywise or the pattern's cross terms vanish (all g_i equal attains it); in
    general the right side is an upper bound. Exponential in T: the tests' oracle on small T."""
    b, k = _check_participation(min_separation, max_participations)
    gram = np.abs(np.asarray(matrix, dtype=np.float64).T @ np.asarray(matrix, dtype=np.float64))
    best = max(gram[np.ix_(p, p)].sum() for p in participation_patterns(gram.shape[0], b, k))
    return float(math.sqrt(best))


def min_sep_sensitivity(matrix: np.ndarray, min_separation: int, max_participations: int) -> float:
    r"""The min-separation sensitivity (unit clip) of a matrix with at most ``min_separation`` bands: the
    allowed patterns' columns share no row, so it is :math:`\sqrt{\max_\pi \sum_{i\in\pi} \lVert C_{:,i}\rVert^2}`,
    found by a dynamic programme over (round, participations) in O(T·k). Raises ValueError (naming
    ``matrix``) when the matrix has more bands than the separation (use :func:`brute_force_sensitivity`)."""
    b, k = _check_participation(min_separation, max_participations)
    c = np.asarray(matrix, dtype=np.float64)
    if bandwidth(c) > b:
        raise ValueError(
            f"matrix must have at most min_separation={b} bands for the column-norm sensitivity, it has {bandwidth(c)}"
        )
    energy = np.sum(c * c, axis=0)
    t = energy.size
    # best[i][j]: the largest energy of a pattern within rounds 0..i-1 with at most j participations
    best = np.zeros((t + 1, k + 1))
    for i in range(1, t + 1):
        take = best[max(0, i - b), :-1] + energy[i - 1]
        best[i, 1:] = np.maximum(best[i - 1, 1:], take)
    return float(math.sqrt(best[t, k]))


def prefix_sensitivities(
    coefficients: Sequence[float], num_rounds: int, min_separation: int, max_participations: int
) -> np.ndarray:
    r""":math:`\mathrm{sens}_t` for t = 1..T (unit clip) of the banded Toeplitz C of ``coefficients``
    restricted to its first t rows, by the closed form of the module docstring,
    :math:`\min(k,n)\lVert c\rVert^2 + [k>n] P(r)`, t = nb + r. Needs ``min_separation`` ≥ the number of bands."""
    c = _check_coefficients(coefficients)
    b, k = _check_participation(min_separation, max_participations)
    if c.size > b:
        raise ValueError(f"coefficients must have at most min_separation={b} bands, got {c.size}")
    increments = np.array(
        [round_increment(c, t, b, k) for t in range(1, check_int("num_rounds", num_rounds, minimum=1) + 1)]
    )
    return np.sqrt(np.cumsum(increments))


def round_increment(
    coefficients: np.ndarray, release_index: int, min_separation: int, max_participations: int
) -> float:
    r""":math:`\mathrm{sens}_t^2 - \mathrm{sens}_{t-1}^2` (unit clip) for the release t = ``release_index`` (1-based):
    :math:`c_p^2` with p = (t−1) mod b while ⌊(t−1)/b⌋ < k, else 0 (coefficients past the bands are 0)."""
    t = check_int("release_index", release_index, minimum=1)
    epoch, position = divmod(t - 1, min_separation)
    if epoch >= max_participations or position >= len(coefficients):
        return 0.0
    return float(coefficients[position]) ** 2


def round_event(
    coefficients: np.ndarray,
    release_index: int,
    noise_multiplier: float,
    min_separation: int,
    max_participations: int,
) -> Optional[GaussianDpEvent]:
    """What release t adds to the run's privacy loss: ``GaussianDpEvent(z / sqrt(increment))`` (None when the
    increment is 0); composed over t = 1..T they are exactly ``GaussianDpEvent(z / sens_T)``."""
    z = check_positive("noise_multiplier", noise_multiplier)
    inc = round_increment(coefficients, release_index, min_separation, max_participations)
    return None if inc <= 0.0 else GaussianDpEvent(z / math.sqrt(inc))


def amplified_round_event(
    release_index: int, noise_multiplier: float, num_bands: int, sampling_rate: float, max_column_norm: float = 1.0
) -> Optional[PoissonSampledDpEvent]:
    """Cyclic Poisson sampling within bands (module docstring): ``PoissonSampledDpEvent(q, GaussianDpEvent(z /
    max_col))`` at the first release of each epoch of b releases (t ≡ 1 mod b), None otherwise."""
    t = check_int("release_index", release_index, minimum=1)
    z = check_positive("noise_multiplier", noise_multiplier)
    b = check_int("num_bands", num_bands, minimum=1)
    q = check_probability("sampling_rate", sampling_rate, low_open=True)
    norm = check_positive("max_column_norm", max_column_norm)
    return PoissonSampledDpEvent(q, GaussianDpEvent(z / norm)) if (t - 1) % b == 0 else None


def run_event(
    coefficients: Sequence[float],
    num_rounds: int,
    noise_multiplier: float,
    min_separation: int,
    max_participations: int,
) -> GaussianDpEvent:
    """The whole run of ``num_rounds`` releases as one ``GaussianDpEvent(z / sens_T)`` (unit clip)."""
    z = check_positive("noise_multiplier", noise_multiplier)
    sens = prefix_sensitivities(coefficients, num_rounds, min_separation, max_participations)[-1]
    return GaussianDpEvent(z / sens)


# ---------------------------------------------------------------------- the noise stream
KEY_BYTES = 32
"""The noise key: 256 bits."""

BLOCK = 1 << 16
"""Normals per keyed block: block j of release t is keystream (nonce t, j), and the recurrence runs block by block
(every buffer of a block stays in cache)."""

_KEY_MAGIC = b"flwr-dp-strategies bandmf noise key v1\n"
_SEED_DOMAIN = b"flwr-dp-strategies bandmf test key from seed\x00"
_CHECK_DOMAIN = b"flwr-dp-strategies bandmf replay check\x00"


def noise_key(rng: RngLike = None) -> bytes:
    """A new secret noise key: 32 bytes of OS entropy (:func:`secrets.token_bytes`) for ``rng=None``, the only
    choice for a deployment. An ``int`` seed gives the key SHA-256(domain, seed) and a Generator its next 32 bytes:
    reproducible, public, **tests and benchmarks only** (whoever knows the seed knows all the noise)."""
    if rng is None:
        return secrets.token_bytes(KEY_BYTES)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        if rng < 0:
            raise ValueError(f"rng seed must be an integer in [0, inf), got {rng}")
        return hashlib.sha256(_SEED_DOMAIN + int(rng).to_bytes(32, "little")).digest()
    return resolve_rng(rng).bytes(KEY_BYTES)


def _check_key(key: object) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes (a noise_key()), got {type(key).__name__}")
    return bytes(key)


class _Normals:
    """Standard normals of (key, release, block) into caller buffers, with the scratch reused across blocks."""

    def __init__(self, key: bytes) -> None:
        self.key = _check_key(key)
        pairs = (BLOCK + 1) // 2
        self._zero = bytes(16 * pairs)
        self._stream = bytearray(16 * pairs)
        self._floats = np.empty((4, pairs))
        self._bits = np.empty(pairs, dtype=np.uint64)
        self._quadrant = np.empty(pairs, dtype=np.uint64)
        self._mask = np.empty(pairs, dtype=bool)

    def fill(self, release: int, block: int, out: np.ndarray) -> None:
        """``out`` (float64, at most BLOCK values) := the first ``out.size`` normals of block ``block`` of release
        ``release``: Box–Muller on the ChaCha20 keystream of key, nonce (release, block); the first ⌈n/2⌉ are the
        pairs' cosine parts, the rest their sine parts."""
        size = out.size
        pairs = (size + 1) // 2
        nonce = b"\x00\x00\x00\x00" + release.to_bytes(8, "little") + block.to_bytes(4, "little")
        encryptor = Cipher(algorithms.ChaCha20(self.key, nonce), mode=None).encryptor()
        encryptor.update_into(memoryview(self._zero)[: 16 * pairs], self._stream)
        words = np.frombuffer(self._stream, dtype=np.uint64, count=2 * pairs)
        bits, quadrant, mask = self._bits[:pairs], self._quadrant[:pairs], self._mask[:pairs]
        radius, angle, cos, sin = (scratch[:pairs] for scratch in self._floats)
        # radius sqrt(-2 ln u1), u1 = (k + 1)·2⁻⁵³ in (0, 1]: 53 uniform bits, exact in float64, log finite
        np.right_shift(words[:pairs], np.uint64(11), out=bits)
        np.add(bits, np.uint64(1), out=bits)
        np.multiply(bits, 2.0**-53, out=radius)
        np.log(radius, out=radius)
        np.multiply(radius, -2.0, out=radius)
        np.sqrt(radius, out=radius)  # <= sqrt(106 ln 2) ≈ 8.57
        # angle θ = q·π/2 + φ, uniform on the circle: the quadrant q from the top 2 bits of the second word, φ
        # uniform in [-π/4, π/4) from its next 53 bits (numpy's cos and sin are several times faster there than
        # on [0, 2π)); (cos θ, sin θ) is (cos φ, sin φ) turned by q quarter turns: swapped for odd q, x negated
        # for q in {1, 2}, y for q in {2, 3}
        np.left_shift(words[pairs:], np.uint64(2), out=bits)
        np.right_shift(bits, np.uint64(11), out=bits)
        np.multiply(bits, 0.5 * math.pi * 2.0**-53, out=angle)
        np.subtract(angle, 0.25 * math.pi, out=angle)
        np.cos(angle, out=cos)
        np.sin(angle, out=sin)
        np.right_shift(words[pairs:], np.uint64(62), out=quadrant)
        x, y = out[:pairs], out[pairs:]
        n_y = y.size
        np.bitwise_and(quadrant, np.uint64(1), out=bits)
        np.not_equal(bits, 0, out=mask)  # odd q
        np.copyto(x, cos)
        np.copyto(x, sin, where=mask)
        np.copyto(y, sin[:n_y])
        np.copyto(y, cos[:n_y], where=mask[:n_y])
        np.right_shift(quadrant, np.uint64(1), out=bits)
        np.bitwise_xor(quadrant, bits, out=bits)
        np.bitwise_and(bits, np.uint64(1), out=bits)
        np.not_equal(bits, 0, out=mask)  # q in {1, 2}
        np.negative(x, out=x, where=mask)
        np.greater_equal(quadrant, np.uint64(2), out=mask)  # q in {2, 3}
        np.negative(y, out=y, where=mask[:n_y])
        np.multiply(x, radius, out=x)
        np.multiply(y, radius[:n_y], out=y)


_BACKGROUND = ThreadPoolExecutor(1, thread_name_prefix="bandmf-noise")  # BandedNoise.prepare


def default_threads() -> int:
    """The threads :class:`BandedNoise` uses by default: the CPUs this process may run on, at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def keyed_standard_normal(key: bytes, release: int, size: int) -> np.ndarray:
    r"""Z_t: ``size`` i.i.d. standard normals (float64) of release t = ``release`` (≥ 1) under ``key``, a pure
    function of (key, t): block j (:data:`BLOCK` values) is Box–Muller on the ChaCha20 keystream of key with
    nonce (t, j) (the :mod:`cryptography` package), 53 uniform bits per uniform.

    Why this is sound: ChaCha20 is a pseudo-random function of the key; for a uniformly random secret key its
    keystream is computationally indistinguishable from uniform bytes by any efficient adversary who does not know
    the key (distinct nonces give independent-looking streams), and Box–Muller maps two independent uniforms to two
    independent standard normals (up to the 53-bit grid of the uniforms: tails beyond 8.57σ are cut). The released
    noise is therefore computationally indistinguishable from the i.i.d. Gaussian noise the accounting assumes, and
    the DP guarantee becomes a computational one with respect to the key, as with any CSPRNG (and exactly as good
    as its secrecy: the key must come from OS entropy and stay in its 0600 file)."""
    _check_key(key)
    t = check_int("release", release, minimum=1)
    n = check_int("size", size, minimum=0)
    out = np.empty(n)
    normals = _Normals(key)
    for block, start in enumerate(range(0, n, BLOCK)):
        normals.fill(t, block, out[start : start + BLOCK])
    return out


class BandedNoise:
    r"""Rows of :math:`C^{-1}Z` for the banded lower-triangular Toeplitz C of ``coefficients``, one per call of
    :meth:`next`, :math:`Z_t` = :func:`keyed_standard_normal` (key, t): the stream is a pure function of the key.

    Memory O(b·d), float64: a ring of the last b−1 output rows (the recurrence needs them, not the Z) plus a
    few blocks of scratch per thread (``threads``, default :func:`default_threads`: the blocks are independent
    coordinates, computed in parallel, each by the same code, so the bits do not depend on the threads).
    :meth:`prepare` makes the next row in the background (a server starts it when it sends the round's
    instructions). On disk only the key (:func:`save_noise_key`) and the number of releases; a restart rebuilds
    the ring with :meth:`fast_forward` (regenerates Z_1..Z_t and replays the recurrence, O(t·b·d) once), bit-exact
    on the same platform: every step is numpy float64 arithmetic in a fixed order (numpy's own loops, no BLAS),
    and :meth:`check_value` detects a replay on another numpy build or CPU that differs.

    ``dimension``: d, the number of coordinates (the model's). ``key``: 32 secret bytes (:func:`noise_key`).
    """

    def __init__(
        self, coefficients: Sequence[float], dimension: int, key: bytes, threads: Optional[int] = None
    ) -> None:
        self.coefficients = _check_coefficients(coefficients)
        self.dimension = check_int("dimension", dimension, minimum=1)
        self._key = _check_key(key)
        self.count = 0
        self._pending: Optional[Future] = None  # the next row, being made in the background (prepare)
        lags = self.coefficients.size - 1
        # w_s is kept in ring row (s - 1) % rows
        self._rows = max(lags, 1)
        self._ring = np.zeros((self._rows, self.dimension))
        blocks = -(-self.dimension // BLOCK)
        threads = default_threads() if threads is None else check_int("threads", threads, minimum=1)
        # per thread: its generator scratch and two blocks of scratch (blocks are independent coordinates)
        self._workers = [
            (_Normals(self._key), np.empty((2, min(BLOCK, self.dimension)))) for _ in range(min(threads, blocks))
        ]

    @property
    def key(self) -> bytes:
        return self._key

    @property
    def buffer(self) -> np.ndarray:
        """The last b−1 rows, newest first (a copy; zeros before the first releases)."""
        lags = self.coefficients.size - 1
        self.settle()
        order = [(self.count - 1 - l) % self._rows for l in range(lags)]
        return self._ring[order].copy() if lags else np.zeros((0, self.dimension))

    def next(self) -> np.ndarray:
        """:math:`w_t = (z_t - \\sum_{l=1}^{b-1} c_l w_{t-l}) / c_0` for t = count + 1 (the row :meth:`prepare`
        started, if any): a read-only view (float64, length d) valid until the next call of :meth:`next` or
        :meth:`prepare` (copy it to keep it)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending.result()
        t = self.count + 1
        return self._step(lambda normals, block, out: normals.fill(t, block, out))

    def prepare(self) -> None:
        """Start making the next row in a background thread (nothing if it is already started), so that
        :meth:`next` only collects it: a server calls this when it sends the round's instructions, and the
        row is made while the clients train. The row counts as made (``count``) once the thread has finished;
        every other method first waits for it (:meth:`settle`)."""
        if self._pending is None:
            t = self.count + 1
            self._pending = _BACKGROUND.submit(self._step, lambda normals, block, out: normals.fill(t, block, out))

    def settle(self) -> None:
        """Wait for a row :meth:`prepare` started (it then counts as made; its errors are raised here)."""
        if self._pending is not None:
            self._pending.result()

    def push(self, z: np.ndarray) -> np.ndarray:
        """The next row for a given :math:`z_t` (d values; the recurrence alone, for tests): as :meth:`next`."""
        self.settle()
        z = np.asarray(z, dtype=np.float64).reshape(-1)
        if z.size != self.dimension:
            raise ValueError(f"z must have dimension={self.dimension} entries, got {z.size}")
        return self._step(lambda normals, block, out: np.copyto(out, z[block * BLOCK : block * BLOCK + out.size]))

    def fast_forward(self, releases: int) -> None:
        """Advance to ``releases`` rows made (regenerating and replaying the rows in between): a restart."""
        self.settle()
        target = check_int("releases", releases, minimum=self.count)
        if self.coefficients.size == 1:  # no memory: nothing to replay
            self.count = target
            return
        while self.count < target:
            self.next()

    def _step(self, fill) -> np.ndarray:
        c = self.coefficients
        lags = c.size - 1
        weights = np.zeros(self._rows)  # c_l on the ring row of w_{t-l}; rows not yet written are 0 and add 0
        for lag in range(1, lags + 1):
            weights[(self.count - lag) % self._rows] = c[lag]
        target = self.count % self._rows  # the oldest row (lag b−1), overwritten last
        blocks = -(-self.dimension // BLOCK)
        stride = len(self._workers)

        def run(worker: int) -> None:
            normals, scratch = self._workers[worker]
            for block in range(worker, blocks, stride):
                start, stop = block * BLOCK, min(block * BLOCK + BLOCK, self.dimension)
                w, term = scratch[0, : stop - start], scratch[1, : stop - start]
                fill(normals, block, w)
                if lags:  # numpy's own loops (no BLAS): the same bits on a replay, whatever the threads
                    np.einsum("l,lj->j", weights, self._ring[:, start:stop], out=term)
                    np.subtract(w, term, out=w)
                np.divide(w, c[0], out=self._ring[target, start:stop])

        if stride == 1:
            run(0)
        else:  # numpy and OpenSSL release the GIL: the blocks are computed in parallel
            with ThreadPoolExecutor(stride) as pool:
                list(pool.map(run, range(stride)))
        self.count += 1
        out = self._ring[target].view()
        out.flags.writeable = False
        return out

    def check_value(self) -> str:
        """A keyed digest of the newest row's first block (HMAC-SHA-256 under a key derived from the noise key:
        it reveals nothing of the noise), kept in the signed ledger state so that a restart whose replay differs
        from the released stream (another numpy build or CPU) is refused instead of continued."""
        self.settle()
        if self.count == 0:
            return ""
        mac_key = hmac.new(self.key, _CHECK_DOMAIN, hashlib.sha256).digest()
        row = self._ring[(self.count - 1) % self._rows, :BLOCK]
        message = self.count.to_bytes(8, "little") + np.ascontiguousarray(row).tobytes()
        return hmac.new(mac_key, message, hashlib.sha256).hexdigest()


# ---------------------------------------------------------------------- tree and BLT (non-banded factorisations)
_TREE_DOMAIN = b"flwr-dp-strategies bandmf tree node key\x00"
MAX_BUFFERS = 8
"""The most BLT buffers :func:`optimal_blt_parameters` fits."""


def tree_factorization(num_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, C) of the plain streaming binary tree over T = ``num_rounds`` rounds (module docstring): C has one row per
    dyadic interval inside [0, T) (level by level, left to right), B one row per prefix (1 on the nodes of the
    binary decomposition of t), A = B C. The released noise :class:`TreeNoise` has covariance
    :math:`A^{-1}BB^\\top A^{-\\top}` per coordinate."""
    t = check_int("num_rounds", num_rounds, minimum=1)
    nodes = [(h, start) for h in range(t.bit_length()) for start in range(0, t - 2**h + 1, 2**h)]
    index = {node: i for i, node in enumerate(nodes)}
    c = np.zeros((len(nodes), t))
    for i, (h, start) in enumerate(nodes):
        c[i, start : start + 2**h] = 1.0
    b = np.zeros((t, len(nodes)))
    for prefix in range(1, t + 1):
        start = 0
        for h in reversed(range(prefix.bit_length())):
            if prefix >> h & 1:
                b[prefix - 1, index[(h, start)]] = 1.0
                start += 2**h
    return b, c


def tree_prefix_sensitivities(num_rounds: int, min_separation: int, max_participations: int) -> np.ndarray:
    """An upper bound on sens_t (unit clip), t = 1..T, of the plain tree's first t releases under b-min-separation
    and at most k participations (the bound of the module docstring; sound for every allowed pattern, non-decreasing)."""
    t_max = check_int("num_rounds", num_rounds, minimum=1)
    b, k = _check_participation(min_separation, max_participations)
    out = np.empty(t_max)
    for t in range(1, t_max + 1):
        total = 0
        for h in range(t.bit_length()):
            count = t >> h
            cap = min(k, -(-(2**h) // b))
            budget = min(k, -(-(count * 2**h) // b))
            full = min(count, budget // cap)
            rest = min(budget - full * cap, cap) if full < count else 0
            total += full * cap * cap + rest * rest
        out[t - 1] = math.sqrt(total)
    return np.maximum.accumulate(out)


def tree_prefix_error(num_rounds: int) -> float:
    """The RMS over t = 1..T of the tree's prefix-noise standard deviation per coordinate, noise multiplier 1:
    :math:`\\sqrt{\\mathrm{mean}_t\\,\\mathrm{popcount}(t)}`."""
    t = check_int("num_rounds", num_rounds, minimum=1)
    return math.sqrt(sum(bin(i).count("1") for i in range(1, t + 1)) / t)


def check_blt_parameters(lambdas: object, thetas: object) -> tuple[np.ndarray, np.ndarray]:
    """(λ, θ) as float64 arrays after checking what the accounting needs: the same length n ≥ 1, every θ_j in
    (0, 1), every λ_j > 0 and Σλ_j ≤ 1 (so 1 = c_0 ≥ c_1 ≥ ... > 0); ValueError naming ``lambdas``/``thetas``."""
    lam = np.asarray(lambdas, dtype=np.float64)
    theta = np.asarray(thetas, dtype=np.float64)
    if theta.ndim != 1 or theta.size < 1 or not np.all(np.isfinite(theta)) or not np.all((theta > 0) & (theta < 1)):
        raise ValueError(f"thetas must be a non-empty 1-D array of numbers in (0, 1), got {thetas!r}")
    if lam.shape != theta.shape or not np.all(np.isfinite(lam)) or not np.all(lam > 0) or not float(np.sum(lam)) <= 1.0:
        raise ValueError(
            f"lambdas must be {theta.size} numbers in (0, inf) with sum <= 1 (C >= 0, non-increasing), got {lambdas!r}"
        )
    return lam, theta


def blt_coefficients(lambdas: Sequence[float], thetas: Sequence[float], length: int) -> np.ndarray:
    """c_0..c_{length−1} of the BLT C: c_0 = 1, c_i = Σ_j λ_j θ_j^(i−1)."""
    lam, theta = check_blt_parameters(lambdas, thetas)
    n = check_int("length", length, minimum=1)
    c = np.ones(n)
    if n > 1:
        c[1:] = (lam[:, None] * theta[:, None] ** np.arange(n - 1)[None, :]).sum(axis=0)
    return c


def _blt_inverse(lam: np.ndarray, theta: np.ndarray, length: int) -> np.ndarray:
    """The first column of C⁻¹ for the BLT: the impulse response of Q(x)/P(x), Q = Π(1 − θ_j x), P = C(x)·Q(x)."""
    from scipy.signal import lfilter

    q = np.array([1.0])
    for th in theta:
        q = np.convolve(q, [1.0, -th])
    p = np.concatenate((q, [0.0]))
    for j, lj in enumerate(lam):
        others = np.array([1.0])
        for l, th in enumerate(theta):
            if l != j:
                others = np.convolve(others, [1.0, -th])
        p[1 : 1 + others.size] += lj * others
    impulse = np.zeros(length)
    impulse[0] = 1.0
    return lfilter(q, p, impulse)


def _earliest_pattern_column(coefficients: np.ndarray, min_separation: int, max_participations: int) -> np.ndarray:
    """v_{π*}[r] = Σ_{j<k, jb ≤ r} c_{r−jb}: the worst pattern's column sum (module docstring), r = 0..T−1."""
    t = coefficients.size
    v = np.zeros(t)
    for j in range(min(max_participations, -(-t // min_separation))):
        v[j * min_separation :] += coefficients[: t - j * min_separation]
    return v


def toeplitz_prefix_sensitivities(
    coefficients: Sequence[float], min_separation: int, max_participations: int
) -> np.ndarray:
    """sens_t (unit clip), t = 1..len(coefficients), of the lower-triangular Toeplitz C of ``coefficients``
    (c_0..c_{T−1}, not banded) restricted to its first t rows, under b-min-separation and at most k
    participations: exactly :math:`\\sqrt{\\sum_{r<t} v_{\\pi^*}[r]^2}` (the earliest tight pattern is the worst,
    proved in the module docstring). ValueError (naming ``coefficients``) unless they are ≥ 0 and non-increasing."""
    c = _check_coefficients(coefficients)
    b, k = _check_participation(min_separation, max_participations)
    if np.any(c < 0) or np.any(np.diff(c) > 0):
        raise ValueError("coefficients must be >= 0 and non-increasing for the earliest-pattern sensitivity")
    v = _earliest_pattern_column(c, b, k)
    return np.sqrt(np.cumsum(v * v))


def blt_prefix_error(lambdas: Sequence[float], thetas: Sequence[float], num_rounds: int) -> float:
    """The RMS over t of the BLT's prefix-noise standard deviation per coordinate, noise multiplier 1:
    :math:`\\lVert AC^{-1}\\rVert_F/\\sqrt T` (as :func:`toeplitz_prefix_error`, without its ‖c‖ factor)."""
    lam, theta = check_blt_parameters(lambdas, thetas)
    t = check_int("num_rounds", num_rounds, minimum=1)
    s = np.cumsum(_blt_inverse(lam, theta, t))
    return float(math.sqrt(np.dot(np.arange(t, 0, -1), s * s) / t))


@functools.lru_cache(maxsize=32)
def _optimal_blt(num_rounds: int, num_buffers: int, b: int, k: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    from scipy.optimize import minimize

    n, t = num_buffers, num_rounds

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        theta = 1.0 / (1.0 + np.exp(-x[:n]))
        weights = np.exp(x[n : 2 * n] - np.max(x[n : 2 * n]))
        lam = weights / weights.sum() * (1.0 - 1e-9) / (1.0 + math.exp(-x[2 * n]))
        return lam, np.clip(theta, 1e-9, 1 - 1e-9)

    def objective(x: np.ndarray) -> float:
        lam, theta = unpack(x)
        if not (np.all(lam > 0) and np.all((theta > 0) & (theta < 1)) and lam.sum() <= 1.0):
            return 1e30
        c = blt_coefficients(lam, theta, t)
        sens = math.sqrt(float(np.sum(_earliest_pattern_column(c, b, k) ** 2)))
        s = np.cumsum(_blt_inverse(lam, theta, t))
        value = sens * math.sqrt(float(np.dot(np.arange(t, 0, -1), s * s)) / t)
        return math.log(value) if np.isfinite(value) and value > 0 else 1e30

    # deterministic starts (public, no randomness): timescales spread geometrically over [2, T], [2, √T] and
    # [√T, T], with equal weights summing to 1/2 or 1/10
    def start(low: float, high: float, total: float) -> np.ndarray:
        theta0 = 1.0 - 1.0 / np.geomspace(low, max(high, low * 1.5), n)
        return np.concatenate((np.log(theta0 / (1 - theta0)), np.zeros(n), [math.log(total / (1 - total))]))

    root = max(2.0, math.sqrt(t))
    base = start(2.0, max(4.0, float(t)), 0.5)
    starts = [base, start(2.0, root, 0.5), start(root, max(4.0, float(t)), 0.5), start(2.0, max(4.0, float(t)), 0.1)]
    x, best = base, objective(base)
    for x0 in starts:
        result = minimize(objective, x0, method="L-BFGS-B", options={"maxiter": 500})
        if result.fun < best:
            x, best = result.x, result.fun
    lam, theta = unpack(x)
    order = np.argsort(theta)
    return tuple(float(v) for v in lam[order]), tuple(float(v) for v in theta[order])


def optimal_blt_parameters(
    num_rounds: int, num_buffers: int, min_separation: int, max_participations: int
) -> tuple[np.ndarray, np.ndarray]:
    """(λ, θ) of a BLT with n = ``num_buffers`` buffers minimising sens_T · RMS prefix-sum error for T =
    ``num_rounds`` under b-min-separation and at most k participations (the loss at a fixed ε: the noise multiplier
    scales with sens_T). A small L-BFGS run over θ = sigmoid, λ = sigmoid·softmax (so λ > 0, Σλ < 1, 0 < θ < 1:
    C ≥ 0, non-increasing, whatever the optimiser does), started from timescales spread geometrically over [2, T];
    computed once per (T, n, b, k) and cached. Deterministic (a fixed start, no randomness): the same arguments
    give the same parameters on the same platform, and a restart checks them in the signed state."""
    t = check_int("num_rounds", num_rounds, minimum=1)
    n = check_int("num_buffers", num_buffers, minimum=1)
    if n > MAX_BUFFERS:
        raise ValueError(f"num_buffers must be an integer in [1, {MAX_BUFFERS}], got {num_buffers!r}")
    b, k = _check_participation(min_separation, max_participations)
    lam, theta = _optimal_blt(t, n, b, k)
    return np.array(lam), np.array(theta)


def increment_event(increment: float, noise_multiplier: float) -> Optional[GaussianDpEvent]:
    """``GaussianDpEvent(z / sqrt(increment))`` for a release whose squared sensitivity grows by ``increment``
    (None when it does not grow)."""
    z = check_positive("noise_multiplier", noise_multiplier)
    return None if not increment > 0.0 else GaussianDpEvent(z / math.sqrt(increment))


def _check_digest(key: bytes, count: int, row: np.ndarray) -> str:
    mac_key = hmac.new(key, _CHECK_DOMAIN, hashlib.sha256).digest()
    message = count.to_bytes(8, "little") + np.ascontiguousarray(row[:BLOCK]).tobytes()
    return hmac.new(mac_key, message, hashlib.sha256).hexdigest()


class _KeyedStream:
    """Shared by :class:`TreeNoise` and :class:`BltNoise`: rows made one by one (:meth:`next`), optionally in the
    background (:meth:`prepare`), a keyed check value of the newest row and :meth:`fast_forward` after a restart;
    the same interface as :class:`BandedNoise`."""

    def __init__(self, dimension: int, key: bytes) -> None:
        self.dimension = check_int("dimension", dimension, minimum=1)
        self._key = _check_key(key)
        self.count = 0
        self._pending: Optional[Future] = None
        self._row = np.zeros(self.dimension)
        self._scratch = np.empty(min(BLOCK, self.dimension))

    @property
    def key(self) -> bytes:
        return self._key

    def next(self) -> np.ndarray:
        """Row t = count + 1: a read-only view (float64, length d) valid until the next :meth:`next`/:meth:`prepare`."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending.result()
        return self._advance()

    def prepare(self) -> None:
        """Start making the next row in a background thread (as :meth:`BandedNoise.prepare`)."""
        if self._pending is None:
            self._pending = _BACKGROUND.submit(self._advance)

    def settle(self) -> None:
        if self._pending is not None:
            self._pending.result()

    def fast_forward(self, releases: int) -> None:
        """Advance to ``releases`` rows made (regenerating and replaying the rows in between): a restart."""
        self.settle()
        target = check_int("releases", releases, minimum=self.count)
        while self.count < target:
            self.next()

    def check_value(self) -> str:
        """As :meth:`BandedNoise.check_value`: a keyed digest of the newest row's first block."""
        self.settle()
        return "" if self.count == 0 else _check_digest(self.key, self.count, self._row)

    def _advance(self) -> np.ndarray:
        self._make(self.count + 1)
        self.count += 1
        out = self._row.view()
        out.flags.writeable = False
        return out

    def _make(self, release: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class TreeNoise(_KeyedStream):
    r"""Rows :math:`w_t = N_t - N_{t-1}` of the plain binary tree (module docstring): the node (level h, 1-based end e)
    gets the normals :func:`keyed_standard_normal` would give release ``e·64 + h`` under the key HMAC(key, tree
    domain) (one nonce per node, separated from the banded stream's), so row t is a pure function of (key, t):
    no state across rows (memory: the row and one block of scratch), and a restart is bit-exact by construction
    (:meth:`fast_forward` only moves the counter)."""

    def __init__(self, dimension: int, key: bytes) -> None:
        super().__init__(dimension, key)
        self._normals = _Normals(hmac.new(self._key, _TREE_DOMAIN, hashlib.sha256).digest())

    @staticmethod
    def nodes(release: int) -> tuple[tuple[int, int], list[tuple[int, int]]]:
        """(the node added, the nodes subtracted) of release t, each as (level, 1-based end)."""
        t = check_int("release", release, minimum=1)
        r = (t & -t).bit_length() - 1
        return (r, t), [(h, ((t - 1) >> h) << h) for h in range(r)]

    def fast_forward(self, releases: int) -> None:
        """Advance to ``releases`` rows made: only the newest is computed (the rows are pure functions of t)."""
        self.settle()
        self._pending = None  # a prepared row is made and counted: nothing to collect
        target = check_int("releases", releases, minimum=self.count)
        if target > self.count:
            self.count = target - 1
            self.next()

    def _make(self, release: int) -> None:
        added, subtracted = self.nodes(release)
        for start in range(0, self.dimension, BLOCK):
            out = self._row[start : start + BLOCK]
            scratch = self._scratch[: out.size]
            block = start // BLOCK
            self._normals.fill((added[1] << 6) | added[0], block, out)
            for h, end in subtracted:
                self._normals.fill((end << 6) | h, block, scratch)
                np.subtract(out, scratch, out=out)


class BltNoise(_KeyedStream):
    r"""Rows of :math:`C^{-1}Z` for the BLT C of (λ, θ) (module docstring), :math:`Z_t` = :func:`keyed_standard_normal`
    (key, t): :math:`w_t = z_t - \sum_j \lambda_j S_j`, then :math:`S_j \leftarrow \theta_j S_j + w_t`. Memory: the
    n buffers and the row, (n + 1)·d float64. A restart replays Z_1..Z_t (:meth:`fast_forward`, O(t·n·d) once),
    bit-exact on the same platform: numpy float64 element-wise operations in a fixed order, no BLAS."""

    def __init__(self, lambdas: Sequence[float], thetas: Sequence[float], dimension: int, key: bytes) -> None:
        super().__init__(dimension, key)
        self.lambdas, self.thetas = check_blt_parameters(lambdas, thetas)
        self.buffers = np.zeros((self.lambdas.size, self.dimension))
        self._normals = _Normals(self._key)

    def _make(self, release: int) -> None:
        for start in range(0, self.dimension, BLOCK):
            out = self._row[start : start + BLOCK]
            scratch = self._scratch[: out.size]
            self._normals.fill(release, start // BLOCK, out)
            buffers = self.buffers[:, start : start + BLOCK]
            for lam, buffer in zip(self.lambdas, buffers):
                np.multiply(buffer, lam, out=scratch)
                np.subtract(out, scratch, out=out)
            for theta, buffer in zip(self.thetas, buffers):
                np.multiply(buffer, theta, out=buffer)
                np.add(buffer, out, out=buffer)


def state_checksum(data: bytes) -> str:
    """The SHA-256 of a secret state file (kept in the signed ledger file)."""
    return hashlib.sha256(data).hexdigest()


def save_noise_key(path: "os.PathLike[str] | str", key: bytes) -> str:
    """Write the noise key to ``path`` (mode 0600, temp file + fsync + rename; a few dozen bytes, once per run);
    returns the file's SHA-256 for the signed ledger state."""
    from ..accounting.ledger_file import write_atomic

    data = _KEY_MAGIC + _check_key(key)
    write_atomic(os.fspath(path), data)
    return state_checksum(data)


def read_checked(path: "os.PathLike[str] | str", checksum: str, what: str) -> bytes:
    """The bytes of a secret state file the signed ledger names by ``checksum``; ValueError (naming ``what`` and
    the file) when it is missing or its SHA-256 differs (a restart never continues from another run's state)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be read ({err}): the run cannot continue") from err
    if state_checksum(data) != checksum:
        raise ValueError(f"{what} {path} does not match the checksum in the ledger file")
    return data


def load_noise_key(path: "os.PathLike[str] | str", checksum: str) -> bytes:
    """The key saved at ``path`` (:func:`read_checked`: the correlated noise never continues under another key)."""
    data = read_checked(path, checksum, "noise key")
    if len(data) != len(_KEY_MAGIC) + KEY_BYTES or not data.startswith(_KEY_MAGIC):
        raise ValueError(f"noise key {os.fspath(path)} is not a saved BandMF noise key")
    return data[len(_KEY_MAGIC) :]


__all__ = [
    "BANDED_FACTORIZATIONS",
    "BandedNoise",
    "BltNoise",
    "MAX_BUFFERS",
    "TreeNoise",
    "blt_coefficients",
    "blt_prefix_error",
    "check_blt_parameters",
    "increment_event",
    "optimal_blt_parameters",
    "toeplitz_prefix_sensitivities",
    "tree_factorization",
    "tree_prefix_error",
    "tree_prefix_sensitivities",
    "amplified_round_event",
    "FACTORIZATIONS",
    "bandwidth",
    "banded_sqrt_coefficients",
    "binary_tree_factorization",
    "brute_force_sensitivity",
    "inverse_coefficients",
    "BLOCK",
    "KEY_BYTES",
    "default_threads",
    "keyed_standard_normal",
    "load_noise_key",
    "noise_key",
    "min_sep_sensitivity",
    "optimal_banded_coefficients",
    "participation_patterns",
    "prefix_sensitivities",
    "prefix_sum_matrix",
    "round_event",
    "round_increment",
    "run_event",
    "save_noise_key",
    "read_checked",
    "state_checksum",
    "strategy_coefficients",
    "toeplitz_matrix",
    "toeplitz_prefix_error",
]
