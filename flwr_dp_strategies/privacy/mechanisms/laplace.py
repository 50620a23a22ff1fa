"""Vector Laplace mechanism (L1 sensitivity).

Math (Dwork, McSherry, Nissim, Smith 2006; Dwork & Roth 2014, Thm 3.6): for a
query f with L1 sensitivity Δ₁ = max_{D~D'} ‖f(D) − f(D')‖₁, releasing
f(D) + (Y₁, …, Y_d) with Yᵢ i.i.d. Laplace(b), b = Δ₁/ε, is ε-DP under the
neighbouring relation for which Δ₁ was computed. The event is
``LaplaceDpEvent(noise_multiplier=b/Δ₁)``; dp-accounting composes it (RDP:
Mironov 2017, Prop. 6; PLD: exact Laplace privacy-loss distribution).

Floating-point attack (Mironov, CCS 2012, "On significance of the least
significant bits for differential privacy"): the textbook sampler computes
x + b·log(U) in doubles. Which doubles can come out depends on x, so an
observer can sometimes tell x from x' exactly, whatever ε says. **The default
(``secure=False``) is the textbook sampler and does NOT resist this attack.**

``secure=True`` resists it the way Google's DP libraries do: values are clamped
to a declared public bound [−B, B], rounded to a power-of-two grid γ (chosen from
b and B only, never from the data) and perturbed with two-sided geometric
(discrete Laplace) noise on that grid; the output γ·(k + Z) is an exact double,
so the set of reachable outputs is the same grid for every input. Rounding moves
each coordinate by at most γ/2, so neighbours' grid images differ by at most
⌊Δ₁/γ⌋ + d grid steps in L1; the event is
``DiscreteLaplaceDpEvent(noise_parameter=γ/b, sensitivity=⌊Δ₁/γ⌋ + d)``, i.e.
ε_eff = (⌊Δ₁/γ⌋ + d)·γ/b, which exceeds ε by a relative d·γ/Δ₁ (≤ 1e-6 for
d ≤ 1e6 with the default grid). Residual caveat: numpy's geometric sampler
itself uses floating-point inversion (⌈E/−log(1−p)⌉, E a float64 exponential
variate on a grid of spacing ≤ 7.7·2^-53), so the grid probabilities are not exact
(as CKS20's rational samplers are): with b/γ in (2^39, 2^40] (the default grid)
each value's probability is resolved to a relative error of order (b/γ)·2^-53,
about 1e-4 (more in the far tails), which can move the privacy loss of an output
by about twice that; the booked ε does not include it.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event

from .release import Release
from ..rng import RngLike, resolve_rng
from ..validation import as_finite_array, check_epsilon, check_positive, check_sensitivity

#: Grid resolution of the secure sampler, relative to the noise scale (2^-40)
#: and to the value bound (2^-48, keeping |k| < 2^53 so outputs stay exact).
_GRID_BITS_SCALE = 40
_GRID_BITS_BOUND = 48


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """b = Δ₁/ε."""
    return check_sensitivity(sensitivity) / check_epsilon(epsilon)


def laplace_mechanism(
    values: object,
    *,
    epsilon: float,
    sensitivity: float = 1.0,
    rng: RngLike = None,
    secure: bool = False,
    value_bound: float | None = None,
) -> Release[np.ndarray]:
    """Add i.i.d. Laplace(Δ₁/ε) noise to every coordinate of ``values``.

    Args:
        values: real array (any shape); NaN/inf rejected.
        epsilon: ε in (0, inf).
        sensitivity: L1 sensitivity Δ₁ in (0, inf) of the query that produced ``values``.
        rng: None (OS entropy), an int seed or a numpy Generator.
        secure: use the grid-snapped discrete sampler (see module docstring).
        value_bound: public bound B > 0 on |values|; required when ``secure``.

    Returns:
        Release with the noisy float64 array (same shape) and its DpEvent.
    """
    x = as_finite_array("values", values)
    b = laplace_scale(epsilon, sensitivity)
    gen = resolve_rng(rng)
    if not secure:
        noisy = gen.laplace(0.0, b, size=x.shape)
        noisy += x  # in place: x + noise without a second d-sized array
        return Release(noisy, dp_event.LaplaceDpEvent(noise_multiplier=b / float(sensitivity)))
    if value_bound is None:
        raise ValueError("value_bound must be given (a public bound B in (0, inf) on |values|) when secure=True")
    bound = check_positive("value_bound", value_bound)
    return _secure_laplace(x, b, float(sensitivity), bound, gen)


def secure_grid(scale: float, value_bound: float) -> float:
    """The power-of-two grid γ used by the secure sampler (data-independent)."""
    target = max(scale * 2.0**-_GRID_BITS_SCALE, value_bound * 2.0**-_GRID_BITS_BOUND)
    return 2.0 ** math.ceil(math.log2(target))


def _secure_laplace(x: np.ndarray, b: float, sensitivity: float, bound: float, gen: np.random.Generator) -> Release:
    gamma = secure_grid(b, bound)
    k = np.rint(np.clip(x, -bound, bound) / gamma).astype(np.int64)
    p = -math.expm1(-gamma / b)  # success probability of each geometric
    z = gen.geometric(p, size=x.shape) - gen.geometric(p, size=x.shape)
    noisy = gamma * (k + z).astype(np.float64)
    steps = int(math.floor(sensitivity / gamma)) + int(x.size)
    return Release(noisy, dp_event.DiscreteLaplaceDpEvent(noise_parameter=gamma / b, sensitivity=steps))
