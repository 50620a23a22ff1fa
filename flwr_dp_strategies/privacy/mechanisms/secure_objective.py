r"""The functional mechanism's objective summed under secure aggregation, with the noise added once.

Why. In DELM (:mod:`.functional_mechanism`) every client perturbs its own Taylor
coefficients; summed over m clients the noise variance is m times that of one
release. If the clients hand their *exact* coefficients to secure aggregation,
each with a share of integer noise, the server only sees the sum and the sum
carries the noise of **one** central release: the noise std is √m times smaller
at the same record-level ε (Kairouz, Liu & Steinke, ICML 2021, "KLS21"; Agarwal,
Kairouz & Liu, NeurIPS 2021, for the Skellam noise). No Flower here; the
protocol is :mod:`flwr_dp_strategies.secure_aggregation`.

**Per-record vector.** A record (x, y), x clipped to ‖x‖₂ ≤ 1
(:func:`~.functional_mechanism.clip_rows`), r = r(y) as in
:func:`~.functional_mechanism.response_matrix`, contributes

.. math:: \varphi(x, y) = \bigl(\operatorname{vec}(x r^\top),\ \operatorname{triu}(x x^\top),\ 1\bigr)
          \in \mathbb R^{D},\qquad D = qc' + q(q+1)/2 + 1,

the released vector of :func:`~.functional_mechanism.released_vector` plus the
record count; a client's exact coefficients are :math:`c_i = \sum_{(x,y)\in D_i}\varphi(x,y)`
(:func:`objective_vector`) and the federation's objective is :math:`\sum_i c_i`.
The count travels inside the secure sum because under add/remove it is private
(see ``client_mods/functional_mechanism.py`` item 5: a count in the clear leaks).

**Per-record L2 bound** B (:func:`record_l2_bound`):
:math:`\lVert\varphi\rVert_2^2 = \lVert x\rVert^2\lVert r\rVert^2 + \sum_{j\le l}x_j^2x_l^2 + 1
\le \lVert r\rVert^2 + \lVert x\rVert^4 + 1`, since
:math:`\sum_{j\le l}x_j^2x_l^2 \le \lVert xx^\top\rVert_F^2 = \lVert x\rVert^4 \le 1`, with
:math:`\lVert r\rVert_2^2 = (c-1)/c` (softmax, the same for every label) or ¼ (logistic): the
bounds :func:`~.functional_mechanism.fm_l2_sensitivity` uses, plus 1 for the count. So
:math:`B = \sqrt{\lVert r\rVert^2 + 2}`, attained by x = e₁. Every coordinate of φ is also
at most 1 in magnitude (|x_j r_k| ≤ 1, |x_j x_l| ≤ 1), so :math:`|\sum_i c_i|_\infty \le N`
for N records in all (used for the modular range).

**Neighbouring relation and coefficient sensitivity** (:func:`coefficient_l2_sensitivity`).
Record level: two federations differ in one record of any one client. Add/remove:
:math:`\sum_i c_i` moves by one φ, at most B. Replace-one: by φ − φ′, whose parts are
bounded by 2‖r‖ (linear), ‖triu(xxᵀ − x′x′ᵀ)‖ ≤ ‖xxᵀ − x′x′ᵀ‖_F ≤ √2 and 0 (count), so
:math:`\Delta = \sqrt{4\lVert r\rVert^2 + 2}` (= :func:`~.functional_mechanism.fm_l2_sensitivity`).

**Encoding** (:func:`client_integer_objective`, :func:`encode_objective`): each client
scales its exact vector by s, rounds every coordinate independently and without bias,
:math:`k_j = \lfloor s c_j + U_j\rfloor`, :math:`U_j\sim\mathrm U[0,1)` (i.e.
⌊y⌋ + Bernoulli(y − ⌊y⌋)), adds its Skellam share Sk(μ/m) per coordinate and wraps modulo
2^b. No rotation: the coordinates are bounded deterministically (above), not only in norm.

**Integer sensitivity** (:func:`integer_l2_sensitivity`; a coupling argument, the
"deterministic" bound, not KLS21's conditional rounding). Fix the client whose record
changes, and let y, y′ be its scaled vectors on the two neighbours, ‖y − y′‖₂ ≤ sΔ. Run
both roundings on the *same* uniforms U. Then
:math:`k - k' = (y - y') + (e - e')` with :math:`e = \lfloor y + U\rfloor - y \in (-1, 1)`
coordinatewise and likewise e′, and since k_j − k′_j is an integer within
(y_j − y′_j) ± 1 (:math:`\lfloor a\rfloor - \lfloor b\rfloor` lies strictly between
a − b − 1 and a − b + 1), :math:`|k_j - k'_j - (y_j - y'_j)| < 1`, so

.. math:: \lVert k - k'\rVert_2 < s\Delta + \sqrt D =: \Delta_2,
          \qquad \lVert k - k'\rVert_1 \le \min(\lfloor\Delta_2^2\rfloor, \sqrt D\,\Delta_2)

(integers: |v| ≤ v²). Every other client's vector and the total noise Sk(μ) are the same
random variables on both sides. So each output distribution is a mixture over U,
:math:`P = \mathbb E_U P_U`, :math:`P' = \mathbb E_U P'_U`, where :math:`P_U, P'_U` are the
Skellam mechanism at two integer means at most (Δ₁, Δ₂) apart. For α > 1,
:math:`e^{(\alpha-1)D_\alpha(P\Vert P')}` is an f-divergence (f(t) = t^α), jointly convex,
so :math:`D_\alpha(P\Vert P') \le \sup_U D_\alpha(P_U\Vert P'_U)`: the RDP of the
Skellam mechanism with sensitivities (Δ₁, Δ₂) bounds the whole release. The rounding thus
costs at most √D in the sensitivity; :func:`calibrate_secure_objective` picks s so that
sΔ ≫ √D (reported as ``rounding_inflation``).

**Event** (:func:`objective_event`): ``SkellamDpEvent(Δ₁, Δ₂, μ)`` (Agarwal et al. 2021,
Thm 3.5; :mod:`.skellam`) for the single release of the sum, booked once, centrally
(``client=None``: every record of every client is covered), under the relation it was
calibrated for; the add/remove event is booked with its tighter replace-one form
(sensitivity from √(4‖r‖² + 2), not 2B). μ is the *minimum* total noise: each client
adds μ/m and a sum is only revealed with at least m clients in it (more noise is
post-processing of μ, Skellam being closed under sums). Decoding, PSD repair and the
solve are post-processing.

**Calibration** (:func:`calibrate_secure_objective`): for a target ε at δ, μ is the
smallest value (bisection, relative precision 1e-6) whose event's ε, as a fresh RDP
ledger computes it, is ≤ ε; or μ = (zΔ₂)² for a noise multiplier z. The scale s is the
largest for which the planned sum fits the centred range :math:`[-2^{b-1}, 2^{b-1})`:
:math:`sN + n + k\sqrt{n\mu/m} \le 2^{b-1} - 1` (N: a public upper bound on the records
in the federation; n: clients asked, each rounding error < 1; k = ``overflow_sigmas``
standard deviations of the noise when all n survive). μ depends on s through Δ₂, so the
two are iterated to a fixed point; ValueError naming ``bits`` when no s fits, or when the
largest s that fits leaves sΔ < √D (the rounding would more than double the sensitivity). A sum that
overflows wraps (wrong objective, never less privacy).

Randomness: the rounding and the noise use a private generator (:mod:`.rng`: OS entropy by
default; a seed or Generator for tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from .distributed_dp import MAX_BITS
from .functional_mechanism import (
    LOSSES,
    QuadraticStatistics,
    clip_rows,
    fm_l2_sensitivity,
    from_released_vector,
    released_vector,
    response_matrix,
)
from ..rng import RngLike, resolve_rng
from .skellam import MAX_MU, SkellamDpEvent, sample_skellam, skellam_event
from ..validation import as_finite_array, check_delta, check_epsilon, check_int, check_nonnegative, check_positive

RELATIONS: tuple[str, ...] = ("add_or_remove_one", "replace_one")
DEFAULT_BITS = 32
DEFAULT_OVERFLOW_SIGMAS = 6.0
#: Scaled values must stay well inside float64's exact-integer range (2^53).
_MAX_SCALED = 2.0**50


def _check_loss(loss: str) -> str:
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    return loss


def _check_relation(relation: str) -> str:
    if relation not in RELATIONS:
        raise ValueError(f"neighboring_relation must be one of {RELATIONS}, got {relation!r}")
    return relation


def _check_bits(bits: object) -> int:
    b = check_int("bits", bits, minimum=2)
    if b > MAX_BITS:
        raise ValueError(f"bits must be an integer in [2, {MAX_BITS}], got {bits!r}")
    return b


def vector_length(dim: int, num_classes: int, loss: str = "softmax") -> int:
    """D = q·c′ + q(q+1)/2 + 1 (c′ = c, or 1 for logistic)."""
    q = check_int("dim", dim, minimum=1)
    c = check_int("num_classes", num_classes, minimum=2)
    width = 1 if _check_loss(loss) == "logistic" else c
    return q * width + q * (q + 1) // 2 + 1


def _response_norm_sq(num_classes: int, loss: str) -> float:
    return 0.25 if _check_loss(loss) == "logistic" else (num_classes - 1) / num_classes


def record_l2_bound(num_classes: int, loss: str = "softmax") -> float:
    """B = √(‖r‖² + 2): the L2 norm bound of every record's vector φ(x, y) (module docstring)."""
    c = check_int("num_classes", num_classes, minimum=2)
    return math.sqrt(_response_norm_sq(c, loss) + 2.0)


