r"""Functional mechanism (objective perturbation) for softmax / logistic heads.

Zhang, Zhang, Xiao, Yang, Winslett, "Functional Mechanism: Regression Analysis
under Differential Privacy", PVLDB 5(11) 2012 ("FM"), as the DELM paper (Cao,
Chen, Tang, Su, Chinese J. of Computers 2023, §3.3, eqs. 5-13) uses it.

**Objective.** A linear head :math:`s = W^\top x` (:math:`W\in\mathbb R^{q\times c}`)
with the softmax cross-entropy :math:`L = \operatorname{lse}(s) - y^\top s`
(:math:`y` one-hot) is replaced by its degree-2 Taylor expansion at
:math:`s = 0` (FM §5; DELM eq. 12 with the Hessian written out):

.. math:: \bar L(W; x, y) = \log c + r^\top W^\top x + \tfrac1{2c}\, x^\top W H W^\top x,
          \qquad r = \tfrac1c\mathbf 1 - y,\quad H = I_c - \tfrac1c\mathbf 1\mathbf 1^\top,

because :math:`\nabla\operatorname{lse}(0) = \mathbf 1/c` and
:math:`\nabla^2\operatorname{lse}(0) = H/c`. Summed over a data set,

.. math:: \bar f_D(W) = n\log c + \langle A, W\rangle + \tfrac1{2c}\operatorname{tr}(W^\top S W H),
          \quad A = \sum_i x_i r_i^\top,\ S = \sum_i x_i x_i^\top .

The binary ``"logistic"`` loss (DELM eq. 6; sigmoid output, :math:`y\in\{0,1\}`)
is :math:`\log 2 + (\tfrac12 - y)\,w^\top x + \tfrac18 (w^\top x)^2`, i.e.
:math:`r = \tfrac12 - y` and the quadratic form :math:`\tfrac18 w^\top S w`.

Every coefficient of the polynomial :math:`\bar f_D` is a fixed linear function of
the entries of :math:`A` and of the upper triangle of :math:`S`, so releasing
:math:`(A, \operatorname{triu} S)` with Laplace noise releases a perturbed
objective (FM's Algorithm 1 with the polynomial written in that basis; the
monomial basis of DELM eq. 7 repeats each entry of :math:`S` :math:`c^2` times and
would need :math:`c^2` times the noise).

**Sensitivity** (L1, of the released vector :math:`T(x,y) = (x r^\top, \operatorname{triu}(xx^\top))`,
rows with :math:`\lVert x\rVert_2\le 1`, :math:`\rho = \max_y\lVert r\rVert_1`,
which is :math:`2(c-1)/c` for softmax and :math:`1/2` for logistic):

* add/remove one record: :math:`\Delta = \max\lVert T\rVert_1
  = \max\big(\lVert x\rVert_1\rho + \tfrac12(\lVert x\rVert_1^2 + \lVert x\rVert_2^2)\big)
  = \sqrt q\,\rho + \tfrac{q+1}2`, since :math:`\sum_{j\le l}|x_jx_l| = \tfrac12(\lVert x\rVert_1^2+\lVert x\rVert_2^2)`
  and :math:`\lVert x\rVert_1\le\sqrt q\lVert x\rVert_2`. **Tight**: attained by
  the flat row :math:`|x_j| = 1/\sqrt q`.
* replace one record: with :math:`M = xx^\top - x'x'^\top`,
  :math:`\lVert T - T'\rVert_1 \le 2\sqrt q\,\rho + \tfrac12(\lVert M\rVert_1 + \sum_j|M_{jj}|)`.
  :math:`M` has rank ≤ 2 and eigenvalues :math:`\pm\sin\theta` for unit rows at
  angle θ (in general :math:`\lVert M\rVert_F^2 = \lVert x\rVert^4 + \lVert x'\rVert^4
  - 2(x^\top x')^2\le 2`), so :math:`\lVert M\rVert_1\le q\lVert M\rVert_F\le\sqrt2\,q`
  (Cauchy-Schwarz over the :math:`q^2` entries) and :math:`\sum_j|M_{jj}|\le
  \lVert x\rVert^2 + \lVert x'\rVert^2\le 2`, hence
  :math:`\Delta = 2\sqrt q\,\rho + \tfrac{\sqrt2\,q}2 + 1`. The quadratic part is
  attained for q = 2 (rows at 90° rotated by π/8); the linear part by
  :math:`x' = -x`; the two maximisers differ, so the joint maximum is lower
  (``tests/test_functional_mechanism.py`` measures the gap by adversarial search).

**The paper's bound** (DELM eqs. 9 and 13: :math:`d + d^2/4` logistic, :math:`2d + cd^2`
softmax) bounds every :math:`|x_j|` by 1 and never uses :math:`\lVert x\rVert_2\le 1`;
it is valid (an over-estimate: for q = 20, c = 10 it is 4 040 against 31.2 here)
and available as ``calibration="paper"``: the noise is then larger than needed and
the event still records the true ε, :math:`\varepsilon\,\Delta_{\text{sound}}/\Delta_{\text{paper}}`.

**Guarantee.** :func:`functional_mechanism` releases
:math:`(A,\operatorname{triu}S) + \operatorname{Lap}(\Delta/\varepsilon)^{\otimes}`: ε-DP
for one record of the client's data under the chosen relation
(``LaplaceDpEvent(noise_multiplier = b/Δ_sound)``). Anything computed from the
noisy statistics afterwards (PSD repair, every gradient step of every round) is
post-processing, so computing them **once per client** keeps that client's ε
fixed whatever the number of rounds.

**PSD repair** (:func:`repair_psd`): noise can make :math:`\tilde S` indefinite and
the noisy objective unbounded below; negative eigenvalues are clipped to a floor
(FM §6 uses regularisation and spectral trimming for the same reason).
Post-processing, no privacy cost.

Pure numpy; no Flower import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
from dp_accounting import dp_event

from .gaussian import gaussian_mechanism, gaussian_sigma
from .laplace import laplace_mechanism
from .release import Release
from ..rng import RngLike
from ..validation import as_finite_array, check_epsilon, check_int, check_nonnegative

LOSSES: tuple[str, ...] = ("softmax", "logistic")
RELATIONS: tuple[str, ...] = ("replace_one", "add_or_remove_one")
CALIBRATIONS: tuple[str, ...] = ("sound", "paper")
FM_NOISES: tuple[str, ...] = ("laplace", "gaussian")


@dataclass(frozen=True)
class QuadraticStatistics:
    """The data-dependent coefficients of the Taylor objective: A (q×c', c' = c or 1), S (q×q), n."""

    linear: np.ndarray
    quadratic: np.ndarray
    count: int
    loss: str
    num_classes: int

    @property
    def dim(self) -> int:
        return int(self.quadratic.shape[0])


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def clip_rows(features: object, bound: float = 1.0) -> np.ndarray:
    """Rows scaled down to L2 norm ≤ ``bound`` (a per-record map: no privacy cost)."""
    x = as_finite_array("features", features)
    if x.ndim != 2:
        raise ValueError(f"features must be a 2-D array (n, q), got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, bound / np.maximum(norms, 1e-300))


def response_matrix(labels: object, num_classes: int, loss: str = "softmax") -> np.ndarray:
    """r per record: 1/c − onehot(y) (softmax, n×c) or ½ − y (logistic, n×1, y ∈ {0,1})."""
    _check_choice("loss", loss, LOSSES)
    c = check_int("num_classes", num_classes, minimum=2)
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or y.size and (y.min() < 0 or y.max() >= c):
        raise ValueError(f"labels must be 1-D integers in [0, {c}), got dtype {y.dtype} shape {y.shape}")
    if loss == "logistic":
        if c != 2:
            raise ValueError(f"num_classes must be 2 for loss='logistic', got {c}")
        return (0.5 - y.astype(np.float64))[:, None]
    r = np.full((y.size, c), 1.0 / c)
    r[np.arange(y.size), y] -= 1.0
    return r


def quadratic_statistics(
    features: object, labels: object, *, num_classes: int, loss: str = "softmax"
) -> QuadraticStatistics:
    """A = Σ x rᵀ and S = Σ x xᵀ of the rows clipped to unit L2 norm (two BLAS products)."""
    x = clip_rows(features)
    r = response_matrix(labels, num_classes, loss)
    if r.shape[0] != x.shape[0]:
        raise ValueError(f"labels must have one entry per row of features ({x.shape[0]}), got {r.shape[0]}")
    return QuadraticStatistics(x.T @ r, x.T @ x, int(x.shape[0]), loss, int(num_classes))


def _rho(num_classes: int, loss: str) -> float:
    return 0.5 if loss == "logistic" else 2.0 * (num_classes - 1) / num_classes


def fm_sensitivity(
    dim: int,
    num_classes: int,
    *,
    loss: str = "softmax",
    neighboring_relation: str = "replace_one",
    calibration: str = "sound",
) -> float:
    """L1 sensitivity of (A, triu S) for unit-norm rows (module docstring: derivation).

    ``calibration="paper"`` returns DELM's eq. 9 (logistic: d + d²/4) or eq. 13
    (softmax: 2d + c·d²), derived for replace-one with |x_j| ≤ 1.
    """
    q = check_int("dim", dim, minimum=1)
    c = check_int("num_classes", num_classes, minimum=2)
    _check_choice("loss", loss, LOSSES)
    _check_choice("neighboring_relation", neighboring_relation, RELATIONS)
    if _check_choice("calibration", calibration, CALIBRATIONS) == "paper":
        return q + q * q / 4.0 if loss == "logistic" else 2.0 * q + c * q * q
    rho = _rho(c, loss)
    if neighboring_relation == "add_or_remove_one":
        return math.sqrt(q) * rho + (q + 1) / 2.0
    return 2.0 * math.sqrt(q) * rho + math.sqrt(2.0) * q / 2.0 + 1.0


def released_vector(stats: QuadraticStatistics) -> np.ndarray:
    """The vector FM perturbs: A flattened, then the upper triangle of S (diagonal included)."""
    rows, cols = np.triu_indices(stats.dim)
    return np.concatenate([stats.linear.ravel(), stats.quadratic[rows, cols]])


def from_released_vector(vector: np.ndarray, like: QuadraticStatistics) -> QuadraticStatistics:
    """Inverse of :func:`released_vector` (S rebuilt symmetric)."""
    q, n_lin = like.dim, like.linear.size
    linear = vector[:n_lin].reshape(like.linear.shape)
    quadratic = np.zeros((q, q))
    rows, cols = np.triu_indices(q)
    quadratic[rows, cols] = vector[n_lin:]
    quadratic[cols, rows] = vector[n_lin:]
    return replace(like, linear=linear, quadratic=quadratic)


def fm_l2_sensitivity(num_classes: int, *, loss: str = "softmax", neighboring_relation: str = "replace_one") -> float:
    """L2 sensitivity of (A, triu S) for unit-norm rows: dimension-free.

    ‖x rᵀ‖_F = ‖x‖‖r‖ with ‖r‖₂² = (c−1)/c (softmax) or ¼ (logistic), and
    ‖triu(xxᵀ)‖₂ ≤ ‖x‖² ≤ 1, so add/remove: Δ₂ = √(‖r‖² + 1) (tight: x = e₁);
    replace one: Δ₂ ≤ √((2‖r‖)² + 2) (‖M‖_F ≤ √2, module docstring).
    """
    c = check_int("num_classes", num_classes, minimum=2)
    _check_choice("loss", loss, LOSSES)
    _check_choice("neighboring_relation", neighboring_relation, RELATIONS)
    r2 = 0.25 if loss == "logistic" else (c - 1) / c
    if neighboring_relation == "add_or_remove_one":
        return math.sqrt(r2 + 1.0)
    return math.sqrt(4.0 * r2 + 2.0)


def functional_mechanism(
    stats: QuadraticStatistics,
    *,
    epsilon: float,
    neighboring_relation: str = "replace_one",
    calibration: str = "sound",
    noise: str = "laplace",
    delta: float = 1e-5,
    rng: RngLike = None,
    secure: bool = False,
) -> Release[QuadraticStatistics]:
    """Noise on every released coefficient of the Taylor objective.

    ``noise="laplace"`` (FM, pure ε-DP): Laplace(Δ₁/ε); the event records the true ε
    (sound Δ₁ even with ``calibration="paper"``). ``noise="gaussian"`` ((ε, δ)-DP,
    not in the paper): N(0, σ²) with the analytic-Gaussian σ for the dimension-free
    :func:`fm_l2_sensitivity`; far less noise than Laplace for q ≳ 10, since Δ₁
    grows linearly with q and Δ₂ does not. Its event is ``GaussianDpEvent(σ/Δ₂)``; with
    ``secure=True`` the noise is the floating-point-safe discrete Gaussian on a grid
    (:mod:`.discrete_gaussian`) and the event its ``ZCDpEvent``.
    """
    eps = check_epsilon(epsilon)
    if _check_choice("noise", noise, FM_NOISES) == "gaussian":
        sens = fm_l2_sensitivity(stats.num_classes, loss=stats.loss, neighboring_relation=neighboring_relation)
        sigma = gaussian_sigma(eps, delta, sens)
        # secure: discrete Gaussian on a grid; |coefficients| ≤ n for unit rows (n public under replace-one)
        noisy = gaussian_mechanism(
            released_vector(stats),
            noise_multiplier=sigma / sens,
            sensitivity=sens,
            rng=rng,
            secure=secure,
            value_bound=float(max(stats.count, 1)),
        )
        return Release(from_released_vector(noisy.value, stats), noisy.event)
    kwargs = dict(loss=stats.loss, neighboring_relation=neighboring_relation)
    used = fm_sensitivity(stats.dim, stats.num_classes, calibration=calibration, **kwargs)
    true = fm_sensitivity(stats.dim, stats.num_classes, calibration="sound", **kwargs)
    noisy = laplace_mechanism(released_vector(stats), epsilon=eps, sensitivity=used, rng=rng)
    scale = used / eps
    return Release(from_released_vector(noisy.value, stats), dp_event.LaplaceDpEvent(noise_multiplier=scale / true))


def repair_psd(matrix: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Symmetrise and clip eigenvalues below ``floor`` to ``floor`` (post-processing)."""
    fl = check_nonnegative("floor", floor)
    sym = (np.asarray(matrix, dtype=np.float64) + np.asarray(matrix, dtype=np.float64).T) / 2.0
    values, vectors = np.linalg.eigh(sym)
    return (vectors * np.maximum(values, fl)) @ vectors.T


