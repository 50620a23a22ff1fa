r"""Distributed DP encoding for secure aggregation: clip, rotate, scale, round, add Skellam, wrap mod 2^b.

Why. Under secure aggregation the server only sees the sum of the clients'
vectors, computed in modular integer arithmetic. Each client therefore turns its
real-valued update into an integer vector and adds its share of integer noise;
the noise shares sum to the noise of one central mechanism (Kairouz, Liu &
Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation", ICML 2021, "KLS21"; Agarwal, Kairouz & Liu, "The Skellam
Mechanism for Differentially Private Federated Learning", NeurIPS 2021). This
module is that client-side encoding and the server-side decoding of a sum, with
no Flower and no secure aggregation (a sum mod 2^b stands in for it).

Pipeline (:func:`encode_update`), public parameters in :class:`DistributedDpParams`:

(a) **clip** the update x ∈ ℝ^d to L2 norm ≤ C;
(b) **rotate** (:func:`random_rotation`, no padding: the encoded vector has D = d
    coordinates): multiply by random signs drawn from a *public* seed, then apply an
    orthonormal transform: the normalised Walsh–Hadamard transform H_d/√d when d is a
    power of two, the orthonormal DCT-II (``scipy.fft.dct(type=2, norm="ortho")``)
    otherwise; both O(d log d). The rotation spreads the mass over all coordinates so
    that each coordinate is small and the modular range is used well (KLS21 §4.2;
    the flattening bound, :func:`rotation_flattening`, sizes the range). The norm is
    preserved: ‖Rx‖₂ = ‖x‖₂ ≤ C. (Earlier versions padded d to the next power
    of two, 2^⌈log₂ d⌉: +29 % upload for the 50 890-parameter MLP; :func:`randomized_hadamard`
    is that padded rotation, kept for its callers);
(c) **scale** by s (``scale``; the grid granularity in update units is 1/s):
    ‖sRx‖₂ ≤ c = sC;
(d) **conditional randomized rounding** (KLS21 §4.1): each coordinate y is rounded
    to ⌊y⌋ + Bernoulli(y − ⌊y⌋) (unbiased), and the whole vector is re-drawn until
    its L2 norm is at most

    .. math:: \tilde\Delta_2 = \min\Bigl(c + \sqrt D,\;
              \sqrt{c^2 + D/4 + \sqrt{2\ln(1/\beta)}\,(c + \sqrt D/2)}\Bigr)

    (:func:`rounded_l2_norm_bound`; c + √D always holds as |rounding error| < 1
    per coordinate; the second term holds with probability ≥ 1 − β per draw,
    KLS21, so the expected number of draws is ≤ 1/(1 − β)). The bound is
    *enforced*, so every client's integer vector k satisfies ‖k‖₂ ≤ Δ̃₂ whatever
    its update: Δ̃₂ is the integer L2 sensitivity, and
    ‖k‖₁ ≤ min(⌊Δ̃₂²⌋, √D·Δ̃₂) (integers: |kᵢ| ≤ kᵢ²) the L1 sensitivity.
    Conditioning on the norm makes the rounding slightly biased (towards smaller
    norms): with p the probability that one draw is rejected, the mean moves by at
    most p/(1 − p)·√D in L2 norm (rejected draws lie within √D of y). For the
    default β = e^{-1/2} (KLS21's and TF Federated's choice) p is far below β:
    measured 0 for c = 5, D = 1024; 0.6 % for c = 100, D = 1024; 5 % for c = 30,
    D = 64; 9 % for c = 1000, D = 1024 (the tests bound the bias by it);
(e) **noise**: add Skellam Sk(μ/n) per coordinate (:mod:`.skellam`); the sum over
    n clients carries Sk(μ);
(f) **wrap** modulo 2^b into unsigned integers (``bits`` = b).

Decoding (:func:`decode_sum`) of the modular sum of n encodings: map [0, 2^b) to
the centred range [−2^{b−1}, 2^{b−1}), divide by s, undo the rotation. It is exact
up to the rounding errors (< 1/s per coordinate and client) and the noise *provided the true integer sum lies in the centred range*; a sum
that overflows it wraps silently. Two rules size the range: :func:`scale_for_bits`
(what :class:`~flwr_dp_strategies.DistributedDpFedAvg` uses) picks s for a given b so that
the *rotated* sum plus noise fits with k = 6 planned standard deviations to spare (a
coordinate overflows with probability at most 2e^{-18}(1 + o(1)) ≈ 3e-8, proved in
:func:`wrap_probability_bound`); :attr:`SkellamCalibration.bits_needed` is the
worst case for a given s (every client's whole norm on one coordinate), which never
overflows but asks 2-3 more bits than the rotation makes necessary.

Privacy (:func:`calibrate_skellam`). The sum Σₖ kⱼ + Sk(μ) is the Skellam
mechanism with integer sensitivities (Δ₁, Δ₂ = Δ̃₂) under add/remove of one
client's update with the total noise present in both neighbours (a client without
data still sends its noise share; replace-one doubles both sensitivities); the
event is ``SkellamDpEvent(Δ₁, Δ₂, μ)`` (RDP: Agarwal et al. 2021, Thm 3.5). For a
target noise multiplier z the calibration takes μ = (z·Δ̃₂)², so the Gaussian part
of the RDP bound is α/(2z²), as for ``GaussianDpEvent(z)``; in update units the
noise standard deviation is z·Δ̃₂/s ≥ z·C. Decoding is post-processing.
The analysis does not depend on which rotation is used: the sensitivity is the norm bound
Δ̃₂ that step (d) enforces on the integer vector after the (public, data-independent,
orthonormal) rotation; the rotation enters only through D (= d, in Δ̃₂'s D/4 term and in
Δ₁ ≤ √D·Δ̃₂) and through the flattening that sizes the modular range (utility).

Floating point. Steps (a)–(c) run in float64 and may overshoot C by a relative
1e-16; privacy does not depend on them, only on the norm bound that step (d)
enforces on the integers, and on the Skellam noise (:mod:`.skellam` for its
sampler's floating-point caveat).

Randomness. The rotation signs are public (``rotation_seed``, shared by clients
and server, taken from the raw PCG64 bit stream, which NumPy keeps stable across
versions). The rounding and the noise use a private generator (:mod:`.rng`: OS
entropy by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import scipy.fft

from ..rng import RngLike, resolve_rng
from .skellam import MAX_POISSON_LAMBDA, SkellamDpEvent, check_skellam_parameters, sample_skellam, skellam_event
from ..validation import as_finite_array, check_int, check_nonnegative, check_positive

#: KLS21's and TF Federated's default for the conditional rounding (success probability ≥ 1 − e^{-1/2} ≈ 0.39 per draw).
DEFAULT_BETA = math.exp(-0.5)
#: Largest modulus exponent: sums are formed in uint64 arithmetic (wrapping mod 2^64, a multiple of 2^b).
MAX_BITS = 62
#: Scaled values must stay well inside float64's exact-integer range (2^53).
_MAX_SCALED_NORM = 2.0**50
_MAX_DIM = 2**40


def padded_dimension(dim: int) -> int:
    """The smallest power of two ≥ ``dim``."""
    d = check_int("dim", dim, minimum=1)
    return 1 << (d - 1).bit_length()


def _rotation_signs(seed: int, size: int) -> np.ndarray:
    """±1 signs from the raw PCG64 stream of ``seed`` (stable across NumPy versions)."""
    words = np.random.PCG64(seed).random_raw(-(-size // 64)).astype("<u8")
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:size]
    return 1.0 - 2.0 * bits.astype(np.float64)


def _flip_signs(vector: np.ndarray, seed: int) -> np.ndarray:
    """``vector`` (float64, owned by the caller) times :func:`_rotation_signs` (``seed``, its length), in place:
    the entries whose sign is −1 negated (exactly the product), with no float64 temporary of the vector's size."""
    words = np.random.PCG64(seed).random_raw(-(-vector.size // 64)).astype("<u8")
    negative = np.unpackbits(words.view(np.uint8), bitorder="little")[: vector.size]
    if vector.dtype != np.float64 or vector.ndim != 1 or not vector.flags.c_contiguous:
        np.negative(vector, out=vector, where=negative.view(np.bool_))
        return vector
    raw = vector.view(np.uint64)  # negating a float64 is flipping its sign bit (bit 63), exactly
    for start in range(0, vector.size, _ROUND_BLOCK):
        block = raw[start : start + _ROUND_BLOCK]
        block ^= negative[start : start + block.size].astype(np.uint64) << np.uint64(63)
    return vector


def _check_seed(seed: object) -> int:
    s = check_int("rotation_seed", seed, minimum=0)
    if s >= 2**128:
        raise ValueError(f"rotation_seed must be an integer in [0, 2**128), got {seed!r}")
    return s


def walsh_hadamard(x: np.ndarray) -> np.ndarray:
    """Unnormalised fast Walsh–Hadamard transform H_D x of a vector of power-of-two length D (O(D log D))."""
    y = np.array(x, dtype=np.float64, copy=True)
    size = y.shape[-1]
    if y.ndim != 1 or size & (size - 1):
        raise ValueError(f"x must be a 1-D array whose length is a power of two, got shape {y.shape}")
    h = 1
    while h < size:
        pairs = y.reshape(size // (2 * h), 2, h)
        y = np.stack((pairs[:, 0, :] + pairs[:, 1, :], pairs[:, 0, :] - pairs[:, 1, :]), axis=1).reshape(size)
        h *= 2
    return y


def randomized_hadamard(x: object, rotation_seed: int) -> np.ndarray:
    """Pad ``x`` to D = 2^⌈log₂ d⌉, flip signs from the public seed, apply H_D/√D (orthonormal)."""
    v = as_finite_array("x", x)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"x must be a non-empty 1-D array, got shape {v.shape}")
    seed = _check_seed(rotation_seed)
    size = padded_dimension(v.size)
    padded = np.zeros(size)
    padded[: v.size] = v
    return walsh_hadamard(padded * _rotation_signs(seed, size)) / math.sqrt(size)


def inverse_randomized_hadamard(y: object, dim: int, rotation_seed: int) -> np.ndarray:
    """Inverse of :func:`randomized_hadamard`: S·H_D·y/√D (H_D is symmetric and H_D² = D·I), first ``dim`` entries."""
    v = as_finite_array("y", y)
    d = check_int("dim", dim, minimum=1)
    seed = _check_seed(rotation_seed)
    if v.ndim != 1 or v.size != padded_dimension(d):
        raise ValueError(
            f"y must be a 1-D array of length padded_dimension(dim) = {padded_dimension(d)}, got shape {v.shape}"
        )
    return (walsh_hadamard(v) * _rotation_signs(seed, v.size) / math.sqrt(v.size))[:d]


def _is_power_of_two(dim: int) -> bool:
    return dim & (dim - 1) == 0


def rotation_kind(dim: int) -> str:
    """The orthonormal transform :func:`random_rotation` applies to a vector of length ``dim`` (≥ 1):
    ``"hadamard"`` (H_d/√d) when d is a power of two, ``"dct"`` (orthonormal DCT-II) otherwise."""
    d = check_int("dim", dim, minimum=1)
    return "hadamard" if _is_power_of_two(d) else "dct"


def rotation_flattening(dim: int) -> float:
    r"""F(d): every coordinate of the rotated vector is sub-Gaussian with variance proxy F·‖x‖²/d.

    Derivation. The rotation is R = T·S with S = diag(s₁, …, s_d) of independent uniform ±1 signs
    (public, drawn independently of x) and T orthonormal. Coordinate j of Rx is
    :math:`Y_j = \sum_i T_{ji} x_i s_i`, a Rademacher sum; Hoeffding's lemma
    (:math:`\mathbb{E}\,e^{\lambda a s} = \cosh(\lambda a) \le e^{\lambda^2 a^2/2}`) and independence give

    .. math:: \mathbb{E}\,e^{\lambda Y_j} \le \exp\Bigl(\frac{\lambda^2}{2}\sum_i T_{ji}^2 x_i^2\Bigr),
              \qquad \sum_i T_{ji}^2 x_i^2 \le \max_i T_{ji}^2\,\|x\|_2^2 ,

    so the variance proxy (and the variance, which equals :math:`\sum_i T_{ji}^2 x_i^2` exactly) is at
    most :math:`\max_{j,i} T_{ji}^2 \cdot \|x\|^2`, and the tail is
    :math:`P(|Y_j| > t) \le 2\exp(-t^2 / (2F\|x\|^2/d))`.

    * Walsh–Hadamard, d = 2^k: :math:`|T_{ji}| = 1/\sqrt d`, so F = 1 (and the variance is exactly ‖x‖²/d).
    * Orthonormal DCT-II: :math:`T_{0i} = \sqrt{1/d}` and
      :math:`T_{ji} = \sqrt{2/d}\cos(\pi(2i+1)j/(2d))` for j ≥ 1, so
      :math:`\max T_{ji}^2 \le 2/d`: F = 2 — a factor √2 on the per-coordinate standard deviation
      against the padded Hadamard of the same d. The bound is attained up to
      :math:`\cos^2(\pi/(2d))`: x = e₀ gives coordinate 1 the variance
      :math:`(2/d)\cos^2(\pi/(2d))\,\|x\|^2`, so no F < 2 holds for every x (d ≥ 3).

    What the padding bought is therefore worth less than it cost here: the Hadamard on
    D = 2^⌈log₂ d⌉ coordinates has variance proxy ‖x‖²/D, the DCT 2‖x‖²/d, at most 2× more per
    coordinate while the upload shrinks by D/d (up to 2×) and the rounding's +D/4 term with it.
    """
    return 1.0 if rotation_kind(dim) == "hadamard" else 2.0


def random_rotation(x: object, rotation_seed: int) -> np.ndarray:
    """R x = T·S·x for a 1-D ``x`` of length d (no padding): S the public random signs of ``rotation_seed``,
    T = H_d/√d when d is a power of two, the orthonormal DCT-II otherwise (:func:`rotation_kind`)."""
    v = as_finite_array("x", x)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"x must be a non-empty 1-D array, got shape {v.shape}")
    return _rotate_owned(np.array(v, dtype=np.float64, copy=True), _check_seed(rotation_seed))


def _rotate_owned(v: np.ndarray, seed: int) -> np.ndarray:
    """:func:`random_rotation` of a 1-D float64 ``v`` the caller owns and gives up (its signs are flipped in
    place and the DCT may overwrite it): no copy of the input."""
    signed = _flip_signs(v, seed)
    if _is_power_of_two(v.size):
        return walsh_hadamard(signed) / math.sqrt(v.size)
    return np.asarray(scipy.fft.dct(signed, type=2, norm="ortho", overwrite_x=True), dtype=np.float64)


def inverse_random_rotation(y: object, rotation_seed: int) -> np.ndarray:
    """Inverse of :func:`random_rotation`: S·Tᵀ·y (Tᵀ = T for the Hadamard, the inverse DCT-II for the DCT)."""
    v = as_finite_array("y", y)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"y must be a non-empty 1-D array, got shape {v.shape}")
    seed = _check_seed(rotation_seed)
    if _is_power_of_two(v.size):
        return _flip_signs(walsh_hadamard(v) / math.sqrt(v.size), seed)
    return _inverse_rotate_owned(np.array(v, dtype=np.float64, copy=True), seed)


