"""The binary tree and BLT factorisations of AccountedBandedMatrixFactorization (issue 39): their noise streams'
covariance, their prefix sensitivities against the brute force, the booked ε, a restart and the refusals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from flwr_dp_strategies import AccountedBandedMatrixFactorization
from flwr_dp_strategies.privacy.accounting.ledger_file import LedgerFileError
from flwr_dp_strategies.privacy.mechanisms import matrix_factorization as mf
from loopback import LoopbackGrid
from noise_stats import covariance_z_scores

N, BANDS, ROUNDS = 12, 3, 6
SAMPLES = 200_000  # coordinates of one stream: each an independent draw of the T-vector of noise rows
Z_LIMIT = 5.0  # |z-score| bound per covariance entry: P(|N(0,1)| > 5) = 5.7e-7, at most 36 entries
# BLT parameters for the statistical tests: 10 % off in any one of them moves some covariance entry by >= 9.5
# standard errors at this sample size (computed), so the positive controls fail with overwhelming probability
LAMBDAS, THETAS = (0.45, 0.45), (0.75, 0.55)


# ---------------------------------------------------------------------- the streams
def rows(noise, rounds=ROUNDS) -> np.ndarray:
    return np.stack([noise.next().copy() for _ in range(rounds)])


def tree_covariance(rounds=ROUNDS) -> np.ndarray:
    """A⁻¹ B Bᵀ A⁻ᵀ: the released noise of the plain tree whose prefix noise is B Z."""
    decoder, _ = mf.tree_factorization(rounds)
    difference = np.linalg.inv(mf.prefix_sum_matrix(rounds))
    return difference @ decoder @ decoder.T @ difference.T


def blt_covariance(lambdas=LAMBDAS, thetas=THETAS, rounds=ROUNDS) -> np.ndarray:
    inverse = np.linalg.inv(mf.toeplitz_matrix(mf.blt_coefficients(lambdas, thetas, rounds), rounds))
    return inverse @ inverse.T


@pytest.fixture(scope="module")
def tree_rows() -> np.ndarray:
    return rows(mf.TreeNoise(SAMPLES, mf.noise_key(3)))


def test_the_tree_factorises_the_prefix_sums_with_complete_dyadic_nodes():
    for rounds in (1, 5, 8, 11):
        decoder, tree = mf.tree_factorization(rounds)
        np.testing.assert_array_equal(decoder @ tree, mf.prefix_sum_matrix(rounds))
        assert tree.shape[0] == sum(rounds >> h for h in range(rounds.bit_length()))
        np.testing.assert_array_equal(decoder.sum(axis=1), [bin(t).count("1") for t in range(1, rounds + 1)])


def test_tree_noise_has_the_trees_covariance(tree_rows):
    scores = covariance_z_scores(tree_rows, tree_covariance())
    assert np.max(np.abs(scores)) < Z_LIMIT, np.round(scores, 1)


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_tree_noise_ten_percent_off_in_scale_is_detected(tree_rows, factor):
    """Positive control: the same test fails for the stream scaled by 0.9 or 1.1."""
    scores = covariance_z_scores(factor * tree_rows, tree_covariance())
    assert np.max(np.abs(scores)) > Z_LIMIT


def test_tree_noise_with_one_node_ten_percent_off_is_detected(tree_rows):
    """Positive control: the node (level 1, end 2) scaled by 1.1 in every row it enters (releases 2 and 4)."""
    noise = mf.TreeNoise(SAMPLES, mf.noise_key(3))
    node = np.empty(SAMPLES)
    for start in range(0, SAMPLES, mf.BLOCK):
        noise._normals.fill((2 << 6) | 1, start // mf.BLOCK, node[start : start + mf.BLOCK])
    wrong = tree_rows.copy()
    wrong[1] += 0.1 * node  # w_2 = N_2 − N_1 adds Z_(1,2); in w_3 = N_3 − N_2 it cancels
    wrong[3] -= 0.1 * node  # w_4 = N_4 − N_3 subtracts it
    scores = covariance_z_scores(wrong, tree_covariance())
    assert np.max(np.abs(scores)) > Z_LIMIT


def test_the_tree_rows_are_the_differences_of_consecutive_prefix_noises():
    key, d = mf.noise_key(5), 7
    noise = mf.TreeNoise(d, key)
    released = rows(noise, 11)
    _, tree = mf.tree_factorization(11)
    # the node of row i of tree: (level, 1-based end); its normals as TreeNoise draws them
    normals = mf._Normals(noise._normals.key)
    z = np.empty((tree.shape[0], d))
    for i, row in enumerate(tree):
        width, end = int(row.sum()), int(np.nonzero(row)[0][-1]) + 1
        normals.fill((end << 6) | (width.bit_length() - 1), 0, z[i])
    decoder, _ = mf.tree_factorization(11)
    np.testing.assert_allclose(np.cumsum(released, axis=0), decoder @ z, atol=1e-12)
    assert mf.TreeNoise.nodes(8) == ((3, 8), [(0, 7), (1, 6), (2, 4)])


@pytest.fixture(scope="module")
def blt_rows() -> np.ndarray:
    return rows(mf.BltNoise(LAMBDAS, THETAS, SAMPLES, mf.noise_key(4)))


def test_blt_noise_has_c_inverse_c_inverse_transpose_covariance(blt_rows):
    scores = covariance_z_scores(blt_rows, blt_covariance())
    assert np.max(np.abs(scores)) < Z_LIMIT, np.round(scores, 1)


@pytest.mark.parametrize("which, index", [("lambdas", 0), ("lambdas", 1), ("thetas", 0), ("thetas", 1), ("scale", 0)])
@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_blt_noise_with_one_parameter_ten_percent_off_is_detected(blt_rows, which, index, factor):
    """Positive control: the stream of parameters with one λ_j or θ_j 10 % off (or the noise scaled by 0.9 or
    1.1) fails the same test against the true parameters' covariance."""
    if which == "scale":
        samples = factor * blt_rows
    else:
        params = {"lambdas": list(LAMBDAS), "thetas": list(THETAS)}
        params[which][index] *= factor
        samples = rows(mf.BltNoise(params["lambdas"], params["thetas"], SAMPLES, mf.noise_key(4)))
    scores = covariance_z_scores(samples, blt_covariance())
    assert np.max(np.abs(scores)) > Z_LIMIT


