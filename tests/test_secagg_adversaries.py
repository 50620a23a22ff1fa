"""Secure aggregation against the adversaries of docs/distributed-dp.md's threat-model table.

Each test plays one adversary through the real client mod (``distributed_dp_mod``: real ECDH, Shamir,
Fernet, ChaCha20, Ed25519) and the real server protocol or strategy, with the server's messages rewritten
as the adversary chooses (``tests/active_server.py``), and compares what it recovers bit for bit with what
the mod encoded. Attacks A-E are those of issue 35:

A. a zero noise share asked of every client;
B. selective forwarding plus lies about dropouts, complete graph;
C. the same on a SecAgg+ ring;
D. a Sybil server that invents peers;
E. a client that advertises a key on another curve.

Each has a positive control: the same attack code against clients that accept what they accepted before
(the rule that stops the attack switched off), which recovers the target's encoding exactly.
"""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.supercore.primitives.asymmetric import bytes_to_public_key
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

import importlib
from client_mods.distributed_dp_mod import DEFAULT_MIN_NOISE_MULTIPLIER, make_distributed_dp_mod
from flwr_dp_strategies import DistributedDpFedAvg
from flwr_dp_strategies.secure_aggregation import SecureAggregationAborted, SecureAggregationRound
from flwr_dp_strategies.secure_aggregation import client_protocol, protocol, server_protocol
from flwr_dp_strategies.secure_aggregation.protocol import (
    RECORD,
    STATE_RECORD,
    ProtocolError,
    Stage,
    choose_num_shares,
    graph_failure_bound,
    min_threshold,
    ring_neighbours,
)
from flwr_dp_strategies.secure_aggregation.server_protocol import components

from active_server import BITS, D, PARAMS, ActiveServer, public, record_encodings
from secagg_harness import LazyRoster, LoopbackGrid, shifting_app, stage_of_message

mod_module = importlib.import_module("client_mods.distributed_dp_mod")  # the package re-exports a function of that name
pytestmark = pytest.mark.usefixtures("task_identity")

DELTA = PARAMS.rounding_bound  # the integer L2 sensitivity every floor is measured in


def deltas_for(nodes) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(1)
    return {n: rng.normal(size=D) * 0.05 for n in nodes}


def clipped(delta: np.ndarray) -> np.ndarray:
    return delta.astype(np.float32).astype(np.float64) * min(1.0, 1.0 / np.linalg.norm(delta))


def share_for(z: float, honest: int) -> float:
    """The noise share (variance) whose sum over ``honest`` clients has noise multiplier z."""
    return (z * DELTA) ** 2 / honest


def model() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(D, np.float32))})


@pytest.fixture
def old_client_rules(monkeypatch):
    """Clients as they were before issue 35: any survivor set signed, no signature asked for at unmask, and the
    noise floor counted on whatever the server claims (here: not checked)."""
    monkeypatch.setattr(client_protocol, "survivor_set_flaw", lambda *a, **k: None)
    monkeypatch.setattr(client_protocol, "required_signers", lambda *a, **k: [])
    monkeypatch.setattr(mod_module, "check_noise_floor", lambda *a, **k: 0.0)


# ------------------------------------------------------------------------------------------ A. zero noise
def zero_share_round(nodes, app) -> tuple[DistributedDpFedAvg, LoopbackGrid, object]:
    """DistributedDpFedAvg (z = 1) runs one round; the server rewrites every collect message's noise share to 0."""
    grid = LoopbackGrid(app, nodes)
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, fraction_evaluate=0.0)
    messages = list(strategy.configure_train(1, model(), ConfigRecord(), grid))
    for msg in messages:
        msg.content[RECORD]["dp-noise-share"] = 0.0
    arrays, _ = strategy.aggregate_train(1, grid.send_and_receive(messages))
    return strategy, grid, arrays


def test_a_zero_noise_share_is_refused_by_the_default_mod(monkeypatch):
    nodes = list(range(101, 106))
    encoded = record_encodings(monkeypatch)
    app = shifting_app(deltas_for(nodes), rng=3, min_noise_multiplier=DEFAULT_MIN_NOISE_MULTIPLIER)
    strategy, grid, arrays = zero_share_round(nodes, app)
    assert arrays is None and strategy.ledger.epsilon() == 0.0
    assert encoded == {}  # no client encoded, so nothing of any update left a node
    assert len(grid.errors) == 5 and all("below this client's minimum 1.0" in e for e in grid.errors)