def coefficient_l2_sensitivity(
    num_classes: int, *, loss: str = "softmax", neighboring_relation: str = "add_or_remove_one"
) -> float:
    """Δ of Σᵢ cᵢ for one record: B (add/remove) or √(4‖r‖² + 2) (replace one; the count is unchanged)."""
    if _check_relation(neighboring_relation) == "add_or_remove_one":
        return record_l2_bound(num_classes, loss)
    return fm_l2_sensitivity(num_classes, loss=loss, neighboring_relation="replace_one")


def integer_l2_sensitivity(scale: float, length: int, coefficient_sensitivity: float) -> float:
    """Δ₂ = s·Δ + √D: the L2 distance of neighbouring rounded vectors under the shared-uniform coupling."""
    s = check_positive("scale", scale)
    d = check_int("length", length, minimum=1)
    return s * check_positive("coefficient_sensitivity", coefficient_sensitivity) + math.sqrt(d)


def record_vectors(features: object, labels: object, *, num_classes: int, loss: str = "softmax") -> np.ndarray:
    """φ(x, y) of every record, one row each (n × D): for tests and audits; clients use :func:`objective_vector`."""
    x = clip_rows(features)
    r = response_matrix(labels, num_classes, loss)
    if r.shape[0] != x.shape[0]:
        raise ValueError(f"labels must have one entry per row of features ({x.shape[0]}), got {r.shape[0]}")
    rows, cols = np.triu_indices(x.shape[1])
    linear = (x[:, :, None] * r[:, None, :]).reshape(x.shape[0], -1)
    return np.concatenate([linear, x[:, rows] * x[:, cols], np.ones((x.shape[0], 1))], axis=1)