def test_the_blt_recurrence_solves_c_and_keeps_n_rows():
    key, d = mf.noise_key(6), 9
    noise = mf.BltNoise(LAMBDAS, THETAS, d, key)
    released = rows(noise, 13)
    z = np.stack([mf.keyed_standard_normal(key, t, d) for t in range(1, 14)])
    c = mf.toeplitz_matrix(mf.blt_coefficients(LAMBDAS, THETAS, 13), 13)
    np.testing.assert_allclose(released, np.linalg.solve(c, z), rtol=1e-9, atol=1e-9)
    assert noise.buffers.shape == (2, d)  # n·d floats of state (and the row)


@pytest.mark.parametrize("factorization", ["tree", "blt"])
@pytest.mark.parametrize("dimension", [5, mf.BLOCK + 3])
def test_a_stream_rebuilt_from_the_key_continues_bit_exactly(factorization, dimension):
    key = mf.noise_key(8)

    def make():
        return mf.TreeNoise(dimension, key) if factorization == "tree" else mf.BltNoise(LAMBDAS, THETAS, dimension, key)

    whole = make()
    straight = [whole.next().copy() for _ in range(9)]
    restarted = make()
    restarted.fast_forward(6)
    assert restarted.count == 6
    for t in range(6, 9):
        np.testing.assert_array_equal(restarted.next(), straight[t])
    assert restarted.check_value() == whole.check_value() != ""
    restarted.prepare()
    np.testing.assert_array_equal(restarted.next(), whole.next())
    restarted.prepare()  # a prepared row, then a fast-forward past it
    restarted.fast_forward(12)
    for _ in range(2):
        whole.next()
    assert restarted.count == whole.count == 12
    np.testing.assert_array_equal(restarted.next(), whole.next())


# ---------------------------------------------------------------------- the sensitivities
def completed_nodes(tree: np.ndarray, t: int) -> np.ndarray:
    """The rows of C the first t releases reveal: the nodes inside rounds [0, t)."""
    return tree[[i for i in range(tree.shape[0]) if not tree[i, t:].any()]]


@pytest.mark.parametrize("bands, participations", [(1, 12), (1, 3), (2, 2), (2, 6), (3, 1), (3, 2), (4, 3)])
def test_the_tree_sensitivity_is_never_below_the_brute_force(bands, participations):
    """At every prefix t of T = 12; equal for k = 1 and for b = 1, k ≥ t; within 5 % otherwise (these cases)."""
    rounds = 12
    _, tree = mf.tree_factorization(rounds)
    bound = mf.tree_prefix_sensitivities(rounds, bands, participations)
    exact = np.array(
        [mf.brute_force_sensitivity(completed_nodes(tree, t), bands, participations) for t in range(1, rounds + 1)]
    )
    assert np.all(bound >= exact - 1e-12) and np.all(np.diff(bound) >= 0)
    if participations == 1 or (bands == 1 and participations >= rounds):
        np.testing.assert_allclose(bound, exact, rtol=1e-12)
    assert np.max(bound / exact) < 1.05


