"""Secure aggregation against the adversaries of docs/distributed-dp.md's threat-model table.

Each test plays one adversary through the real client mod (``distributed_dp_mod``: real ECDH, Shamir,
Fernet and ChaCha20) and the real server protocol, and checks what it learns: a lying server (the
double reveal, forced thresholds, hand-picked views), colluding clients, an honest server facing a
survivors' graph that splits, and the client's noise floor. The positive controls replay each attack
against clients that accept what the old rules accepted, to show the attack code itself works.
"""

from __future__ import annotations

import logging
import math
import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from flwr_dp_strategies import DistributedDpFedAvg
from flwr_dp_strategies.privacy.distributed_dp import DistributedDpParams, decode_sum
from flwr_dp_strategies.secure_aggregation import SecureAggregationAborted, SecureAggregationRound
from flwr_dp_strategies.secure_aggregation import client_protocol, protocol
from flwr_dp_strategies.secure_aggregation import shamir
from flwr_dp_strategies.secure_aggregation.client_protocol import agreed_key, private_key_from_scalar
from flwr_dp_strategies.secure_aggregation.masks import apply_mask, pairwise_sign, prg_mask, reduce_mod
from flwr_dp_strategies.secure_aggregation.protocol import (
    RECORD,
    STAGE_KEY,
    STATE_RECORD,
    ProtocolError,
    Stage,
    choose_num_shares,
    graph_failure_bound,
    honest_shares_bound,
    min_threshold,
    ring_neighbours,
)

from secagg_harness import LoopbackGrid, shifting_app, stage_of_message

pytestmark = pytest.mark.usefixtures("task_identity")

D, BITS, SCALE = 64, 24, 200.0
PARAMS = DistributedDpParams(dim=D, clip_norm=1.0, scale=SCALE, bits=BITS, rotation_seed=5)
PUBLIC = {
    "dp-dim": D,
    "dp-clip-norm": 1.0,
    "dp-scale": SCALE,
    "dp-rotation-seed": 5,
    "dp-beta": PARAMS.beta,
    "dp-noise-share": 0.0,
}  # no noise: what the attacker reads is the update itself


def deltas_for(nodes: list[int]) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(1)
    return {n: rng.normal(size=D) * 0.05 for n in nodes}


def secure_round(
    nodes: list[int], *, threshold: int, num_shares: int, colluders: int = 0, die: dict | None = None, tamper=None
) -> tuple[SecureAggregationRound, LoopbackGrid]:
    """A round past setup and share-keys. ``threshold`` is written into the round after construction,
    as a server that ignores the library's own check would."""
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes, die=die, tamper=tamper)
    size = protocol.neighbourhood_size(len(nodes), num_shares)
    secure = SecureAggregationRound(
        1,
        nodes,
        num_shares=num_shares,
        threshold=min_threshold(size, colluders),
        min_survivors=2,
        bits=BITS,
        length=PARAMS.padded_dim,
        timeout=None,
        colluders=colluders,
        rng=random.Random(7),
    )
    secure.threshold = threshold
    secure.min_survivors = 2
    secure.setup(grid)
    secure.share_keys(grid)
    return secure, grid


def collect(secure: SecureAggregationRound, grid: LoopbackGrid) -> dict[int, np.ndarray]:
    model = ArrayRecord({"w": Array(np.zeros(D, np.float32))})
    replies = grid.send_and_receive(
        secure.collect_messages(lambda node: RecordDict({"arrays": model, "config": ConfigRecord()}), PUBLIC)
    )
    secure.add_masked(replies)
    return {int(r.metadata.src_node_id): secure.masked_vector(r.content) for r in replies if not r.has_error()}


def unmask_requests(
    secure: SecureAggregationRound, grid: LoopbackGrid, told_dead: dict[int, set[int]]
) -> dict[int, tuple[list[int], list[bytes]]]:
    """Ask every survivor for its shares, naming the nodes in ``told_dead[holder]`` as dropped and every
    other held peer as alive (each request complete, as clients require); the answers by holder."""
    messages = []
    for node in sorted(secure.survivors):
        held = {src for src, _ in secure.forwarded[node]} | {node}
        dead = sorted(told_dead.get(node, set()) & held - {node})
        messages.append(
            secure._message(node, {STAGE_KEY: Stage.UNMASK, "active": sorted(held - set(dead)), "dead": dead})
        )
    answers = {}
    for reply in grid.send_and_receive(messages):
        if not reply.has_error():
            record = reply.content[RECORD]
            answers[int(reply.metadata.src_node_id)] = (list(record["nids"]), list(record["shares"]))
    return answers