def objective_vector(stats: QuadraticStatistics) -> np.ndarray:
    """cᵢ = Σ φ over the client's records: the released vector of (A, triu S), then the count n."""
    return np.concatenate([released_vector(stats), [float(stats.count)]])


def objective_from_vector(vector: object, *, dim: int, num_classes: int, loss: str = "softmax") -> QuadraticStatistics:
    """Inverse of :func:`objective_vector`; the (noisy) count is rounded and floored at 1."""
    v = as_finite_array("vector", vector)
    length = vector_length(dim, num_classes, loss)
    if v.shape != (length,):
        raise ValueError(f"vector must have shape ({length},), got {v.shape}")
    width = 1 if loss == "logistic" else num_classes
    like = QuadraticStatistics(np.zeros((dim, width)), np.zeros((dim, dim)), 0, loss, num_classes)
    stats = from_released_vector(v[:-1], like)
    return QuadraticStatistics(stats.linear, stats.quadratic, max(1, int(round(float(v[-1])))), loss, num_classes)


def randomized_round(x: object, rng: RngLike = None) -> np.ndarray:
    """⌊x + U⌋ per coordinate, U ~ U[0, 1) independent: unbiased, within 1 of x (int64)."""
    v = as_finite_array("x", x)
    if v.size and float(np.max(np.abs(v))) > _MAX_SCALED:
        raise ValueError(f"x must have entries of magnitude at most 2**50 to round exactly, got {np.max(np.abs(v))!r}")
    gen = resolve_rng(rng)
    floor = np.floor(v)
    return floor.astype(np.int64) + (gen.random(v.shape) < (v - floor))