def test_positive_control_a_zero_noise_share_reveals_the_noise_free_sum(monkeypatch):
    nodes = list(range(101, 106))
    encoded = record_encodings(monkeypatch)
    monkeypatch.setattr(mod_module, "check_noise_floor", lambda *a, **k: 0.0)  # the old default floor, 0
    revealed = []
    unmask = SecureAggregationRound.unmask
    monkeypatch.setattr(
        SecureAggregationRound, "unmask", lambda self, grid: revealed.append(unmask(self, grid)) or revealed[-1]
    )
    strategy, _, arrays = zero_share_round(nodes, shifting_app(deltas_for(nodes), rng=3))
    assert arrays is not None and sorted(encoded) == nodes
    assert all(share == 0.0 for _, share in encoded.values())
    total = np.zeros_like(revealed[0])
    for vector, _ in encoded.values():
        total += vector
    np.testing.assert_array_equal(revealed[0], total & np.uint64((1 << strategy.bits) - 1))


def test_the_mods_floor_is_positive_by_default_and_set_by_the_client_side_only():
    with pytest.raises(ValueError, match="min_noise_multiplier"):
        make_distributed_dp_mod(min_noise_multiplier=0.0)
    policy = mod_module.ClientPolicy(min_noise_multiplier=2.0, max_colluding_clients=0, identity=None)
    from flwr.app import Context, RecordDict

    ctxt = Context(run_id=1, node_id=5, node_config={"dp-min-noise-multiplier": 3.0}, state=RecordDict(), run_config={})
    assert policy.resolve(ctxt)[0] == 3.0  # the node's operator may change it; the run config (server) is not read
    ctxt = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={"dp-min-noise-multiplier": 0.0})
    assert policy.resolve(ctxt)[0] == 2.0
    ctxt = Context(run_id=1, node_id=5, node_config={"dp-min-noise-multiplier": "x"}, state=RecordDict(), run_config={})
    with pytest.raises((ValueError, TypeError), match="dp-min-noise-multiplier"):
        policy.resolve(ctxt)


# ------------------------------------------------------------------- B, C. selective forwarding, lying
def forwarding_attack(nodes, *, num_shares, threshold, honest, target, floor=1.0 - 1e-9) -> ActiveServer:
    """The target receives only t − 1 of its neighbours' ciphertexts (P); the server then asks the target to sign a
    survivor set without its other neighbours, and every other node a set without the members of P (but itself),
    and asks every node to unmask with all the signatures it got: the target's seed comes from holders told it
    survived, each partner's key from holders told that partner dropped."""
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3, min_noise_multiplier=floor), nodes)
    attack = ActiveServer(grid, nodes, num_shares=num_shares, threshold=threshold, honest=honest)
    attack.keys()
    neighbours = attack.secure.neighbours
    partners: list[int] = []

    def forward(node, srcs):
        if node != target:
            return srcs
        partners.extend(sorted(srcs)[: attack.threshold - 1])
        return partners

    attack.collect(share_for(1.0, honest), forward)
    others = set(neighbours[target]) - set(partners) - {target}
    view = set(attack.secure.alive_keys)
    sets = {target: sorted(view - others)}
    for node in sorted(attack.masked):
        if node != target:
            sets[node] = sorted(view - (set(partners) - {node}))
    attack.sign(sets)
    attack.unmask(sorted(attack.masked))
    return attack


def assert_reads_exactly(attack: ActiveServer, encoded, target: int) -> None:
    got = attack.read(target)
    assert got is not None
    np.testing.assert_array_equal(got, encoded[target][0])
    assert np.sqrt(encoded[target][1]) / DELTA < 1.0  # it holds far less noise than the client's floor


