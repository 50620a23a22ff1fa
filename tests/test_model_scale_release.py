"""Issue 40 item 1: the central release draws the noise of one ``rng.normal`` call and nothing when sigma = 0 (Flower's
sampler adds the noise afterwards); the client-side norm limit reads ||w|| in float64 blocks, with the value of the
float64 copy it replaced."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flwr_dp_strategies.rounds.central_release import fixed_denominator_release
from flwr_dp_strategies.rounds.streaming_aggregation import _NOISE_CHUNK, ClippedSum, squared_norm_float64
from flwr_dp_strategies.strategy.client_side_adaptive_clipping import clipped_norm_limit


def _summed(d: int, dtype=np.float32) -> ClippedSum:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(d).astype(dtype)
    summed = ClippedSum({"w": reference}, 1.0)
    for _ in range(3):
        assert summed.add([reference + rng.standard_normal(d).astype(dtype)]) is not None
    return summed


def test_the_release_draws_the_noise_of_one_normal_call():
    d, sigma = _NOISE_CHUNK + 100, 0.5
    summed = _summed(d)
    reference = summed.reference["w"].copy()
    mean = summed.result()["w"] / 4 + reference  # the noiseless release, as the separate passes computed it
    released = fixed_denominator_release(_summed(d), 4, sigma, np.random.default_rng(3))["w"].numpy()
    noise = np.random.default_rng(3).normal(0.0, sigma, d)
    np.testing.assert_allclose(released, (mean + noise).astype(np.float32), rtol=0, atol=2e-6)


def test_sigma_zero_draws_nothing():
    generator = np.random.default_rng(4)
    summed = _summed(1000)
    mean = summed.result()["w"] / 4 + summed.reference["w"]
    released = fixed_denominator_release(_summed(1000), 4, 0.0, generator)["w"].numpy()
    np.testing.assert_allclose(released, mean, rtol=0, atol=1e-6)
    assert generator.bit_generator.state == np.random.default_rng(4).bit_generator.state


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
