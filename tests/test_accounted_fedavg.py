"""AccountedFedAvg: booking client declarations, screening malformed replies, per-round ε."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent, LaplaceDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flwr_dp_strategies import AccountedFedAvg, declare_release, read_declarations
from flwr_dp_strategies.declarations import PRIVACY_RECORD, MalformedDeclaration
from flwr_dp_strategies.privacy import PrivacyLedger

from loopback import LoopbackGrid

N = 4
pytestmark = pytest.mark.usefixtures("task_identity")


def reply_to(
    msg: Message, arrays: list[np.ndarray], *, weight: float = 10.0, event=None, metrics: dict | None = None
) -> Message:
    content = RecordDict(
        {"arrays": ArrayRecord(arrays), "metrics": MetricRecord(metrics or {"num-examples": weight, "loss": 0.5})}
    )
    if event is not None:
        declare_release(content, event, label="test", neighboring_relation="replace_one")
    return Message(content, reply_to=msg)


def configure(strategy: AccountedFedAvg, server_round: int, current: list[np.ndarray]) -> list[Message]:
    return list(strategy.configure_train(server_round, ArrayRecord(current), ConfigRecord(), LoopbackGrid.of(N)))


def make() -> AccountedFedAvg:
    return AccountedFedAvg(min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N)


def test_declarations_round_trip_and_append():
    content = RecordDict()
    declare_release(content, GaussianDpEvent(1.5), label="a", neighboring_relation="replace_one")
    declare_release(content, LaplaceDpEvent(0.5), label="b", neighboring_relation="replace_one")
    got = read_declarations(content)
    assert [d.label for d in got] == ["a", "b"]
    assert got[0].event == GaussianDpEvent(1.5) and got[1].event == LaplaceDpEvent(0.5)
    assert read_declarations(RecordDict()) == []


@pytest.mark.parametrize(
    "entries",
    [
        ["not json"],
        [json.dumps({"event": {"type": "os.system", "x": 1}})],
        [json.dumps({"label": "no event"})],
        ["x" * 5000],
        [json.dumps({"event": {"type": "GaussianDpEvent", "noise_multiplier": 1.0}})] * 65,
    ],
)
def test_malformed_declarations_raise(entries):
    content = RecordDict({PRIVACY_RECORD: ConfigRecord({"events": entries})})
    with pytest.raises(MalformedDeclaration):
        read_declarations(content)


def test_declared_events_are_booked_per_node_and_composed_over_rounds():
    strategy = make()
    current = [np.zeros(3), np.zeros((2, 2))]
    eps = []
    for rnd in (1, 2, 3):
        msgs = configure(strategy, rnd, current)
        replies = [reply_to(m, [current[0] + 1, current[1] + 1], event=GaussianDpEvent(2.0)) for m in msgs]
        arrays, metrics = strategy.aggregate_train(rnd, replies)
        assert arrays is not None
        eps.append(metrics["privacy/epsilon"])
        current = arrays.to_numpy_ndarrays()
    assert set(strategy.ledger.clients) == {str(i) for i in range(101, 101 + N)}
    expected = PrivacyLedger(1e-5)
    for rnd in (1, 2, 3):
        expected.record(GaussianDpEvent(2.0), server_round=rnd, client="x")
    assert eps[-1] == pytest.approx(expected.epsilon(), rel=1e-9)
    assert eps[0] < eps[1] < eps[2]
    assert metrics["privacy/clients"] == N


def test_malformed_replies_are_rejected_counted_and_the_round_goes_on():
    strategy = make()
    current = [np.zeros(3), np.zeros((2, 2))]
    msgs = configure(strategy, 1, current)
    good = [np.ones(3), np.ones((2, 2))]
    bad_decl = reply_to(msgs[3], good)
    bad_decl.content[PRIVACY_RECORD] = ConfigRecord({"events": ["{broken"]})
    replies = [
        reply_to(msgs[0], good),
        reply_to(msgs[1], [np.array([np.nan, 1, 1]), np.ones((2, 2))]),  # NaN
        reply_to(msgs[2], [np.ones(4), np.ones((2, 2))]),  # wrong shape
        bad_decl,
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.ones(3))
    assert strategy.rejections["train"]["non-finite"] == 1
    assert strategy.rejections["train"]["shape"] == 1
    assert strategy.rejections["train"]["declaration"] == 1
    assert strategy.rejections["train"]["keys"] == 0


def test_wrong_keys_and_weights_are_rejected_but_other_metric_sets_are_kept():
    strategy = make()
    current = [np.zeros(3)]
    msgs = configure(strategy, 1, current)
    wrong_keys = Message(
        RecordDict(
            {
                "arrays": ArrayRecord({"other": ArrayRecord([np.ones(3)])["0"]}),
                "metrics": MetricRecord({"num-examples": 1.0, "loss": 0.1}),
            }
        ),
        reply_to=msgs[1],
    )
    replies = [
        reply_to(msgs[0], [np.ones(3)]),
        wrong_keys,
        reply_to(msgs[2], [np.ones(3)], weight=-1.0),
        reply_to(msgs[3], [np.ones(3)], metrics={"num-examples": 5.0, "extra": 1.0}),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None
    # acceptance depends on each reply alone (issue 16 C6): a different metric key set is no rejection;
    # each key is averaged over the replies that carry it
    assert strategy.rejections["train"] == {"keys": 1, "weight": 1}
    assert metrics["loss"] == pytest.approx(0.5) and metrics["extra"] == pytest.approx(1.0)


def test_a_rejected_reply_still_has_its_release_booked():
    """The client did send its noisy release: its ε counts even if the reply is not aggregated."""
    strategy = make()
    msgs = configure(strategy, 1, [np.zeros(3)])
    replies = [reply_to(m, [np.full(3, np.inf)], event=LaplaceDpEvent(1.0)) for m in msgs]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is None
    assert strategy.rejections["train"]["non-finite"] == N
    assert len(strategy.ledger.clients) == N
    assert metrics["privacy/epsilon"] == pytest.approx(1.0, rel=1e-3)


def test_unaccountable_event_is_rejected_and_does_not_break_the_ledger():
    strategy = make()
    msgs = configure(strategy, 1, [np.zeros(3)])
    replies = [reply_to(m, [np.ones(3)], event=GaussianDpEvent(1.0)) for m in msgs[:3]]
    bad = reply_to(msgs[3], [np.ones(3)])  # declare_release itself refuses NaN: forge the JSON
    bad.content[PRIVACY_RECORD] = ConfigRecord(
        {
            "events": [
                json.dumps(
                    {
                        "event": {"type": "GaussianDpEvent", "noise_multiplier": float("nan")},
                        "label": "x",
                        "relation": "replace_one",
                    }
                )
            ]
        }
    )
    replies.append(bad)
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"]["declaration"] == 1
    assert all(np.isfinite(strategy.ledger.epsilon(m.metadata.dst_node_id)) for m in msgs[:3])
    # the NaN declaration was not booked; the raw update it came with was (issue 16 D8): non-private
    assert strategy.ledger.epsilon(msgs[3].metadata.dst_node_id) == np.inf


def test_ledger_path_persists_and_restores(tmp_path):
    path = str(tmp_path / "ledger.json")
    strategy = AccountedFedAvg(min_train_nodes=N, min_available_nodes=N, ledger_path=path)
    msgs = configure(strategy, 1, [np.zeros(3)])
    strategy.aggregate_train(1, [reply_to(m, [np.ones(3)], event=LaplaceDpEvent(0.5)) for m in msgs])
    restarted = AccountedFedAvg(min_train_nodes=N, min_available_nodes=N, ledger_path=path, resume=True)
    assert restarted.ledger.epsilon() == pytest.approx(strategy.ledger.epsilon())
    assert restarted.ledger.clients == strategy.ledger.clients


def test_per_client_metrics_and_evaluate_declarations():
    strategy = AccountedFedAvg(
        min_train_nodes=N,
        min_available_nodes=N,
        min_evaluate_nodes=N,
        per_client_metrics=True,
        evaluate_metrics="flower",
    )
    msgs = list(strategy.configure_evaluate(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(N)))
    replies = []
    for m in msgs:
        scale = float(m.metadata.dst_node_id - 100)  # nodes 101..104 -> Laplace scale 1..4
        content = RecordDict({"metrics": MetricRecord({"num-examples": 5.0, "accuracy": 0.5})})
        declare_release(content, LaplaceDpEvent(scale), label="eval", neighboring_relation="replace_one")  # ε = 1/scale
        replies.append(Message(content, reply_to=m))
    metrics = strategy.aggregate_evaluate(1, replies)
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["privacy/epsilon/node-101"] == pytest.approx(1.0, rel=1e-3)
    assert metrics["privacy/epsilon/node-104"] == pytest.approx(0.25, rel=1e-3)
    assert metrics["privacy/epsilon"] == pytest.approx(1.0, rel=1e-3)


def test_a_node_over_max_epsilon_is_not_asked_again(caplog):
    """Issue 37 item 4 (its budget half): with ``max_epsilon`` set, a node whose own ε exceeds it (here ∞: it sent
    an undeclared, non-private update; and a node that declared too much) is left out of the next rounds' sample;
    the others are still asked. Without a budget every node is asked, as FedAvg does."""
    strategy = AccountedFedAvg(
        min_train_nodes=N,
        min_available_nodes=N,
        min_evaluate_nodes=N,
        ledger=PrivacyLedger(1e-5, neighboring_relation="replace_one", max_epsilon=5.0),
    )
    current = [np.zeros(3)]
    messages = configure(strategy, 1, current)
    assert len(messages) == N
    replies = []
    for i, msg in enumerate(messages):
        event = None if i == 0 else GaussianDpEvent(0.1 if i == 1 else 20.0)  # 0: undeclared, 1: ε ≫ 5, else small
        replies.append(reply_to(msg, [np.full(3, 0.1)], event=event))
    strategy.aggregate_train(1, replies)
    nodes = [int(m.metadata.dst_node_id) for m in messages]
    assert strategy.ledger.epsilon(nodes[0]) == float("inf") and strategy.ledger.epsilon(nodes[1]) > 5.0
    assert all(strategy.ledger.epsilon(n) < 5.0 for n in nodes[2:])
    with caplog.at_level("INFO"):
        second = configure(strategy, 2, current)
    assert sorted(int(m.metadata.dst_node_id) for m in second) == sorted(nodes[2:])
    assert "2 sampled node(s) over max_epsilon=5 are not asked to train" in caplog.text
    unbounded = make()
    first = configure(unbounded, 1, current)
    unbounded.aggregate_train(1, [reply_to(m, [np.full(3, 0.1)]) for m in first])
    assert len(configure(unbounded, 2, current)) == N
