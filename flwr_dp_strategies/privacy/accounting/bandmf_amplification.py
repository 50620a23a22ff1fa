r"""Sampling-free Rényi accounting of banded matrix factorisation under *window allocation* (random allocation of
one release per cycle), after Schuchardt & Kalinin 2026 ("Sampling-free privacy accounting for matrix mechanisms
under random allocation", arXiv 2601.21636): a bound on the Rényi moments of the mixture over the secret
allocation, valid for adaptive clients, computed exactly by enumerating count vectors. No Flower here.

The sampling (``sampling="window-allocation"`` of the strategy). The clients are split into G fixed groups; the run
is cut into cycles of L = G·w releases and cycle c gives group g the *window* of w consecutive releases
:math:`W_{c,g} = [cL + gw, cL + gw + w)` (0-based). In every cycle each member of group g is asked in exactly one
release of its window, chosen uniformly at random and independently of everything else (a pseudo-random function
of a secret key: :func:`window_slot`), and the choice is never published. Two releases of one client are then at
least :math:`L - w + 1 = (G-1)w + 1` apart, so a strategy matrix C of b ≤ (G − 1)w + 1 bands keeps the
b-min-separation of the un-amplified analysis (which stays valid and is booked when smaller).

The mechanism (unit clip, :math:`\sigma` = z): :math:`Y = Cx + \sigma Z`, rows released in order, x_t the sum of the
clipped updates of release t, each client's update of release t a function of :math:`Y_{<t}` (adaptive), C lower
triangular banded Toeplitz with coefficients :math:`c_0..c_{b-1} \ge 0`, :math:`\lVert c\rVert = 1`.

Derivation. Fix the differing client and condition on everything but its allocation π = (j_0, j_1, …) (one slot
per cycle, i.i.d. uniform on {0..w−1}). If the client is at slot j of cycle c its update g (‖g‖ ≤ 1, a function of
the rows released before that release) moves Y by :math:`v_{c,j} g^\top` where :math:`v_{c,j}` is column
:math:`cL + gw + j` of C: supported on the w + b − 1 ≤ L rows of the *block* of cycle c, so blocks of different
cycles are disjoint. With :math:`\mu_r` the (adaptive) mean of row r without the client, the density ratio of the
run with the client (P) to the run without it (Q) is :math:`P/Q(y) = \mathbb E_\pi L_\pi(y)`,
:math:`L_\pi = \prod_r \exp(\langle y_r - \mu_r, h_{\pi,r}\rangle/\sigma^2 - \sum_{c} v_{c,j_c}[r]^2\lVert g_{c,j_c}\rVert^2/(2\sigma^2))`,
:math:`h_{\pi,r} = \sum_c v_{c,j_c}[r] g_{c,j_c}` (each g depending on rows before its column's first row).

*Remove direction*, integer α ≥ 2: :math:`\mathbb E_Q[(P/Q)^\alpha] = \mathbb E_{\pi_1..\pi_\alpha}\mathbb E_Q[\prod_a
L_{\pi_a}]` (π_a i.i.d.). Integrate the rows from the last one backwards: given the earlier rows, row r is
:math:`\mathcal N(\mu_r, \sigma^2 I)` under Q and every g that row r multiplies is already fixed, so the row contributes
:math:`\exp(\sum_{a \ne a'} v_{a}[r]v_{a'}[r]\langle g_a, g_{a'}\rangle / (2\sigma^2)) \le \exp(\sum_{a\ne a'}
v_a[r]v_{a'}[r]/(2\sigma^2))` (v ≥ 0, ‖g‖ ≤ 1): a constant, and induction gives

.. math:: \mathbb E_Q[(P/Q)^\alpha] \le \prod_c w^{-\alpha}\sum_{n \in \mathbb N^w,\ |n| = \alpha}
          \binom{\alpha}{n} \exp\Big(\frac{n^\top R\, n - \alpha}{2\sigma^2}\Big),
          \qquad R_{jj'} = \rho(|j - j'|) = \sum_l c_l c_{l+|j-j'|},

with equality for a non-adaptive client whose updates are all one unit vector (so the bound is exact for the worst
non-adaptive client; :func:`remove_log_moment`). Cycles multiply: each cycle contributes the same RDP (a last cycle
cut short by T has shorter columns, and the moment only grows with the entries of R: the full cycle bounds it).

*Add direction*: :math:`\mathbb E_P[(Q/P)^{\alpha-1}] = \mathbb E_Q[M^{-\beta}]`, M = P/Q, β = α − 1. By the power-mean
inequality, for every integer m ≥ 1, :math:`M = \mathbb E_\pi L_\pi \ge (\mathbb E_\pi L_\pi^{-\beta/m})^{-m/\beta}`,
so :math:`M^{-\beta} \le (\mathbb E_\pi L_\pi^{-\beta/m})^m = \mathbb E_{\pi_1..\pi_m}\prod_i L_{\pi_i}^{-\beta/m}`; the
same backward integration bounds row r by :math:`\exp(((\beta/m)^2 (\sum_i v_i[r])^2 + (\beta/m)\sum_i v_i[r]^2)/(2\sigma^2))`
and (per cycle, :math:`\sum_i \lVert v_i\rVert^2 = m`)

.. math:: \mathbb E_Q[M^{-\beta}] \le \prod_c e^{\beta/(2\sigma^2)}\, w^{-m}\sum_{|n| = m}\binom{m}{n}
          \exp\Big(\frac{(\beta/m)^2\, n^\top R\, n}{2\sigma^2}\Big)

(:func:`add_log_moment`, the smallest over m = 1..:data:`MAX_ORDER`; m = 1 is the un-amplified Gaussian). The RDP
of one cycle at order α is the larger of the two directions divided by α − 1 (add/remove-one needs both); for a
non-integer order the next integer's (Rényi divergences grow with the order), and past :data:`MAX_ORDER` none (∞).

Assumptions: the allocation is secret, uniform, independent across clients and cycles and of the data (a PRF of a
secret key from OS entropy: computationally indistinguishable from that); the groups and windows are fixed before
the run; the coefficients are non-negative (the banded square root's are; a factorisation with a negative
coefficient is refused); the server's noise is secret; a client that is not asked is never aggregated (enforced by
the strategy). The cap k: the strategy counts a participation when a node is *asked* (replying or not), so every
node is asked in at most k cycles, whatever the data and whatever the client does:
the bound composes min(k, cycles) cycles (a client that could skip a cycle without spending its cap would make the
number of its cycles depend on its behaviour). The un-amplified analysis, which also uses k, is booked instead
when smaller.

Checked against independent computations (tests/test_bandmf_amplification.py): the remove moment equals a direct
quadrature of the non-adaptive worst case, the add bound is never below it, and the ε booked is never below the
exact ε of one cycle computed by quadrature of its privacy loss.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import math
from collections.abc import Sequence
from typing import ClassVar

import attr
import numpy as np
from scipy.special import gammaln, logsumexp

from ..validation import check_int, check_positive
from .custom_events import CustomDpEvent, real

MAX_ORDER = 32
"""The largest Rényi order bounded (count vectors of |n| ≤ 32 over w ≤ :data:`MAX_WINDOW` slots: about 10⁶ rows in
all); larger orders get no bound (∞), which is sound and only matters for ε far below 1."""

MAX_WINDOW = 6
"""The largest window w supported (the enumeration grows as α^(w−1))."""


def check_coefficients(coefficients: Sequence[float]) -> tuple[float, ...]:
    """The coefficients as a tuple of floats, refused unless finite, non-negative, c_0 > 0 (the derivation needs
    C ≥ 0 entrywise)."""
    c = np.asarray(coefficients, dtype=np.float64)
    if c.ndim != 1 or c.size < 1 or not np.all(np.isfinite(c)) or np.any(c < 0) or not c[0] > 0:
        raise ValueError(
            "coefficients must be a non-empty 1-D array of finite non-negative numbers with coefficients[0] > 0 "
            f"(the window-allocation bound needs C >= 0), got {coefficients!r}"
        )
    return tuple(float(v) for v in c)


def window_gram(coefficients: Sequence[float], window: int) -> np.ndarray:
    """R (w × w): :math:`R_{jj'} = \\sum_l c_l c_{l+|j-j'|}`, the inner products of the w candidate columns of one
    window (0 beyond the bands)."""
    c = np.asarray(check_coefficients(coefficients))
    w = check_int("window", window, minimum=1)
    rho = [float(np.dot(c[: c.size - d], c[d:])) if d < c.size else 0.0 for d in range(w)]
    return np.array([[rho[abs(i - j)] for j in range(w)] for i in range(w)])


@functools.lru_cache(maxsize=None)
def _counts(total: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """Every n ∈ ℕ^parts with |n| = total, and log multinomial(total; n)."""
    rows = []
    for cuts in itertools.combinations(range(total + parts - 1), parts - 1):
        prev, n = -1, []
        for cut in cuts:
            n.append(cut - prev - 1)
            prev = cut
        n.append(total + parts - 2 - prev)
        rows.append(n)
    counts = np.array(rows, dtype=np.float64).reshape(-1, parts)
    return counts, gammaln(total + 1) - gammaln(counts + 1).sum(axis=1)


def _quadratic(gram: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    counts, log_multinomial = _counts(total, gram.shape[0])
    return np.einsum("ij,jk,ik->i", counts, gram, counts), log_multinomial


def remove_log_moment(coefficients: Sequence[float], window: int, noise_multiplier: float, order: int) -> float:
    """log of the bound on :math:`\\mathbb E_Q[(P/Q)^\\alpha]` for one cycle (module docstring), integer α ≥ 2."""
    gram = window_gram(coefficients, window)
    sigma2 = check_positive("noise_multiplier", noise_multiplier) ** 2
    a = check_int("order", order, minimum=2)
    quad, log_multinomial = _quadratic(gram, a)
    return float(logsumexp(log_multinomial + (quad - a) / (2.0 * sigma2)) - a * math.log(window))


def add_log_moment(coefficients: Sequence[float], window: int, noise_multiplier: float, order: int) -> float:
    """log of the bound on :math:`\\mathbb E_Q[(Q/P)^{\\alpha-1}]` for one cycle: the smallest power-mean bound over
    m = 1..:data:`MAX_ORDER` (module docstring), integer α ≥ 2."""
    gram = window_gram(coefficients, window)
    sigma2 = check_positive("noise_multiplier", noise_multiplier) ** 2
    beta = check_int("order", order, minimum=2) - 1
    best = math.inf
    for m in range(1, MAX_ORDER + 1):
        quad, log_multinomial = _quadratic(gram, m)
        value = beta / (2.0 * sigma2) + float(
            logsumexp(log_multinomial + (beta / m) ** 2 * quad / (2.0 * sigma2)) - m * math.log(window)
        )
        best = min(best, value)
    return best


@functools.lru_cache(maxsize=256)
def _cycle_rdp(coefficients: tuple[float, ...], window: int, noise_multiplier: float) -> np.ndarray:
    """RDP of one cycle at the integer orders 2..MAX_ORDER (index α − 2): the larger direction (the computations of
    :func:`remove_log_moment` and :func:`add_log_moment`, with the count vectors of each total enumerated once)."""
    gram = window_gram(coefficients, window)
    two_sigma2 = 2.0 * noise_multiplier**2
    log_w = math.log(window)
    tables = [None] + [_quadratic(gram, m) for m in range(1, MAX_ORDER + 1)]
    out = np.empty(MAX_ORDER - 1)
    for a in range(2, MAX_ORDER + 1):
        quad, log_multinomial = tables[a]
        remove = float(logsumexp(log_multinomial + (quad - a) / two_sigma2)) - a * log_w
        beta = a - 1
        add = min(
            beta / two_sigma2 + float(logsumexp(tables[m][1] + (beta / m) ** 2 * tables[m][0] / two_sigma2)) - m * log_w
            for m in range(1, MAX_ORDER + 1)
        )
        out[a - 2] = max(remove, add) / (a - 1)
    return out


def window_allocation_rdp(
    coefficients: Sequence[float], window: int, noise_multiplier: float, orders: Sequence[float]
) -> np.ndarray:
    """The RDP of one cycle of window allocation at each order (module docstring): the bound of order ⌈α⌉ for
    1 < α ≤ :data:`MAX_ORDER`, ∞ beyond (and for α ≤ 1, which RDP accounting does not use)."""
    c = check_coefficients(coefficients)
    w = check_int("window", window, minimum=1)
    if w > MAX_WINDOW:
        raise ValueError(f"window must be an integer in [1, {MAX_WINDOW}], got {window!r}")
    curve = _cycle_rdp(c, w, check_positive("noise_multiplier", noise_multiplier))
    out = np.full(len(orders), np.inf)
    for i, alpha in enumerate(np.asarray(orders, dtype=np.float64)):
        if 1.0 < alpha <= MAX_ORDER:
            out[i] = curve[max(2, math.ceil(alpha)) - 2]
    return out


@attr.s(frozen=True)
class WindowAllocationDpEvent(CustomDpEvent):
    """One cycle of BandMF under window allocation (module docstring): each client asked in one uniformly random
    release of a window of ``window`` consecutive releases, banded Toeplitz C of ``coefficients`` (≥ 0), noise
    multiplier ``noise_multiplier`` in clip units, add/remove-one. RDP only (the PLD accountant does not know it:
    the ledger's ``"best"`` mode takes the RDP bound); never inside a sampled event (the sampling is in the event)."""

    FIELDS: ClassVar[dict] = {
        "noise_multiplier": real(0.0),
        "window": real(1.0, low_open=False, high=MAX_WINDOW, high_open=False),
    }
    AMPLIFIABLE: ClassVar[bool] = False
    noise_multiplier: float = attr.ib()
    window: int = attr.ib()
    coefficients: tuple = attr.ib(converter=tuple)

    def __attrs_post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)
        w = check_int("window", self.window, minimum=1)
        if w > MAX_WINDOW:
            raise ValueError(f"window must be an integer in [1, {MAX_WINDOW}], got {self.window!r}")
        check_coefficients(self.coefficients)

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        return window_allocation_rdp(self.coefficients, int(self.window), float(self.noise_multiplier), orders)


_SLOT_DOMAIN = b"flwr-dp-strategies bandmf window slot\x00"


def window_slot(key: bytes, node: int, cycle: int, window: int) -> int:
    """The secret slot (0..w−1) of ``node`` in ``cycle``: HMAC-SHA-256 under a key derived from the run's secret noise
    key, read as a 256-bit integer modulo w (a pseudo-random function of (node, cycle): uniform up to 2⁻²⁵⁰ and
    independent across nodes and cycles for whoever does not know the key; reproducible after a restart)."""
    w = check_int("window", window, minimum=1)
    slot_key = hmac.new(bytes(key), _SLOT_DOMAIN, hashlib.sha256).digest()
    message = int(node).to_bytes(16, "little", signed=True) + check_int("cycle", cycle, minimum=0).to_bytes(8, "little")
    return int.from_bytes(hmac.new(slot_key, message, hashlib.sha256).digest(), "little") % w


__all__ = [
    "MAX_ORDER",
    "MAX_WINDOW",
    "WindowAllocationDpEvent",
    "add_log_moment",
    "check_coefficients",
    "remove_log_moment",
    "window_allocation_rdp",
    "window_gram",
    "window_slot",
]
