r"""Private second-moment matrices for LDP federated PCA (DELM Algorithm 2).

Each client releases :math:`C_i = M_i^\top M_i = \sum_r x_r x_r^\top` of its
rows clipped to unit L2 norm, with noise; the server averages the releases,
eigendecomposes and keeps the top ``k`` eigenvectors (:func:`top_eigenvectors`).

**Default: Analyze Gauss** (Dwork, Talwar, Thakurta, Zhang, "Analyze Gauss:
Optimal Bounds for Privacy-Preserving PCA", STOC 2014). Add a symmetric matrix
:math:`E` whose upper triangle (diagonal included) is i.i.d.
:math:`\mathcal N(0,\sigma^2)`. The released vector is :math:`\operatorname{triu}C`;
its L2 sensitivity is

* add/remove one row: :math:`\lVert\operatorname{triu}(xx^\top)\rVert_2\le\lVert xx^\top\rVert_F
  = \lVert x\rVert_2^2\le 1`;
* replace one row: :math:`\lVert\operatorname{triu}M\rVert_2\le\lVert M\rVert_F\le\sqrt2`
  for :math:`M = xx^\top - x'x'^\top` (:math:`\lVert M\rVert_F^2 = \lVert x\rVert^4 +
  \lVert x'\rVert^4 - 2(x^\top x')^2`), attained by orthogonal unit rows.

so the release is the Gaussian mechanism: ``GaussianDpEvent(σ/Δ₂)``, which the
ledger composes exactly (RDP/PLD) with the client's other releases. σ for a
target (ε, δ) is the analytic Gaussian's (Balle & Wang 2018).

**The paper's noise is not DP** (``paper_wishart_noise``). DELM adds
:math:`ZZ^\top` with :math:`Z\in\mathbb R^{d\times(d+1)}`, :math:`z\sim\mathcal N(0, 1/(2\varepsilon_1))`,
i.e. a Wishart :math:`W_d(d+1, \tfrac1{2\varepsilon_1}I)` matrix, following the
Wishart mechanism (Jiang, Xie, Zhang, AAAI 2016, whose scale is
:math:`3/(2\varepsilon)`, three times the paper's). Whatever the scale, a Wishart
matrix is positive definite, so :math:`C + ZZ^\top` lives in :math:`C + \mathbb S_{++}`:
an output :math:`X = C + \eta I` (small η) has positive density under :math:`C` and
zero density under a neighbour :math:`C' = C + x'x'^\top - xx^\top` whenever
:math:`X - C'` is indefinite, which it is for η below the largest eigenvalue of
:math:`xx^\top - x'x'^\top`. The likelihood ratio is unbounded: no finite ε.
The variant is kept for reproducing the paper and records ``NonPrivateDpEvent``
(ε = inf in every report). ``tests/test_federated_pca.py`` exhibits the output.

Pure numpy; no Flower import.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
from dp_accounting import dp_event

from .discrete_gaussian import secure_gaussian_mechanism
from .functional_mechanism import RELATIONS, clip_rows
from .gaussian import gaussian_sigma
from .release import Release
from ..rng import RngLike, resolve_rng
from ..validation import as_finite_array, check_epsilon, check_int

NOISES: tuple[str, ...] = ("analyze-gauss", "paper-wishart")


def second_moment(features: object) -> np.ndarray:
    """Σ x xᵀ of the rows clipped to unit L2 norm (the paper's C_i = M_iᵀ M_i)."""
    x = clip_rows(features)
    return x.T @ x


def covariance_l2_sensitivity(neighboring_relation: str = "replace_one") -> float:
    """Δ₂ of triu(Σ x xᵀ) for unit rows: 1 (add/remove) or √2 (replace one)."""
    if neighboring_relation not in RELATIONS:
        raise ValueError(f"neighboring_relation must be one of {RELATIONS}, got {neighboring_relation!r}")
    return 1.0 if neighboring_relation == "add_or_remove_one" else math.sqrt(2.0)


def covariance_replace_one_event(event: dp_event.DpEvent) -> Optional[dp_event.DpEvent]:
    """The replace-one form of an add/remove covariance release's event, or None if there is no tighter one.

    Replacing one unit row moves triu(Σ x xᵀ) by at most √2 in L2 (twice the add/remove bound's square),
    not the 2 of the generic add/remove → replace-one conversion: the Gaussian's noise multiplier σ/Δ₂ is
    divided by √2 (``GaussianDpEvent``), its zCDP ρ = Δ₂²/(2σ²) doubled (``ZCDpEvent``; for the secure
    mechanism this bounds the rounding term (√2Δ₂/γ + √d)² ≤ 2(Δ₂/γ + √d)² too).
    """
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier / math.sqrt(2.0))
    if isinstance(event, dp_event.ZCDpEvent) and event.xi == 0:
        return dp_event.ZCDpEvent(2.0 * event.rho)
    return None