@dataclass(frozen=True)
class SecureObjectiveParams:
    """The public parameters of one secure objective sum: q, c, loss, scale s, bits b."""

    dim: int
    num_classes: int
    loss: str
    scale: float
    bits: int

    def __post_init__(self) -> None:
        check_int("dim", self.dim, minimum=1)
        check_int("num_classes", self.num_classes, minimum=2)
        _check_loss(self.loss)
        if self.loss == "logistic" and self.num_classes != 2:
            raise ValueError(f"num_classes must be 2 for loss='logistic', got {self.num_classes}")
        check_positive("scale", self.scale)
        _check_bits(self.bits)

    @property
    def length(self) -> int:
        """D, the length of every encoded vector."""
        return vector_length(self.dim, self.num_classes, self.loss)

    @property
    def modulus(self) -> int:
        return 1 << self.bits


def client_integer_objective(
    stats: QuadraticStatistics, params: SecureObjectiveParams, *, local_noise_variance: float = 0.0, rng: RngLike = None
) -> np.ndarray:
    """round(s·cᵢ) + Sk(local_noise_variance) per coordinate (int64, length D), before the wrap."""
    if not isinstance(params, SecureObjectiveParams):
        raise ValueError(f"params must be a SecureObjectiveParams, got {type(params).__name__}")
    if (stats.dim, stats.num_classes, stats.loss) != (params.dim, params.num_classes, params.loss):
        raise ValueError(
            f"stats must have dim={params.dim}, num_classes={params.num_classes}, loss={params.loss!r}, "
            f"got {stats.dim}, {stats.num_classes}, {stats.loss!r}"
        )
    share = check_nonnegative("local_noise_variance", local_noise_variance)
    gen = resolve_rng(rng)
    k = randomized_round(objective_vector(stats) * params.scale, gen)
    if share > 0.0:
        k = k + sample_skellam(share, k.size, gen)
    return k


def encode_objective(
    stats: QuadraticStatistics, params: SecureObjectiveParams, *, local_noise_variance: float = 0.0, rng: RngLike = None
) -> np.ndarray:
    """What a client hands to secure aggregation: :func:`client_integer_objective` mod 2^b (uint64)."""
    k = client_integer_objective(stats, params, local_noise_variance=local_noise_variance, rng=rng)
    return np.mod(k, np.int64(params.modulus)).astype(np.uint64)


