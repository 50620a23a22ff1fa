"""NoisyObjectiveSum: the server sums the clients' noisy FM objectives, repairs and solves the sum once."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from client_mods import FunctionalMechanismTrainer
from flwr_dp_strategies import NoisyObjectiveSum
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import (
    QuadraticStatistics,
    descend,
    fm_noise_std,
    functional_mechanism,
    noise_adapted_ridge,
    quadratic_statistics,
    repaired,
    solve_objective,
    sum_statistics,
    taylor_gradient,
)
from flwr_dp_strategies.strategy.noisy_objective_sum import LINEAR_KEY, QUADRATIC_KEY

from loopback import LoopbackGrid

pytestmark = pytest.mark.usefixtures("task_identity")
Q, C = 6, 3


def unit_rows(n: int, q: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.normal(size=(n, q))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def client_data(n_clients: int, n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """Three Gaussian classes around the first three axes, rows of unit norm."""
    out = []
    for _ in range(n_clients):
        y = rng.integers(0, C, n)
        x = np.eye(Q)[y] * 1.5 + rng.normal(size=(n, Q)) * 0.6
        out.append((x / np.linalg.norm(x, axis=1, keepdims=True), y))
    return out


@pytest.mark.parametrize("loss, c", [("softmax", 4), ("logistic", 2)])
def test_solve_is_the_fixed_point_of_descent(loss, c):
    rng = np.random.default_rng(1)
    stats = quadratic_statistics(unit_rows(200, 5, rng), rng.integers(0, c, 200), num_classes=c, loss=loss)
    ridge = 1e-3
    solved = solve_objective(stats, ridge=ridge)
    descended = descend(stats, np.zeros(stats.linear.shape), steps=20000, learning_rate=5.0, ridge=ridge)
    np.testing.assert_allclose(solved, descended, atol=1e-6)
    gradient = taylor_gradient(stats, solved) / stats.count + ridge * solved
    np.testing.assert_allclose(gradient, 0.0, atol=1e-10)


def test_solve_repairs_an_indefinite_quadratic_before_solving():
    rng = np.random.default_rng(2)
    stats = quadratic_statistics(unit_rows(50, 4, rng), rng.integers(0, 3, 50), num_classes=3)
    noisy = QuadraticStatistics(
        stats.linear, stats.quadratic - 20.0 * np.eye(4) * (np.arange(4) == 0), stats.count, "softmax", 3
    )
    assert np.linalg.eigvalsh(noisy.quadratic)[0] < 0
    np.testing.assert_allclose(
        solve_objective(noisy, ridge=1e-2), solve_objective(repaired(noisy), ridge=1e-2), atol=1e-12
    )
    with pytest.raises(ValueError, match="ridge"):
        solve_objective(noisy, ridge=-1.0)


def test_summed_statistics_are_those_of_the_union():
    rng = np.random.default_rng(3)
    parts = client_data(4, 30, rng)
    union = quadratic_statistics(np.vstack([x for x, _ in parts]), np.concatenate([y for _, y in parts]), num_classes=C)
    total = sum_statistics(quadratic_statistics(x, y, num_classes=C) for x, y in parts)
    np.testing.assert_allclose(total.linear, union.linear, atol=1e-12)
    np.testing.assert_allclose(total.quadratic, union.quadratic, atol=1e-12)
    assert total.count == union.count == 120
    with pytest.raises(ValueError, match="share shapes"):
        sum_statistics([total, quadratic_statistics(unit_rows(3, 2, rng), [0, 1, 2], num_classes=C)])


def test_noise_adapted_ridge_uses_the_spectral_edge_of_the_summed_noise():
    """A symmetric N(0, σ²) matrix's top eigenvalue is 2σ√q (within a few % at q = 400), as the ridge assumes."""
    rng = np.random.default_rng(4)
    sigma, q = 3.0, 400
    g = np.triu(rng.normal(0.0, sigma, (q, q)))
    top = np.linalg.eigvalsh(g + np.triu(g, 1).T)[-1]
    assert top == pytest.approx(2 * sigma * math.sqrt(q), rel=0.05)
    ridge = noise_adapted_ridge(sigma, dim=q, count=1000, num_classes=10, fraction=1.0)
    assert ridge == pytest.approx(2 * (1 / 20) * top / 1000, rel=0.05)
    with pytest.raises(ValueError, match="noise_std"):
        noise_adapted_ridge(-1.0, dim=q, count=10, num_classes=10)