def _curvature(stats: QuadraticStatistics) -> float:
    """The constant in front of the quadratic form: 1/(2c) (softmax, with H) or 1/8 (logistic)."""
    return 1.0 / 8.0 if stats.loss == "logistic" else 1.0 / (2.0 * stats.num_classes)


def _center_columns(weights: np.ndarray, stats: QuadraticStatistics) -> np.ndarray:
    """W H (softmax: subtract each row's mean over classes); W itself for logistic."""
    if stats.loss == "logistic":
        return weights
    return weights - weights.mean(axis=1, keepdims=True)


def taylor_objective(stats: QuadraticStatistics, weights: np.ndarray) -> float:
    """f̄(W) = n log c + ⟨A, W⟩ + κ tr(Wᵀ S W H) (κ = 1/(2c); logistic: n log 2 + aᵀw + ⅛ wᵀSw)."""
    w = np.asarray(weights, dtype=np.float64).reshape(stats.linear.shape)
    constant = stats.count * math.log(2 if stats.loss == "logistic" else stats.num_classes)
    quad = float(np.sum(w * (stats.quadratic @ _center_columns(w, stats))))
    return constant + float(np.sum(stats.linear * w)) + _curvature(stats) * quad


def taylor_gradient(stats: QuadraticStatistics, weights: np.ndarray) -> np.ndarray:
    """∇f̄(W) = A + 2κ S W H (same shape as A)."""
    w = np.asarray(weights, dtype=np.float64).reshape(stats.linear.shape)
    return stats.linear + 2.0 * _curvature(stats) * (stats.quadratic @ _center_columns(w, stats))