def test_selective_forwarding_on_the_complete_graph_reads_nothing(monkeypatch):
    """Issue 35 B: n = 5, the server's t = 3, clients requiring z ≥ 1."""
    encoded = record_encodings(monkeypatch)
    attack = forwarding_attack(list(range(101, 106)), num_shares=5, threshold=3, honest=4, target=101)
    assert 101 in encoded and attack.read(101) is None
    assert 101 not in attack.signed_set  # the target refused the set that would expose it


def test_positive_control_selective_forwarding_on_the_complete_graph(monkeypatch, old_client_rules):
    encoded = record_encodings(monkeypatch)
    attack = forwarding_attack(list(range(101, 106)), num_shares=5, threshold=3, honest=4, target=101)
    assert_reads_exactly(attack, encoded, 101)


def test_selective_forwarding_on_a_ring_reads_nothing(monkeypatch):
    """Issue 35 C, on a ring of 24 with k = 8 (h = 9, t = 5) and n_h = m = 20."""
    encoded = record_encodings(monkeypatch)
    attack = forwarding_attack(list(range(101, 125)), num_shares=8, threshold=5, honest=20, target=110)
    assert 110 in encoded and attack.read(110) is None and 110 not in attack.signed_set


def test_positive_control_selective_forwarding_on_a_ring(monkeypatch, old_client_rules):
    encoded = record_encodings(monkeypatch)
    attack = forwarding_attack(list(range(101, 125)), num_shares=8, threshold=5, honest=20, target=110)
    assert_reads_exactly(attack, encoded, 110)


@pytest.mark.slow
@pytest.mark.parametrize("rules", ["new", "old"])
def test_selective_forwarding_at_the_default_sizes_of_100_clients(monkeypatch, rules):
    """Issue 35 C at its own sizes: DistributedDpFedAvg's defaults for 100 clients (k = 22, t = 12, m = 80)."""
    if rules == "old":
        monkeypatch.setattr(client_protocol, "survivor_set_flaw", lambda *a, **k: None)
        monkeypatch.setattr(client_protocol, "required_signers", lambda *a, **k: [])
    encoded = record_encodings(monkeypatch)
    sizes = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0).protocol_sizes(100)
    assert (sizes.num_shares, sizes.threshold, sizes.honest) == (22, 12, 80)
    nodes = list(range(101, 201))
    attack = forwarding_attack(
        nodes, num_shares=sizes.num_shares, threshold=sizes.threshold, honest=sizes.honest, target=150
    )
    if rules == "old":
        assert_reads_exactly(attack, encoded, 150)
    else:
        assert attack.read(150) is None


def test_a_holder_answers_only_with_the_signatures_of_the_survivor_set_it_signed(monkeypatch):
    """Forged or missing signatures get no share: every node signs the true set, the server then drops one
    member's signature (or replaces it) from every request."""
    nodes = list(range(101, 107))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    attack = ActiveServer(grid, nodes, num_shares=6, threshold=4, honest=5)
    attack.keys()
    attack.collect(share_for(1.0, 5))
    assert all(attack.sign({n: nodes for n in nodes}).values())
    key = tuple(nodes)
    real = dict(attack.signatures[key])
    attack.signatures[key] = {n: s for n, s in real.items() if n != 103}
    assert not any(attack.unmask([101, 102], forge={103: bytes(64)}).values())
    assert all("no valid signature of node 103" in e for e in grid.errors[-2:])
    attack.signatures[key] = real
    assert all(attack.unmask([104, 105]).values())  # with every signature, they answer


# ------------------------------------------------------------------------------------------------ D. Sybils
def sybil_round(target_app_kwargs, *, sybils: int, threshold: int, honest: int, share: float):
    """One real client (101) and ``sybils`` peers the server invents and plays itself (it reads their state)."""
    nodes = [101, *range(901, 901 + sybils)]
    deltas = deltas_for(nodes)
    grid = LoopbackGrid(shifting_app(deltas, rng=3, identities=False, min_noise_multiplier=1e-9), nodes)
    grid.apps[101] = shifting_app(deltas, rng=3, **target_app_kwargs)
    attack = ActiveServer(
        grid, nodes, num_shares=len(nodes), threshold=threshold, honest=honest, sybils=range(901, 901 + sybils)
    )
    attack.keys()
    attack.collect(share)
    attack.sign({n: nodes for n in attack.masked})
    attack.unmask(sorted(attack.masked))
    return attack, grid


