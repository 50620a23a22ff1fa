"""LocalUpdateNoiseMod: clipping, analytic-Gaussian noise scale, declaration per round."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from scipy import stats

from client_mods import LocalUpdateNoiseMod
from flwr_dp_strategies import AccountedFedAvg, read_declarations
from flwr_dp_strategies.privacy import PrivacyLedger, gaussian_sigma
from flwr_dp_strategies.privacy.mechanisms.gaussian import classical_gaussian_sigma

pytestmark = pytest.mark.usefixtures("task_identity")
D = 50_000


def context() -> Context:
    return Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})


def train_message(arrays: list[np.ndarray], message_type: str = MessageType.TRAIN) -> Message:
    content = RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord({})})
    return Message(content, dst_node_id=7, message_type=message_type)


def trainer_adding(update: list[np.ndarray]):
    def call_next(msg: Message, ctx: Context) -> Message:
        received = msg.content["arrays"].to_numpy_ndarrays()
        trained = [r + u for r, u in zip(received, update)]
        content = RecordDict({"arrays": ArrayRecord(trained), "metrics": MetricRecord({"num-examples": 5})})
        return Message(content, reply_to=msg)

    return call_next


def released(mod: LocalUpdateNoiseMod, received: list[np.ndarray], update: list[np.ndarray]):
    reply = mod(train_message(received), context(), trainer_adding(update))
    return reply.content["arrays"].to_numpy_ndarrays(), reply


def test_noise_std_is_z_times_2c_and_10_percent_off_is_rejected():
    c, z = 0.5, 1.3
    mod = LocalUpdateNoiseMod(c, z, rng=5)
    received = [np.zeros(D // 2), np.zeros((D // 4, 2))]
    small = [np.full(D // 2, 1e-4), np.zeros((D // 4, 2))]  # norm 7e-3 < C: not clipped
    out, reply = released(mod, received, small)
    residual = np.concatenate([(out[0] - small[0]), out[1].ravel()])
    sigma = z * 2 * c
    assert stats.kstest(residual, "norm", args=(0, sigma)).pvalue > 1e-3
    for factor in (0.9, 1.1):
        assert stats.kstest(residual, "norm", args=(0, factor * sigma)).pvalue < 1e-6
    (declaration,) = read_declarations(reply.content)
    assert declaration.event == GaussianDpEvent(z)
    assert [a.shape for a in out] == [a.shape for a in received]


def test_updates_are_clipped_to_c_in_l2_over_all_arrays():
    c = 1.0
    mod = LocalUpdateNoiseMod(c, 1e-9, rng=0)  # noise negligible
    received = [np.ones(10), np.ones((3, 3))]
    update = [np.full(10, 3.0), np.full((3, 3), -4.0)]
    out, _ = released(mod, received, update)
    delta = np.concatenate([(o - r).ravel() for o, r in zip(out, received)])
    assert np.linalg.norm(delta) == pytest.approx(c, rel=1e-6)
    expected_direction = np.concatenate([u.ravel() for u in update])
    np.testing.assert_allclose(delta, expected_direction / np.linalg.norm(expected_direction), rtol=1e-6)


def test_epsilon_delta_uses_the_analytic_gaussian_not_the_classical_formula():
    mod = LocalUpdateNoiseMod(1.0, epsilon=4.0, delta=1e-5)
    assert mod.sigma == pytest.approx(gaussian_sigma(4.0, 1e-5, 2.0))
    assert mod.sigma < classical_gaussian_sigma(0.99, 1e-5, 2.0)  # sanity: less noise than at eps < 1
    ledger = PrivacyLedger(1e-5)
    ledger.record(GaussianDpEvent(mod.noise_multiplier), server_round=1, client="a")
    assert ledger.epsilon() == pytest.approx(4.0, rel=2e-2)  # one round spends the calibrated epsilon


def test_non_train_messages_pass_and_errors_name_parameters():
    mod = LocalUpdateNoiseMod(1.0, 1.0, rng=0)
    received = [np.zeros(3)]
    reply = mod(train_message(received, MessageType.EVALUATE), context(), trainer_adding([np.ones(3)]))
    np.testing.assert_array_equal(reply.content["arrays"].to_numpy_ndarrays()[0], np.ones(3))
    assert read_declarations(reply.content) == []
    with pytest.raises(ValueError, match="clipping_norm"):
        LocalUpdateNoiseMod(0.0, 1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        LocalUpdateNoiseMod(1.0)
    with pytest.raises(ValueError, match="delta"):
        LocalUpdateNoiseMod(1.0, epsilon=1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        LocalUpdateNoiseMod(1.0, -2.0)


def test_rounds_compose_per_client_in_accounted_fedavg():
    from loopback import LoopbackGrid

    n, z = 3, 2.0
    strategy = AccountedFedAvg(min_train_nodes=n, min_available_nodes=n)
    mods = {node: LocalUpdateNoiseMod(1.0, z, rng=node) for node in range(101, 101 + n)}
    current = [np.zeros(4)]
    for rnd in (1, 2, 3, 4):
        msgs = list(strategy.configure_train(rnd, ArrayRecord(current), ConfigRecord(), LoopbackGrid.of(n)))
        replies = [mods[m.metadata.dst_node_id](m, context(), trainer_adding([np.ones(4)])) for m in msgs]
        arrays, metrics = strategy.aggregate_train(rnd, replies)
        current = arrays.to_numpy_ndarrays()
    expected = PrivacyLedger(1e-5)
    for rnd in range(1, 5):
        expected.record(GaussianDpEvent(z), server_round=rnd, client="x")
    assert metrics["privacy/epsilon"] == pytest.approx(expected.epsilon(), rel=1e-9)
    assert all(strategy.ledger.rounds(c) == [1, 2, 3, 4] for c in strategy.ledger.clients)


def test_pickled_copies_of_a_default_mod_draw_different_noise():
    import pickle

    from client_mods import LabelDp

    mod = LocalUpdateNoiseMod(1.0, 1.0)
    outs = [released(pickle.loads(pickle.dumps(mod)), [np.zeros(16)], [np.zeros(16)])[0][0] for _ in range(2)]
    assert not np.array_equal(outs[0], outs[1])
    label_dp = LabelDp(0.5, num_classes=10)
    labels = np.arange(200) % 10
    a, b = (pickle.loads(pickle.dumps(label_dp))(labels) for _ in range(2))
    assert not np.array_equal(a, b)


@pytest.mark.parametrize(
    "factor, relation",
    [(None, "replace_one"), (2.0, "replace_one"), (1.0, "add_or_remove_one"), (1.5, "add_or_remove_one")],
)
def test_declared_relation_is_the_one_the_sensitivity_covers(factor, relation):
    """Δ₂ = 2C covers any two inputs (replace one); Δ₂ = C only a clipped update against the zero one (add/remove),
    which a replace-one ledger must book at 2C, i.e. at twice the noise multiplier's ε."""
    c = 0.5
    mod = LocalUpdateNoiseMod(c, 1.0, sensitivity=None if factor is None else factor * c, rng=0)
    _, reply = released(mod, [np.zeros(4)], [np.ones(4)])
    (declaration,) = read_declarations(reply.content)
    assert declaration.neighboring_relation == relation
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(declaration.event, server_round=1, client=7, neighboring_relation=declaration.neighboring_relation)
    true = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    true.record(GaussianDpEvent(mod.sigma / (2 * c)), server_round=1, client=7)  # the noise against Δ₂ = 2C
    assert ledger.epsilon(7) >= true.epsilon(7) * (1 - 1e-9)


def test_sensitivity_below_the_clipping_norm_bounds_no_relation():
    with pytest.raises(ValueError, match="sensitivity"):
        LocalUpdateNoiseMod(1.0, 1.0, sensitivity=0.5)