def repaired(stats: QuadraticStatistics, floor: float = 0.0) -> QuadraticStatistics:
    """``stats`` with S replaced by :func:`repair_psd` (S) (post-processing)."""
    return replace(stats, quadratic=repair_psd(stats.quadratic, floor))


def smooth_step_size(stats: QuadraticStatistics, ridge: float = 0.0) -> float:
    """1/L for the objective :func:`descend` minimises: L = 2κ·λ_max(S)/n + ridge.

    The gradient A + 2κ S W H is Lipschitz in W with constant 2κ·λ_max(S)·‖H‖ and
    ‖H‖ ≤ 1 (H projects columns onto the centred subspace, or is 1), so gradient
    descent with step 1/L decreases the (convex, after PSD repair) objective
    monotonically. Computed from the *noisy* statistics it is post-processing.
    """
    lam = check_nonnegative("ridge", ridge)
    top = float(np.linalg.eigvalsh(stats.quadratic)[-1]) if stats.quadratic.size else 0.0
    lipschitz = 2.0 * _curvature(stats) * max(top, 0.0) / max(stats.count, 1) + lam
    return math.inf if lipschitz == 0.0 else 1.0 / lipschitz


def descend(
    stats: QuadraticStatistics, weights: np.ndarray, *, steps: int, learning_rate: float, ridge: float = 0.0
) -> np.ndarray:
    """``steps`` of gradient descent on (f̄(W) + ½·ridge·n·‖W‖²)/n from ``weights`` (a new array).

    Dividing by n (public under replace-one) makes ``learning_rate`` independent
    of the client's data size. A client's local training in DELM (Alg. 1 line 7):
    a function of the noisy statistics only.
    """
    n_steps = check_int("steps", steps, minimum=0)
    lr = check_nonnegative("learning_rate", learning_rate)
    lam = check_nonnegative("ridge", ridge)
    w = np.array(weights, dtype=np.float64).reshape(stats.linear.shape)
    n = max(stats.count, 1)
    for _ in range(n_steps):
        w -= lr * (taylor_gradient(stats, w) / n + lam * w)
    return w


