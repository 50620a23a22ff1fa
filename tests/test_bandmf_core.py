"""The privacy core of DP-FTRL with banded matrix factorisation (issue 30):
flwr_dp_strategies.privacy.mechanisms.matrix_factorization, no Flower."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms import matrix_factorization as mf
from noise_stats import covariance_z_scores

T, B = 6, 3
SAMPLES = 200_000  # coordinates of one stream: each is an independent draw of the T-vector (C^{-1} Z)_{:, j}
Z_LIMIT = 5.0  # |z-score| bound per covariance entry: P(|N(0,1)| > 5) = 5.7e-7, 21 entries


def stream(coefficients, rounds=T, dimension=SAMPLES, seed=3):
    noise = mf.BandedNoise(coefficients, dimension, mf.noise_key(seed))
    return np.stack([noise.next().copy() for _ in range(rounds)])


def expected_covariance(coefficients, rounds=T):
    inverse = np.linalg.inv(mf.toeplitz_matrix(coefficients, rounds))
    return inverse @ inverse.T


@pytest.mark.parametrize(
    "factory", [lambda: mf.banded_sqrt_coefficients(B), lambda: mf.optimal_banded_coefficients(T, B)]
)
def test_released_noise_has_covariance_c_inverse_c_inverse_transpose(factory):
    c = factory()
    scores = covariance_z_scores(stream(c), expected_covariance(c))
    assert np.max(np.abs(scores)) < Z_LIMIT, np.round(scores, 1)


@pytest.mark.parametrize("index", range(B))
@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_a_band_coefficient_ten_percent_off_is_detected(index, factor):
    """The same test fails when the stream uses a coefficient 10 % off (its power, on each band)."""
    c = mf.banded_sqrt_coefficients(B)
    wrong = c.copy()
    wrong[index] *= factor
    scores = covariance_z_scores(stream(wrong), expected_covariance(c))
    assert np.max(np.abs(scores)) > Z_LIMIT


def test_the_stream_is_forward_substitution_of_c_and_keeps_b_minus_1_rows():
    c = mf.banded_sqrt_coefficients(4)
    z = np.random.default_rng(0).standard_normal((12, 5))
    noise = mf.BandedNoise(c, 5, mf.noise_key(0))
    rows = np.stack([noise.push(row).copy() for row in z])
    np.testing.assert_allclose(rows, np.linalg.solve(mf.toeplitz_matrix(c, 12), z), rtol=1e-12, atol=1e-12)
    assert noise.buffer.shape == (3, 5)  # O(b·d)


def test_square_root_coefficients_square_to_the_prefix_sum_matrix():
    c = mf.banded_sqrt_coefficients(8)
    root = mf.toeplitz_matrix(c, 8) / c[0]  # un-normalised: r_0 = 1
    np.testing.assert_allclose(root @ root, mf.prefix_sum_matrix(8), atol=1e-12)
    assert np.linalg.norm(c) == pytest.approx(1.0)


def test_optimised_coefficients_are_no_worse_than_the_square_root_and_cached():
    sqrt_error = mf.toeplitz_prefix_error(mf.banded_sqrt_coefficients(10), 200)
    optimal = mf.optimal_banded_coefficients(200, 10)
    assert mf.toeplitz_prefix_error(optimal, 200) < sqrt_error
    assert np.linalg.norm(optimal) == pytest.approx(1.0)
    assert mf._optimal.cache_info().hits + mf._optimal.cache_info().misses >= 1
    np.testing.assert_array_equal(mf.optimal_banded_coefficients(200, 10), optimal)


def test_prefix_error_matches_the_dense_matrices():
    c = mf.banded_sqrt_coefficients(3)
    dense = mf.prefix_sum_matrix(7) @ np.linalg.inv(mf.toeplitz_matrix(c, 7))
    assert mf.toeplitz_prefix_error(c, 7) == pytest.approx(np.linalg.norm(dense) / math.sqrt(7))


@pytest.mark.parametrize("bands, participations, rounds", [(3, 2, 9), (3, 5, 10), (2, 3, 7), (4, 1, 8)])
@pytest.mark.parametrize("factorization", ["banded-sqrt", "banded-optimal"])
def test_sensitivity_equals_the_brute_force_maximum_over_patterns(bands, participations, rounds, factorization):
    """For every prefix t: the closed form, the dynamic programme and the maximum over every b-min-separated
    pattern of at most k rounds agree."""
    c = mf.strategy_coefficients(factorization, bands, rounds)
    closed = mf.prefix_sensitivities(c, rounds, bands, participations)
    for t in range(1, rounds + 1):
        matrix = mf.toeplitz_matrix(c, rounds)[:t, :t]
        oracle = mf.brute_force_sensitivity(matrix, bands, participations)
        assert closed[t - 1] == pytest.approx(oracle, rel=1e-12)
        assert mf.min_sep_sensitivity(matrix, bands, participations) == pytest.approx(oracle, rel=1e-12)


def test_full_run_sensitivity_is_sqrt_k_times_the_largest_column_norm():
    c = mf.banded_sqrt_coefficients(10)
    assert mf.prefix_sensitivities(c, 40, 10, 4)[-1] == pytest.approx(2.0)  # √4 · ‖c‖, ‖c‖ = 1


def test_without_min_separation_the_cross_terms_count():
    """A pattern closer than b reads overlapping columns: the column-norm formula refuses it."""
    c = mf.toeplitz_matrix(mf.banded_sqrt_coefficients(3), 6)
    with pytest.raises(ValueError, match="matrix must have at most min_separation=2 bands"):
        mf.min_sep_sensitivity(c, 2, 2)
    assert mf.brute_force_sensitivity(c, 2, 2) > math.sqrt(2) * np.linalg.norm(c[:, 0])


@pytest.mark.parametrize("z", [0.7, 2.0])
def test_booked_epsilon_equals_dp_accountings_for_the_computed_sensitivity(z):
    """Booking round_event(t) for t = 1..T composes to GaussianDpEvent(z / sens_T): the ledger's ε (RDP and PLD)
    equals dp-accounting's for that one Gaussian."""
    rounds, bands, k = 20, 4, 3
    c = mf.banded_sqrt_coefficients(bands)
    ledger = PrivacyLedger(1e-5)
    for t in range(1, rounds + 1):
        event = mf.round_event(c, t, z, bands, k)
        if event is not None:
            ledger.record(event, server_round=t)
    sens = mf.prefix_sensitivities(c, rounds, bands, k)[-1]
    assert sens == pytest.approx(math.sqrt(k))
    whole = GaussianDpEvent(z / sens)
    assert mf.run_event(c, rounds, z, bands, k) == whole
    pld = PLDAccountant().compose(whole).get_epsilon(1e-5)
    rdp = RdpAccountant().compose(whole).get_epsilon(1e-5)
    report = ledger.report()
    assert report.epsilon_rdp == pytest.approx(rdp, rel=1e-9)
    assert report.epsilon_pld == pytest.approx(pld, rel=1e-2)
    assert report.epsilon == pytest.approx(min(pld, rdp), rel=1e-2)


