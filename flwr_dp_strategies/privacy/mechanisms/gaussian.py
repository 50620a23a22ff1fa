"""Vector Gaussian mechanism (L2 sensitivity).

Math: releasing f(D) + N(0, σ²I) where f has L2 sensitivity Δ₂ is described by
``GaussianDpEvent(noise_multiplier=z)``, z = σ/Δ₂. Its Rényi DP is α/(2z²)
(Mironov 2017, Prop. 7) and its exact (ε, δ) curve is the analytic Gaussian of
Balle & Wang 2018, Thm 8: δ(ε) = Φ(1/(2z) − εz) − e^ε·Φ(−1/(2z) − εz).

Calibration: :func:`gaussian_sigma` returns the smallest σ for a target (ε, δ)
from that exact curve (dp-accounting's ``get_sigma_gaussian``), valid for every
ε > 0. The classical σ = Δ₂·√(2 ln(1.25/δ))/ε (Dwork & Roth Thm A.1, used by
Flower's ``LocalDpMod`` and most DP-SGD tutorials) holds only for ε < 1; it
is offered as :func:`classical_gaussian_sigma` for comparison and rejects ε ≥ 1.

Floating-point caveat: by default noise comes from numpy's ``Generator.normal`` in
float64. **This does not resist floating-point attacks** on Gaussian samplers (Jin,
McMurtry, Rubinstein, Ohrimenko, IEEE S&P 2022); the released ε assumes exact
real-valued Gaussian noise. ``secure=True`` (with a public ``value_bound``) uses
the discrete Gaussian on a data-independent grid instead
(:func:`~.discrete_gaussian.secure_gaussian_mechanism`, CKS 2020), whose event is
the sound ``ZCDpEvent`` including the grid rounding.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event
from dp_accounting import gaussian_mechanism as _analytic

from .release import Release
from ..rng import RngLike, resolve_rng
from ..validation import as_finite_array, check_delta, check_epsilon, check_positive, check_sensitivity


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ making one Gaussian release (ε, δ)-DP (analytic Gaussian, Balle & Wang 2018)."""
    eps = check_epsilon(epsilon)
    dlt = check_delta(delta)
    return check_sensitivity(sensitivity) * float(_analytic.get_sigma_gaussian(eps, dlt))


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """σ = Δ₂·√(2 ln(1.25/δ))/ε (Dwork & Roth Thm A.1); valid only for ε in (0, 1)."""
    eps = check_epsilon(epsilon)
    if eps >= 1.0:
        raise ValueError(f"epsilon must be in (0, 1) for the classical Gaussian bound, got {epsilon}")
    dlt = check_delta(delta)
    return check_sensitivity(sensitivity) * math.sqrt(2.0 * math.log(1.25 / dlt)) / eps


def gaussian_mechanism(
    values: object,
    *,
    noise_multiplier: float,
    sensitivity: float = 1.0,
    rng: RngLike = None,
    secure: bool = False,
    value_bound: float | None = None,
) -> Release[np.ndarray]:
    """Add N(0, (z·Δ₂)²) noise to every coordinate of ``values``.

    Args:
        values: real array (any shape); NaN/inf rejected.
        noise_multiplier: z = σ/Δ₂ in (0, inf) (use :func:`gaussian_sigma` / Δ₂ for a target (ε, δ)).
        sensitivity: L2 sensitivity Δ₂ in (0, inf).
        rng: None (OS entropy), an int seed or a numpy Generator.
        secure: the floating-point-safe discrete Gaussian on a grid (see the module docstring).
        value_bound: public bound B > 0 on |values|; required when ``secure``.
    """
    if secure:
        if value_bound is None:
            raise ValueError("value_bound must be given (a public bound B in (0, inf) on |values|) when secure=True")
        from .discrete_gaussian import secure_gaussian_mechanism

        return secure_gaussian_mechanism(
            values, noise_multiplier=noise_multiplier, sensitivity=sensitivity, value_bound=value_bound, rng=rng
        )
    x = as_finite_array("values", values)
    z = check_positive("noise_multiplier", noise_multiplier)
    sigma = z * check_sensitivity(sensitivity)
    gen = resolve_rng(rng)
    noisy = gen.normal(0.0, sigma, size=x.shape)
    noisy += x  # in place: x + noise without a second d-sized array
    return Release(noisy, dp_event.GaussianDpEvent(noise_multiplier=z))


def bounded_mean(
    values: object,
    *,
    lower: float,
    upper: float,
    denominator: int,
    noise_multiplier: float,
    rng: RngLike = None,
) -> Release[float]:
    r"""The noised mean of per-client scalars known to lie in a declared range, over a public denominator.

    .. math:: \tilde\mu = \ell + \frac1m\Big(\sum_{i} \big(\operatorname{clip}(v_i, \ell, u) - \ell\big)
              + \mathcal N\!\big(0, (z\,(u - \ell))^2\big)\Big)

    with m = ``denominator`` fixed before the values are seen (the clients asked, never the number of
    values), ``[lower, upper]`` = [ℓ, u] declared before the round and z = ``noise_multiplier``.

    Derivation. Each shifted term :math:`\operatorname{clip}(v_i) - \ell` lies in [0, u − ℓ]. Adding or
    removing one client's value changes the sum by at most u − ℓ; replacing one client's value by another
    changes it by at most u − ℓ as well (both terms are in [0, u − ℓ]). So the sum has L2 sensitivity
    u − ℓ under both ``add_or_remove_one`` and ``replace_one``; the noise std z(u − ℓ) makes it a Gaussian
    mechanism of multiplier z, ``GaussianDpEvent(z)`` under either relation (no conversion). Dividing by
    the public m and adding ℓ is post-processing. The estimate is unbiased when m values arrive (fewer
    pull it towards ℓ, as the fixed-denominator estimator of DP-FedAvg does; McMahan et al. 2018).

    Args:
        values: the clients' scalars (1-D; NaN/inf rejected: the caller drops them first).
        lower, upper: the declared range, finite, lower < upper.
        denominator: m >= 1, public.
        noise_multiplier: z in (0, inf).
        rng: None (OS entropy), an int seed or a numpy Generator.
    """
    x = as_finite_array("values", values).reshape(-1)
    lo, hi = float(lower), float(upper)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"lower and upper must be finite with lower < upper, got lower={lower!r}, upper={upper!r}")
    if isinstance(denominator, bool) or not isinstance(denominator, (int, np.integer)) or denominator < 1:
        raise ValueError(f"denominator must be an integer >= 1, got {denominator!r}")
    z = check_positive("noise_multiplier", noise_multiplier)
    total = float(np.sum(np.clip(x, lo, hi) - lo))
    noisy = total + float(resolve_rng(rng).normal(0.0, z * (hi - lo)))
    return Release(lo + noisy / int(denominator), dp_event.GaussianDpEvent(noise_multiplier=z))
