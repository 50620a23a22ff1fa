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
server's noise Z is secret and fresh (OS entropy), and nothing is amplified: the cohort of each round may be
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
w_{t-l}) / c_0` (forward substitution in the banded system), so the server keeps the last b−1 noise vectors:
O(b·d) memory, float64. Its state is secret (whoever reads it can subtract the correlated part of later noise):
:func:`save_noise_state` writes it to its own file (mode 0600, atomic), whose SHA-256 the caller keeps in the
signed ledger file.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
import os
from collections.abc import Sequence
from typing import Optional

import numpy as np
from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent

from ..rng import RngLike, resolve_rng
from ..validation import check_int, check_positive, check_probability

FACTORIZATIONS = ("banded-sqrt", "banded-optimal")


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
    raise ValueError(f"factorization must be one of {FACTORIZATIONS}, got {factorization!r}")


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
class BandedNoise:
    r"""Rows of :math:`C^{-1}Z` for the banded lower-triangular Toeplitz C of ``coefficients``, one per call
    of :meth:`next`, Z with i.i.d. standard normal entries; O(b·d) memory (the last b−1 rows, float64).

    ``dimension``: d, the number of coordinates (the model's). :meth:`next` draws :math:`z_t` from the
    generator it is given (the caller's OS-entropy source, a seed only in tests).
    """

    def __init__(self, coefficients: Sequence[float], dimension: int) -> None:
        self.coefficients = _check_coefficients(coefficients)
        self.dimension = check_int("dimension", dimension, minimum=1)
        self.count = 0
        self.buffer = np.zeros((self.coefficients.size - 1, self.dimension))  # w_{t-1}, w_{t-2}, ...

    def next(self, rng: RngLike = None) -> np.ndarray:
        """:math:`w_t = (z_t - \\sum_{l=1}^{b-1} c_l w_{t-l}) / c_0` (a new array, float64, length d)."""
        generator = resolve_rng(rng)
        w = generator.standard_normal(self.dimension)
        return self.push(w)

    def push(self, z: np.ndarray) -> np.ndarray:
        """The next row for a given :math:`z_t` (d standard normal draws)."""
        w = np.array(z, dtype=np.float64, copy=True).reshape(-1)
        if w.size != self.dimension:
            raise ValueError(f"z must have dimension={self.dimension} entries, got {w.size}")
        for lag in range(1, min(self.count, self.buffer.shape[0]) + 1):
            w -= self.coefficients[lag] * self.buffer[lag - 1]
        w /= self.coefficients[0]
        if self.buffer.shape[0]:
            self.buffer[1:] = self.buffer[:-1]
            self.buffer[0] = w
        self.count += 1
        return w

    def to_bytes(self) -> bytes:
        """The state (count, coefficients, buffer) as one ``.npy`` array of float64 rows: [count, b, d], c, buffer."""
        b = self.coefficients.size
        header = np.zeros((1, max(self.dimension, b, 3)))
        header[0, :3] = (self.count, b, self.dimension)
        coeffs = np.zeros((1, header.shape[1]))
        coeffs[0, :b] = self.coefficients
        body = np.zeros((self.buffer.shape[0], header.shape[1]))
        body[:, : self.dimension] = self.buffer
        out = io.BytesIO()
        np.save(out, np.concatenate([header, coeffs, body]), allow_pickle=False)
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "BandedNoise":
        """The stream :meth:`to_bytes` saved; ValueError if the bytes are not such a state."""
        try:
            table = np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as err:  # noqa: BLE001 - any parse failure is one error
            raise ValueError(f"noise state is not a saved BandedNoise: {err}") from err
        if table.ndim != 2 or table.dtype != np.float64 or table.shape[0] < 2 or not np.all(np.isfinite(table)):
            raise ValueError("noise state is not a saved BandedNoise (shape, dtype or non-finite values)")
        count, b, d = table[0, :3]
        if not (count >= 0 and b >= 1 and d >= 1 and count == int(count) and b == int(b) and d == int(d)):
            raise ValueError("noise state header must hold integers count >= 0, b >= 1, d >= 1")
        b, d = int(b), int(d)
        if table.shape != (1 + b, max(d, b, 3)):
            raise ValueError(f"noise state must have {1 + b} rows of {max(d, b, 3)} values, got {table.shape}")
        noise = cls(table[1, :b], d)
        noise.count = int(count)
        noise.buffer[...] = table[2:, :d]
        return noise


def state_checksum(data: bytes) -> str:
    """The SHA-256 of a saved noise state (kept in the signed ledger file)."""
    return hashlib.sha256(data).hexdigest()


def save_noise_state(path: "os.PathLike[str] | str", noise: BandedNoise) -> str:
    """Write ``noise``'s state to ``path`` (mode 0600, temp file + fsync + rename); returns its SHA-256."""
    from ..accounting.ledger_file import write_atomic

    data = noise.to_bytes()
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


def load_noise_state(path: "os.PathLike[str] | str", checksum: str) -> BandedNoise:
    """The stream saved at ``path`` (:func:`read_checked`: the correlated noise never continues from other noise)."""
    return BandedNoise.from_bytes(read_checked(path, checksum, "noise state"))


__all__ = [
    "BandedNoise",
    "amplified_round_event",
    "FACTORIZATIONS",
    "bandwidth",
    "banded_sqrt_coefficients",
    "binary_tree_factorization",
    "brute_force_sensitivity",
    "inverse_coefficients",
    "load_noise_state",
    "min_sep_sensitivity",
    "optimal_banded_coefficients",
    "participation_patterns",
    "prefix_sensitivities",
    "prefix_sum_matrix",
    "round_event",
    "round_increment",
    "run_event",
    "save_noise_state",
    "read_checked",
    "state_checksum",
    "strategy_coefficients",
    "toeplitz_matrix",
    "toeplitz_prefix_error",
]