def test_rounds_past_k_participations_cost_nothing():
    c = mf.banded_sqrt_coefficients(2)
    assert [mf.round_event(c, t, 1.0, 2, 2) is None for t in range(1, 7)] == [False] * 4 + [True] * 2


def test_noise_key_round_trips_and_is_checked(tmp_path):
    key = mf.noise_key()
    path = tmp_path / "key"
    digest = mf.save_noise_key(path, key)
    assert (path.stat().st_mode & 0o777) == 0o600 and path.stat().st_size < 100  # O(1), whatever d
    assert mf.load_noise_key(path, digest) == key
    with pytest.raises(ValueError, match="does not match the checksum"):
        mf.load_noise_key(path, "0" * 64)
    with pytest.raises(ValueError, match="cannot be read"):
        mf.load_noise_key(tmp_path / "missing", digest)
    path.write_bytes(b"x" * 10)
    with pytest.raises(ValueError, match="not a saved BandMF noise key"):
        mf.load_noise_key(path, mf.state_checksum(b"x" * 10))


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: mf.banded_sqrt_coefficients(0), "num_bands"),
        (lambda: mf.optimal_banded_coefficients(0, 3), "num_rounds"),
        (lambda: mf.strategy_coefficients("tree", 3), "factorization"),
        (lambda: mf.BandedNoise([0.0, 1.0], 3, bytes(32)), "coefficients"),
        (lambda: mf.BandedNoise([1.0], 0, bytes(32)), "dimension"),
        (lambda: mf.BandedNoise([1.0], 3, b"short"), "key"),
        (lambda: mf.keyed_standard_normal(bytes(32), 0, 3), "release"),
        (lambda: mf.prefix_sensitivities([1.0], 3, 0, 1), "min_separation"),
        (lambda: mf.prefix_sensitivities([1.0], 3, 1, 0), "max_participations"),
        (lambda: mf.round_event(np.ones(1), 1, 0.0, 1, 1), "noise_multiplier"),
        (lambda: mf.prefix_sensitivities([1.0, 0.5], 3, 1, 1), "coefficients"),
    ],
)
def test_bad_arguments_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_tree_baseline_factorises_the_prefix_sums():
    decoder, tree = mf.binary_tree_factorization(10)
    np.testing.assert_allclose(decoder @ tree, mf.prefix_sum_matrix(10), atol=1e-10)