def read_vector(
    secure: SecureAggregationRound, masked: np.ndarray, target: int, seed_shares: list[bytes], sk1_shares: list[bytes]
) -> np.ndarray | None:
    """The target's own encoding, if t shares of both its seed and its key are in hand (None otherwise)."""
    t = secure.threshold
    if len(seed_shares) < t or len(sk1_shares) < t:
        return None
    seed = shamir.reconstruct(seed_shares[:t], 32)
    sk1 = private_key_from_scalar(shamir.reconstruct(sk1_shares[:t], 48))
    vector = masked.copy()
    apply_mask(vector, prg_mask(seed, PARAMS.padded_dim, BITS), -1)
    for peer in sorted(secure.neighbours[target] & secure.shared - {target}):
        key = agreed_key(sk1, secure.public_keys[peer][0])
        apply_mask(vector, prg_mask(key, PARAMS.padded_dim, BITS), -pairwise_sign(target, peer))
    return reduce_mod(vector, BITS)


def double_reveal(nodes: list[int], *, threshold: int, num_shares: int, target: int) -> np.ndarray | None:
    """The attack: the holders of the target's shares are split; one group is told the target survived
    (its mask seed), the other that it dropped (its key). Every split is tried; the decoded update of
    the first that yields both secrets, or None."""
    for alive_group in range(0, len(nodes) + 1):
        secure, grid = secure_round(nodes, threshold=threshold, num_shares=num_shares)
        if target not in secure.shared:
            return None
        masked = collect(secure, grid)
        holders = sorted(h for h in secure.survivors if target in {s for s, _ in secure.forwarded[h]})
        told_dead = {h: {target} for h in holders[alive_group:]}
        answers = unmask_requests(secure, grid, told_dead)
        seeds, keys = [], []
        for holder, (nids, shares) in answers.items():
            for owner, share in zip(nids, shares):
                if owner == target:
                    (keys if target in told_dead.get(holder, set()) else seeds).append(share)
        vector = read_vector(secure, masked[target], target, seeds, keys)
        if vector is not None:
            return decode_sum(vector, PARAMS)
    return None


def clipped(delta: np.ndarray) -> np.ndarray:
    return delta.astype(np.float32).astype(np.float64) * min(1.0, 1.0 / np.linalg.norm(delta))


@pytest.fixture
def old_threshold_rule(monkeypatch):
    """Clients that accept any t ≥ 2 (the rule before 2t > h + c)."""
    monkeypatch.setattr(client_protocol, "min_threshold", lambda holders, colluders=0: 2)


def test_positive_control_the_double_reveal_reads_a_clients_update_when_clients_accept_half(old_threshold_rule):
    nodes = list(range(101, 107))
    got = double_reveal(nodes, threshold=3, num_shares=6, target=103)  # the old default: t = 0.5 k
    assert got is not None
    np.testing.assert_allclose(got, clipped(deltas_for(nodes)[103]), atol=2 * math.sqrt(D) / SCALE)


@pytest.mark.parametrize(
    "n,num_shares,threshold",
    [
        (6, 6, 4),  # the least t clients accept for 6 holders
        (6, 6, 5),  # DistributedDpFedAvg's default at n = 6
        (12, 6, 4),  # a SecAgg+ neighbourhood of 7 in a ring of 12
    ],
)
def test_the_double_reveal_recovers_nothing_under_the_threshold_rule(n, num_shares, threshold):
    nodes = list(range(101, 101 + n))
    assert double_reveal(nodes, threshold=threshold, num_shares=num_shares, target=103) is None