# ------------------------------------------------------------------ the strategy with the trainer
def context(node: int) -> Context:
    return Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})


def run_round(strategy, server_round: int, head: np.ndarray, clients, trainers, contexts, tamper=None):
    messages = list(
        strategy.configure_train(
            server_round, ArrayRecord({"head.weight": Array(head)}), ConfigRecord(), LoopbackGrid.of(len(clients))
        )
    )
    replies = []
    for msg in sorted(messages, key=lambda m: m.metadata.dst_node_id):
        i = msg.metadata.dst_node_id - 101  # LoopbackGrid.of's node ids are 101, 102, ...
        x, y = clients[i]
        reply = trainers[i].train(msg, contexts[i], x, y)
        if tamper is not None:
            reply = tamper(i, msg, reply)
        replies.append(Message(reply.content, reply_to=msg))
    return strategy.aggregate_train(server_round, replies), replies


def federation(n: int, records: int, seed: int):
    """n clients' data, trainers uploading their Gaussian-FM objective at ε = 1, and node contexts."""
    clients = client_data(n, records, np.random.default_rng(seed))
    trainers = [
        FunctionalMechanismTrainer(1.0, num_classes=C, noise="gaussian", upload="objective", rng=100 * seed + i)
        for i in range(n)
    ]
    return clients, trainers, [context(101 + i) for i in range(n)]


def uploaded(reply: Message, count: int) -> QuadraticStatistics:
    arrays = reply.content["arrays"]
    return QuadraticStatistics(arrays[LINEAR_KEY].numpy(), arrays[QUADRATIC_KEY].numpy(), count, "softmax", C)


def make_strategy(n: int, ridge: float = 1e-3) -> NoisyObjectiveSum:
    return NoisyObjectiveSum(
        num_classes=C,
        min_train_nodes=n,
        min_available_nodes=n,
        ridge=ridge,
        ledger=PrivacyLedger(1e-5, neighboring_relation="replace_one"),
    )


def test_head_is_the_solution_of_the_summed_released_objectives_and_epsilon_does_not_grow():
    clients, trainers, contexts = federation(4, 500, seed=5)
    strategy = make_strategy(4)
    head = np.zeros((Q, C), dtype=np.float32)
    heads, epsilons = [], []
    for rnd in (1, 2, 3):
        (arrays, metrics), replies = run_round(strategy, rnd, head, clients, trainers, contexts)
        head = arrays["head.weight"].numpy()
        heads.append(head)
        epsilons.append(metrics["privacy/epsilon"])
        assert strategy.server_figures["train"]["objective/clients"] == 4
        assert strategy.server_figures["train"]["objective/new-clients"] == (4 if rnd == 1 else 0)
        if rnd == 1:
            released = [uploaded(r, 500) for r in replies]
            expected = solve_objective(sum_statistics(released), ridge=1e-3)
            np.testing.assert_allclose(head, expected.astype(np.float32), rtol=1e-5, atol=1e-6)
            exact = [quadratic_statistics(x, y, num_classes=C) for x, y in clients]
            assert not np.allclose(released[0].quadratic, exact[0].quadratic)  # noisy, not exact
    assert head.dtype == np.float32
    np.testing.assert_array_equal(heads[0], heads[2])
    assert epsilons[0] == pytest.approx(1.0, rel=1e-3) and epsilons[2] == pytest.approx(epsilons[0])
    x_all = np.vstack([x for x, _ in clients])
    y_all = np.concatenate([y for _, y in clients])
    assert np.mean(np.argmax(x_all @ head, axis=1) == y_all) > 0.8