def test_amplified_booking_is_k_poisson_sampled_gaussians_one_per_epoch():
    """Cyclic Poisson within bands: one PoissonSampledDpEvent(q, Gaussian(z)) at each epoch's first release, so T
    releases book ⌈T/b⌉ of them; the ledger's ε equals dp-accounting's for that composition."""
    from dp_accounting.dp_event import PoissonSampledDpEvent, SelfComposedDpEvent

    rounds, bands, q, z = 10, 4, 0.25, 1.0
    events = [mf.amplified_round_event(t, z, bands, q) for t in range(1, rounds + 1)]
    assert [e is not None for e in events] == [(t - 1) % bands == 0 for t in range(1, rounds + 1)]
    ledger = PrivacyLedger(1e-5)
    for t, event in enumerate(events, start=1):
        if event is not None:
            ledger.record(event, server_round=t)
    expected = SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), math.ceil(rounds / bands))
    pld = PLDAccountant().compose(expected).get_epsilon(1e-5)
    rdp = RdpAccountant().compose(expected).get_epsilon(1e-5)
    assert ledger.epsilon() == pytest.approx(min(pld, rdp), rel=2e-2)
    with pytest.raises(ValueError, match="sampling_rate"):
        mf.amplified_round_event(1, z, bands, 0.0)


@pytest.mark.slow
def test_the_committed_benchmark_cell_reproduces():
    """T = 40, ε = 8 of flwr_dp_benchmarks/results/bandmf/results.json, recomputed: the un-amplified ratios are
    ‖c‖·‖AC⁻¹‖_F / ‖A‖_F (one Gaussian each, sensitivity √k for both) whatever ε, the tree's uses its brute-force
    sensitivity."""
    import json
    from pathlib import Path

    from flwr_dp_benchmarks import bench_bandmf

    (row,) = bench_bandmf.table(
        epsilons=(8.0,), rounds=(40,), amplified_bands=(), poisson=False, window_configs=()
    )  # the fast rows
    shape = mf.toeplitz_prefix_error(mf.banded_sqrt_coefficients(10), 40)
    assert row["banded-sqrt"] == pytest.approx(shape / math.sqrt(np.mean(np.arange(1, 41))), rel=1e-3)
    committed = json.loads((Path(bench_bandmf.__file__).parent / "results" / "bandmf" / "results.json").read_text())
    (saved,) = [r for r in committed if r["rounds"] == 40 and r["epsilon"] == 8.0]
    for key, value in row.items():
        assert saved[key] == pytest.approx(value, rel=1e-3), key