@pytest.mark.parametrize(
    "kwargs,sybils,why",
    [
        ({"identities": False}, 1, "below this client's minimum"),  # the default mod: no roster
        ({"identities": LazyRoster(3)}, 24, "not in this client's roster"),  # a roster
    ],
)
def test_a_sybil_server_reads_nothing(monkeypatch, kwargs, sybils, why):
    """Issue 35 D: one invented peer (t = 2) or 24 (t = h = 25) and shares calibrated for 80 honest clients."""
    encoded = record_encodings(monkeypatch)
    kwargs = {"min_noise_multiplier": DEFAULT_MIN_NOISE_MULTIPLIER, **kwargs}
    attack, grid = sybil_round(kwargs, sybils=sybils, threshold=1 + sybils, honest=80, share=share_for(1.0, 80))
    assert 101 not in encoded and attack.read(101) is None
    assert any(e.startswith("101:") and why in e for e in grid.errors)


def test_without_a_roster_a_client_still_holds_its_floor_against_sybils(monkeypatch):
    """A server may read a roster-less client through Sybils, but only with the client's own share, which the
    client sized to its floor: what it reads has noise multiplier ≥ z_min."""
    encoded = record_encodings(monkeypatch)
    attack, _ = sybil_round(
        {"identities": False, "min_noise_multiplier": 1.0}, sybils=1, threshold=2, honest=1, share=share_for(1.0, 1)
    )
    got = attack.read(101)
    assert got is not None and np.array_equal(got, encoded[101][0])
    assert np.sqrt(encoded[101][1]) / DELTA >= 1.0


def test_positive_control_a_sybil_server_reads_a_client_that_trusts_the_server(monkeypatch):
    encoded = record_encodings(monkeypatch)
    monkeypatch.setattr(mod_module, "check_noise_floor", lambda *a, **k: 0.0)
    attack, _ = sybil_round({"identities": False}, sybils=1, threshold=2, honest=80, share=share_for(1.0, 80))
    got = attack.read(101)
    assert got is not None and np.array_equal(got, encoded[101][0])
    assert np.sqrt(encoded[101][1]) / DELTA < 0.2


# ------------------------------------------------------------------------------------------------ E. bad key
def bad_key_grid(nodes, bad: int) -> LoopbackGrid:
    """``bad`` advertises SECP256R1 round keys, signed with its own (roster) identity."""
    roster = LazyRoster(len(nodes) + 2)
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3, identities=roster), nodes)
    honest_app = grid.app

    def p256_app(msg: Message, ctxt):
        original = client_protocol.generate_key_pairs
        client_protocol.generate_key_pairs = lambda: (lambda k: (k, k.public_key()))(
            ec.generate_private_key(ec.SECP256R1())
        )
        try:
            return honest_app(msg, ctxt)
        finally:
            client_protocol.generate_key_pairs = original

    grid.apps[bad] = p256_app
    return grid


def play(secure: SecureAggregationRound, grid, honest: int) -> SecureAggregationRound:
    """An honest server's whole round: setup, share-keys, collect (shares calibrated for ``honest``), unmask."""
    secure.setup(grid)
    secure.share_keys(grid)
    replies = grid.send_and_receive(
        secure.collect_messages(
            lambda n: RecordDict({"arrays": model(), "config": ConfigRecord()}), public(share_for(1.0, honest))
        )
    )
    secure.add_masked(replies)
    secure.unmask(grid)
    return secure


def bad_key_round(grid, nodes) -> SecureAggregationRound:
    secure = SecureAggregationRound(
        1, nodes, num_shares=len(nodes), threshold=4, min_survivors=4, bits=BITS, length=PARAMS.padded_dim, timeout=None
    )
    return play(secure, grid, 4)


def test_a_key_on_another_curve_drops_only_its_owner():
    """Issue 35 E: node 106 advertises P-256 keys; the server drops it at setup and the 5 others unmask."""
    nodes = list(range(101, 107))
    secure = bad_key_round(bad_key_grid(nodes, 106), nodes)
    assert secure.survivors == set(range(101, 106)) and secure.rejected["secure-aggregation"] == 1