@pytest.mark.parametrize("n,num_shares,threshold", [(4, 4, 2), (6, 6, 3), (12, 6, 3)])
def test_clients_refuse_a_threshold_at_or_below_half_their_share_holders(n, num_shares, threshold):
    nodes = list(range(101, 101 + n))
    with pytest.raises(SecureAggregationAborted):
        secure_round(nodes, threshold=threshold, num_shares=num_shares)
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    with pytest.raises(ValueError, match="threshold must be an integer in"):  # and the honest server refuses it
        SecureAggregationRound(
            1,
            nodes,
            num_shares=num_shares,
            threshold=threshold,
            min_survivors=2,
            bits=BITS,
            length=PARAMS.padded_dim,
            timeout=None,
        )
    assert grid.sent == []


def test_the_clients_refusal_names_the_rule():
    nodes = list(range(101, 105))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    secure = SecureAggregationRound(
        1, nodes, num_shares=4, threshold=3, min_survivors=2, bits=BITS, length=PARAMS.padded_dim, timeout=None
    )
    secure.threshold = 2
    secure.setup(grid)
    with pytest.raises(SecureAggregationAborted):
        secure.share_keys(grid)
    assert len(grid.errors) == 4 and all("2t > h + c" in e for e in grid.errors)


# ---------------------------------------------------------------------------------------------- colluders
def colluders_read(
    nodes: list[int], *, threshold: int, colluders: list[int], target: int, declared: int | None = None
) -> np.ndarray | None:
    """An honest server, plus colluding clients that hand over every share they hold (copied before the
    unmask stage closes their state): the target's update if their shares and the honest unmask together
    rebuild its key. ``declared``: the colluders the server declares (default: as many as there are)."""
    declared = len(colluders) if declared is None else declared
    secure, grid = secure_round(nodes, threshold=threshold, num_shares=len(nodes), colluders=declared)
    masked = collect(secure, grid)
    pooled = []
    for node in colluders:
        state = grid.contexts[node].state[STATE_RECORD]
        pooled += [share for owner, share in zip(state["sk1-owners"], state["sk1-shares"]) if owner == target]
    seeds = []
    for holder, (nids, shares) in unmask_requests(secure, grid, {}).items():  # the honest request
        seeds += [share for owner, share in zip(nids, shares) if owner == target]
    vector = read_vector(secure, masked[target], target, seeds, pooled)
    return None if vector is None else decode_sum(vector, PARAMS)


def test_positive_control_colluders_at_the_threshold_read_a_neighbour(old_threshold_rule):
    nodes = list(range(101, 107))
    got = colluders_read(nodes, threshold=3, colluders=[104, 105, 106], target=101, declared=0)
    np.testing.assert_allclose(got, clipped(deltas_for(nodes)[101]), atol=2 * math.sqrt(D) / SCALE)


def test_colluders_up_to_the_configured_bound_cannot_read_a_neighbour():
    nodes = list(range(101, 107))
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, max_colluding_clients=2)
    sizes = strategy.protocol_sizes(len(nodes))
    assert sizes.threshold > 2 and 2 * sizes.threshold > len(nodes) + 2
    assert colluders_read(nodes, threshold=sizes.threshold, colluders=[105, 106], target=101) is None


def test_colluders_leave_at_least_the_calibrated_noise():
    """Each client adds μ/(m − c): a sum of m survivors less the c colluders' own shares keeps μ."""
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, max_colluding_clients=2, min_survivors=8)
    sizes = strategy.protocol_sizes(10)
    _, calibration = strategy.round_parameters(1, D, sizes)
    assert sizes.honest == 6 and calibration.local_mu == pytest.approx(calibration.mu / 6)
    assert (sizes.min_survivors - 2) * calibration.local_mu >= calibration.mu * (1 - 1e-12)
    plain = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, min_survivors=8)
    _, without = plain.round_parameters(1, D, plain.protocol_sizes(10))
    assert without.local_mu == pytest.approx(without.mu / 8)  # without colluders: μ/m


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"max_colluding_clients": 3, "min_survivors": 3}, "min_survivors"),
        ({"max_colluding_clients": 2, "reconstruction_threshold": 2}, "reconstruction_threshold"),
        ({"max_colluding_clients": -1}, "max_colluding_clients"),
        ({"reconstruction_threshold": 0.5}, "reconstruction_threshold"),
        ({"dropout_rate": 1.0}, "dropout_rate"),
        ({"failure_probability": 0.0}, "failure_probability"),
    ],
)
def test_configurations_that_cannot_resist_their_adversary_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, **kwargs)