def solve_objective(stats: QuadraticStatistics, *, ridge: float, floor: float = 0.0) -> np.ndarray:
    r"""The minimiser of :math:`\bar f(W)/n + \tfrac12\lambda\lVert W\rVert^2` after PSD repair of S.

    With :math:`S = V\operatorname{diag}(s)V^\top` (eigenvalues clipped below ``floor``,
    as :func:`repair_psd`) the gradient :math:`A/n + 2\kappa SWH/n + \lambda W` vanishes
    on the centred columns at

    .. math:: W^\star = -V\operatorname{diag}\big(1/(2\kappa s/n + \lambda)\big)V^\top A H / n

    (:math:`H` is 1 for logistic). The non-centred part of W (a score added to every
    class alike) never changes the argmax and is left at 0. Directions with
    :math:`2\kappa s/n + \lambda = 0` get 0 (minimum-norm solution). This is the
    fixed point :func:`descend` converges to, computed in one eigendecomposition;
    applied to noisy statistics it is post-processing.
    """
    lam = check_nonnegative("ridge", ridge)
    fl = check_nonnegative("floor", floor)
    n = max(stats.count, 1)
    sym = (stats.quadratic + stats.quadratic.T) / 2.0
    values, vectors = np.linalg.eigh(sym)
    denominator = 2.0 * _curvature(stats) * np.maximum(values, fl) / n + lam
    target = vectors.T @ _center_columns(stats.linear, stats) / n
    safe = np.where(denominator > 0.0, denominator, 1.0)
    coefficients = np.where(denominator[:, None] > 0.0, -target / safe[:, None], 0.0)
    return vectors @ coefficients


