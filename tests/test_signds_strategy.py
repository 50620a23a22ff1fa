"""SignDS strategy + signds_mod on real Flower Messages (no simulation)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

from client_mods import signds_mod
from loopback import LoopbackGrid
from flwr_dp_strategies import SignDS, read_declarations
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.signds import round_event

pytestmark = pytest.mark.usefixtures("task_identity")
N = 6
SHAPES = [(40, 30), (30,), (30, 10)]


def context() -> Context:
    return Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})


def trainer_adding(scale: float, seed: int):
    """A train function that adds a fixed random update of the given scale."""

    def call_next(msg: Message, ctx: Context) -> Message:
        received = msg.content["arrays"].to_numpy_ndarrays()
        rng = np.random.default_rng(seed)
        trained = [r + scale * rng.normal(size=r.shape).astype(r.dtype) for r in received]
        content = RecordDict({"arrays": ArrayRecord(trained), "metrics": MetricRecord({"num-examples": 10.0})})
        return Message(content, reply_to=msg)

    return call_next


def model() -> list[np.ndarray]:
    return [np.zeros(shape, dtype=np.float32) for shape in SHAPES]


def make(**kwargs) -> SignDS:
    return SignDS(min_train_nodes=N, min_available_nodes=N, **kwargs)


def run_round(strategy: SignDS, rnd: int, current: list[np.ndarray], scale: float = 1e-3):
    """configure_train, and each node's reply through ``signds_mod`` (the caller aggregates)."""
    grid = LoopbackGrid.of(N, by_index=lambda i, m: signds_mod(m, context(), trainer_adding(scale, seed=100 * rnd + i)))
    msgs = list(strategy.configure_train(rnd, ArrayRecord(current), ConfigRecord(), grid))
    return msgs, grid.send_and_receive(msgs)


def test_mod_uploads_only_indices_sign_and_bit_and_declares_the_round():
    strategy = make(sign_k=0.05, sign_eps=10.0)
    _, replies = run_round(strategy, 1, model())
    for reply in replies:
        record = reply.content["arrays"]
        assert sorted(record.keys()) == ["b-hat", "indices", "sign"]
        assert all(record[k].numpy().dtype == np.int64 for k in record.keys())
        idx = record["indices"].numpy()
        assert 1 <= idx.size <= 100 and np.all(np.diff(idx) > 0)
        (declaration,) = read_declarations(reply.content)
        assert declaration.event == round_event(10.0, 5.0)


def test_rebuild_is_the_weighted_sparse_sign_average_with_step_3_n_r_est():
    strategy = make(sign_k=0.05, sign_eps=10.0)
    current = model()
    msgs, replies = run_round(strategy, 1, current)
    expected_flat = np.zeros(sum(np.prod(s) for s in SHAPES))
    for reply in replies:
        rec = reply.content["arrays"]
        expected_flat[rec["indices"].numpy()] += rec["sign"].numpy()[0]
    step = 3.0 * N * 1e-5
    arrays, metrics = strategy.aggregate_train(1, replies)
    flat = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
    np.testing.assert_allclose(flat, step * expected_flat / N, rtol=1e-6, atol=1e-12)
    assert metrics["signds/step"] == pytest.approx(step)
    assert metrics["signds/values-per-client"] <= 102 and metrics["signds/dense-values"] == flat.size


def test_epsilon_composes_per_client_and_r_est_grows_while_updates_are_large():
    strategy = make(sign_k=0.05, sign_eps=2.0)
    current = model()
    r_est = [strategy.state.r_est]
    for rnd in (1, 2, 3):
        _, replies = run_round(strategy, rnd, current, scale=1.0)  # r ≫ 2·r_est: b = 0
        arrays, metrics = strategy.aggregate_train(rnd, replies)
        current = arrays.to_numpy_ndarrays()
        r_est.append(metrics["signds/r-est"])
    assert r_est == pytest.approx([1e-5, 5e-5, 2.5e-4, 1.25e-3])  # growth ×5 each round (RR keeps the majority)
    expected = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    for rnd in (1, 2, 3):
        expected.record(round_event(2.0, 5.0), server_round=rnd, client="x")
    assert metrics["privacy/epsilon"] == pytest.approx(expected.epsilon(), rel=1e-9)
    assert len(strategy.ledger.clients) == N