def random_non_increasing(rng: np.random.Generator, length: int) -> np.ndarray:
    return np.sort(rng.uniform(0.0, 1.0, length))[::-1]


@pytest.mark.parametrize("seed", range(4))
def test_the_toeplitz_sensitivity_equals_the_brute_force(seed):
    """Non-negative, non-increasing Toeplitz coefficients (random, and a BLT): the earliest tight pattern is the
    worst, at every prefix t, for every (b, k) of T = 10."""
    rng = np.random.default_rng(seed)
    rounds = 10
    c = random_non_increasing(rng, rounds) if seed else mf.blt_coefficients(LAMBDAS, THETAS, rounds)
    for bands, participations in itertools.product((1, 2, 3, 4), (1, 2, 3, 10)):
        sens = mf.toeplitz_prefix_sensitivities(c, bands, participations)
        for t in range(1, rounds + 1):
            exact = mf.brute_force_sensitivity(mf.toeplitz_matrix(c, rounds)[:t], bands, participations)
            assert sens[t - 1] == pytest.approx(exact, rel=1e-12), (bands, participations, t)


def test_the_toeplitz_sensitivity_needs_non_negative_non_increasing_coefficients():
    with pytest.raises(ValueError, match="coefficients"):
        mf.toeplitz_prefix_sensitivities([1.0, 0.5, 0.7], 1, 3)
    with pytest.raises(ValueError, match="coefficients"):
        mf.toeplitz_prefix_sensitivities([1.0, -0.1], 1, 2)


def test_the_optimised_blt_is_valid_cached_and_better_than_its_start():
    rounds, buffers, bands, participations = 40, 3, 10, 4
    lambdas, thetas = mf.optimal_blt_parameters(rounds, buffers, bands, participations)
    assert lambdas.size == thetas.size == buffers and np.all(lambdas > 0) and lambdas.sum() <= 1
    assert np.all((thetas > 0) & (thetas < 1))
    c = mf.blt_coefficients(lambdas, thetas, rounds)
    assert c[0] == 1.0 and np.all(np.diff(c) <= 0) and np.all(c > 0)

    def loss(lam, theta):
        c = mf.blt_coefficients(lam, theta, rounds)
        return mf.toeplitz_prefix_sensitivities(c, bands, participations)[-1] * mf.blt_prefix_error(lam, theta, rounds)

    start = 1.0 - 1.0 / np.geomspace(2.0, rounds, buffers)
    assert loss(lambdas, thetas) <= loss(np.full(buffers, 0.5 / buffers), start)
    again = mf.optimal_blt_parameters(rounds, buffers, bands, participations)
    np.testing.assert_array_equal(again[0], lambdas)
    # the prefix error matches the dense matrices
    inverse = np.linalg.inv(mf.toeplitz_matrix(c, rounds))
    dense = np.linalg.norm(mf.prefix_sum_matrix(rounds) @ inverse) / math.sqrt(rounds)
    assert mf.blt_prefix_error(lambdas, thetas, rounds) == pytest.approx(dense, rel=1e-9)
    decoder, _ = mf.tree_factorization(rounds)
    assert mf.tree_prefix_error(rounds) == pytest.approx(np.linalg.norm(decoder) / math.sqrt(rounds), rel=1e-12)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: mf.tree_factorization(0), "num_rounds"),
        (lambda: mf.tree_prefix_sensitivities(4, 0, 1), "min_separation"),
        (lambda: mf.tree_prefix_sensitivities(4, 1, 0), "max_participations"),
        (lambda: mf.check_blt_parameters([0.5], [1.0]), "thetas"),
        (lambda: mf.check_blt_parameters([0.7, 0.4], [0.5, 0.5]), "lambdas"),
        (lambda: mf.check_blt_parameters([-0.1], [0.5]), "lambdas"),
        (lambda: mf.check_blt_parameters([0.1, 0.1], [0.5]), "lambdas"),
        (lambda: mf.optimal_blt_parameters(10, 0, 1, 1), "num_buffers"),
        (lambda: mf.optimal_blt_parameters(10, mf.MAX_BUFFERS + 1, 1, 1), "num_buffers"),
        (lambda: mf.BltNoise(LAMBDAS, THETAS, 0, bytes(32)), "dimension"),
        (lambda: mf.TreeNoise(3, b"short"), "key"),
        (lambda: mf.increment_event(1.0, 0.0), "noise_multiplier"),
    ],
)
def test_bad_mechanism_arguments_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ---------------------------------------------------------------------- the strategy
def make(factorization, z=1.0, clip=1.0, m=4, **kwargs) -> AccountedBandedMatrixFactorization:
    kwargs.setdefault("num_bands", BANDS)
    kwargs.setdefault("num_rounds", ROUNDS)
    return AccountedBandedMatrixFactorization(
        FedAvg(fraction_train=1.0, min_available_nodes=1), z, clip, m, factorization=factorization, **kwargs
    )


