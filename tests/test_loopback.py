"""The tests' own Grid (tests/loopback.py): metadata as a SuperLink sets it, dropped, failing and silent nodes."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from loopback import CLIENT_APP_RAISED_EXCEPTION, NODE_UNAVAILABLE, SUPERLINK_NODE_ID, LoopbackGrid, run_round

pytestmark = pytest.mark.usefixtures("task_identity")


def echo(msg: Message) -> Message:
    return Message(
        RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg
    )


def test_replies_carry_the_ids_a_superlink_sets():
    grid = LoopbackGrid.of(3, echo)
    assert isinstance(grid, Grid) and grid.get_node_ids() == [101, 102, 103]
    messages = [Message(RecordDict({"arrays": ArrayRecord([np.zeros(2)])}), n, "train") for n in (101, 103)]
    replies = grid.send_and_receive(messages)
    assert len({m.metadata.message_id for m in messages}) == 2 and all(m.metadata.message_id for m in messages)
    assert [r.metadata.reply_to_message_id for r in replies] == [m.metadata.message_id for m in messages]
    assert [r.metadata.src_node_id for r in replies] == [101, 103]
    assert all(r.metadata.dst_node_id == m.metadata.src_node_id for r, m in zip(replies, messages))
    assert grid.sent == messages and grid.received == replies
    assert grid.run.run_id == 1


def test_push_then_pull_and_a_reply_is_pulled_once():
    grid = LoopbackGrid.of(2, echo)
    ids = list(grid.push_messages([Message(RecordDict({"arrays": ArrayRecord([np.zeros(1)])}), 102, "train")]))
    assert len(grid.pull_messages(ids)) == 1 and grid.pull_messages(ids) == []


def test_dropped_raising_and_silent_nodes():
    def client(msg: Message, context: Context) -> Message | None:
        if context.node_id == 102:
            raise RuntimeError("boom")
        if context.node_id == 103:
            return None  # never answers
        return echo(msg)

    grid = LoopbackGrid.of(4, client, drop={104})
    messages = [Message(RecordDict({"arrays": ArrayRecord([np.zeros(1)])}), n, "train") for n in grid.get_node_ids()]
    replies = {r.metadata.reply_to_message_id: r for r in grid.send_and_receive(messages)}
    by_node = {m.metadata.dst_node_id: replies.get(m.metadata.message_id) for m in messages}
    assert by_node[101].has_content() and by_node[103] is None
    assert by_node[102].error.code == CLIENT_APP_RAISED_EXCEPTION and by_node[102].metadata.src_node_id == 102
    assert by_node[104].error.code == NODE_UNAVAILABLE and by_node[104].metadata.src_node_id == SUPERLINK_NODE_ID
    assert grid.errors == ["102: boom"]


def test_a_client_app_with_a_mod_keeps_its_context_across_rounds():
    app = ClientApp()

    def counting_mod(msg, context, call_next):
        context.state["count"] = MetricRecord({"n": int(context.state.get("count", MetricRecord({"n": 0}))["n"]) + 1})
        return call_next(msg, context)

    @app.train(mods=[counting_mod])
    def train(msg: Message, context: Context) -> Message:
        return echo(msg)

    strategy = FedAvg(min_train_nodes=2, min_available_nodes=2, fraction_evaluate=0.0)
    grid = LoopbackGrid.of(2, app)
    arrays = ArrayRecord([np.ones(3)])
    for rnd in (1, 2):
        messages, replies, (arrays, _) = run_round(strategy, grid, arrays, rnd)
        assert len(messages) == len(replies) == 2
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.ones(3))
    assert [int(grid.contexts[n].state["count"]["n"]) for n in (101, 102)] == [2, 2]


def test_run_round_evaluates_too():
    def evaluate(msg: Message) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1, "acc": 0.5})}), reply_to=msg)

    strategy = FedAvg(min_evaluate_nodes=2, min_available_nodes=2, fraction_evaluate=1.0)
    messages, replies, metrics = run_round(
        strategy, LoopbackGrid.of(2, evaluate), ArrayRecord([np.ones(1)]), 1, phase="evaluate"
    )
    assert len(replies) == 2 and metrics["acc"] == pytest.approx(0.5)


def test_exchange_stops_waiting_for_a_node_that_left_the_federation():
    """Flower 1.43 drops the reply of a node that died (1.41–1.42 answer with an error reply): the round's
    exchange must not wait for it until the timeout (issue 38 item 1)."""
    import time

    from flwr.app import ConfigRecord, Message, RecordDict

    from flwr_dp_strategies.rounds.exchange import push_and_pull as exchange  # a Flower Grid's path
    from loopback import LoopbackGrid

    class Dropping(LoopbackGrid):
        """Node 103 never answers, and leaves the node list after its message was pushed."""

        def push_messages(self, messages):
            ids = super().push_messages(messages)
            self.left = True
            return ids

        def pull_messages(self, message_ids):
            return [r for r in super().pull_messages(message_ids) if int(r.metadata.src_node_id) != 103]

        def get_node_ids(self):
            nodes = super().get_node_ids()
            return [n for n in nodes if n != 103] if getattr(self, "left", False) else nodes

    grid = Dropping(lambda msg: Message(RecordDict({"c": ConfigRecord({"ok": 1})}), reply_to=msg), [101, 102, 103])
    messages = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in (101, 102, 103)]
    started = time.monotonic()
    replies = exchange(grid, messages, timeout=600)
    assert sorted(int(r.metadata.src_node_id) for r in replies) == [101, 102]
    assert time.monotonic() - started < 5  # before: the whole timeout
    # a node still listed is waited for, until the timeout
    grid = Dropping(lambda msg: Message(RecordDict({"c": ConfigRecord({"ok": 1})}), reply_to=msg), [101, 102, 103])
    grid.get_node_ids = lambda: [101, 102, 103]
    started = time.monotonic()
    assert len(exchange(grid, [Message(RecordDict(), dst_node_id=103, message_type="train")], timeout=0.5)) == 0
    assert 0.4 < time.monotonic() - started < 5
