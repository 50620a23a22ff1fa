"""The un-padded rotation of the distributed-DP encoding: orthonormal and inverted, its flattening bound
(F = 1 Hadamard, 2 DCT) tight and holding, and the wrap probability below what ``scale_for_bits`` promises."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.fft

from flwr_dp_strategies.privacy.mechanisms.distributed_dp import (
    DistributedDpParams,
    _rotation_signs,
    calibrate_skellam,
    client_integer_vector,
    decode_sum,
    encode_update,
    inverse_random_rotation,
    modular_sum,
    planned_sum_std,
    random_rotation,
    rotation_flattening,
    rotation_kind,
    scale_for_bits,
    sum_headroom,
    wrap_probability_bound,
)


def _matrix(dim: int, seed: int) -> np.ndarray:
    return np.stack([random_rotation(np.eye(dim)[i], seed) for i in range(dim)], axis=1)


@pytest.mark.parametrize("dim", [1, 2, 3, 7, 64, 96, 100, 127])
def test_rotation_is_orthonormal_and_pads_nothing(dim):
    rotation = _matrix(dim, seed=11)
    assert rotation.shape == (dim, dim)
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(dim), atol=1e-12)
    assert rotation_kind(dim) == ("hadamard" if dim & (dim - 1) == 0 else "dct")


@pytest.mark.parametrize("dim", [1, 3, 100, 1000, 1025, 4096, 50_890])
def test_rotation_is_exactly_inverted(dim):
    x = np.random.default_rng(dim).normal(size=dim) * 3.0
    y = random_rotation(x, rotation_seed=5)
    assert y.shape == (dim,)
    assert abs(np.linalg.norm(y) - np.linalg.norm(x)) <= 1e-12 * np.linalg.norm(x) * math.sqrt(dim)
    np.testing.assert_allclose(inverse_random_rotation(y, rotation_seed=5), x, atol=1e-12 * np.abs(x).max() * 50)
    assert dim == 1 or not np.allclose(random_rotation(x, rotation_seed=6), y)


def test_dct_rotation_is_the_signed_orthonormal_dct_ii():
    x = np.random.default_rng(1).normal(size=100)
    expected = scipy.fft.dct(x * _rotation_signs(9, 100), type=2, norm="ortho")
    np.testing.assert_allclose(random_rotation(x, 9), expected, atol=1e-13)


@pytest.mark.parametrize("dim", [3, 96, 100, 1000])
def test_flattening_constant_bounds_every_entry_and_is_attained(dim):
    """F·‖x‖²/d bounds the variance of every coordinate iff F/d ≥ max T_ji² (the variance is Σ T_ji² x_i²,
    x = e_i attains T_ji²); the DCT's largest squared entry is (2/d)cos²(π/(2d)): F = 2, and no F 10 % smaller."""
    unsigned = scipy.fft.dct(np.eye(dim), type=2, norm="ortho", axis=0)
    largest = float(np.max(unsigned**2)) * dim
    assert rotation_flattening(dim) == 2.0
    assert largest <= 2.0 + 1e-12
    assert largest > 0.9 * 2.0
    assert rotation_flattening(64) == 1.0 and np.allclose(np.abs(_matrix(64, 0)) ** 2 * 64, 1.0)