def test_malformed_objectives_are_rejected_and_the_round_goes_on():
    clients, trainers, contexts = federation(5, 40, seed=6)

    def tamper(i, msg, reply):
        arrays = reply.content["arrays"]
        if i == 1:  # NaN in the quadratic
            bad = arrays[QUADRATIC_KEY].numpy().copy()
            bad[0, 0] = np.nan
            arrays = ArrayRecord({LINEAR_KEY: arrays[LINEAR_KEY], QUADRATIC_KEY: Array(bad)})
        elif i == 2:  # wrong shape
            arrays = ArrayRecord({LINEAR_KEY: arrays[LINEAR_KEY], QUADRATIC_KEY: Array(np.zeros((Q + 1, Q + 1)))})
        elif i == 3:  # the head instead of the objective
            arrays = ArrayRecord({"head.weight": Array(np.zeros((Q, C)))})
        else:
            return reply
        content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 40.0})})
        for name, record in reply.content.config_records.items():
            content[name] = record
        return Message(content, reply_to=msg)

    strategy = make_strategy(5)
    (arrays, metrics), replies = run_round(strategy, 1, np.zeros((Q, C)), clients, trainers, contexts, tamper)
    assert strategy.rejections["train"] == {"non-finite": 1, "shape": 1, "keys": 1}
    assert strategy.contributors == frozenset({101, 105})
    kept = [uploaded(replies[i], 40) for i in (0, 4)]
    np.testing.assert_allclose(
        arrays["head.weight"].numpy(), solve_objective(sum_statistics(kept), ridge=1e-3), atol=1e-10
    )


def test_client_side_repair_inflates_the_summed_quadratic_linearly_in_the_clients():
    """The bias this strategy avoids: Σ repair(S̃_i) − S is positive definite and grows like m; the
    error of repair(Σ S̃_i) grows like √m (the summed noise)."""
    q, n = 30, 50
    client_bias, server_error = {}, {}
    for m in (16, 64):
        rng = np.random.default_rng(m)
        exact = [quadratic_statistics(rng.normal(size=(n, q)), rng.integers(0, C, n), num_classes=C) for _ in range(m)]
        noisy = [
            functional_mechanism(s, epsilon=1.0, noise="gaussian", rng=np.random.default_rng([m, i])).value
            for i, s in enumerate(exact)
        ]
        total = sum_statistics(exact).quadratic
        client_side = sum_statistics(repaired(s) for s in noisy).quadratic - total
        client_bias[m] = np.linalg.eigvalsh(client_side)[0]
        server_error[m] = np.linalg.norm(repaired(sum_statistics(noisy)).quadratic - total, 2)
        assert client_bias[m] > 0  # every direction inflated
    assert client_bias[64] > 3.0 * client_bias[16]  # ~ m (×4)
    assert server_error[64] < 2.5 * server_error[16]  # ~ √m (×2)
    assert client_bias[64] > server_error[64]


def test_trainer_upload_choices_and_a_repaired_state_cannot_be_uploaded():
    with pytest.raises(ValueError, match="upload"):
        FunctionalMechanismTrainer(1.0, num_classes=C, upload="coefficients")
    rng = np.random.default_rng(8)
    ((x, y),) = client_data(1, 20, rng)
    ctx = context(101)
    head_msg = Message(
        RecordDict({"arrays": ArrayRecord({"head.weight": Array(np.zeros((Q, C)))}), "config": ConfigRecord()}),
        dst_node_id=101,
        message_type="train",
    )
    FunctionalMechanismTrainer(1.0, num_classes=C, rng=1).train(head_msg, ctx, x, y)
    with pytest.raises(ValueError, match="raw release"):
        FunctionalMechanismTrainer(1.0, num_classes=C, upload="objective", rng=1).train(head_msg, ctx, x, y)


