"""The one-pass central release and the blockwise float64 norm (issue 40 item 1) compute what the separate passes
computed: the same noise draws, the same values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flwr_dp_strategies.rounds.central_release import fixed_denominator_release
from flwr_dp_strategies.rounds.streaming_aggregation import (
    _NOISE_CHUNK,
    ClippedSum,
    add_gaussian_noise,
    noisy_mean_inplace,
    squared_norm_float64,
)
from flwr_dp_strategies.strategy.client_side_adaptive_clipping import clipped_norm_limit


def _summed(d: int, dtype=np.float32) -> ClippedSum:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(d).astype(dtype)
    summed = ClippedSum({"w": reference}, 1.0)
    for _ in range(3):
        assert summed.add([reference + rng.standard_normal(d).astype(dtype)]) is not None
    return summed


@pytest.mark.parametrize("d", [7, 3000, 2 * _NOISE_CHUNK + 5])
@pytest.mark.parametrize("sigma", [0.0, 0.3])
def test_one_pass_equals_the_separate_passes_bit_for_bit(d, sigma):
    a, b = _summed(d), _summed(d)
    expected = a.result()["w"]
    np.divide(expected, 4, out=expected)
    if sigma:
        add_gaussian_noise(expected, sigma, np.random.default_rng(11))
    np.add(expected, a.reference["w"], out=expected, casting="same_kind")
    sums, offset = b.raw()
    assert offset > 0
    assert noisy_mean_inplace(sums["w"], b.reference["w"], offset, 4, sigma, np.random.default_rng(11))
    np.testing.assert_array_equal(sums["w"], expected)


def test_the_release_draws_the_noise_of_one_normal_call():
    d, sigma = _NOISE_CHUNK + 100, 0.5
    summed = _summed(d)
    reference = summed.reference["w"].copy()
    mean = summed.result()["w"] / 4 + reference  # the noiseless release, as the separate passes computed it
    released = fixed_denominator_release(_summed(d), 4, sigma, np.random.default_rng(3))["w"].numpy()
    noise = np.random.default_rng(3).normal(0.0, sigma, d)
    np.testing.assert_allclose(released, (mean + noise).astype(np.float32), rtol=0, atol=2e-6)


def test_non_contiguous_arrays_are_left_to_the_separate_passes():
    acc = np.zeros((4, 6), np.float32)[:, ::2]
    assert not noisy_mean_inplace(acc, np.zeros((4, 3), np.float32), 1.0, 2, 0.1, np.random.default_rng(0))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.float64])
def test_blockwise_float64_norm_matches_the_float64_copy(dtype):
    values = (np.random.default_rng(1).standard_normal(300_003) * 50).astype(dtype)
    exact = math.fsum(float(v) ** 2 for v in values.astype(np.float64))
    assert squared_norm_float64(values) == pytest.approx(exact, rel=1e-12)
    assert squared_norm_float64(values.reshape(3, -1)[:, ::2]) == pytest.approx(
        math.fsum(float(v) ** 2 for v in values.reshape(3, -1)[:, ::2].ravel().astype(np.float64)), rel=1e-12
    )


def test_client_side_norm_limit_is_unchanged():
    w = {"a": np.full(1000, 3.0, np.float32), "b": np.arange(10, dtype=np.float32)}
    norm = math.sqrt(1000 * 9.0 + sum(i * i for i in range(10)))
    u = float(np.finfo(np.float32).eps) / 2
    expected = 0.5 * (1 + 1e-6) + 2 * u * ((math.ceil(math.log2(1010)) + 5) * 0.5 + norm)
    assert clipped_norm_limit(w, 0.5) == pytest.approx(expected, rel=1e-12)