def _inverse_rotate_owned(v: np.ndarray, seed: int) -> np.ndarray:
    """:func:`inverse_random_rotation` of a 1-D float64 ``v`` the caller owns and gives up (the inverse DCT may
    overwrite it; the signs are flipped in the result, in place)."""
    if _is_power_of_two(v.size):
        return _flip_signs(walsh_hadamard(v) / math.sqrt(v.size), seed)
    back = np.asarray(scipy.fft.idct(v, type=2, norm="ortho", overwrite_x=True), dtype=np.float64)
    return _flip_signs(back, seed)


def l2_clip(x: object, clip_norm: float) -> np.ndarray:
    """``x`` scaled by min(1, C/‖x‖₂)."""
    v = as_finite_array("x", x)
    c = check_positive("clip_norm", clip_norm)
    owned = v is not x and v.flags.owndata  # converted here (a fresh float64 array), never the caller's buffer
    return _clip_in_place(v if owned else v.copy(), c)


def _clip_in_place(v: np.ndarray, c: float) -> np.ndarray:
    """:func:`l2_clip` of a float64 ``v`` the caller owns, scaled in place."""
    norm = float(np.linalg.norm(v.ravel()))
    if norm > c:
        v *= c / norm
    return v


def rounded_l2_norm_bound(scaled_norm_bound: float, dim: int, beta: float = DEFAULT_BETA) -> float:
    """KLS21's bound Δ̃₂ on the L2 norm of the rounded vector (module docstring, step d); β ∈ [0, 1)."""
    c = check_nonnegative("scaled_norm_bound", scaled_norm_bound)
    d = check_int("dim", dim, minimum=1)
    b = _check_beta(beta)
    deterministic = c + math.sqrt(d)
    if b == 0.0:
        return deterministic
    squared = c * c + d / 4.0 + math.sqrt(2.0 * math.log(1.0 / b)) * (c + math.sqrt(d) / 2.0)
    return min(deterministic, math.sqrt(squared))


