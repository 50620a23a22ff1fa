"""Distributed-DP encoding (issue 19, first step): clip, rotate, scale, round, Skellam, mod 2^b, and decoding.

No Flower and no secure aggregation: :func:`modular_sum` stands in for the secure sum.
Seeds are fixed; statistical tolerances are derived from the sample sizes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event as d
from scipy.linalg import hadamard

from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms.distributed_dp import (
    DistributedDpParams,
    _rotation_signs,
    calibrate_skellam,
    client_integer_vector,
    conditional_randomized_round,
    decode_sum,
    encode_update,
    inverse_random_rotation,
    inverse_randomized_hadamard,
    l2_clip,
    modular_sum,
    padded_dimension,
    randomized_hadamard,
    rounded_l2_norm_bound,
    to_modular,
    walsh_hadamard,
)
from flwr_dp_strategies.privacy.mechanisms.skellam import SkellamDpEvent


def _params(**overrides) -> DistributedDpParams:
    base = dict(dim=300, clip_norm=1.0, scale=50.0, bits=24, rotation_seed=2024)
    return DistributedDpParams(**(base | overrides))


# ---------------------------------------------------------------- rotation
@pytest.mark.parametrize("size", [1, 2, 4, 8, 64, 256])
def test_fast_walsh_hadamard_equals_the_sylvester_matrix(size):
    x = np.random.default_rng(size).normal(size=size)
    np.testing.assert_allclose(walsh_hadamard(x), hadamard(size) @ x, atol=1e-12)


@pytest.mark.parametrize("dim", [1, 3, 100, 1000, 1025])
def test_rotation_preserves_the_norm_and_is_inverted(dim):
    x = np.random.default_rng(dim).normal(size=dim) * 3.0
    y = randomized_hadamard(x, rotation_seed=7)
    assert y.shape == (padded_dimension(dim),)
    assert abs(np.linalg.norm(y) - np.linalg.norm(x)) <= 1e-9 * np.linalg.norm(x)
    np.testing.assert_allclose(inverse_randomized_hadamard(y, dim, rotation_seed=7), x, atol=1e-9)
    assert not np.allclose(randomized_hadamard(x, rotation_seed=8), y) or dim == 1


def test_rotation_matrix_is_orthonormal():
    size = 32
    rotation = np.stack([randomized_hadamard(np.eye(size)[i], rotation_seed=3) for i in range(size)], axis=1)
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(size), atol=1e-12)


def test_rotation_signs_are_pinned_to_the_raw_pcg64_stream():
    """Clients and server must derive the same signs; the raw bit stream is stable across NumPy versions."""
    assert _rotation_signs(0, 16).astype(int).tolist() == [-1, -1, -1, -1, -1, 1, -1, 1, 1, -1, 1, 1, 1, 1, 1, -1]
    assert _rotation_signs(12345, 70)[64:].astype(int).tolist() == [1, -1, -1, -1, -1, 1]


def test_rotation_spreads_a_spike():
    y = randomized_hadamard(np.eye(1024)[5] * 10.0, rotation_seed=1)
    np.testing.assert_allclose(np.abs(y), 10.0 / 32.0)


# ---------------------------------------------------------------- conditional rounding
def test_rounding_bound_formula_matches_kls21():
    c, dim, beta = 20.0, 256, math.exp(-0.5)
    expected = math.sqrt(c * c + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(dim) / 2))
    assert rounded_l2_norm_bound(c, dim, beta) == pytest.approx(expected)
    assert rounded_l2_norm_bound(c, dim, 0.0) == c + math.sqrt(dim)
    assert rounded_l2_norm_bound(0.0, 4, 1e-12) == 2.0  # here the deterministic c + √D is the smaller one


@pytest.mark.parametrize("norm, dim", [(3.0, 16), (30.0, 64), (100.0, 1024), (1000.0, 1024)])
def test_conditional_rounding_always_respects_its_bound(norm, dim):
    gen = np.random.default_rng(int(norm))
    bound = rounded_l2_norm_bound(norm, dim)
    for _ in range(200):
        x = gen.normal(size=dim)
        x *= norm / np.linalg.norm(x)
        k = conditional_randomized_round(x, bound, gen)
        assert k.dtype == np.int64
        assert np.linalg.norm(k) <= bound
        assert np.all((k == np.floor(x)) | (k == np.floor(x) + 1))


def test_rounding_is_unbiased_when_the_condition_rarely_binds():
    """c = 5, D = 64: P[reject] is negligible, so the mean of N draws is x within 5 standard errors (≤ 1/(2√N))."""
    gen = np.random.default_rng(0)
    x = gen.normal(size=64)
    x *= 5.0 / np.linalg.norm(x)
    bound = rounded_l2_norm_bound(5.0, 64)
    n = 20_000
    draws = np.stack([conditional_randomized_round(x, bound, gen) for _ in range(n)])
    frac = x - np.floor(x)
    std_err = np.sqrt(frac * (1 - frac) / n)
    assert np.all(np.abs(draws.mean(axis=0) - x) <= 5.0 * std_err + 1e-12)


def test_conditional_rounding_bias_is_bounded_by_the_rejection_rate():
    """With c/√D large the norm condition rejects a few per cent; the mean shifts by at most
    p/(1 − p)·√D in L2 norm (p = rejection rate: rejected draws are within √D of x), plus sampling error."""
    gen = np.random.default_rng(1)
    dim, norm = 64, 30.0
    x = gen.normal(size=dim)
    x *= norm / np.linalg.norm(x)
    bound = rounded_l2_norm_bound(norm, dim)
    n = 20_000
    frac = x - np.floor(x)
    raw = np.floor(x) + (gen.random((n, dim)) < frac)
    p_reject = float(np.mean(np.linalg.norm(raw, axis=1) > bound))
    assert 0.0 < p_reject < 0.2
    draws = np.stack([conditional_randomized_round(x, bound, gen) for _ in range(n)])
    bias = np.linalg.norm(draws.mean(axis=0) - x)
    sampling = 5.0 * math.sqrt(dim / (4.0 * n))
    assert bias <= (p_reject * 1.5) / (1 - p_reject * 1.5) * math.sqrt(dim) + sampling


def test_rounding_gives_up_loudly_when_the_bound_is_unreachable():
    with pytest.raises(RuntimeError, match="attempts"):
        conditional_randomized_round(np.full(4, 1.5), 0.1, rng=0, max_attempts=20)


# ---------------------------------------------------------------- encode / sum / decode
def test_noiseless_sum_is_exact_mod_2b_and_decodes_to_the_clipped_sum():
    params = _params(dim=300, bits=16)
    gen = np.random.default_rng(42)
    updates = [gen.normal(size=300) * s for s in (0.01, 0.05, 0.1, 0.2, 5.0)]  # the last one is clipped
    ints = [client_integer_vector(u, params, rng=gen) for u in updates]
    encoded = [to_modular(k, params.bits) for k in ints]
    summed = modular_sum(encoded, params)
    exact = np.mod(np.sum(ints, axis=0), params.modulus)
    np.testing.assert_array_equal(summed.astype(np.int64), exact)  # exactly the integer sum mod 2^b
    assert np.any(np.sum(ints, axis=0) < 0)  # negative coordinates did wrap, and came back

    decoded = decode_sum(summed, params)
    clipped_sum = sum(l2_clip(u, params.clip_norm) for u in updates)
    np.testing.assert_allclose(
        decoded, inverse_random_rotation(np.sum(ints, axis=0) / params.scale, params.rotation_seed), atol=1e-9
    )
    # rounding moves each of the D coordinates of each client by < 1/s; the rotation is orthonormal
    error = np.linalg.norm(decoded - clipped_sum)
    assert error <= len(updates) * math.sqrt(params.padded_dim) / params.scale
    # and typically far less: the n·D rounding errors are independent with variance ≤ 1/4, so the norm
    # of their sum concentrates at or below its RMS √(nD/4)/s (1.5× leaves a wide margin)
    assert error <= 1.5 * math.sqrt(len(updates) * params.padded_dim / 4.0) / params.scale


def test_encode_update_is_to_modular_of_the_integer_vector():
    params = _params()
    update = np.random.default_rng(3).normal(size=300)
    a = encode_update(update, params, local_noise_variance=4.0, rng=9)
    b = to_modular(client_integer_vector(update, params, local_noise_variance=4.0, rng=9), params.bits)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.uint64 and int(a.max()) < params.modulus


def test_every_client_vector_respects_the_sensitivities_whatever_the_update():
    params = _params(dim=100, scale=20.0)
    cal = calibrate_skellam(params, noise_multiplier=1.0, n_clients=10)
    gen = np.random.default_rng(8)
    for scale in (1e-3, 0.1, 1.0, 1e3, 1e6):
        k = client_integer_vector(gen.normal(size=100) * scale, params, rng=gen)
        assert np.linalg.norm(k) <= cal.l2_sensitivity
        assert np.abs(k).sum() <= cal.l1_sensitivity


def test_noisy_decoded_sum_has_the_calibrated_noise():
    """With noise, decoded − Σ clipped = rounding + Sk(μ) rotated back: per-coordinate variance in
    [μ/s², (μ + n/4)/s²]; the estimate over d coordinates has relative error ≈ √(2/d), 5σ tolerance."""
    n_clients, dim = 8, 2000
    params = _params(dim=dim, scale=30.0, bits=20)
    cal = calibrate_skellam(params, noise_multiplier=0.8, n_clients=n_clients)
    assert cal.bits_needed <= params.bits
    gen = np.random.default_rng(17)
    updates = [gen.normal(size=dim) * 0.05 for _ in range(n_clients)]
    encoded = [encode_update(u, params, local_noise_variance=cal.local_mu, rng=gen) for u in updates]
    error = decode_sum(modular_sum(encoded, params), params) - sum(l2_clip(u, 1.0) for u in updates)
    tol = 5.0 * math.sqrt(2.0 / dim)
    low = cal.mu / params.scale**2
    high = (cal.mu + n_clients / 4.0) / params.scale**2
    assert low * (1 - tol) <= np.mean(error**2) <= high * (1 + tol)
    assert cal.noise_std == pytest.approx(math.sqrt(cal.mu) / params.scale)


def test_a_sum_beyond_the_modular_range_wraps_and_is_flagged_by_bits_needed():
    params = _params(dim=4, clip_norm=1.0, scale=1000.0, bits=8)
    cal = calibrate_skellam(params, noise_multiplier=0.5, n_clients=4)
    assert cal.bits_needed > params.bits
    update = np.array([1.0, 0.0, 0.0, 0.0])
    encoded = [encode_update(update, params, rng=i) for i in range(4)]
    decoded = decode_sum(modular_sum(encoded, params), params)
    assert np.linalg.norm(decoded - 4 * update) > 0.5  # silently wrong: the caller must respect bits_needed


# ---------------------------------------------------------------- calibration and accounting
def test_calibration_matches_the_rounding_bound_and_books_a_skellam_event():
    params = _params(dim=1000, scale=100.0, bits=24)
    cal = calibrate_skellam(params, noise_multiplier=1.2, n_clients=20)
    l2 = params.rounding_bound
    assert cal.l2_sensitivity == l2
    assert cal.mu == pytest.approx((1.2 * l2) ** 2)
    assert cal.local_mu == pytest.approx(cal.mu / 20)
    assert cal.l1_sensitivity == min(math.floor(l2 * l2), math.sqrt(params.padded_dim) * l2)
    assert cal.l1_sensitivity <= math.sqrt(params.padded_dim) * l2
    assert cal.effective_noise_multiplier >= 1.2
    assert cal.event == SkellamDpEvent(cal.l1_sensitivity, l2, cal.mu)
    ledger, gaussian = PrivacyLedger(1e-5), PrivacyLedger(1e-5, accounting="rdp")
    for r in range(1, 11):
        ledger.record(cal.event, server_round=r)
        gaussian.record(d.GaussianDpEvent(1.2), server_round=r)
    assert math.isfinite(ledger.epsilon())
    assert gaussian.epsilon() <= ledger.epsilon() <= 1.05 * gaussian.epsilon()


def test_more_noise_means_smaller_epsilon():
    params = _params()
    eps = []
    for z in (0.5, 1.0, 2.0, 4.0):
        ledger = PrivacyLedger(1e-5)
        ledger.record(calibrate_skellam(params, noise_multiplier=z, n_clients=5).event, server_round=1)
        eps.append(ledger.epsilon())
    assert all(a > b for a, b in zip(eps, eps[1:]))


# ---------------------------------------------------------------- argument validation
_BAD_CALLS = [
    (lambda: DistributedDpParams(dim=0, clip_norm=1.0, scale=1.0, bits=8, rotation_seed=0), "dim"),
    (lambda: DistributedDpParams(dim=4, clip_norm=-1.0, scale=1.0, bits=8, rotation_seed=0), "clip_norm"),
    (lambda: DistributedDpParams(dim=4, clip_norm=1.0, scale=float("nan"), bits=8, rotation_seed=0), "scale"),
    (lambda: DistributedDpParams(dim=4, clip_norm=1.0, scale=1e20, bits=8, rotation_seed=0), "scale"),
    (lambda: DistributedDpParams(dim=4, clip_norm=1.0, scale=1.0, bits=1, rotation_seed=0), "bits"),
    (lambda: DistributedDpParams(dim=4, clip_norm=1.0, scale=1.0, bits=63, rotation_seed=0), "bits"),
    (lambda: DistributedDpParams(dim=4, clip_norm=1.0, scale=1.0, bits=8, rotation_seed=-1), "rotation_seed"),
    (lambda: DistributedDpParams(dim=4, clip_norm=1.0, scale=1.0, bits=8, rotation_seed=1.5), "rotation_seed"),
    (lambda: DistributedDpParams(dim=4, clip_norm=1.0, scale=1.0, bits=8, rotation_seed=0, beta=1.0), "beta"),
    (lambda: randomized_hadamard([1.0, float("inf")], 0), "x"),
    (lambda: randomized_hadamard(np.ones((2, 2)), 0), "x"),
    (lambda: inverse_randomized_hadamard(np.ones(3), 3, 0), "y"),
    (lambda: walsh_hadamard(np.ones(3)), "power of two"),
    (lambda: l2_clip([1.0], 0.0), "clip_norm"),
    (lambda: rounded_l2_norm_bound(-1.0, 4), "scaled_norm_bound"),
    (lambda: rounded_l2_norm_bound(1.0, 0), "dim"),
    (lambda: rounded_l2_norm_bound(1.0, 4, beta=-0.1), "beta"),
    (lambda: conditional_randomized_round([0.5], 0.0), "norm_bound"),
    (lambda: conditional_randomized_round([0.5], 1.0, max_attempts=0), "max_attempts"),
    (lambda: client_integer_vector(np.ones(5), _params()), "update"),
    (lambda: client_integer_vector(np.ones(300), _params(), local_noise_variance=-1.0), "local_noise_variance"),
    (lambda: client_integer_vector(np.ones(300), "params"), "params"),
    (lambda: to_modular(np.ones(3), 8), "integer"),
    (lambda: to_modular(np.ones(3, dtype=np.int64), 70), "bits"),
    (lambda: modular_sum([], _params()), "at least one"),
    (lambda: modular_sum([np.zeros(300, dtype=np.int64)], _params()), "uint64"),
    (lambda: modular_sum([np.full(300, 2**30, dtype=np.uint64)], _params()), r"\[0, 2\*\*24\)"),
    (lambda: decode_sum(np.zeros(7, dtype=np.uint64), _params()), "shape"),
    (lambda: decode_sum(np.full(300, -1, dtype=np.int64), _params()), r"\[0, 2\*\*24\)"),
    (lambda: calibrate_skellam(_params(), noise_multiplier=0.0, n_clients=3), "noise_multiplier"),
    (lambda: calibrate_skellam(_params(), noise_multiplier=1.0, n_clients=0), "n_clients"),
]


@pytest.mark.parametrize("call, field", _BAD_CALLS, ids=[f"{i}-{f}" for i, (_, f) in enumerate(_BAD_CALLS)])
def test_arguments_are_validated_with_the_parameter_named(call, field):
    with pytest.raises(ValueError, match=field):
        call()
