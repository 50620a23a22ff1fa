r"""Discrete Gaussian noise (Canonne, Kamath & Steinke, NeurIPS 2020): a floating-point-safe Gaussian.

Why. ``Generator.normal`` in float64 leaks through the low bits of its outputs:
which doubles x + N(0, σ²) can produce depends on x (Mironov 2012 for Laplace;
Jin et al., IEEE S&P 2022 for Gaussians), so an observer can sometimes tell
neighbours apart whatever ε says. The cure, as for the secure Laplace
(:mod:`.laplace`), is to release points of a data-independent grid only.

Mechanism (:func:`secure_gaussian_mechanism`). Values are clamped to a public
bound [−B, B] and rounded to the power-of-two grid γ (from σ and B only, never
from the data), and integer noise from the discrete Gaussian
:math:`\mathcal N_{\mathbb Z}(0, s^2)`, :math:`P[Z = z] \propto e^{-z^2/(2s^2)}`,
:math:`s = \sigma/\gamma`, is added in grid units: the output
:math:`\gamma (k + Z)` is an exact double on the grid for every input.

Privacy (CKS 2020, Thm 14 and Cor. 9, multivariate): for integer vectors μ, ν,
:math:`D_\alpha(\mathcal N_{\mathbb Z}(\mu, s^2 I) \Vert \mathcal N_{\mathbb Z}(\nu, s^2 I))
\le \alpha \lVert\mu - \nu\rVert_2^2 / (2 s^2)`, i.e. the release is
ρ-zCDP with :math:`\rho = \Delta_\gamma^2 / (2 s^2)`, where :math:`\Delta_\gamma` bounds
the L2 distance of neighbours' grid images. Rounding moves each coordinate by at
most γ/2, so :math:`\lVert k - k'\rVert_2 \le \Delta_2/\gamma + \sqrt d`; the event is
``ZCDpEvent(rho)`` with :math:`\rho = (\Delta_2/\gamma + \sqrt d)^2 \gamma^2 / (2\sigma^2)`,
which exceeds the continuous Gaussian's :math:`\Delta_2^2/(2\sigma^2)` by a relative
:math:`\approx 2\sqrt d\,\gamma/\Delta_2` (≤ 1e-6 for d ≤ 1e6 with the default grid).

Sampler (CKS 2020, Algorithm 3): with :math:`t = \lfloor s \rfloor + 1`, draw Y
from the discrete Laplace with scale t (difference of two geometrics) and accept
it with probability :math:`\exp(-(|Y| - s^2/t)^2 / (2 s^2))`; accepted values are
exactly :math:`\mathcal N_{\mathbb Z}(0, s^2)`. :func:`sample_discrete_gaussian`
runs it vectorised on a NumPy Generator (OS entropy by default); its geometric
draws and acceptance test use float64, so the grid probabilities are not exact.
What holds: NumPy draws a geometric with success probability p ≈ 1/t by inversion,
⌈E·t⌉ with E a float64 exponential variate (ziggurat: E = r·w_i, r < 2^53,
w_i ≤ 7.7·2^-53). Each integer is the image of an interval of E of length ≈ 1/t that
holds only about 1/(t·w_i) reachable values of E, so its probability is resolved to
a relative error of order t·2^-53: about 1e-4 at the default grid, where
:func:`gaussian_grid` puts s in (2^39, 2^40] (s ≈ 2^39.7 gives t·2^-53 ≈ 1.0e-4), and
more in the far tails. A relative error r on every value's probability moves the
privacy loss of any output by at most ln((1+r)/(1−r)) ≈ 2r; the booked ε is that of
the exact :math:`\mathcal N_{\mathbb Z}(0, s^2)` and does not include this residual
(the same caveat as the secure Laplace, whose grid is chosen the same way).
:func:`sample_discrete_gaussian_exact` is the paper's rational-arithmetic
algorithm (Python ``Fraction`` and :class:`random.SystemRandom`), exact and slow
(tens of µs per draw): the reference the tests check the fast sampler against.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Optional

import numpy as np
from dp_accounting import dp_event

from .release import Release
from ..rng import RngLike, resolve_rng
from ..validation import as_finite_array, check_int, check_positive, check_sensitivity

#: Grid resolution relative to the noise scale (2^-40) and to the value bound (2^-48, |k| < 2^53).
_GRID_BITS_SCALE = 40
_GRID_BITS_BOUND = 48


def gaussian_grid(sigma: float, value_bound: float) -> float:
    """The power-of-two grid γ of the secure Gaussian (data-independent)."""
    target = max(sigma * 2.0**-_GRID_BITS_SCALE, value_bound * 2.0**-_GRID_BITS_BOUND)
    return 2.0 ** math.ceil(math.log2(target))


def sample_discrete_gaussian(scale: float, size: int, rng: RngLike = None) -> np.ndarray:
    """``size`` draws of :math:`\\mathcal N_{\\mathbb Z}(0, s^2)`, s = ``scale`` (CKS Algorithm 3, vectorised).

    Expected cost about 2 discrete-Laplace draws per output (the acceptance rate is ≥ 0.5 for s ≥ 1).
    """
    s = check_positive("scale", scale)
    n = check_int("size", size, minimum=0)
    gen = resolve_rng(rng)
    t = math.floor(s) + 1
    p = -math.expm1(-1.0 / t)  # geometric success probability of the discrete Laplace with scale t
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = max(16, int(1.3 * (n - filled)) * 2)
        y = gen.geometric(p, size=want) - gen.geometric(p, size=want)
        accept = gen.random(want) < np.exp(-((np.abs(y) - s * s / t) ** 2) / (2.0 * s * s))
        kept = y[accept][: n - filled]
        out[filled : filled + kept.size] = kept
        filled += kept.size
    return out


def _bernoulli_exp(gamma: Fraction, rnd: random.Random) -> bool:
    """Exact Bernoulli(exp(−γ)), γ ≥ 0 rational (CKS Algorithm 1)."""
    while gamma > 1:
        if not _bernoulli_exp(Fraction(1), rnd):
            return False
        gamma -= 1
    k = 1
    while True:
        if rnd.randrange(gamma.denominator * k) >= gamma.numerator:  # Bernoulli(γ/k) came out 0
            return k % 2 == 1
        k += 1


def _discrete_laplace_exact(t: int, rnd: random.Random) -> int:
    """Exact discrete Laplace with scale t (CKS Algorithm 2, s = 1, t integer)."""
    while True:
        u = rnd.randrange(t)
        if not _bernoulli_exp(Fraction(u, t), rnd):
            continue
        v = 0
        while _bernoulli_exp(Fraction(1), rnd):
            v += 1
        magnitude = u + t * v
        negative = rnd.randrange(2) == 1
        if negative and magnitude == 0:
            continue
        return -magnitude if negative else magnitude


def sample_discrete_gaussian_exact(
    scale: Fraction | float, size: int, rnd: Optional[random.Random] = None
) -> list[int]:
    """Exact :math:`\\mathcal N_{\\mathbb Z}(0, s^2)` draws (CKS Algorithm 3 in rational arithmetic).

    ``rnd`` defaults to :class:`random.SystemRandom` (OS entropy); pass ``random.Random(seed)`` in tests.
    """
    s2 = Fraction(scale) ** 2
    if s2 <= 0:
        raise ValueError(f"scale must be in (0, inf), got {scale!r}")
    n = check_int("size", size, minimum=0)
    rnd = rnd if rnd is not None else random.SystemRandom()
    t = math.floor(math.sqrt(s2)) + 1
    out = []
    while len(out) < n:
        y = _discrete_laplace_exact(t, rnd)
        gamma = (abs(y) - s2 / t) ** 2 / (2 * s2)
        if _bernoulli_exp(gamma, rnd):
            out.append(y)
    return out


def secure_gaussian_mechanism(
    values: object, *, noise_multiplier: float, sensitivity: float = 1.0, value_bound: float, rng: RngLike = None
) -> Release[np.ndarray]:
    """``values`` clamped to [−B, B], rounded to the grid γ, plus γ·N_Z(0, (σ/γ)²); σ = z·Δ₂.

    The event is ``ZCDpEvent(ρ)`` with ρ = (Δ₂/γ + √d)²γ²/(2σ²) (module docstring).
    """
    x = as_finite_array("values", values)
    z = check_positive("noise_multiplier", noise_multiplier)
    delta2 = check_sensitivity(sensitivity)
    bound = check_positive("value_bound", value_bound)
    sigma = z * delta2
    gamma = gaussian_grid(sigma, bound)
    k = np.rint(np.clip(x, -bound, bound) / gamma).astype(np.int64)
    noise = sample_discrete_gaussian(sigma / gamma, x.size, rng).reshape(x.shape)
    noisy = gamma * (k + noise).astype(np.float64)
    grid_sensitivity = delta2 / gamma + math.sqrt(x.size)
    rho = (grid_sensitivity * gamma) ** 2 / (2.0 * sigma * sigma)
    return Release(noisy, dp_event.ZCDpEvent(rho=rho))


__all__ = ["gaussian_grid", "sample_discrete_gaussian", "sample_discrete_gaussian_exact", "secure_gaussian_mechanism"]