def _check_beta(beta: object) -> float:
    b = check_nonnegative("beta", beta)
    if b >= 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta!r}")
    return b


_ROUND_BLOCK = 1 << 16  # values rounded (and noised) at a time: temporaries of ~0.5 MiB whatever d


def conditional_randomized_round(
    x: object, norm_bound: float, rng: RngLike = None, *, max_attempts: int = 10_000
) -> np.ndarray:
    """Unbiased randomized rounding of each coordinate, re-drawn until ‖k‖₂ ≤ ``norm_bound`` (int64).

    Raises ``RuntimeError`` after ``max_attempts`` draws (the bound is then too tight
    for ``x``; with :func:`rounded_l2_norm_bound` each draw succeeds with probability ≥ 1 − β).
    """
    v = as_finite_array("x", x)
    bound = check_positive("norm_bound", norm_bound)
    attempts = check_int("max_attempts", max_attempts, minimum=1)
    if v.size and float(np.max(np.abs(v))) > _MAX_SCALED_NORM:
        raise ValueError(f"x must have entries of magnitude at most 2**50 to round exactly, got {np.max(np.abs(v))!r}")
    gen = resolve_rng(rng)
    flat = v.ravel()
    k = np.empty(flat.size, dtype=np.int64)
    bound_sq = bound * bound
    for _ in range(attempts):
        # block by block (the same uniforms, in the same order, as one draw of v's size): no temporary of
        # the vector's size besides k; the squared norm summed over blocks
        squared = 0.0
        for start in range(0, flat.size, _ROUND_BLOCK):
            block = flat[start : start + _ROUND_BLOCK]
            floor = np.floor(block)
            chunk = k[start : start + block.size]
            np.copyto(chunk, floor, casting="unsafe")  # floor(x) is an integer below 2**50: exact in int64
            chunk += gen.random(block.size) < (block - floor)
            values = chunk.astype(np.float64)
            # einsum's own loop, not BLAS: a multi-threaded BLAS dot per 64 K block spins its threads (1.1 s of
            # CPU at d = 1e7 on 2 busy cores, against 0.03 s)
            squared += float(np.einsum("i,i->", values, values))
        if squared <= bound_sq:
            return k.reshape(v.shape)
    raise RuntimeError(f"conditional rounding found no draw with L2 norm <= {bound} in {attempts} attempts")