def test_a_round_whose_sizes_cannot_be_met_is_skipped_with_a_warning(caplog):
    nodes = [101, 102, 103]
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, max_colluding_clients=3, min_survivors=1.0)
    model = ArrayRecord({"w": Array(np.zeros(D, np.float32))})
    with caplog.at_level(logging.WARNING):
        assert list(strategy.configure_train(1, model, ConfigRecord(), grid)) == []
    assert "round is skipped" in caplog.text and grid.sent == []


def test_a_round_of_two_clients_runs():
    nodes = [101, 102]
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    strategy = DistributedDpFedAvg(noise_multiplier=0.01, clipping_norm=1.0)
    model = ArrayRecord({"w": Array(np.zeros(D, np.float32))})
    replies = grid.send_and_receive(list(strategy.configure_train(1, model, ConfigRecord(), grid)))
    arrays, _ = strategy.aggregate_train(1, replies)
    expected = np.mean([clipped(d) for d in deltas_for(nodes).values()], axis=0)
    assert arrays is not None and np.abs(arrays["w"].numpy() - expected).max() < 0.05


# ---------------------------------------------------------------------------------------------- honest server
def test_a_survivors_graph_that_splits_aborts_before_any_share_is_asked():
    """30 nodes, neighbourhoods of 7: two runs of 3 dropouts on the ring cut out a part of 3 survivors,
    whose sum the server could unmask on its own. The round aborts and no unmask request goes out."""
    nodes = list(range(101, 131))
    secure, grid = secure_round(nodes, threshold=4, num_shares=6)
    secure.min_survivors = 10
    order = sorted(nodes)
    random.Random(secure.graph_seed).shuffle(order)
    for position in (3, 4, 5, 9, 10, 11):
        grid.die[order[position]] = "collect"
    collect(secure, grid)
    with pytest.raises(SecureAggregationAborted, match=r"parts of \[3, 21\]"):
        secure.unmask(grid)
    assert not [m for m in grid.sent if stage_of_message(m) == Stage.UNMASK]


def test_the_default_graph_meets_its_failure_bound_under_random_dropouts():
    """k from choose_num_shares at 100 nodes and 5 % dropout: the bound holds, and over 300 dropout draws
    no survivors' graph splits and every node keeps t live holders."""
    n, rate = 100, 0.05
    k = choose_num_shares(n, colluders=0, dropout_rate=rate, failure_probability=1e-6)
    h = protocol.neighbourhood_size(n, k)
    t = min_threshold(h)
    assert k < n and graph_failure_bound(n, k, t, rate) <= 1e-6
    rng = np.random.default_rng(0)
    from flwr_dp_strategies.secure_aggregation.server_protocol import components

    for draw in range(300):
        graph = ring_neighbours(range(n), k, draw)
        alive = {u for u in range(n) if rng.random() >= rate}
        assert len(components(alive, graph)) == 1
        assert all(len(graph[u] & alive - {u}) + (u in alive) >= t for u in range(n))


# ---------------------------------------------------------------------------------------------- view, requests
def test_a_client_shown_another_view_is_refused_by_its_neighbours():
    """The server gives node 103 another graph seed (same complete neighbourhood): the digest in its
    shares differs, every neighbour refuses them at the collect stage, and 103 refuses theirs."""
    nodes = list(range(101, 107))

    def tamper_share_keys(msg: Message) -> None:
        if stage_of_message(msg) == Stage.SHARE_KEYS and int(msg.metadata.dst_node_id) == 103:
            msg.content[RECORD]["graph-seed"] = 12345

    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    send = grid.send_and_receive

    def sending(messages, *, timeout=None):
        for msg in messages:
            tamper_share_keys(msg)
        return send(messages, timeout=timeout)

    grid.send_and_receive = sending
    secure = SecureAggregationRound(
        1, nodes, num_shares=6, threshold=4, min_survivors=2, bits=BITS, length=PARAMS.padded_dim, timeout=None
    )
    secure.setup(grid)
    secure.share_keys(grid)
    collect(secure, grid)
    assert len(grid.errors) == 6 and all("another view" in e for e in grid.errors)
    assert sum("node 103 shared" in e for e in grid.errors) == 5 and secure.survivors == set()