def sum_statistics(parts: Iterable[QuadraticStatistics]) -> QuadraticStatistics:
    """Σ A_i, Σ S_i, Σ n_i of several data sets' (noisy) statistics: the objective of their union.

    The Taylor objective is a sum over records, so the clients' objectives add up
    to the federation's; summing noisy releases is post-processing. Accumulated
    in place (one q×q buffer).
    """
    total: Optional[QuadraticStatistics] = None
    for part in parts:
        if total is None:
            total = replace(
                part,
                linear=np.array(part.linear, dtype=np.float64),
                quadratic=np.array(part.quadratic, dtype=np.float64),
            )
            continue
        if part.linear.shape != total.linear.shape or part.quadratic.shape != total.quadratic.shape:
            raise ValueError(
                f"statistics must share shapes {total.linear.shape} / {total.quadratic.shape}, "
                f"got {part.linear.shape} / {part.quadratic.shape}"
            )
        np.add(total.linear, part.linear, out=total.linear)
        np.add(total.quadratic, part.quadratic, out=total.quadratic)
        total = replace(total, count=total.count + part.count)
    if total is None:
        raise ValueError("parts must hold at least one QuadraticStatistics")
    return total


def fm_noise_std(
    dim: int,
    num_classes: int,
    *,
    epsilon: float,
    noise: str = "laplace",
    delta: float = 1e-5,
    loss: str = "softmax",
    neighboring_relation: str = "replace_one",
    calibration: str = "sound",
) -> float:
    """Standard deviation of the noise :func:`functional_mechanism` adds to each coefficient.

    Gaussian: σ of the analytic Gaussian for :func:`fm_l2_sensitivity`; Laplace: √2·b with
    b = Δ₁/ε (:func:`fm_sensitivity` with the given ``calibration``). Public: it depends on
    the mechanism's parameters only.
    """
    eps = check_epsilon(epsilon)
    if _check_choice("noise", noise, FM_NOISES) == "gaussian":
        return gaussian_sigma(
            eps, delta, fm_l2_sensitivity(num_classes, loss=loss, neighboring_relation=neighboring_relation)
        )
    return (
        math.sqrt(2.0)
        * fm_sensitivity(
            dim, num_classes, loss=loss, neighboring_relation=neighboring_relation, calibration=calibration
        )
        / eps
    )