@dataclass(frozen=True)
class DistributedDpParams:
    """The public parameters every client and the server share.

    dim: length d of the (flattened) update; clip_norm: C; scale: s (grid 1/s);
    bits: modulus 2^b of the secure sum, b ∈ [2, 62]; rotation_seed: public seed
    of the random signs; beta: conditional-rounding parameter β ∈ [0, 1).
    """

    dim: int
    clip_norm: float
    scale: float
    bits: int
    rotation_seed: int
    beta: float = DEFAULT_BETA

    def __post_init__(self) -> None:
        d = check_int("dim", self.dim, minimum=1)
        if d > _MAX_DIM:
            raise ValueError(f"dim must be an integer in [1, 2**40], got {self.dim!r}")
        c = check_positive("clip_norm", self.clip_norm)
        s = check_positive("scale", self.scale)
        if c * s > _MAX_SCALED_NORM:
            raise ValueError(f"scale * clip_norm must be in (0, 2**50], got {c * s!r}")
        b = check_int("bits", self.bits, minimum=2)
        if b > MAX_BITS:
            raise ValueError(f"bits must be an integer in [2, {MAX_BITS}], got {self.bits!r}")
        _check_seed(self.rotation_seed)
        _check_beta(self.beta)

    @property
    def padded_dim(self) -> int:
        """D, the length of every encoded vector: D = d (the rotation pads nothing, :func:`random_rotation`)."""
        return self.dim

    @property
    def modulus(self) -> int:
        """2^b."""
        return 1 << self.bits

    @property
    def rounding_bound(self) -> float:
        """Δ̃₂: the enforced L2 bound of every client's rounded integer vector (its L2 sensitivity)."""
        return rounded_l2_norm_bound(self.scale * self.clip_norm, self.padded_dim, self.beta)