def test_an_unmask_request_that_omits_a_held_peer_is_refused():
    nodes = list(range(101, 106))
    secure, grid = secure_round(nodes, threshold=3, num_shares=5)
    collect(secure, grid)
    state = grid.contexts[101].state[STATE_RECORD]
    client = client_protocol.ClientRound(state, 101)
    with pytest.raises(ProtocolError, match="every peer"):
        client.unmask(ConfigRecord({"round": 1, "active": [101, 102, 103], "dead": []}))
    with pytest.raises(ProtocolError, match="fewer than the threshold"):
        client.unmask(ConfigRecord({"round": 1, "active": [101, 102], "dead": [103, 104, 105]}))


# ---------------------------------------------------------------------------------------------- client floor
def test_the_mod_floor_counts_the_shares_a_lying_server_is_sure_to_leave():
    """n = 6, z = 1: at the default t = 5 any sum the server can unmask holds 5 honest shares of μ/5, so a
    client asking for z ≥ 1 answers; at t = 4 (the least accepted) a lying server can unmask a sum of 3,
    z = √(3/5) < 1, and the client refuses."""
    nodes = list(range(101, 107))
    assert honest_shares_bound(6, 5, 0, complete=True) == 5 and honest_shares_bound(6, 4, 0, complete=True) == 3
    model = ArrayRecord({"w": Array(np.zeros(D, np.float32))})
    for threshold, answered in ((None, True), (4, False)):
        grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3, min_noise_multiplier=1.0), nodes)
        strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, reconstruction_threshold=threshold)
        replies = grid.send_and_receive(list(strategy.configure_train(1, model, ConfigRecord(), grid)))
        arrays, _ = strategy.aggregate_train(1, replies)
        assert (arrays is not None) is answered
        assert answered or all("below this client's minimum 1.0" in e for e in grid.errors)


def test_the_summary_states_the_enforced_trust_model(caplog):
    nodes = list(range(101, 107))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, max_colluding_clients=1)
    model = ArrayRecord({"w": Array(np.zeros(D, np.float32))})
    strategy.aggregate_train(1, grid.send_and_receive(list(strategy.configure_train(1, model, ConfigRecord(), grid))))
    with caplog.at_level(logging.INFO):
        strategy.summary()
    sizes = strategy.protocol_sizes(6)
    assert "up to 1 colluding client" in caplog.text
    assert f"t = {sizes.threshold}" in caplog.text and "2t > h + c" in caplog.text
    assert "substitutes public keys" in caplog.text


def test_a_client_assuming_more_colluders_than_declared_still_joins_a_round_that_meets_its_bound():
    """Client 101 assumes 1 colluder, the server declares 0: t = 4 of 6 meets 2t > h + 1, so 101 takes part
    (its own checks use its bound; the digest the clients compare uses the declared one)."""
    nodes = list(range(101, 107))
    app_plain = shifting_app(deltas_for(nodes), rng=3)
    strict = shifting_app(deltas_for(nodes), rng=3, max_colluding_clients=1)
    grid = LoopbackGrid(app_plain, nodes)
    grid.apps = {101: strict}
    secure = SecureAggregationRound(
        1, nodes, num_shares=6, threshold=4, min_survivors=4, bits=BITS, length=PARAMS.padded_dim, timeout=None
    )
    secure.setup(grid)
    secure.share_keys(grid)
    collect(secure, grid)
    secure.unmask(grid)
    assert secure.survivors == set(nodes) and grid.errors == []
    secure = SecureAggregationRound(
        1, nodes, num_shares=6, threshold=4, min_survivors=4, bits=BITS, length=PARAMS.padded_dim, timeout=None
    )
    grid = LoopbackGrid(app_plain, nodes)
    grid.apps = {101: shifting_app(deltas_for(nodes), rng=3, max_colluding_clients=2)}  # 2t = 8 = h + 2: refused
    secure.setup(grid)
    secure.share_keys(grid)
    assert 101 not in secure.shared and any("2t > h + c" in e for e in grid.errors)