def _upload(msg: Message, indices, sign=1, bit=0, weight=10.0) -> Message:
    record = ArrayRecord(
        {
            "indices": Array(np.asarray(indices, dtype=np.int64)),
            "sign": Array(np.array([sign], dtype=np.int64)),
            "b-hat": Array(np.array([bit], dtype=np.int64)),
        }
    )
    return Message(RecordDict({"arrays": record, "metrics": MetricRecord({"num-examples": weight})}), reply_to=msg)


def test_malformed_uploads_are_rejected_and_counted_while_the_round_goes_on():
    strategy = make(sign_k=0.05, sign_eps=10.0)
    current = model()
    msgs = list(strategy.configure_train(1, ArrayRecord(current), ConfigRecord(), LoopbackGrid.of(N)))
    d = sum(int(np.prod(s)) for s in SHAPES)
    replies = [
        _upload(msgs[0], [1, 5, 9]),  # valid
        _upload(msgs[1], [1, 5, d]),  # out of range
        _upload(msgs[2], [5, 1, 9]),  # not sorted
        _upload(msgs[3], np.arange(101)),  # more than max_dim_out
        _upload(msgs[4], [1, 2], sign=0),  # sign not ±1
        _upload(msgs[5], [3, 3], bit=2),  # duplicate indices
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None
    # out of range, unsorted, duplicates -> indices; 101 indices -> shape; sign 0 -> values
    assert strategy.rejections["train"] == {"indices": 3, "shape": 1, "values": 1}
    flat = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
    assert set(np.nonzero(flat)[0]) == {1, 5, 9}
    # the valid upload came without a declaration: the server books what it asked for
    assert strategy.ledger.epsilon(msgs[0].metadata.dst_node_id) == pytest.approx(_single_round_epsilon(10.0), rel=1e-9)
    # the rejected undeclared uploads reached the server as they were: non-private (issue 16 D8)
    assert all(strategy.ledger.epsilon(m.metadata.dst_node_id) == np.inf for m in msgs[1:])


def _single_round_epsilon(sign_eps: float) -> float:
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(round_event(sign_eps, 5.0), server_round=1, client="x")
    return ledger.epsilon()


def test_evaluate_passes_through_and_a_missing_config_fails_loudly():
    received = ArrayRecord(model())
    msg = Message(
        RecordDict({"arrays": received, "config": ConfigRecord({})}), dst_node_id=7, message_type=MessageType.EVALUATE
    )
    reply = signds_mod(msg, context(), trainer_adding(1.0, 0))
    assert sorted(reply.content["arrays"].keys()) == sorted(received.keys())
    train = Message(
        RecordDict({"arrays": received, "config": ConfigRecord({})}), dst_node_id=7, message_type=MessageType.TRAIN
    )
    with pytest.raises(KeyError, match="signds"):
        signds_mod(train, context(), trainer_adding(1.0, 0))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"sign_k": 0.3}, "sign_k"),
        ({"sign_eps": 0.0}, "sign_eps"),
        ({"sign_global_lr": 0.0}, "sign_global_lr"),
        ({"sign_dim_out": 51}, "sign_dim_out"),
        ({"max_dim_out": 0}, "max_dim_out"),
    ],
)
def test_strategy_parameter_domains(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make(**kwargs)


def test_capped_mod_refuses_a_server_asking_for_more_epsilon():
    from client_mods import make_signds_mod

    strategy = make(sign_k=0.05, sign_eps=10.0)
    msgs = list(strategy.configure_train(1, ArrayRecord(model()), ConfigRecord(), LoopbackGrid.of(N)))
    with pytest.raises(ValueError, match="sign_eps"):
        make_signds_mod(max_sign_eps=5.0)(msgs[0], context(), trainer_adding(1e-3, 0))
    reply = make_signds_mod(max_sign_eps=10.0)(msgs[0], context(), trainer_adding(1e-3, 0))
    assert sorted(reply.content["arrays"].keys()) == ["b-hat", "indices", "sign"]