def client_integer_vector(
    update: object, params: DistributedDpParams, *, local_noise_variance: float = 0.0, rng: RngLike = None
) -> np.ndarray:
    """Steps (a)–(e): the client's integer vector k + Sk(local_noise_variance) (int64, length D = d).

    ``local_noise_variance`` ≥ 0 is the client's share μ/n (0: no noise, for tests and
    for a deployment where another party adds the noise).
    """
    if not isinstance(params, DistributedDpParams):
        raise ValueError(f"params must be a DistributedDpParams, got {type(params).__name__}")
    x = as_finite_array("update", update)
    if x.size != params.dim:
        raise ValueError(f"update must have params.dim = {params.dim} entries, got {x.size}")
    share = check_nonnegative("local_noise_variance", local_noise_variance)
    gen = resolve_rng(rng)
    # one float64 copy of the update (the conversion from float32 is one; a float64 update is copied), clipped,
    # signed and rotated in place, then scaled in place
    owned = x is not update and x.flags.owndata and x.flags.c_contiguous
    rotated = _rotate_owned(
        _clip_in_place(x.reshape(-1) if owned else np.array(x, dtype=np.float64).reshape(-1), params.clip_norm),
        _check_seed(params.rotation_seed),
    )
    del x
    rotated *= params.scale
    k = conditional_randomized_round(rotated, params.rounding_bound, gen)
    del rotated
    if share > 0.0:
        _add_skellam_share(k, share, gen)
    return k


def _add_skellam_share(k: np.ndarray, variance: float, rng: RngLike = None) -> np.ndarray:
    """``k`` (1-D int64) += i.i.d. Sk(``variance``) per coordinate, in place, drawn block by block
    (:func:`~.skellam.sample_skellam` of 64 K values at a time: no temporary of k's size); returns k."""
    if k.dtype != np.int64 or k.ndim != 1:
        raise ValueError(f"k must be a 1-D int64 array, got {k.dtype} {k.shape}")
    share = check_nonnegative("variance", variance)
    gen = resolve_rng(rng)
    if share > 0.0:
        for start in range(0, k.size, _ROUND_BLOCK):
            chunk = k[start : start + _ROUND_BLOCK]
            chunk += sample_skellam(share, chunk.size, gen)
    return k


def to_modular(k: object, bits: int) -> np.ndarray:
    """Integer vector ``k`` modulo 2^b as uint64 in [0, 2^b)."""
    b = check_int("bits", bits, minimum=2)
    if b > MAX_BITS:
        raise ValueError(f"bits must be an integer in [2, {MAX_BITS}], got {bits!r}")
    arr = np.asarray(k)
    if not np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_):
        raise ValueError(f"k must be an integer array, got dtype {arr.dtype}")
    # k mod 2^b = the low b bits of k in two's complement: one int64 copy, reinterpreted and masked in place
    out = arr.astype(np.int64, copy=True).view(np.uint64)
    out &= np.uint64((1 << b) - 1)
    return out