def decode_objective(summed: object, params: SecureObjectiveParams) -> QuadraticStatistics:
    """A modular sum of encodings back to the (noisy) summed objective: centre, divide by s, unflatten."""
    v = np.asarray(summed)
    if not np.issubdtype(v.dtype, np.integer) or v.shape != (params.length,):
        raise ValueError(f"summed must be an integer array of shape ({params.length},), got {v.dtype} {v.shape}")
    m = np.uint64(params.modulus)
    wrapped = (v.astype(np.uint64) % m).astype(np.int64)
    centred = np.where(wrapped >= params.modulus // 2, wrapped - np.int64(params.modulus), wrapped)
    return objective_from_vector(
        centred.astype(np.float64) / params.scale, dim=params.dim, num_classes=params.num_classes, loss=params.loss
    )


def objective_event(
    params: SecureObjectiveParams, mu: float, *, neighboring_relation: str = "add_or_remove_one"
) -> SkellamDpEvent:
    """``SkellamDpEvent(Δ₁, Δ₂, μ)`` of the released sum, Δ₂ = s·Δ + √D under ``neighboring_relation``."""
    delta = coefficient_l2_sensitivity(params.num_classes, loss=params.loss, neighboring_relation=neighboring_relation)
    return skellam_event(integer_l2_sensitivity(params.scale, params.length, delta), mu, params.length)


def event_epsilon(event: SkellamDpEvent, delta: float, neighboring_relation: str) -> float:
    """ε at δ of one event, from a fresh RDP ledger of that relation (as the strategy's ledger books it)."""
    from ..accounting.ledger import PrivacyLedger  # noqa: PLC0415 - the ledger imports the accountants; keep this module light

    ledger = PrivacyLedger(delta, neighboring_relation=neighboring_relation, accounting="rdp")
    ledger.record(event, server_round=0)
    return ledger.epsilon()


@dataclass(frozen=True)
class SecureObjectiveCalibration:
    """Scale, noise and events of one secure objective sum (:func:`calibrate_secure_objective`).

    params: the public encoding parameters; mu: the minimum total Skellam variance (integer
    units); local_mu: each client's share μ/m; event: the event for ``neighboring_relation``;
    add_remove_event / replace_one_event: both forms (the strategy books the first with the
    second as its replace-one form); epsilon: the event's ε at ``delta`` (fresh RDP ledger);
    noise_std: √μ/s, the minimum noise std per coefficient; noise_multiplier: √μ/Δ₂;
    rounding_inflation: Δ₂/(sΔ), the rounding's price in sensitivity.
    """

    params: SecureObjectiveParams
    mu: float
    local_mu: float
    neighboring_relation: str
    event: SkellamDpEvent
    add_remove_event: SkellamDpEvent
    replace_one_event: SkellamDpEvent
    epsilon: float
    delta: float
    noise_std: float
    noise_multiplier: float
    rounding_inflation: float


def planned_magnitude(
    scale: float,
    mu: float,
    *,
    max_records: int,
    n_clients: int,
    min_survivors: int,
    overflow_sigmas: float = DEFAULT_OVERFLOW_SIGMAS,
) -> float:
    """s·N + n + k·√(nμ/m): the largest |coordinate| of the integer sum the range is planned for."""
    return scale * max_records + n_clients + overflow_sigmas * math.sqrt(n_clients * mu / min_survivors)


# pylint: disable=too-many-arguments,too-many-locals
def calibrate_secure_objective(
    *,
    dim: int,
    num_classes: int,
    max_records: int,
    n_clients: int,
    min_survivors: int,
    epsilon: Optional[float] = None,
    noise_multiplier: Optional[float] = None,
    delta: float = 1e-5,
    loss: str = "softmax",
    neighboring_relation: str = "add_or_remove_one",
    bits: int = DEFAULT_BITS,
    overflow_sigmas: float = DEFAULT_OVERFLOW_SIGMAS,
) -> SecureObjectiveCalibration:
    """The scale s and noise μ of a secure objective sum (module docstring: **Calibration**).

    Exactly one of ``epsilon`` (target ε at ``delta``) or ``noise_multiplier`` (z = √μ/Δ₂).
    ``max_records``: public upper bound N on the records summed; ``n_clients``: clients asked;
    ``min_survivors``: m ≤ n, the fewest clients in a revealed sum (each adds μ/m).
    """
    q = check_int("dim", dim, minimum=1)
    c = check_int("num_classes", num_classes, minimum=2)
    length = vector_length(q, c, loss)
    big_n = check_int("max_records", max_records, minimum=1)
    n = check_int("n_clients", n_clients, minimum=1)
    m = check_int("min_survivors", min_survivors, minimum=1)
    if m > n:
        raise ValueError(f"min_survivors must be at most n_clients={n}, got {min_survivors!r}")
    relation = _check_relation(neighboring_relation)
    b = _check_bits(bits)
    k = check_positive("overflow_sigmas", overflow_sigmas)
    dlt = check_delta(delta)
    if (epsilon is None) == (noise_multiplier is None):
        raise ValueError("epsilon or noise_multiplier must be given, exactly one of them")
    eps = None if epsilon is None else check_epsilon(epsilon)
    z_fixed = None if noise_multiplier is None else check_positive("noise_multiplier", noise_multiplier)
    sens = coefficient_l2_sensitivity(c, loss=loss, neighboring_relation=relation)
    limit = float((1 << (b - 1)) - 1)

    def mu_for(scale: float) -> float:
        l2 = integer_l2_sensitivity(scale, length, sens)
        if z_fixed is not None:
            return (z_fixed * l2) ** 2
        params = SecureObjectiveParams(q, c, loss, scale, b)
        low, high = 1e-6 * l2 * l2, l2 * l2
        while event_epsilon(objective_event(params, high, neighboring_relation=relation), dlt, relation) > eps:
            low, high = high, high * 4.0
            if high > MAX_MU:
                raise ValueError(f"epsilon={eps!r} needs more noise than the Skellam sampler allows (mu > {MAX_MU:g})")
        for _ in range(80):
            mid = math.sqrt(low * high)
            if event_epsilon(objective_event(params, mid, neighboring_relation=relation), dlt, relation) > eps:
                low = mid
            else:
                high = mid
            if high / low < 1.0 + 1e-6:
                break
        return high

    def best_scale(ratio: float) -> float:
        """Largest s with s·N + n + k√(n/m)·ratio·(sΔ + √D) ≤ limit, ratio = √μ/Δ₂."""
        a = k * math.sqrt(n / m) * ratio
        return (limit - n - a * math.sqrt(length)) / (big_n + a * sens)

    ratio = 1.0 if z_fixed is None else z_fixed  # √μ/Δ₂; for a target ε a first guess, then iterated
    scale, mu = 0.0, 0.0
    for _ in range(20):
        scale = min(best_scale(ratio), _MAX_SCALED / big_n)
        if not scale > 0.0:
            break
        mu = mu_for(scale)
        needed = math.sqrt(mu) / integer_l2_sensitivity(scale, length, sens)
        if needed <= ratio:
            break  # s was planned for at least this much noise: the sum fits
        ratio = needed * (1.0 + 1e-4)
    if (
        not scale > 0.0
        or mu > MAX_MU
        or planned_magnitude(scale, mu, max_records=big_n, n_clients=n, min_survivors=m, overflow_sigmas=k) > limit
    ):
        raise ValueError(
            f"bits must be larger: {b} bits cannot hold the sum of {big_n} records' objectives "
            f"(D = {length}) from {n} clients plus the noise (got bits={bits!r})"
        )
    if scale * sens < math.sqrt(length):
        raise ValueError(
            f"bits must be larger: at {b} bits the scale s = {scale:.4g} leaves the rounding "
            f"(sqrt(D) = {math.sqrt(length):.4g}) above the records' sensitivity s*Delta = "
            f"{scale * sens:.4g}, more than doubling the noise (got bits={bits!r})"
        )
    params = SecureObjectiveParams(q, c, loss, scale, b)
    events = {rel: objective_event(params, mu, neighboring_relation=rel) for rel in RELATIONS}
    l2 = integer_l2_sensitivity(scale, length, sens)
    return SecureObjectiveCalibration(
        params=params,
        mu=mu,
        local_mu=mu / m,
        neighboring_relation=relation,
        event=events[relation],
        add_remove_event=events["add_or_remove_one"],
        replace_one_event=events["replace_one"],
        epsilon=event_epsilon(events[relation], dlt, relation),
        delta=dlt,
        noise_std=math.sqrt(mu) / scale,
        noise_multiplier=math.sqrt(mu) / l2,
        rounding_inflation=l2 / (scale * sens),
    )


def sum_integer_objectives(vectors: Iterable[np.ndarray], params: SecureObjectiveParams) -> np.ndarray:
    """Σ of encodings mod 2^b (what secure aggregation reveals): for tests and the benchmark."""
    total = np.zeros(params.length, dtype=np.uint64)
    for v in vectors:
        total += np.asarray(v, dtype=np.uint64)
    return total % np.uint64(params.modulus)


__all__ = [
    "DEFAULT_BITS",
    "DEFAULT_OVERFLOW_SIGMAS",
    "RELATIONS",
    "SecureObjectiveCalibration",
    "SecureObjectiveParams",
    "calibrate_secure_objective",
    "client_integer_objective",
    "coefficient_l2_sensitivity",
    "decode_objective",
    "encode_objective",
    "event_epsilon",
    "integer_l2_sensitivity",
    "objective_event",
    "objective_from_vector",
    "objective_vector",
    "planned_magnitude",
    "randomized_round",
    "record_l2_bound",
    "record_vectors",
    "sum_integer_objectives",
    "vector_length",
]