def test_positive_control_a_key_on_another_curve_aborts_the_round_when_only_parsed(monkeypatch):
    nodes = list(range(101, 107))

    def parse_only(value):
        bytes_to_public_key(value)
        return value

    monkeypatch.setattr(server_protocol, "_public_key", parse_only)
    grid = bad_key_grid(nodes, 106)
    with pytest.raises(SecureAggregationAborted):
        bad_key_round(grid, nodes)
    assert sum("not a SECP384R1 key" in e for e in grid.errors) == 6  # every node, 106 itself included


# ---------------------------------------------------------------------------------------------- colluders
def colluders_read(nodes, *, threshold: int, colluders: list[int], target: int, declared: int) -> np.ndarray | None:
    """An honest server, plus colluding clients that hand over every share they hold: the target's encoding if
    their shares and an honest unmask rebuild both its seed and its key."""
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3, max_colluding_clients=0), nodes)
    attack = ActiveServer(grid, nodes, num_shares=len(nodes), threshold=threshold, colluders=declared, honest=1)
    attack.collude(colluders)
    attack.keys()
    attack.collect(share_for(1.0, 1))
    attack.sign({n: sorted(attack.masked) for n in attack.masked})
    attack.unmask(sorted(attack.masked))
    return attack.read(target)


def test_positive_control_colluders_at_the_threshold_read_a_neighbour(monkeypatch):
    monkeypatch.setattr(client_protocol, "min_threshold", lambda holders, colluders=0: 2)  # t ≥ 2 accepted
    encoded = record_encodings(monkeypatch)
    got = colluders_read(list(range(101, 107)), threshold=3, colluders=[104, 105, 106], target=101, declared=0)
    assert got is not None and np.array_equal(got, encoded[101][0])


def test_colluders_up_to_the_configured_bound_cannot_read_a_neighbour():
    nodes = list(range(101, 107))
    sizes = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, max_colluding_clients=2).protocol_sizes(6)
    assert 2 * sizes.threshold > len(nodes) + 2
    assert colluders_read(nodes, threshold=sizes.threshold, colluders=[105, 106], target=101, declared=2) is None


def test_colluders_leave_at_least_the_calibrated_noise():
    """Each client adds μ/(m − c): a sum of m survivors less the c colluders' own shares keeps μ."""
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, max_colluding_clients=2, min_survivors=8)
    sizes = strategy.protocol_sizes(10)
    _, calibration = strategy.round_parameters(1, D, sizes)
    assert sizes.honest == 6 and calibration.local_mu == pytest.approx(calibration.mu / 6)
    plain = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, min_survivors=8)
    _, without = plain.round_parameters(1, D, plain.protocol_sizes(10))
    assert without.local_mu == pytest.approx(without.mu / 8)


# --------------------------------------------------------------------------------- the client's other rules
@pytest.mark.parametrize("n,num_shares,threshold", [(4, 4, 2), (6, 6, 3), (12, 6, 3)])
def test_clients_refuse_a_threshold_at_or_below_half_their_share_holders(n, num_shares, threshold):
    nodes = list(range(101, 101 + n))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    attack = ActiveServer(grid, nodes, num_shares=num_shares, threshold=threshold)
    with pytest.raises(SecureAggregationAborted):
        attack.keys()
    assert any("2t > h + c" in e for e in grid.errors)
    with pytest.raises(ValueError, match="threshold must be an integer in"):  # and the honest server refuses it
        SecureAggregationRound(
            1, nodes, num_shares=num_shares, threshold=threshold, min_survivors=2, bits=BITS, length=D, timeout=None
        )


def test_a_second_setup_for_the_same_round_is_refused():
    """A server that runs a round twice would get two encodings of one update: one setup per round."""
    nodes = list(range(101, 105))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    ActiveServer(grid, nodes, num_shares=4, threshold=3).keys()
    again = ActiveServer(grid, nodes, num_shares=4, threshold=3)
    with pytest.raises(SecureAggregationAborted):
        again.keys()
    assert sum("one setup per round" in e for e in grid.errors) == 4


