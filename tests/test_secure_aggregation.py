"""SecAgg+ on the Message API: exact sums, dropouts, uniform masks, the threshold, malformed replies."""

from __future__ import annotations

import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from flwr_dp_strategies.secure_aggregation import SecureAggregationAborted, SecureAggregationRound
from flwr_dp_strategies.secure_aggregation.client_protocol import ClientRound, handle
from flwr_dp_strategies.secure_aggregation import shamir
from flwr_dp_strategies.secure_aggregation.masks import pack_bits, packed_size, prg_mask, unpack_bits
from flwr_dp_strategies.secure_aggregation.protocol import (
    MASKED_KEY,
    MASKED_RECORD,
    RECORD,
    STAGE_KEY,
    STATE_RECORD,
    ProtocolError,
    stage_of,
)
from flwr_dp_strategies.secure_aggregation.server_protocol import ring_neighbours

from secagg_harness import LoopbackGrid

pytestmark = pytest.mark.usefixtures("task_identity")


def integer_app(vectors: dict[int, np.ndarray], bits: int) -> ClientApp:
    """A ClientApp that runs the client protocol and contributes ``vectors[node]`` (integers mod 2^b)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        if STATE_RECORD not in context.state:
            context.state[STATE_RECORD] = ConfigRecord()
        stage = stage_of(msg.content)
        node = int(context.node_id)
        fields, vector = handle(context.state[STATE_RECORD], node, stage, msg.content[RECORD], lambda: vectors[node])
        out = RecordDict({RECORD: ConfigRecord({STAGE_KEY: stage, **fields})})
        if vector is not None:
            out[MASKED_RECORD] = ArrayRecord({MASKED_KEY: Array(pack_bits(vector, bits))})
        return Message(out, reply_to=msg)

    return app


def run_round(
    grid: LoopbackGrid,
    nodes: list[int],
    *,
    bits: int,
    length: int,
    num_shares: int,
    threshold: int,
    min_survivors: int = 0,
) -> tuple[SecureAggregationRound, np.ndarray]:
    secure = SecureAggregationRound(
        1,
        nodes,
        num_shares=num_shares,
        threshold=threshold,
        min_survivors=min_survivors,
        bits=bits,
        length=length,
        timeout=None,
        rng=random.Random(0),
    )
    secure.setup(grid)
    secure.share_keys(grid)
    replies = grid.send_and_receive(secure.collect_messages(lambda node: RecordDict()))
    secure.add_masked(replies)
    return secure, secure.unmask(grid)


def vectors_for(nodes: list[int], bits: int, length: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.integers(0, 1 << bits, size=length, dtype=np.uint64) for n in nodes}


def modular(total: list[np.ndarray], bits: int) -> np.ndarray:
    out = np.zeros_like(total[0])
    for v in total:
        out += v
    return out & np.uint64((1 << bits) - 1)


@pytest.mark.parametrize("num_shares,threshold", [(10, 6), (5, 3)])
@pytest.mark.parametrize(
    "die",
    [
        {},
        {103: "share-keys"},
        {104: "collect", 108: "collect"},
        {102: "unmask"},
        {101: "setup", 105: "collect", 109: "unmask"},
    ],
)
def test_revealed_value_is_exactly_the_sum_of_the_survivors_vectors(num_shares, threshold, die):
    nodes, bits, length = list(range(101, 111)), 20, 257
    vectors = vectors_for(nodes, bits, length)
    grid = LoopbackGrid(integer_app(vectors, bits), nodes, die=die)
    secure, total = run_round(grid, nodes, bits=bits, length=length, num_shares=num_shares, threshold=threshold)
    dead_before_upload = {n for n, stage in die.items() if stage in ("setup", "share-keys", "collect")}
    assert secure.survivors == set(nodes) - dead_before_upload
    np.testing.assert_array_equal(total, modular([vectors[n] for n in sorted(secure.survivors)], bits))


def test_dropouts_below_the_threshold_abort_cleanly():
    nodes, bits, length = list(range(101, 107)), 16, 64
    vectors = vectors_for(nodes, bits, length)
    grid = LoopbackGrid(integer_app(vectors, bits), nodes, die={101: "collect", 102: "collect", 103: "collect"})
    with pytest.raises(SecureAggregationAborted, match="fewer than 4"):
        run_round(grid, nodes, bits=bits, length=length, num_shares=6, threshold=4)
    # survivors that would have to answer with fewer than t shares in hand: the unmask aborts too
    grid = LoopbackGrid(integer_app(vectors, bits), nodes, die={101: "unmask", 102: "unmask", 103: "unmask"})
    with pytest.raises(SecureAggregationAborted, match="fewer than the threshold"):
        run_round(grid, nodes, bits=bits, length=length, num_shares=6, threshold=4)


def test_a_masked_vector_is_uniform_whatever_the_input():
    """χ² over 2^8 residues of one client's upload for a constant (all-zero) input, and Flower's
    ``pseudo_rand_gen`` for contrast: it never yields range − 1."""
    nodes, bits, length = [1, 2, 3], 8, 1 << 15
    vectors = {n: np.zeros(length, dtype=np.uint64) for n in nodes}
    grid = LoopbackGrid(integer_app(vectors, bits), nodes)
    secure = SecureAggregationRound(
        1, nodes, num_shares=3, threshold=2, min_survivors=2, bits=bits, length=length, timeout=None
    )
    secure.setup(grid)
    secure.share_keys(grid)
    replies = grid.send_and_receive(secure.collect_messages(lambda node: RecordDict()))
    upload = unpack_bits(replies[0].content[MASKED_RECORD][MASKED_KEY].numpy(), bits, length)
    counts = np.bincount(upload.astype(np.int64), minlength=1 << bits)
    assert stats.chisquare(counts).pvalue > 1e-3
    flower = pseudo_rand_gen(b"\x01" * 32, 1 << bits, [(length,)])[0]
    assert stats.chisquare(np.bincount(flower, minlength=1 << bits)).pvalue < 1e-6
    assert int(flower.max()) == (1 << bits) - 2


def shared_keys(nodes: list[int], threshold: int) -> tuple[dict[int, ConfigRecord], dict[int, dict]]:
    """Client states after setup and share-keys on the complete graph, and each client's outgoing shares."""
    states = {n: ConfigRecord() for n in nodes}
    keys = {
        n: ClientRound(states[n], n).setup(
            ConfigRecord({"round": 1, "threshold": threshold, "bits": 16, "colluders": 0})
        )
        for n in nodes
    }
    record = ConfigRecord(
        {
            "round": 1,
            "nids": nodes,
            "pk1s": [keys[n]["pk1"] for n in nodes],
            "pk2s": [keys[n]["pk2"] for n in nodes],
            "view": nodes,
            "graph-seed": 0,
            "num-shares": len(nodes),
        }
    )
    return states, {n: ClientRound(states[n], n).share_keys(record) for n in nodes}


