"""Bad input gets a ValueError naming the parameter and its domain; randomness is fresh by default."""

import math

import numpy as np
import pytest

from flwr_dp_strategies.privacy.mechanisms.gaussian import classical_gaussian_sigma
from flwr_dp_strategies.privacy import (
    ApproxDpEvent,
    ExponentialMechanismDpEvent,
    binary_randomized_response,
    exponential_mechanism,
    gaussian_mechanism,
    gaussian_sigma,
    kary_randomized_response,
    laplace_mechanism,
)
from flwr_dp_strategies.privacy.rng import resolve_rng

BAD_EPS = [0.0, -1.0, math.nan, math.inf, "1", None, True]


@pytest.mark.parametrize("eps", BAD_EPS)
def test_bad_epsilon_everywhere(eps):
    calls = [
        lambda: laplace_mechanism([1.0], epsilon=eps),
        lambda: binary_randomized_response([0, 1], epsilon=eps),
        lambda: kary_randomized_response([0, 1], epsilon=eps, num_classes=3),
        lambda: exponential_mechanism([0.0, 1.0], epsilon=eps),
        lambda: gaussian_sigma(eps, 1e-5),
        lambda: ExponentialMechanismDpEvent(eps),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="epsilon"):
            call()


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
        gaussian_sigma(1.0, delta)
    with pytest.raises(ValueError, match="delta"):
        ApproxDpEvent(1.0, delta)


@pytest.mark.parametrize("sens", [0.0, -2.0, math.inf, math.nan])
def test_bad_sensitivity(sens):
    with pytest.raises(ValueError, match="sensitivity"):
        laplace_mechanism([1.0], epsilon=1.0, sensitivity=sens)
    with pytest.raises(ValueError, match="sensitivity"):
        gaussian_mechanism([1.0], noise_multiplier=1.0, sensitivity=sens)
    with pytest.raises(ValueError, match="sensitivity"):
        exponential_mechanism([1.0, 2.0], epsilon=1.0, sensitivity=sens)


@pytest.mark.parametrize(
    "values", [[1.0, math.nan], [math.inf], np.array(["a", "b"]), np.array([{}], dtype=object), np.array([True, False])]
)
def test_bad_values(values):
    with pytest.raises(ValueError, match="values"):
        laplace_mechanism(values, epsilon=1.0)
    with pytest.raises(ValueError, match="values"):
        gaussian_mechanism(values, noise_multiplier=1.0)


def test_bad_labels_and_classes():
    with pytest.raises(ValueError, match="labels"):
        kary_randomized_response([0, 3], epsilon=1.0, num_classes=3)
    with pytest.raises(ValueError, match="labels"):
        kary_randomized_response([0.5], epsilon=1.0, num_classes=3)
    with pytest.raises(ValueError, match="num_classes"):
        kary_randomized_response([0], epsilon=1.0, num_classes=1)
    with pytest.raises(ValueError, match="bits"):
        binary_randomized_response([0, 2], epsilon=1.0)


def test_bad_em_arguments():
    with pytest.raises(ValueError, match="k must be in"):
        exponential_mechanism([1.0, 2.0], epsilon=1.0, k=3)
    with pytest.raises(ValueError, match="utilities"):
        exponential_mechanism([[1.0, 2.0]], epsilon=1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        gaussian_mechanism([1.0], noise_multiplier=0.0)
    with pytest.raises(ValueError, match="value_bound"):
        laplace_mechanism([1.0], epsilon=1.0, secure=True)


def test_classical_gaussian_only_below_one():
    with pytest.raises(ValueError, match=r"epsilon must be in \(0, 1\)"):
        classical_gaussian_sigma(1.0, 1e-5)
    # The analytic calibration is never noisier than the classical formula where both apply.
    assert gaussian_sigma(0.5, 1e-5) < classical_gaussian_sigma(0.5, 1e-5)


def test_default_randomness_is_fresh_and_seeds_reproduce():
    a = laplace_mechanism(np.zeros(8), epsilon=1.0).value
    b = laplace_mechanism(np.zeros(8), epsilon=1.0).value
    assert not np.array_equal(a, b)
    c = laplace_mechanism(np.zeros(8), epsilon=1.0, rng=42).value
    d = laplace_mechanism(np.zeros(8), epsilon=1.0, rng=42).value
    assert np.array_equal(c, d)
    gen = np.random.default_rng(3)
    assert resolve_rng(gen) is gen
    with pytest.raises(ValueError, match="rng"):
        resolve_rng("seed")
    with pytest.raises(ValueError, match="rng"):
        resolve_rng(-1)


def test_outputs_keep_shape_and_labels_keep_type():
    x = np.zeros((3, 4))
    assert laplace_mechanism(x, epsilon=1.0, rng=0).value.shape == (3, 4)
    y = kary_randomized_response(np.array([[0, 1], [2, 0]]), epsilon=2.0, num_classes=3, rng=0).value
    assert y.shape == (2, 2) and y.dtype == np.int64 and set(np.unique(y)) <= {0, 1, 2}


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_mechanisms_refuse_non_finite_values_even_next_to_huge_finite_ones(bad):
    from flwr_dp_strategies.privacy import gaussian_mechanism, laplace_mechanism

    values = np.array([1e308, 1e308, bad, -1e308])  # the sum is not finite whatever the bad entry is
    with pytest.raises(ValueError, match="finite"):
        gaussian_mechanism(values, noise_multiplier=1.0, rng=0)
    with pytest.raises(ValueError, match="finite"):
        laplace_mechanism(values, epsilon=1.0, rng=0)


def test_mechanisms_accept_finite_values_whose_sum_overflows():
    from flwr_dp_strategies.privacy import gaussian_mechanism

    values = np.array([1e308, 1e308, 1e308])  # the sum overflows to inf; every entry is finite
    released = gaussian_mechanism(values, noise_multiplier=1.0, rng=0).value
    assert released.shape == (3,) and np.isfinite(released).all()