def test_a_graph_seed_other_than_the_committed_one_is_refused():
    nodes = list(range(101, 107))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    attack = ActiveServer(grid, nodes, num_shares=4, threshold=4)
    attack.secure.setup(grid)
    attack.secure.graph_seed += 1  # chosen after seeing the keys
    with pytest.raises(SecureAggregationAborted):
        attack.secure.share_keys(grid)
    assert sum("not the one committed" in e for e in grid.errors) == 6


def test_a_client_shown_another_view_is_refused_by_its_neighbours():
    """The server gives node 103 another n_h: the digest in its shares differs, every neighbour refuses them at
    the collect stage, and 103 refuses theirs."""
    nodes = list(range(101, 107))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    send = grid.send_and_receive

    def sending(messages, *, timeout=None):
        for msg in messages:
            if stage_of_message(msg) == Stage.SHARE_KEYS and int(msg.metadata.dst_node_id) == 103:
                msg.content[RECORD]["honest"] = 2
        return send(messages, timeout=timeout)

    grid.send_and_receive = sending
    attack = ActiveServer(grid, nodes, num_shares=6, threshold=4, honest=1)
    attack.keys()
    attack.collect(share_for(1.0, 1))
    assert len(grid.errors) == 6 and all("another view" in e for e in grid.errors)
    assert sum("node 103 shared" in e for e in grid.errors) == 5 and attack.secure.survivors == set()


def test_a_client_signs_one_survivor_set_and_only_one_it_may():
    nodes = list(range(101, 107))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    attack = ActiveServer(grid, nodes, num_shares=6, threshold=4, honest=5)
    attack.keys()
    attack.collect(share_for(1.0, 5))
    assert attack.sign({101: [101, 102, 103, 104]}) == {101: False}  # |S| − c < n_h
    assert "fewer than the n_h = 5" in grid.errors[-1]
    assert attack.sign({102: [*nodes, 999]}) == {102: False} and "outside the round's view" in grid.errors[-1]
    assert attack.sign({103: nodes}) == {103: True}
    assert attack.sign({103: nodes}) == {103: False}  # once


# ---------------------------------------------------------------------------------------- honest server, sizes
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
    with caplog.at_level(logging.WARNING):
        assert list(strategy.configure_train(1, model(), ConfigRecord(), grid)) == []
    assert "round is skipped" in caplog.text and grid.sent == []


def test_a_round_of_two_clients_runs():
    nodes = [101, 102]
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    strategy = DistributedDpFedAvg(noise_multiplier=0.01, clipping_norm=1.0)
    replies = grid.send_and_receive(list(strategy.configure_train(1, model(), ConfigRecord(), grid)))
    arrays, _ = strategy.aggregate_train(1, replies)
    expected = np.mean([clipped(d) for d in deltas_for(nodes).values()], axis=0)
    assert arrays is not None and np.abs(arrays["w"].numpy() - expected).max() < 0.05


def test_a_survivors_graph_that_splits_aborts_before_any_share_is_asked():
    """30 nodes, neighbourhoods of 7: two runs of 3 dropouts on the ring cut out a part of 3 survivors,
    whose sum the server could unmask on its own. The round aborts and no signature or share is asked for."""
    nodes = list(range(101, 131))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    attack = ActiveServer(grid, nodes, num_shares=6, threshold=4)
    attack.keys()
    attack.secure.min_survivors = 10
    order = sorted(nodes)
    random.Random(attack.secure.graph_seed).shuffle(order)
    for position in (3, 4, 5, 9, 10, 11):
        grid.die[order[position]] = "collect"
    attack.collect(share_for(1.0, 1))
    with pytest.raises(SecureAggregationAborted, match=r"parts of \[3, 21\]"):
        attack.secure.unmask(grid)
    assert not [m for m in grid.sent if stage_of_message(m) in (Stage.CONSISTENCY, Stage.UNMASK)]