def _symmetric_gaussian(dim: int, sigma: float, gen: np.random.Generator) -> np.ndarray:
    upper = np.triu(gen.normal(0.0, sigma, size=(dim, dim)))
    return upper + np.triu(upper, 1).T


def _check_square(matrix: object) -> np.ndarray:
    m = as_finite_array("matrix", matrix)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"matrix must be square (d, d), got shape {m.shape}")
    return m


def analyze_gauss(
    matrix: object,
    *,
    epsilon: float,
    delta: float,
    neighboring_relation: str = "replace_one",
    rng: RngLike = None,
    secure: bool = False,
    value_bound: Optional[float] = None,
) -> Release[np.ndarray]:
    """C + E, E symmetric with i.i.d. N(0, σ²) upper triangle, σ = analytic-Gaussian σ(ε, δ, Δ₂).

    ``secure=True``: the upper triangle gets discrete Gaussian noise on a data-independent grid
    (:mod:`.discrete_gaussian`, floating-point safe) and the event is its ``ZCDpEvent``;
    ``value_bound`` is a public bound on |C_jk| (n for n unit-norm rows, public under replace-one).
    """
    m = _check_square(matrix)
    sens = covariance_l2_sensitivity(neighboring_relation)
    sigma = gaussian_sigma(epsilon, delta, sens)
    if secure:
        if value_bound is None:
            raise ValueError("value_bound must be given (a public bound in (0, inf) on |C_jk|) when secure=True")
        rows, cols = np.triu_indices(m.shape[0])
        release = secure_gaussian_mechanism(
            m[rows, cols], noise_multiplier=sigma / sens, sensitivity=sens, value_bound=value_bound, rng=rng
        )
        noisy = np.zeros_like(m)
        noisy[rows, cols] = release.value
        noisy[cols, rows] = release.value
        return Release(noisy, release.event)
    noisy = m + _symmetric_gaussian(m.shape[0], sigma, resolve_rng(rng))
    return Release(noisy, dp_event.GaussianDpEvent(noise_multiplier=sigma / sens))


def paper_wishart_noise(matrix: object, *, epsilon: float, rng: RngLike = None) -> Release[np.ndarray]:
    """DELM Alg. 2 lines 4-5: C + ZZᵀ, Z ∈ R^{d×(d+1)}, z ~ N(0, 1/(2ε₁)). NOT DP (module docstring)."""
    m = _check_square(matrix)
    eps = check_epsilon(epsilon)
    z = resolve_rng(rng).normal(0.0, math.sqrt(1.0 / (2.0 * eps)), size=(m.shape[0], m.shape[0] + 1))
    return Release(m + z @ z.T, dp_event.NonPrivateDpEvent())


def private_second_moment(
    features: object,
    *,
    epsilon: float,
    delta: float = 1e-5,
    noise: str = "analyze-gauss",
    neighboring_relation: str = "replace_one",
    rng: RngLike = None,
) -> Release[np.ndarray]:
    """One client's release of Algorithm 2 (lines 2-5) with the chosen ``noise``."""
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    moment = second_moment(features)
    if noise == "paper-wishart":
        return paper_wishart_noise(moment, epsilon=epsilon, rng=rng)
    return analyze_gauss(moment, epsilon=epsilon, delta=delta, neighboring_relation=neighboring_relation, rng=rng)


def top_eigenvectors(matrix: object, num_components: int) -> np.ndarray:
    """The ``num_components`` eigenvectors of the symmetric part of ``matrix`` with the largest eigenvalues (d × k)."""
    m = _check_square(matrix)
    k = check_int("num_components", num_components, minimum=1)
    if k > m.shape[0]:
        raise ValueError(f"num_components must be in [1, {m.shape[0]}], got {k}")
    values, vectors = np.linalg.eigh((m + m.T) / 2.0)
    order = np.argsort(values)[::-1][:k]
    return vectors[:, order]


def num_components_for(dim: int, ratio: float) -> int:
    """k = max(1, round(p·d)): the paper's 'dimension reduction ratio' p in (0, 1]."""
    d = check_int("dim", dim, minimum=1)
    if not 0.0 < float(ratio) <= 1.0:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    return max(1, int(round(float(ratio) * d)))


__all__ = [
    "NOISES",
    "analyze_gauss",
    "covariance_l2_sensitivity",
    "covariance_replace_one_event",
    "num_components_for",
    "paper_wishart_noise",
    "private_second_moment",
    "second_moment",
    "top_eigenvectors",
]