def test_fewer_than_t_shares_do_not_rebuild_a_clients_mask_seed():
    nodes, t = [1, 2, 3, 4, 5], 3
    states, outgoing = shared_keys(nodes, t)
    for n in nodes:
        srcs = [s for s in nodes if s != n]
        ctxts = [outgoing[s]["ctxts"][outgoing[s]["dsts"].index(n)] for s in srcs]
        ClientRound(states[n], n).collect(
            ConfigRecord({"round": 1, "srcs": srcs, "ctxts": ctxts}), lambda: np.zeros(8, dtype=np.uint64)
        )
    seed = bytes(states[1]["seed"])
    shares = [dict(zip(states[h]["seed-owners"], states[h]["seed-shares"]))[1] for h in nodes]
    assert shamir.reconstruct(shares[:t], 32) == seed
    assert shamir.reconstruct(shares[2 : 2 + t], 32) == seed
    try:
        rebuilt = shamir.reconstruct(shares[: t - 1], 32)
    except ValueError:
        rebuilt = None
    assert rebuilt != seed


def test_malformed_masked_replies_are_rejected_and_the_round_still_unmasks():
    nodes, bits, length = list(range(101, 111)), 16, 100
    vectors = vectors_for(nodes, bits, length, seed=3)

    def tamper(msg: Message, reply: Message) -> Message:
        node = int(msg.metadata.dst_node_id)
        if reply.has_error() or reply.content[RECORD].get(STAGE_KEY) != "collect":
            return reply
        if node == 101:
            reply.content[MASKED_RECORD] = ArrayRecord({MASKED_KEY: Array(np.zeros(length, np.uint64))})
        elif node == 102:
            reply.content[MASKED_RECORD] = ArrayRecord({MASKED_KEY: Array(np.zeros(7, np.uint8))})
        elif node == 103:
            del reply.content[MASKED_RECORD]
        elif node == 104:
            reply.content[RECORD][STAGE_KEY] = "unmask"
        return reply

    grid = LoopbackGrid(integer_app(vectors, bits), nodes, tamper=tamper)
    secure, total = run_round(grid, nodes, bits=bits, length=length, num_shares=10, threshold=6)
    assert secure.survivors == set(range(105, 111))
    assert secure.rejected["secure-aggregation"] == 4
    np.testing.assert_array_equal(total, modular([vectors[n] for n in range(105, 111)], bits))