def test_the_default_graph_meets_its_failure_bound_under_random_dropouts():
    """k from choose_num_shares at 100 nodes and 5 % dropout: the bound holds, and over 300 dropout draws
    no survivors' graph splits, every node keeps t live holders and every survivor would sign."""
    n, rate = 100, 0.05
    k = choose_num_shares(n, colluders=0, dropout_rate=rate, failure_probability=1e-6)
    h = protocol.neighbourhood_size(n, k)
    t = min_threshold(h)
    assert k < n and graph_failure_bound(n, k, t, rate) <= 1e-6
    rng = np.random.default_rng(0)
    for draw in range(300):
        graph = ring_neighbours(range(n), k, draw)
        alive = {u for u in range(n) if rng.random() >= rate}
        assert len(components(alive, graph)) == 1
        assert all(len(graph[u] & alive - {u}) + (u in alive) >= t for u in range(n))
        assert all(len(graph[u] - alive) < k // 2 for u in alive)  # the signing rule's third clause


def test_the_summary_states_the_enforced_trust_model(caplog):
    nodes = list(range(101, 107))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, max_colluding_clients=1)
    strategy.aggregate_train(1, grid.send_and_receive(list(strategy.configure_train(1, model(), ConfigRecord(), grid))))
    with caplog.at_level(logging.INFO):
        strategy.summary()
    sizes = strategy.protocol_sizes(6)
    assert "active server with up to 1 colluding client" in caplog.text and "roster" in caplog.text
    assert f"t = {sizes.threshold}" in caplog.text and f"n_h = {sizes.honest}" in caplog.text


def test_a_client_assuming_more_colluders_than_declared_still_joins_a_round_that_meets_its_bound():
    """Client 101 assumes 1 colluder, the server declares 0: t = 4 of 6 meets 2t > h + 1, so 101 takes part
    (its own checks use its bound; the digest the clients compare uses the declared one)."""
    nodes = list(range(101, 107))
    roster = LazyRoster(len(nodes))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3, identities=roster), nodes)
    grid.apps = {101: shifting_app(deltas_for(nodes), rng=3, max_colluding_clients=1, identities=roster)}
    secure = SecureAggregationRound(
        1, nodes, num_shares=6, threshold=4, min_survivors=4, bits=BITS, length=D, timeout=None, honest=4
    )
    play(secure, grid, 4)
    assert secure.survivors == set(nodes) and grid.errors == []
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3, identities=roster), nodes)
    grid.apps = {101: shifting_app(deltas_for(nodes), rng=3, max_colluding_clients=2, identities=roster)}
    secure = SecureAggregationRound(
        1, nodes, num_shares=6, threshold=4, min_survivors=4, bits=BITS, length=D, timeout=None
    )
    secure.setup(grid)
    secure.share_keys(grid)
    assert 101 not in secure.shared and any("2t > h + c" in e for e in grid.errors)


def test_a_client_refuses_an_unmask_before_it_signed():
    nodes = list(range(101, 106))
    grid = LoopbackGrid(shifting_app(deltas_for(nodes), rng=3), nodes)
    attack = ActiveServer(grid, nodes, num_shares=5, threshold=3)
    attack.keys()
    attack.collect(share_for(1.0, 1))
    client = client_protocol.ClientRound(grid.contexts[101].state[STATE_RECORD], 101)
    with pytest.raises(ProtocolError, match="after stage 'collect'"):
        client.unmask(ConfigRecord({"round": 1, "signers": [], "signatures": []}))


@pytest.mark.parametrize("z", [0.1, 0.5, 1.0, 4.04, 25.6])
@pytest.mark.parametrize("n", [5, 10, 100, 1000])
def test_a_client_whose_floor_is_the_booked_z_accepts_the_honest_calibration(z, n):
    """The shipped setting (every client's floor = the server's z) must run: the honest server's share, split over
    n_h and rounded in floating point, meets the floor; 1 % less noise does not."""
    strategy = DistributedDpFedAvg(noise_multiplier=z, clipping_norm=1.0)
    sizes = strategy.protocol_sizes(n)
    for dim in (650, 50890):
        params, calibration = strategy.round_parameters(1, dim, sizes)
        state = ConfigRecord({"honest-bound": sizes.honest, "threshold": sizes.threshold, "colluders": 0})
        client_protocol.check_noise_floor(state, calibration.local_mu, params.rounding_bound, z)
        with pytest.raises(ProtocolError, match="below this client's minimum"):
            client_protocol.check_noise_floor(state, calibration.local_mu * 0.98, params.rounding_bound, z)