def encode_update(
    update: object, params: DistributedDpParams, *, local_noise_variance: float = 0.0, rng: RngLike = None
) -> np.ndarray:
    """Steps (a)–(f): what a client hands to secure aggregation (uint64 in [0, 2^b), length D = d)."""
    k = client_integer_vector(update, params, local_noise_variance=local_noise_variance, rng=rng)
    out = k.view(np.uint64)  # to_modular(k, b) in place: k is this call's own int64 array
    out &= np.uint64(params.modulus - 1)
    return out


def modular_sum(encoded: Iterable[object], params: DistributedDpParams) -> np.ndarray:
    """Σ encodings mod 2^b (what secure aggregation reveals); each must be uint64 in [0, 2^b) of length D."""
    total = np.zeros(params.padded_dim, dtype=np.uint64)
    count = 0
    for index, vector in enumerate(encoded):
        v = np.asarray(vector)
        if v.dtype != np.uint64 or v.shape != (params.padded_dim,):
            raise ValueError(
                f"encoded[{index}] must be a uint64 array of shape ({params.padded_dim},), got {v.dtype} {v.shape}"
            )
        if v.size and int(v.max()) >= params.modulus:
            raise ValueError(f"encoded[{index}] must hold values in [0, 2**{params.bits})")
        total += v  # uint64 arithmetic wraps mod 2^64, a multiple of 2^b
        count += 1
    if count == 0:
        raise ValueError("encoded must hold at least one vector")
    return total % np.uint64(params.modulus)