def test_strategy_arguments_are_checked():
    with pytest.raises(ValueError, match="ridge"):
        NoisyObjectiveSum(num_classes=C, ridge=-1.0)
    with pytest.raises(ValueError, match="loss"):
        NoisyObjectiveSum(num_classes=C, loss="hinge")
    strategy = NoisyObjectiveSum(num_classes=C)
    with pytest.raises(ValueError, match="exactly the head"):
        strategy.configure_train(1, ArrayRecord({"other": Array(np.zeros((Q, C)))}), ConfigRecord(), LoopbackGrid.of(2))


def test_a_declared_release_is_needed_for_a_finite_epsilon():
    """An objective sent without a declaration is booked as non-private (ε = inf), never as 0."""
    strategy = make_strategy(1)
    (msg,) = strategy.configure_train(
        1, ArrayRecord({"head.weight": Array(np.zeros((Q, C)))}), ConfigRecord(), LoopbackGrid.of(1)
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord({LINEAR_KEY: Array(np.zeros((Q, C))), QUADRATIC_KEY: Array(np.eye(Q))}),
            "metrics": MetricRecord({"num-examples": 10.0}),
        }
    )
    _, metrics = strategy.aggregate_train(1, [Message(content, reply_to=msg)])
    assert metrics["privacy/epsilon"] == math.inf


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_fm_noise_std_is_the_std_of_the_released_noise(noise):
    """Empirical std over 5 450 coefficients; tolerance 5 % = 3.3 standard errors for Laplace
    (√(5/4n) = 1.5 %), more for Gaussian: a 10 % error in either scale would fail."""
    rng = np.random.default_rng(9)
    stats = quadratic_statistics(unit_rows(40, 100, rng), rng.integers(0, 4, 40), num_classes=4)
    noisy = functional_mechanism(stats, epsilon=2.0, noise=noise, rng=10).value
    residual = np.concatenate(
        [(noisy.linear - stats.linear).ravel(), (noisy.quadratic - stats.quadratic)[np.triu_indices(100)]]
    )
    assert residual.size == 5450
    assert np.std(residual) == pytest.approx(fm_noise_std(100, 4, epsilon=2.0, noise=noise), rel=0.05)


def test_client_noise_std_sets_the_noise_adapted_ridge_of_the_contributors():
    clients, trainers, contexts = federation(3, 200, seed=11)
    sigma = fm_noise_std(Q, C, epsilon=1.0, noise="gaussian")
    strategy = NoisyObjectiveSum(
        min_train_nodes=3, min_available_nodes=3, num_classes=C, ridge=1e-4, client_noise_std=sigma, ridge_fraction=0.5
    )
    (arrays, metrics), _ = run_round(strategy, 1, np.zeros((Q, C)), clients, trainers, contexts)
    expected = 1e-4 + noise_adapted_ridge(sigma * math.sqrt(3), dim=Q, count=600, num_classes=C, fraction=0.5)
    assert strategy.server_figures["train"]["objective/ridge"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="client_noise_std"):
        NoisyObjectiveSum(num_classes=C, client_noise_std=0.0)


@pytest.mark.parametrize("value", [1e308, -1e308, 1e101])
def test_finite_coefficients_that_would_overflow_the_sum_are_rejected_not_solved(value):
    """A finite objective of ±1e308 summed with the others overflowed to inf and released a NaN head."""
    from strategy_registry import REGISTRY

    entry = REGISTRY["NoisyObjectiveSum"]
    strategy, grid = entry.make(), entry.grid()
    msgs = list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
    replies = entry.train_replies(grid, msgs)
    replies[0].content["arrays"][LINEAR_KEY] = Array(np.full((3, 2), value))
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert np.isfinite(arrays["head.weight"].numpy()).all()
    assert strategy.rejections["train"]["non-finite"] == 1 and strategy.contributors == frozenset(
        int(m.metadata.dst_node_id) for m in msgs[1:]
    )
