"""Malformed secure-aggregation messages, both ways.

From clients to the server: any mix of malformed setup, share-keys, collect and unmask replies either
reveals exactly the sum of the survivors' vectors or aborts the round (SecureAggregationAborted); the
server never reveals a wrong sum and never raises anything else. From a server to a client: any
malformed instruction is refused with a ValueError (ProtocolError) or answered as the protocol says;
it never makes a client answer for a node it holds no share of, or answer twice.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_dp_strategies.secure_aggregation import SecureAggregationAborted, SecureAggregationRound
from flwr_dp_strategies.secure_aggregation.client_protocol import ClientRound
from flwr_dp_strategies.secure_aggregation.protocol import RECORD, STAGE_KEY, Stage

from secagg_harness import LoopbackGrid
from test_secure_aggregation import integer_app, modular, vectors_for

pytestmark = pytest.mark.usefixtures("task_identity")

NODES, BITS, LENGTH = list(range(101, 109)), 12, 17


def _garbage(value):
    if isinstance(value, bytes):
        return value[:3] + b"\x00" + value[4:] if len(value) > 4 else b"\x01"
    if isinstance(value, list):
        return value[:-1] if value else [b"\x00"]
    return "garbage"


FIELD_MUTATIONS = {
    "delete": lambda record, key: record.__delitem__(key),
    "wrong-type": lambda record, key: record.__setitem__(key, 3.5),
    "garbage": lambda record, key: record.__setitem__(key, _garbage(record[key])),
    "repeat": lambda record, key: record.__setitem__(
        key, list(record[key]) * 2 if isinstance(record[key], list) else record[key]
    ),
}
CONTENT_MUTATIONS = {
    "stage": lambda reply: reply.content[RECORD].__setitem__(
        STAGE_KEY, Stage.UNMASK if reply.content[RECORD].get(STAGE_KEY) != Stage.UNMASK else Stage.SETUP
    ),
    "extra-record": lambda reply: reply.content.__setitem__("more", ConfigRecord({"x": 1})),
    "no-record": lambda reply: reply.content.__delitem__(RECORD),
}


def mutate(reply: Message, how: str, pick: int) -> None:
    if how in CONTENT_MUTATIONS:
        CONTENT_MUTATIONS[how](reply)
        return
    record = reply.content[RECORD]
    keys = sorted(k for k in record.keys() if k != STAGE_KEY)
    if keys:
        FIELD_MUTATIONS[how](record, keys[pick % len(keys)])


MUTATION = st.tuples(
    st.sampled_from([Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT, Stage.UNMASK]),
    st.sampled_from(sorted(FIELD_MUTATIONS) + sorted(CONTENT_MUTATIONS)),
    st.integers(0, 5),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(NODES), MUTATION, max_size=3), st.sampled_from([(8, 5), (5, 3)]))
def test_malformed_client_replies_reveal_the_exact_survivors_sum_or_abort(mutations, graph):
    vectors = vectors_for(NODES, BITS, LENGTH, seed=len(mutations))

    def tamper(msg: Message, reply: Message) -> Message:
        node = int(msg.metadata.dst_node_id)
        if reply.has_error() or node not in mutations:
            return reply
        stage, how, pick = mutations[node]
        if reply.content[RECORD].get(STAGE_KEY) == stage:
            mutate(reply, how, pick)
        return reply

    grid = LoopbackGrid(integer_app(vectors, BITS), NODES, tamper=tamper)
    secure = SecureAggregationRound(
        1,
        NODES,
        num_shares=graph[0],
        threshold=graph[1],
        min_survivors=graph[1],
        bits=BITS,
        length=LENGTH,
        timeout=None,
        rng=random.Random(0),
    )
    try:
        secure.setup(grid)
        secure.share_keys(grid)
        secure.add_masked(grid.send_and_receive(secure.collect_messages(lambda node: RecordDict())))
        total = secure.unmask(grid)
    except SecureAggregationAborted:
        return
    np.testing.assert_array_equal(total, modular([vectors[n] for n in sorted(secure.survivors)], BITS))
    for node, (stage, how, _) in mutations.items():  # a reply whose records were replaced never counts
        if how in CONTENT_MUTATIONS and stage != Stage.UNMASK:
            assert node not in secure.survivors


# ---------------------------------------------------------------------------------------------- server → client
def honest_messages(nodes: list[int]) -> tuple[dict[int, ConfigRecord], dict[str, dict[int, ConfigRecord]]]:
    """Client states and the honest server's record for each stage and node (a complete graph of 4, t = 3)."""
    states = {n: ConfigRecord() for n in nodes}
    setup = {n: ConfigRecord({"round": 1, "threshold": 3, "bits": BITS, "colluders": 0}) for n in nodes}
    keys = {n: ClientRound(states[n], n).setup(setup[n]) for n in nodes}
    share = {
        n: ConfigRecord(
            {
                "round": 1,
                "nids": nodes,
                "pk1s": [keys[m]["pk1"] for m in nodes],
                "pk2s": [keys[m]["pk2"] for m in nodes],
                "view": nodes,
                "graph-seed": 3,
                "num-shares": len(nodes),
            }
        )
        for n in nodes
    }
    return states, {Stage.SETUP: setup, Stage.SHARE_KEYS: share}