def noise_adapted_ridge(
    noise_std: float, *, dim: int, count: int, num_classes: int, loss: str = "softmax", fraction: float = 0.5
) -> float:
    r"""A ridge λ for :func:`solve_objective` on a sum of noisy FM objectives, from public quantities.

    The noise on a summed :math:`\tilde S` is a symmetric matrix of independent
    entries (Gaussian, or sums of Laplace) with standard deviation :math:`\sigma_{tot} = \sqrt{\sum_i\sigma_i^2}` (``noise_std``);
    its spectrum fills :math:`[-2\sigma_{tot}\sqrt q, 2\sigma_{tot}\sqrt q]` (Wigner's
    semicircle law, which holds for any such entries of finite variance). Shifting the eigenvalues by ``fraction`` of that edge damps the
    directions the noise dominates: in the units of :func:`solve_objective`,
    :math:`\lambda = 2\kappa\cdot\text{fraction}\cdot 2\sigma_{tot}\sqrt q / n`.
    It depends on σ, q, n and c only (no data beyond the public count), so it costs
    no privacy. The default ``fraction`` = 0.5 is between the best values seen on IID
    MNIST at ε = 1 (0.25-0.5) and on the embedded digits (1-2); 0.25-2 are within
    about 2 points of each other on both (examples/delm/README.md).
    """
    std = check_nonnegative("noise_std", noise_std)
    q = check_int("dim", dim, minimum=1)
    n = check_int("count", count, minimum=1)
    frac = check_nonnegative("fraction", fraction)
    kappa = 1.0 / 8.0 if _check_choice("loss", loss, LOSSES) == "logistic" else 1.0 / (2.0 * num_classes)
    return 2.0 * kappa * frac * 2.0 * std * math.sqrt(q) / n


def solve_noisy_sum(
    total: QuadraticStatistics,
    *,
    ridge: float,
    noise_std: Optional[float] = None,
    ridge_fraction: float = 0.5,
    floor: float = 0.0,
) -> tuple[np.ndarray, float]:
    """The head from a summed noisy objective, and the ridge used: ``ridge`` plus, when the summed
    per-coefficient noise std ``noise_std`` is given, :func:`noise_adapted_ridge` for it; one PSD repair
    and closed-form solve (:func:`solve_objective`). Post-processing of the noisy sum.

    Shared by the server-side solves (``NoisyObjectiveSum``: noise σ√m of m client releases;
    ``SecureObjectiveSum``: the noise added once under secure aggregation).
    """
    lam = noisy_sum_ridge(total, ridge=ridge, noise_std=noise_std, ridge_fraction=ridge_fraction)
    return solve_objective(total, ridge=lam, floor=floor), lam


def noisy_sum_ridge(
    total: QuadraticStatistics, *, ridge: float, noise_std: Optional[float] = None, ridge_fraction: float = 0.5
) -> float:
    """The ridge :func:`solve_noisy_sum` uses: ``ridge`` + :func:`noise_adapted_ridge` (``noise_std``, if given)."""
    lam = check_nonnegative("ridge", ridge)
    if noise_std is None:
        return lam
    return lam + noise_adapted_ridge(
        noise_std,
        dim=total.dim,
        count=max(total.count, 1),
        num_classes=total.num_classes,
        loss=total.loss,
        fraction=ridge_fraction,
    )


__all__ = [
    "descend",
    "solve_objective",
    "solve_noisy_sum",
    "noisy_sum_ridge",
    "noise_adapted_ridge",
    "fm_noise_std",
    "sum_statistics",
    "smooth_step_size",
    "repaired",
    "CALIBRATIONS",
    "LOSSES",
    "QuadraticStatistics",
    "clip_rows",
    "FM_NOISES",
    "fm_l2_sensitivity",
    "fm_sensitivity",
    "from_released_vector",
    "functional_mechanism",
    "quadratic_statistics",
    "released_vector",
    "repair_psd",
    "response_matrix",
    "taylor_gradient",
    "taylor_objective",
]
