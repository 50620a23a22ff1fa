"""BandMF's keyed noise stream (issue 39 item 3): Z_t is a pure function of (key, t), standard normal by the usual
tests, and a stream rebuilt from the key continues bit-exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from flwr_dp_strategies.privacy.mechanisms import matrix_factorization as mf

SIZE = 400_000  # several blocks, an odd tail included below
Z_LIMIT = 5.0  # |z-score| bound of each moment test: P(|N(0,1)| > 5) = 5.7e-7


def moment_z_scores(x: np.ndarray, std: float = 1.0) -> tuple[float, float]:
    """z-scores of the sample mean (se σ/√n) and of the sample variance (se σ²√(2/n)) against N(0, std²)."""
    n = x.size
    mean = float(np.mean(x))
    var = float(np.mean(x * x))  # mean 0 known
    return mean / (std / math.sqrt(n)), (var - std**2) / (std**2 * math.sqrt(2.0 / n))


@pytest.mark.parametrize("seed, release", [(0, 1), (1, 7), (2, 2**40)])
def test_the_keyed_normals_are_standard_normal(seed, release):
    x = mf.keyed_standard_normal(mf.noise_key(seed), release, SIZE + 3)
    assert x.dtype == np.float64 and x.shape == (SIZE + 3,) and np.all(np.isfinite(x))
    mean_z, var_z = moment_z_scores(x)
    assert abs(mean_z) < Z_LIMIT and abs(var_z) < Z_LIMIT, (mean_z, var_z)
    # Kolmogorov-Smirnov: the critical value at level 1e-6 is about sqrt(-ln(5e-7)/2)/sqrt(n) = 2.7/sqrt(n)
    assert stats.kstest(x, "norm").pvalue > 1e-6
    # the two halves of each Box-Muller pair and consecutive values are uncorrelated (se 1/sqrt(n))
    assert abs(np.corrcoef(x[:-1], x[1:])[0, 1]) * math.sqrt(x.size) < Z_LIMIT
    half = mf.BLOCK // 2
    first = x[: mf.BLOCK * 6].reshape(6, mf.BLOCK)
    assert abs(np.corrcoef(first[:, :half].ravel(), first[:, half:].ravel())[0, 1]) * math.sqrt(3 * mf.BLOCK) < Z_LIMIT


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_a_std_ten_percent_off_is_detected(factor):
    """The variance test above fails for noise whose std is 10 % off (here: the right stream scaled)."""
    x = factor * mf.keyed_standard_normal(mf.noise_key(0), 1, SIZE)
    assert abs(moment_z_scores(x)[1]) > Z_LIMIT
    assert stats.kstest(x, "norm").pvalue < 1e-6


def test_the_stream_is_a_function_of_the_key_the_release_and_the_block():
    key = mf.noise_key(5)
    a = mf.keyed_standard_normal(key, 3, 2 * mf.BLOCK + 11)
    np.testing.assert_array_equal(a, mf.keyed_standard_normal(key, 3, 2 * mf.BLOCK + 11))
    np.testing.assert_array_equal(a[: mf.BLOCK], mf.keyed_standard_normal(key, 3, mf.BLOCK))  # block by block
    assert np.corrcoef(a[: mf.BLOCK], a[mf.BLOCK : 2 * mf.BLOCK])[0, 1] ** 2 * mf.BLOCK < Z_LIMIT**2
    other_release = mf.keyed_standard_normal(key, 4, a.size)
    other_key = mf.keyed_standard_normal(mf.noise_key(6), 3, a.size)
    for b in (other_release, other_key):
        assert not np.any(a == b)
        assert np.corrcoef(a, b)[0, 1] ** 2 * a.size < Z_LIMIT**2


def test_keys_come_from_os_entropy_unless_a_test_seed_is_given():
    assert len({mf.noise_key() for _ in range(4)}) == 4 and len(mf.noise_key()) == mf.KEY_BYTES
    assert mf.noise_key(3) == mf.noise_key(3) != mf.noise_key(4)
    assert mf.noise_key(np.random.default_rng(1)) == mf.noise_key(np.random.default_rng(1))
    with pytest.raises(ValueError, match="rng"):
        mf.noise_key(-1)


@pytest.mark.parametrize("bands, dimension", [(1, 7), (4, mf.BLOCK + 5), (10, 1000)])
def test_a_stream_rebuilt_from_the_key_continues_bit_exactly(bands, dimension):
    c = mf.banded_sqrt_coefficients(bands)
    key = mf.noise_key(8)
    whole = mf.BandedNoise(c, dimension, key)
    straight = [whole.next().copy() for _ in range(13)]
    restarted = mf.BandedNoise(c, dimension, key)
    restarted.fast_forward(9)
    assert restarted.count == 9
    for t in range(9, 13):
        np.testing.assert_array_equal(restarted.next(), straight[t])
    np.testing.assert_array_equal(restarted.buffer, whole.buffer)
    assert restarted.check_value() == whole.check_value() != ""
    # the rows are forward substitution of C over the keyed Z
    z = np.stack([mf.keyed_standard_normal(key, t, dimension) for t in range(1, 14)])
    np.testing.assert_allclose(np.stack(straight), np.linalg.solve(mf.toeplitz_matrix(c, 13), z), rtol=1e-9, atol=1e-9)


def test_a_row_is_a_read_only_view_and_the_memory_is_b_minus_1_rows():
    noise = mf.BandedNoise(mf.banded_sqrt_coefficients(4), 10, bytes(32))
    row = noise.next()
    with pytest.raises(ValueError):
        row[0] = 1.0
    assert noise.buffer.shape == (3, 10) and noise._ring.nbytes == 3 * 10 * 8


def test_the_check_value_depends_on_the_key_and_the_release():
    c = mf.banded_sqrt_coefficients(3)
    a, b = mf.BandedNoise(c, 50, mf.noise_key(1)), mf.BandedNoise(c, 50, mf.noise_key(2))
    a.next(), b.next()
    assert a.check_value() != b.check_value()
    first = a.check_value()
    a.next()
    assert a.check_value() != first and len(first) == 64


def test_the_rows_do_not_depend_on_the_threads():
    c = mf.banded_sqrt_coefficients(5)
    dimension = 3 * mf.BLOCK + 17
    one = mf.BandedNoise(c, dimension, mf.noise_key(4), threads=1)
    three = mf.BandedNoise(c, dimension, mf.noise_key(4), threads=3)
    for _ in range(6):
        np.testing.assert_array_equal(one.next(), three.next())


def test_a_prepared_row_is_the_next_row():
    c = mf.banded_sqrt_coefficients(4)
    straight, prepared = mf.BandedNoise(c, 1000, mf.noise_key(2)), mf.BandedNoise(c, 1000, mf.noise_key(2))
    for t in range(1, 8):
        prepared.prepare()
        prepared.prepare()  # idempotent: one row
        if t == 3:
            prepared.settle()
            assert prepared.count == 3
        np.testing.assert_array_equal(prepared.next(), straight.next())
        assert prepared.count == straight.count == t
    np.testing.assert_array_equal(prepared.buffer, straight.buffer)
    assert prepared.check_value() == straight.check_value()