def test_flattening_bound_holds_statistically_and_is_tight():
    """Over 20 000 public sign draws (fixed seed), the empirical variance of a coordinate of the rotated vector
    stays within sampling error below F·‖x‖²/d and above 0.9× it (a bound 10 % too tight fails); the tails
    stay below the sub-Gaussian 2·exp(−t²/(2F‖x‖²/d))."""
    dim, draws = 100, 20_000
    x = np.zeros(dim)
    x[:4] = 0.5  # ‖x‖ = 1 on the coordinates where row 1 of the DCT is largest: the near-worst case
    gen = np.random.default_rng(2026)
    signs = 1.0 - 2.0 * (gen.random((draws, dim)) < 0.5)
    rotated = scipy.fft.dct(signs * x, type=2, norm="ortho", axis=1)  # random_rotation with fresh signs
    np.testing.assert_allclose(rotated[0], scipy.fft.dct(signs[0] * x, type=2, norm="ortho"))
    bound = rotation_flattening(dim) * float(x @ x) / dim
    variance = np.mean(rotated**2, axis=0)  # the mean is 0 by symmetry of the signs
    # Y_1 = Σ a_i s_i over 4 equal-ish terms: Var(Y²) ≤ 2σ⁴, so the estimate's relative error is ≤ √(2/draws)
    slack = 1.0 + 4.0 * math.sqrt(2.0 / draws)
    assert variance.max() <= bound * slack
    assert variance.max() > 0.9 * bound * slack  # 0.9·bound would be exceeded: the bound is tight
    for t in (1.0, 2.0, 3.0):
        threshold = t * math.sqrt(bound)
        tail = float(np.mean(np.abs(rotated) > threshold, axis=0).max())
        assert tail <= 2.0 * math.exp(-(threshold**2) / (2.0 * bound)) + 4.0 * math.sqrt(0.25 / draws)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: random_rotation(np.ones((2, 2)), 0), "x"),
        (lambda: random_rotation([1.0, float("nan")], 0), "x"),
        (lambda: random_rotation(np.ones(3), -1), "rotation_seed"),
        (lambda: inverse_random_rotation(np.ones(0), 0), "y"),
        (lambda: rotation_kind(0), "dim"),
        (lambda: planned_sum_std(0.0, clip_norm=1, padded_dim=3, n_clients=1, noise_multiplier=1, min_survivors=1), "scale"),
        (lambda: planned_sum_std(1.0, clip_norm=1, padded_dim=0, n_clients=1, noise_multiplier=1, min_survivors=1), "padded_dim"),
        (lambda: planned_sum_std(1.0, clip_norm=1, padded_dim=3, n_clients=1, noise_multiplier=1, min_survivors=0), "min_survivors"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_wrap_probability_bound_formula():
    assert wrap_probability_bound(6.0, 1e6) == pytest.approx(2.0 * math.exp(-18.0), rel=1e-9)
    assert wrap_probability_bound(6.0, 100.0) == pytest.approx(
        2.0 * math.exp(-18.0 + 6.0**4 * math.cosh(0.06) / (24.0 * 1e4)), rel=1e-12
    )
    assert wrap_probability_bound(0.5, 10.0) == 1.0
    for bad in (lambda: wrap_probability_bound(0.0, 1.0), lambda: wrap_probability_bound(1.0, -1.0)):
        with pytest.raises(ValueError, match="overflow_sigmas|planned_std"):
            bad()


@pytest.mark.parametrize("dim, overflow_sigmas", [(1000, 1.5), (1000, 2.5), (1024, 1.5)])
def test_wrap_rate_stays_below_the_promise_of_scale_for_bits(dim, overflow_sigmas):
    """n aligned clients (the plan's worst case: every update the same, ‖Δ‖ = C), scale from ``scale_for_bits``
    at small k so that wraps are frequent enough to count: the share of wrapped coordinates of the integer sum,
    over several public seeds, stays below the per-coordinate promise; unwrapped sums decode exactly."""
    n, clip, z, bits = 8, 1.0, 0.5, 14
    scale = scale_for_bits(
        bits=bits, clip_norm=clip, dim=dim, n_clients=n, noise_multiplier=z, min_survivors=n,
        overflow_sigmas=overflow_sigmas,
    )  # fmt: skip
    sigma = planned_sum_std(scale, clip_norm=clip, padded_dim=dim, n_clients=n, noise_multiplier=z, min_survivors=n)
    headroom = sum_headroom(
        scale, clip_norm=clip, padded_dim=dim, n_clients=n, noise_multiplier=z, min_survivors=n,
        overflow_sigmas=overflow_sigmas,
    )  # fmt: skip
    assert headroom <= 2 ** (bits - 1) - 1 < 1.01 * headroom
    promise = wrap_probability_bound(overflow_sigmas, sigma)
    gen = np.random.default_rng(int(dim * overflow_sigmas))
    update = np.zeros(dim)
    update[:3] = clip / math.sqrt(3.0)  # mass where the DCT's low rows are largest
    wrapped, total = 0, 0
    for seed in range(12):
        params = DistributedDpParams(dim=dim, clip_norm=clip, scale=scale, bits=bits, rotation_seed=seed)
        share = calibrate_skellam(params, noise_multiplier=z, n_clients=n).local_mu
        ints = [client_integer_vector(update, params, local_noise_variance=share, rng=gen) for _ in range(n)]
        exact = np.sum(ints, axis=0)
        out = np.abs(exact) > 2 ** (bits - 1) - 1
        wrapped += int(out.sum())
        total += dim
        summed = modular_sum([np.mod(k, params.modulus).astype(np.uint64) for k in ints], params)
        if not out.any():
            np.testing.assert_allclose(
                decode_sum(summed, params), inverse_random_rotation(exact / scale, seed), rtol=0, atol=1e-9
            )
    rate = wrapped / total
    assert rate <= promise, (rate, promise)
    assert overflow_sigmas > 2.0 or wrapped > 0  # at k = 1.5 the test does exercise wraps


def test_upload_of_the_mnist_mlp_is_under_0_8_of_dense_float32_at_20_bits():
    from flwr_dp_strategies.strategy.distributed_dp_fedavg import DistributedDpFedAvg

    dim = (28 * 28 + 1) * 64 + (64 + 1) * 10  # 50 890
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, bits=20, rotation_seed=0)
    assert strategy.upload_bytes(dim) == math.ceil(dim * 20 / 8) == 127_225
    assert strategy.upload_bytes(dim) / (4 * dim) <= 0.8
    params = DistributedDpParams(dim=dim, clip_norm=1.0, scale=100.0, bits=20, rotation_seed=3)
    assert encode_update(np.ones(dim), params, rng=0).shape == (dim,)