def model(d=4) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(d, np.float32))})


def answer(msg: Message, update: float, d=4) -> Message:
    arrays = ArrayRecord({"w": Array(np.full(d, update, np.float32))})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 5})}), reply_to=msg)


def stream(factorization, d, key):
    if factorization == "tree":
        return mf.TreeNoise(d, key)
    lambdas, thetas = mf.optimal_blt_parameters(ROUNDS, 3, BANDS, 2)
    return mf.BltNoise(lambdas, thetas, d, key)


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("factorization", ["tree", "blt"])
def test_a_round_with_replies_adds_the_clipped_sum_over_m_and_the_streams_noise(factorization):
    """One release through the strategy: the group of release 1 replies 0.01 each, the release is
    (sum of the clipped updates + zC·w_1)/m with w_1 the stream's first row under the run's key."""
    z, clip, m, d = 0.5, 1.0, 4, 4
    strategy = make(factorization, z=z, clip=clip, m=m, rng=11)
    grid = LoopbackGrid.of(N)
    msgs = list(strategy.configure_train(1, model(d), ConfigRecord(), grid))
    assert len(msgs) == N // BANDS
    arrays, metrics = strategy.aggregate_train(1, [answer(msg, 0.01, d) for msg in msgs])
    noise = stream(factorization, d, mf.noise_key(11)).next()
    expected = (len(msgs) * 0.01 + z * clip * noise) / m
    np.testing.assert_allclose(arrays["w"].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert metrics["privacy/epsilon"] > 0 and strategy.releases == 1


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("factorization", ["tree", "blt"])
def test_the_released_noise_is_the_stream_scaled_by_z_clip_over_m(factorization):
    z, clip, m, d = 1.5, 0.7, 4, 300
    strategy = make(factorization, z=z, clip=clip, m=m, rng=12)
    grid = LoopbackGrid.of(N)
    released = []
    for r in range(1, ROUNDS + 1):
        strategy.configure_train(r, model(d), ConfigRecord(), grid)
        arrays, _ = strategy.aggregate_train(r, [])
        released.append(arrays["w"].numpy().astype(np.float64))
    noise = stream(factorization, d, mf.noise_key(12))
    expected = [z * clip / m * noise.next() for _ in range(ROUNDS)]
    np.testing.assert_allclose(np.array(released), np.array(expected), rtol=1e-5, atol=1e-6)


def prefix_sensitivities(factorization, rounds=ROUNDS, bands=BANDS, participations=2):
    if factorization == "tree":
        return mf.tree_prefix_sensitivities(rounds, bands, participations)
    lambdas, thetas = mf.optimal_blt_parameters(rounds, 3, bands, participations)
    return mf.toeplitz_prefix_sensitivities(mf.blt_coefficients(lambdas, thetas, rounds), bands, participations)


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("factorization", ["tree", "blt"])
def test_the_booked_epsilon_is_one_gaussian_of_multiplier_z_over_sens_t_at_every_prefix(factorization):
    z = 2.0
    strategy = make(factorization, z=z, rng=4)
    grid = LoopbackGrid.of(N)
    sens = prefix_sensitivities(factorization)
    assert np.all(np.diff(sens) >= 0)
    for t in range(1, ROUNDS + 1):
        strategy.configure_train(t, model(), ConfigRecord(), grid)
        strategy.aggregate_train(t, [])
        if t in (1, 4, ROUNDS):
            report = strategy.ledger.report()
            one = GaussianDpEvent(z / sens[t - 1])
            assert report.epsilon_pld == pytest.approx(PLDAccountant().compose(one).get_epsilon(1e-5), rel=1e-2)
            assert report.epsilon_rdp == pytest.approx(RdpAccountant().compose(one).get_epsilon(1e-5), rel=1e-6)
    assert list(strategy.configure_train(ROUNDS + 1, model(), ConfigRecord(), grid)) == []  # past num_rounds


def _noise_run(path, factorization, rounds, resume=False, **kwargs):
    strategy = make(factorization, rng=9, ledger_path=path, resume=resume, max_participations=2, **kwargs)
    grid = LoopbackGrid.of(N)
    out = []
    for r in range(1, rounds + 1):
        strategy.configure_train(r, model(64), ConfigRecord(), grid)
        arrays, _ = strategy.aggregate_train(r, [])
        out.append(arrays["w"].numpy())
    strategy.ledger_store.close()
    return strategy, out


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("factorization", ["tree", "blt"])
def test_a_restarted_run_continues_the_same_noise_stream_bit_exactly(tmp_path, factorization):
    whole, straight = _noise_run(tmp_path / "a.json", factorization, ROUNDS)
    _, before = _noise_run(tmp_path / "b.json", factorization, 2)
    resumed, after = _noise_run(tmp_path / "b.json", factorization, ROUNDS - 2, resume=True)
    np.testing.assert_array_equal(np.array(before + after), np.array(straight))
    assert resumed.releases == ROUNDS and resumed.ledger.epsilon() == pytest.approx(whole.ledger.epsilon())
    assert resumed.noise.check_value() == whole.noise.check_value()


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize(
    "factorization, change, name",
    [
        ("tree", {"num_rounds": 8}, "num_rounds"),
        ("blt", {"num_rounds": 8}, "num_rounds"),
        ("blt", {"num_buffers": 2}, "num_buffers"),
        ("tree", {"factorization": "blt"}, "factorization"),
        ("tree", {"factorization": "banded-sqrt"}, "factorization"),
        ("blt", {"factorization": "banded-optimal"}, "factorization"),
    ],
)
def test_a_restart_with_another_factorisation_or_parameter_is_refused(tmp_path, factorization, change, name):
    path = tmp_path / "l.json"
    _noise_run(path, factorization, 2)
    kwargs = {"factorization": factorization, **change}
    with pytest.raises(LedgerFileError, match=name):
        make(rng=9, ledger_path=path, resume=True, max_participations=2, **kwargs)
    assert make(factorization, rng=9, ledger_path=path, resume=True, max_participations=2).releases == 2


@pytest.mark.usefixtures("task_identity")
def test_a_banded_run_restarted_as_a_tree_is_refused(tmp_path):
    path = tmp_path / "l.json"
    _noise_run(path, "banded-sqrt", 2)
    with pytest.raises(LedgerFileError, match="factorization"):
        make("tree", rng=9, ledger_path=path, resume=True, max_participations=2)


@pytest.mark.usefixtures("task_identity")
def test_altered_blt_parameters_in_the_state_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "l.json"
    _noise_run(path, "blt", 2)
    real = mf.optimal_blt_parameters(ROUNDS, 3, BANDS, 2)
    monkeypatch.setattr(
        "flwr_dp_strategies.strategy.banded_matrix_factorization.optimal_blt_parameters",
        lambda *args: (real[0] * 0.99, real[1]),
    )
    with pytest.raises(LedgerFileError, match="lambdas"):
        make("blt", rng=9, ledger_path=path, resume=True, max_participations=2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"factorization": "tree", "sampling": "cyclic-poisson", "num_clients": 24}, "factorization"),
        ({"factorization": "blt", "sampling": "cyclic-poisson", "num_clients": 24}, "factorization"),
        ({"factorization": "blt", "sampling": "window-allocation", "allocation_window": 2}, "factorization"),
        ({"factorization": "tree", "num_rounds": None, "max_participations": 2}, "num_rounds"),
        ({"factorization": "blt", "num_rounds": None, "max_participations": 2}, "num_rounds"),
        ({"factorization": "blt", "num_buffers": 0}, "num_buffers"),
        ({"factorization": "blt", "num_buffers": mf.MAX_BUFFERS + 1}, "num_buffers"),
        ({"factorization": "blt", "num_buffers": 2.0}, "num_buffers"),
        ({"factorization": "tree", "num_buffers": 2}, "num_buffers"),
        ({"factorization": "banded-sqrt", "num_buffers": 2}, "num_buffers"),
        ({"factorization": "honaker"}, "factorization"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make(**kwargs)


def test_the_amplified_samplings_are_refused_because_the_tree_and_blt_are_not_banded():
    with pytest.raises(ValueError, match="assume a banded C"):
        make("tree", sampling="cyclic-poisson", num_clients=24)