_VIEW = {"view": [1, 2], "graph-seed": 0, "num-shares": 2}


@pytest.mark.parametrize(
    "record,match",
    [
        ({"round": 1, "nids": [1, 2], "pk1s": [b"a"], "pk2s": [b"b", b"c"], **_VIEW}, "must have 2 items"),
        ({"round": 1, "nids": [1, 1], "pk1s": [b"a", b"b"], "pk2s": [b"c", b"d"], **_VIEW}, "repeats"),
        ({"round": 2, "nids": [1, 2], "pk1s": [b"a", b"b"], "pk2s": [b"c", b"d"], **_VIEW}, "after stage"),
        ({"round": True, "nids": [1, 2], "pk1s": [b"a", b"b"], "pk2s": [b"c", b"d"], **_VIEW}, "must be int"),
        ({"round": 1, "nids": [1, 2], "pk1s": [b"a", b"b"], "pk2s": [b"c", b"d"]}, "'view' is missing"),
        (
            {"round": 1, "nids": [1, 2], "pk1s": [b"a", b"b"], "pk2s": [b"c", b"d"], **_VIEW, "view": [2, 3]},
            "does not hold this node",
        ),
        (
            {"round": 1, "nids": [1, 2], "pk1s": [b"a", b"b"], "pk2s": [b"c", b"d"], **_VIEW, "view": [1, 2, 3]},
            "not this node's neighbourhood",
        ),
    ],
)
def test_a_client_refuses_malformed_or_out_of_order_instructions(record, match):
    state = ConfigRecord()
    client = ClientRound(state, 1)
    client.setup(ConfigRecord({"round": 1, "threshold": 2, "bits": 16, "colluders": 0}))
    with pytest.raises(ProtocolError, match=match):
        client.share_keys(ConfigRecord(record))


def test_a_client_never_reveals_both_shares_of_a_node_and_answers_unmask_once():
    nodes = [1, 2, 3]
    states, outgoing = shared_keys(nodes, 2)
    srcs = [2, 3]
    ctxts = [outgoing[s]["ctxts"][outgoing[s]["dsts"].index(1)] for s in srcs]
    ClientRound(states[1], 1).collect(
        ConfigRecord({"round": 1, "srcs": srcs, "ctxts": ctxts}), lambda: np.zeros(4, dtype=np.uint64)
    )
    with pytest.raises(ProtocolError, match="both"):
        ClientRound(states[1], 1).unmask(ConfigRecord({"round": 1, "active": [1, 2], "dead": [2]}))
    with pytest.raises(ProtocolError, match="fewer than the threshold"):
        ClientRound(states[1], 1).unmask(ConfigRecord({"round": 1, "active": [1], "dead": [2, 3]}))
    answer = ClientRound(states[1], 1).unmask(ConfigRecord({"round": 1, "active": [1, 2], "dead": [3]}))
    assert answer["nids"] == [1, 2, 3]
    with pytest.raises(ProtocolError, match="after stage"):
        ClientRound(states[1], 1).unmask(ConfigRecord({"round": 1, "active": [1, 3], "dead": [2]}))


def test_a_forwarded_ciphertext_for_another_node_is_refused():
    nodes = [1, 2, 3]
    states, outgoing = shared_keys(nodes, 2)
    for_3 = outgoing[2]["ctxts"][outgoing[2]["dsts"].index(3)]
    with pytest.raises(ProtocolError, match="does not decrypt"):
        ClientRound(states[1], 1).collect(
            ConfigRecord({"round": 1, "srcs": [2], "ctxts": [for_3]}), lambda: np.zeros(4, dtype=np.uint64)
        )