def decode_sum(summed: object, params: DistributedDpParams) -> np.ndarray:
    """Server side: a modular sum of encodings back to the (noisy) sum of clipped updates (float64, length d)."""
    if not isinstance(params, DistributedDpParams):
        raise ValueError(f"params must be a DistributedDpParams, got {type(params).__name__}")
    v = np.asarray(summed)
    if not np.issubdtype(v.dtype, np.integer) or v.shape != (params.padded_dim,):
        raise ValueError(f"summed must be an integer array of shape ({params.padded_dim},), got {v.dtype} {v.shape}")
    if v.size and (int(v.min()) < 0 or int(v.max()) >= params.modulus):
        raise ValueError(f"summed must hold values in [0, 2**{params.bits})")
    signed = v.astype(np.int64)
    signed[signed >= params.modulus // 2] -= params.modulus  # centred in place
    values = signed.astype(np.float64)
    del signed
    values /= params.scale
    return _inverse_rotate_owned(values, _check_seed(params.rotation_seed))


@dataclass(frozen=True)
class SkellamCalibration:
    """The noise and accounting of one distributed-DP round (:func:`calibrate_skellam`).

    mu: total Skellam variance per coordinate (integer units); local_mu: each
    client's share μ/n; l2_sensitivity / l1_sensitivity: the integer sensitivities
    (add/remove one client's update); event: the ``SkellamDpEvent`` to book;
    noise_std: the aggregate noise standard deviation in update units (√μ/s);
    effective_noise_multiplier: noise_std / C (≥ the requested z); bits_needed:
    the smallest b for which the worst-case signal sum (≤ n·Δ̃₂ per coordinate, no
    credit for the rotation) plus 8σ of noise fits the centred range
    [−2^{b−1}, 2^{b−1}) (pessimistic; :func:`scale_for_bits` is the rule used to run).
    """

    mu: float
    local_mu: float
    l2_sensitivity: float
    l1_sensitivity: float
    event: SkellamDpEvent
    noise_std: float
    effective_noise_multiplier: float
    bits_needed: int


def calibrate_skellam(params: DistributedDpParams, *, noise_multiplier: float, n_clients: int) -> SkellamCalibration:
    """μ = (z·Δ̃₂)² for ``noise_multiplier`` z and the rounding bound Δ̃₂ of ``params``, split over ``n_clients``."""
    if not isinstance(params, DistributedDpParams):
        raise ValueError(f"params must be a DistributedDpParams, got {type(params).__name__}")
    z = check_positive("noise_multiplier", noise_multiplier)
    n = check_int("n_clients", n_clients, minimum=1)
    l2 = params.rounding_bound
    mu = (z * l2) ** 2
    event = skellam_event(l2, mu, params.padded_dim)
    check_skellam_parameters(event.l1_sensitivity, event.l2_sensitivity, mu)
    noise_std = math.sqrt(mu) / params.scale
    headroom = n * l2 + 8.0 * math.sqrt(mu)
    bits_needed = max(2, math.ceil(math.log2(2.0 * (math.floor(headroom) + 1))))
    return SkellamCalibration(
        mu=mu,
        local_mu=mu / n,
        l2_sensitivity=l2,
        l1_sensitivity=float(event.l1_sensitivity),
        event=event,
        noise_std=noise_std,
        effective_noise_multiplier=noise_std / params.clip_norm,
        bits_needed=bits_needed,
    )


DEFAULT_OVERFLOW_SIGMAS = 6.0
_MAX_NOISE_STD = 0.5 * math.sqrt(MAX_POISSON_LAMBDA)  # μ ≤ λ_max/4: every client's share is one Poisson draw


def planned_sum_std(
    scale: float,
    *,
    clip_norm: float,
    padded_dim: int,
    n_clients: int,
    noise_multiplier: float,
    min_survivors: int,
    beta: float = DEFAULT_BETA,
) -> float:
    r"""σ(s), the planned standard deviation (a sub-Gaussian-type scale) of a coordinate of the integer sum:

    .. math:: \sigma^2(s) = F(D)\,\frac{(n s C)^2}{D} + \frac{n}{m}\bigl(z\tilde\Delta_2(s)\bigr)^2

    with D = ``padded_dim`` the encoded length (= d) and F(D) = :func:`rotation_flattening` (1 for the
    Hadamard, 2 for the DCT). The first term bounds the variance proxy of a coordinate of the rotated sum
    of the (at most n) clipped, scaled updates, whose norm is ≤ nsC whatever their directions
    (:func:`rotation_flattening`: every coordinate is sub-Gaussian with proxy F·norm²/D); the second is the
    largest total Skellam variance, n survivors each adding μ/m with μ = (zΔ̃₂)².
    """
    d = check_int("padded_dim", padded_dim, minimum=1)
    s, c = check_positive("scale", scale), check_positive("clip_norm", clip_norm)
    n, m = check_int("n_clients", n_clients, minimum=1), check_int("min_survivors", min_survivors, minimum=1)
    z = check_positive("noise_multiplier", noise_multiplier)
    rounding = rounded_l2_norm_bound(s * c, d, beta)
    signal = rotation_flattening(d) * (n * s * c) ** 2 / d
    noise = n / m * (z * rounding) ** 2
    return math.sqrt(signal + noise)


def sum_headroom(
    scale: float,
    *,
    clip_norm: float,
    padded_dim: int,
    n_clients: int,
    noise_multiplier: float,
    min_survivors: int,
    beta: float = DEFAULT_BETA,
    overflow_sigmas: float = DEFAULT_OVERFLOW_SIGMAS,
) -> float:
    r"""The largest |coordinate| the integer sum is planned for, at scale s (see :func:`scale_for_bits`).

    .. math:: h(s) = k\,\sigma(s) + n,
              \qquad \sigma^2(s) = F(D)\frac{n^2 (sC)^2}{D} + \frac{n}{m}\bigl(z\tilde\Delta_2(s)\bigr)^2

    σ is :func:`planned_sum_std` (the rotated signal when all n updates point the same way, and the
    Skellam noise when all n clients survive with shares μ/m); n bounds the rounding (< 1 per client and
    coordinate); k = ``overflow_sigmas``. A coordinate exceeds h with probability at most
    :func:`wrap_probability_bound` (k, σ).
    """
    sigma = planned_sum_std(
        scale,
        clip_norm=clip_norm,
        padded_dim=padded_dim,
        n_clients=n_clients,
        noise_multiplier=noise_multiplier,
        min_survivors=min_survivors,
        beta=beta,
    )
    return overflow_sigmas * sigma + n_clients


def wrap_probability_bound(overflow_sigmas: float, planned_std: float) -> float:
    r"""Per-coordinate bound on the probability that the sum leaves the planned range ±h = ±(kσ + n).

    .. math:: P\bigl(|\textstyle\sum_j| > k\sigma + n\bigr) \le
              2\exp\Bigl(-\frac{k^2}{2} + \frac{k^4\cosh(k/\sigma)}{24\,\sigma^2}\Bigr)

    (capped at 1); k = ``overflow_sigmas`` > 0, σ = ``planned_std`` > 0 (:func:`planned_sum_std`, integer
    units). For k = 6 and σ ≥ 100 this is 2e^{-18}·1.005 ≈ 3.1e-8; a round of D coordinates wraps
    somewhere with probability at most D times it (union bound; 1.6e-3 for D = 50 890 with every update
    aligned, the plan's worst case — updates in random directions use far less of the range).

    Derivation. A coordinate of the integer sum is A + N + E: A the coordinate of the rotated sum of the
    scaled clipped updates, N the total Skellam noise, E the rounding errors (|E| < n: each survivor's
    rounding moves it by less than 1, whatever the conditioning). The public signs are independent of the
    updates (clients that see the seed and align their updates on purpose break this: utility, not
    privacy) and the noise is independent of both. A is sub-Gaussian with proxy σ_A² ≤ F·(nsC)²/D
    (:func:`rotation_flattening`); N, a difference of two Poisson(V/2), V ≤ nμ/m, has
    :math:`\log\mathbb{E}e^{\lambda N} = V(\cosh\lambda - 1) \le V\lambda^2/2 + V\lambda^4\cosh(\lambda)/24`
    (the tail :math:`\sum_{j\ge2}\lambda^{2j}/(2j)!` is at most :math:`\lambda^4\cosh(\lambda)/24` as
    (2j)! ≥ 24·(2j−4)!). With σ² ≥ σ_A² + V, Chernoff at λ = k/σ, t = kσ gives
    :math:`P(A + N \ge k\sigma) \le \exp(-k^2 + k^2/2 + k^4\cosh(k/\sigma)/(24\sigma^2))`, the same for
    −(A + N) (both bounds are even in λ), hence the factor 2; E adds at most n to |A + N|. The bound is a
    Chernoff bound, not the Gaussian tail (which at k = 6 would be 2e-9): it holds for every update
    direction and every noise variance, and the extra term vanishes as σ grows.
    """
    k = check_positive("overflow_sigmas", overflow_sigmas)
    sigma = check_positive("planned_std", planned_std)
    exponent = -0.5 * k * k + k**4 * math.cosh(min(k / sigma, 700.0)) / (24.0 * sigma * sigma)
    return min(1.0, 2.0 * math.exp(min(exponent, 0.0)))


def scale_for_bits(
    *,
    bits: int,
    clip_norm: float,
    dim: int,
    n_clients: int,
    noise_multiplier: float,
    min_survivors: int,
    beta: float = DEFAULT_BETA,
    overflow_sigmas: float = DEFAULT_OVERFLOW_SIGMAS,
) -> float:
    r"""The largest scale s whose planned sum fits the centred range: :math:`h(s) \le 2^{b-1} - 1`.

    Choosing s is the utility trade-off of KLS21 §5: a large s makes the rounding
    inflation of the sensitivity (:func:`rounded_l2_norm_bound`, +D/4 under the root)
    negligible, a small s keeps the sum inside 2^b. A coordinate beyond
    :math:`\pm 2^{b-1}` wraps: the decoded update is wrong (utility), never less
    private (privacy rests on the enforced norm bound and the noise alone). The promise: each coordinate
    wraps with probability at most :func:`wrap_probability_bound` (k, σ(s)) ≈ 2e^{-k²/2}, 3e-8 for k = 6,
    for updates in any directions (the rotation's flattening, :func:`rotation_flattening`, is in σ).

    The scale is also capped so that μ = (zΔ̃₂)² ≤ MAX_POISSON_LAMBDA/4 (NumPy's Poisson sampler is
    accurate there, :mod:`.skellam`); with many bits this cap, not b, fixes s, and the rounding's cost
    shows in the effective noise multiplier (:attr:`SkellamCalibration.effective_noise_multiplier`).

    ``n_clients``: clients sampled; ``min_survivors``: m, the fewest whose noise is in
    a revealed sum (each adds μ/m). ValueError naming ``bits`` if no s > 0 fits.
    """
    b = check_int("bits", bits, minimum=2)
    if b > MAX_BITS:
        raise ValueError(f"bits must be an integer in [2, {MAX_BITS}], got {bits!r}")
    c = check_positive("clip_norm", clip_norm)
    d = check_int("dim", dim, minimum=1)  # the encoded length: the rotation pads nothing
    n = check_int("n_clients", n_clients, minimum=1)
    m = check_int("min_survivors", min_survivors, minimum=1)
    z = check_positive("noise_multiplier", noise_multiplier)
    k = check_positive("overflow_sigmas", overflow_sigmas)
    _check_beta(beta)
    limit = float((1 << (b - 1)) - 1)

    def fits(scale: float) -> bool:
        if noise_multiplier * rounded_l2_norm_bound(scale * c, d, beta) > _MAX_NOISE_STD:
            return False  # μ = (zΔ̃₂)² must stay where the Poisson sampler is accurate (skellam.MAX_POISSON_LAMBDA)
        return (
            sum_headroom(
                scale,
                clip_norm=c,
                padded_dim=d,
                n_clients=n,
                noise_multiplier=z,
                min_survivors=m,
                beta=beta,
                overflow_sigmas=k,
            )
            <= limit
        )

    low, high = 0.0, _MAX_SCALED_NORM / c
    if not fits(high * 1e-20):
        raise ValueError(
            f"bits must be larger: {b} bits cannot hold the sum of {n} rounded, noised vectors of "
            f"dimension {d} at noise multiplier {z} (got bits={bits!r})"
        )
    if fits(high):
        return high
    for _ in range(200):
        mid = 0.5 * (low + high) if high / max(low, 1e-300) < 4.0 else math.sqrt(max(low, high * 1e-20) * high)
        low, high = (mid, high) if fits(mid) else (low, mid)
        if high - low <= 1e-9 * high:
            break
    return low


__all__ = [
    "DEFAULT_BETA",
    "DEFAULT_OVERFLOW_SIGMAS",
    "DistributedDpParams",
    "MAX_BITS",
    "SkellamCalibration",
    "calibrate_skellam",
    "client_integer_vector",
    "conditional_randomized_round",
    "decode_sum",
    "encode_update",
    "inverse_random_rotation",
    "inverse_randomized_hadamard",
    "l2_clip",
    "modular_sum",
    "padded_dimension",
    "planned_sum_std",
    "random_rotation",
    "randomized_hadamard",
    "rotation_flattening",
    "rotation_kind",
    "rounded_l2_norm_bound",
    "scale_for_bits",
    "sum_headroom",
    "to_modular",
    "walsh_hadamard",
    "wrap_probability_bound",
]