def run_client(state: ConfigRecord, node: int, stage: str, record: ConfigRecord) -> dict:
    client = ClientRound(state, node)
    if stage == Stage.SETUP:
        return client.setup(record)
    if stage == Stage.SHARE_KEYS:
        return client.share_keys(record)
    if stage == Stage.COLLECT:
        client.collect(record, lambda: np.zeros(LENGTH, dtype=np.uint64))
        return {}
    return client.unmask(record)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT, Stage.UNMASK]),
    st.sampled_from(sorted(FIELD_MUTATIONS)),
    st.integers(0, 9),
)
def test_a_client_refuses_a_malformed_instruction_with_a_value_error(stage, how, pick):
    nodes = [1, 2, 3, 4]
    states, records = honest_messages(nodes)
    outgoing = {n: ClientRound(states[n], n).share_keys(records[Stage.SHARE_KEYS][n]) for n in nodes}
    collect = {
        n: ConfigRecord(
            {
                "round": 1,
                "srcs": [m for m in nodes if m != n],
                "ctxts": [outgoing[m]["ctxts"][outgoing[m]["dsts"].index(n)] for m in nodes if m != n],
            }
        )
        for n in nodes
    }
    unmask = ConfigRecord({"round": 1, "active": [1, 2, 3], "dead": [4]})
    if stage in (Stage.SETUP, Stage.SHARE_KEYS):  # replay from a fresh state
        states, records = honest_messages(nodes)
        if stage == Stage.SHARE_KEYS:
            record = records[Stage.SHARE_KEYS][1]
        else:
            states[1].clear()
            record = records[Stage.SETUP][1]
    elif stage == Stage.COLLECT:
        record = collect[1]
    else:
        ClientRound(states[1], 1).collect(collect[1], lambda: np.zeros(LENGTH, dtype=np.uint64))
        record = unmask
    keys = sorted(k for k in record.keys() if k != "round") or ["round"]
    mutated = ConfigRecord(dict(record.items()))
    FIELD_MUTATIONS[how](mutated, keys[pick % len(keys)])
    try:
        answer = run_client(states[1], 1, stage, mutated)
    except ValueError:
        return  # ProtocolError is a ValueError: Flower turns it into an error reply
    assert how not in ("delete", "wrong-type"), "a missing or mistyped field was answered"
    if stage == Stage.UNMASK:
        held = {2, 3, 4}
        assert set(answer["nids"]) <= held | {1}
        with pytest.raises(ValueError):  # answered once
            run_client(states[1], 1, stage, unmask)