def test_masks_and_packing():
    key = bytes(range(32))
    mask = prg_mask(key, 1000, 20)
    assert mask.dtype == np.uint64 and int(mask.max()) < 1 << 20
    np.testing.assert_array_equal(prg_mask(key, 10, 20), mask[:10])
    assert not np.array_equal(prg_mask(bytes(32), 1000, 20), mask)
    for bits in (2, 13, 32, 62):
        v = np.random.default_rng(bits).integers(0, 1 << bits, size=333, dtype=np.uint64)
        packed = pack_bits(v, bits)
        assert packed.size == packed_size(333, bits) == -(-333 * bits // 8)
        np.testing.assert_array_equal(unpack_bits(packed, bits, 333), v)
    with pytest.raises(ValueError, match="bits"):
        prg_mask(key, 4, 63)
    with pytest.raises(ValueError, match="key"):
        prg_mask(b"short", 4, 8)


def test_ring_neighbourhoods_are_symmetric_of_size_k_and_a_function_of_the_public_seed():
    nodes = list(range(20))
    graph = ring_neighbours(nodes, 7, 1)
    for u, peers in graph.items():
        assert u in peers and len(peers) == 7
        assert all(u in graph[v] for v in peers)
    assert all(len(p) == 20 for p in ring_neighbours(nodes, 25, 1).values())
    assert ring_neighbours(list(reversed(nodes)), 7, 1) == graph  # the order the server lists them in is irrelevant
    assert ring_neighbours(nodes, 7, 2) != graph


@settings(max_examples=8, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(list(range(101, 109))),
        st.sampled_from(["setup", "share-keys", "collect", "unmask"]),
        max_size=3,
    ),
    st.sampled_from([(8, 5), (5, 3)]),
)
def test_any_dropout_pattern_either_reveals_the_exact_sum_or_aborts(die, graph):
    nodes, bits, length = list(range(101, 109)), 12, 33
    vectors = vectors_for(nodes, bits, length, seed=len(die))
    grid = LoopbackGrid(integer_app(vectors, bits), nodes, die=die)
    try:
        secure, total = run_round(grid, nodes, bits=bits, length=length, num_shares=graph[0], threshold=graph[1])
    except SecureAggregationAborted:
        return
    uploaded = {n for n in nodes if die.get(n) not in ("setup", "share-keys", "collect")}
    assert secure.survivors == uploaded
    np.testing.assert_array_equal(total, modular([vectors[n] for n in sorted(uploaded)], bits))


def test_corrupt_shares_of_a_dropped_clients_key_abort_instead_of_unmasking_garbage():
    nodes, bits, length = list(range(101, 107)), 16, 40
    vectors = vectors_for(nodes, bits, length)

    def tamper(msg: Message, reply: Message) -> Message:
        if reply.has_error() or reply.content[RECORD].get(STAGE_KEY) != "unmask":
            return reply
        record = reply.content[RECORD]
        shares = list(record["shares"])
        for index, owner in enumerate(record["nids"]):
            if owner == 101:  # the dropped node: its key's shares are corrupted in transit
                share = bytearray(shares[index])
                share[-1] ^= 0x5A
                shares[index] = bytes(share)
        record["shares"] = shares
        return reply

    grid = LoopbackGrid(integer_app(vectors, bits), nodes, die={101: "collect"}, tamper=tamper)
    with pytest.raises(SecureAggregationAborted, match="corrupt shares|cannot be rebuilt"):
        run_round(grid, nodes, bits=bits, length=length, num_shares=6, threshold=4)


def test_through_the_mod_the_revealed_sum_is_exactly_the_clipped_rotated_rounded_updates_mod_2b():
    """No noise (share 0): the secure round reveals Σ to_modular(k_u) where k_u is each client's clipped,
    rotated, scaled, conditionally rounded update, replayed from the same generator."""
    from flwr_dp_strategies.privacy.distributed_dp import (
        DistributedDpParams,
        client_integer_vector,
        modular_sum,
        to_modular,
    )

    from secagg_harness import shifting_app

    nodes, d, bits = list(range(101, 107)), 100, 24
    rng = np.random.default_rng(5)
    deltas = {n: rng.normal(size=d) * (0.05 if n % 2 else 1.0) for n in nodes}  # half of them clipped
    params = DistributedDpParams(dim=d, clip_norm=1.0, scale=50.0, bits=bits, rotation_seed=7)
    grid = LoopbackGrid(shifting_app(deltas, rng=np.random.default_rng(11)), nodes, die={104: "collect"})
    secure = SecureAggregationRound(
        1, nodes, num_shares=6, threshold=4, min_survivors=4, bits=bits, length=params.padded_dim, timeout=None
    )
    secure.setup(grid)
    secure.share_keys(grid)
    public = {
        "dp-dim": d,
        "dp-clip-norm": 1.0,
        "dp-scale": 50.0,
        "dp-rotation-seed": 7,
        "dp-beta": params.beta,
        "dp-noise-share": 0.0,
    }
    model = ArrayRecord({"w": Array(np.zeros(d, np.float32))})
    replies = grid.send_and_receive(
        secure.collect_messages(lambda node: RecordDict({"arrays": model, "config": ConfigRecord()}), public)
    )
    secure.add_masked(replies)
    total = secure.unmask(grid)
    replay = np.random.default_rng(11)
    expected = []
    for n in sorted(set(nodes) - {104}):  # the mod drew in the order the collect messages went out
        update = deltas[n].astype(np.float32).astype(np.float64)  # what w' - w is after the float32 model
        expected.append(to_modular(client_integer_vector(update, params, rng=replay), bits))
    np.testing.assert_array_equal(total, modular_sum(expected, params))
