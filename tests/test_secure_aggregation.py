"""SecAgg+ on the Message API: exact sums, dropouts, uniform masks, the threshold, the signed survivor set,
malformed replies."""

from __future__ import annotations

import random
from typing import Optional

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from flwr_dp_strategies.secure_aggregation import SecureAggregationAborted, SecureAggregationRound, shamir
from flwr_dp_strategies.secure_aggregation.client_protocol import ClientRound, answer_message
from flwr_dp_strategies.secure_aggregation.identity import (
    NodeIdentity,
    advertisement,
    generate_signing_key,
    public_bytes,
    survivors_statement,
    verify,
)
from flwr_dp_strategies.secure_aggregation.masks import pack_bits, packed_size, prg_mask, unpack_bits
from flwr_dp_strategies.secure_aggregation.protocol import (
    MASKED_KEY,
    MASKED_RECORD,
    RECORD,
    STAGE_KEY,
    ProtocolError,
    Stage,
    graph_commitment,
)
from flwr_dp_strategies.secure_aggregation.server_protocol import ring_neighbours

from secagg_harness import LoopbackGrid, roster_identities

pytestmark = pytest.mark.usefixtures("task_identity")

RUN_ID = 0
"""The run id every raw-record fixture below binds into its key advertisements and view digest."""


def integer_app(
    vectors: dict[int, np.ndarray], bits: int, identities: Optional[dict[int, NodeIdentity]] = None
) -> ClientApp:
    """A ClientApp that runs the client protocol and contributes ``vectors[node]`` (integers mod 2^b); each node
    signs with ``identities[node]`` (a roster) where given, else with a fresh key per round."""
    app = ClientApp()
    table = identities or {}

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = int(context.node_id)
        return answer_message(msg, context, lambda state: vectors[node], identity=table.get(node))

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


DIES = [
    {},
    {103: "share-keys"},
    {104: "collect", 108: "collect"},
    {102: "unmask"},
    {101: "setup", 105: "collect", 109: "unmask"},
]


@pytest.mark.parametrize(
    "num_shares,threshold,die",
    [(10, 6, die) for die in DIES]  # the complete graph (SecAgg)
    + [(7, 4, die) for die in DIES]  # a ring (SecAgg+): up to 2 absent neighbours of a survivor
    + [(5, 3, die) for die in DIES if len([s for s in die.values() if s in ("share-keys", "collect")]) < 2],
)
def test_revealed_value_is_exactly_the_sum_of_the_survivors_vectors(num_shares, threshold, die):
    nodes, bits, length = list(range(101, 111)), 20, 257
    vectors = vectors_for(nodes, bits, length)
    grid = LoopbackGrid(integer_app(vectors, bits), nodes, die=die)
    secure, total = run_round(grid, nodes, bits=bits, length=length, num_shares=num_shares, threshold=threshold)
    dead_before_upload = {n for n, stage in die.items() if stage in ("setup", "share-keys", "collect")}
    assert secure.survivors == set(nodes) - dead_before_upload
    assert secure.consistent == sorted(secure.survivors)  # every survivor signed the survivor set
    np.testing.assert_array_equal(total, modular([vectors[n] for n in sorted(secure.survivors)], bits))


def test_a_survivor_with_half_its_ring_neighbours_absent_refuses_to_sign_and_no_share_is_asked_for():
    """On the ring k = 5 (⌊k/2⌋ = 2) of this seed, 104 and 108 are both neighbours of 109: with both gone after
    sharing their keys, 109 would refuse to sign (a server could cut the ring next to it), so the honest server
    aborts before the consistency stage and no unmask request is ever sent."""
    nodes, bits, length = list(range(101, 111)), 20, 33
    graph = ring_neighbours(nodes, 5, random.Random(0).getrandbits(62))  # run_round's graph seed
    assert {104, 108} <= graph[109]
    grid = LoopbackGrid(
        integer_app(vectors_for(nodes, bits, length), bits), nodes, die={104: "collect", 108: "collect"}
    )
    with pytest.raises(SecureAggregationAborted, match=r"survivors \[109\] would refuse to sign"):
        run_round(grid, nodes, bits=bits, length=length, num_shares=5, threshold=3)
    stages = {m.content[RECORD][STAGE_KEY] for m in grid.sent if RECORD in m.content}
    assert Stage.CONSISTENCY not in stages and Stage.UNMASK not in stages


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


def zeros(length: int = 8):
    return lambda: np.zeros(length, dtype=np.uint64)


class Cohort:
    """Raw-record clients of one round: each node set up (``setup`` for every node, one guard record per node kept
    across its stages, run id :data:`RUN_ID`), and the honest server's records for the later stages, with the
    fields the clients check: ``graph-commit`` at setup, then ``view-ids``, ``ad-sigs``, ``honest`` and the
    committed ``graph-seed`` at share-keys. ``identities``: node -> NodeIdentity (a roster); without, each node
    signs with a fresh key per round."""

    def __init__(
        self,
        nodes: list[int],
        threshold: int,
        *,
        num_shares: Optional[int] = None,
        graph_seed: int = 0,
        server_round: int = 1,
        bits: int = 16,
        colluders: int = 0,
        honest: int = 1,
        identities: Optional[dict[int, NodeIdentity]] = None,
    ) -> None:
        self.nodes = sorted(nodes)
        self.threshold = threshold
        self.num_shares = len(nodes) if num_shares is None else num_shares
        self.graph_seed = graph_seed
        self.server_round = server_round
        self.honest = honest
        self.identities = identities or {}
        self.states = {n: ConfigRecord() for n in self.nodes}
        self.guards = {n: ConfigRecord() for n in self.nodes}
        self.graph = ring_neighbours(self.nodes, self.num_shares, graph_seed)
        self.setup_record = ConfigRecord(
            {
                "round": server_round,
                "threshold": threshold,
                "bits": bits,
                "colluders": colluders,
                "graph-commit": graph_commitment(graph_seed),
            }
        )
        self.keys = {n: self.client(n).setup(ConfigRecord(dict(self.setup_record.items()))) for n in self.nodes}

    def client(self, node: int) -> ClientRound:
        return ClientRound(
            self.states[node], node, identity=self.identities.get(node), run_id=RUN_ID, guard=self.guards[node]
        )

    def share_keys_record(self, node: int) -> ConfigRecord:
        """The honest share-keys record for ``node``: its neighbours' keys and signed advertisements, the view and
        each view member's identity key."""
        nids = sorted(self.graph[node])
        return ConfigRecord(
            {
                "round": self.server_round,
                "nids": nids,
                "pk1s": [self.keys[m]["pk1"] for m in nids],
                "pk2s": [self.keys[m]["pk2"] for m in nids],
                "ad-sigs": [self.keys[m]["ad-sig"] for m in nids],
                "view": self.nodes,
                "view-ids": [self.keys[m]["identity"] for m in self.nodes],
                "graph-seed": self.graph_seed,
                "num-shares": self.num_shares,
                "honest": self.honest,
            }
        )

    def share_keys(self) -> dict[int, dict]:
        """Every node's share-keys answer (its encrypted shares)."""
        return {n: self.client(n).share_keys(self.share_keys_record(n)) for n in self.nodes}

    def collect_record(self, node: int, outgoing: dict[int, dict], srcs: Optional[list[int]] = None) -> ConfigRecord:
        """The collect record forwarding to ``node`` the ciphertexts of ``srcs`` (default: all its neighbours)."""
        srcs = sorted(self.graph[node] - {node}) if srcs is None else srcs
        ctxts = [outgoing[s]["ctxts"][outgoing[s]["dsts"].index(node)] for s in srcs]
        return ConfigRecord({"round": self.server_round, "srcs": srcs, "ctxts": ctxts})

    def collect(self, outgoing: dict[int, dict], nodes: Optional[list[int]] = None) -> None:
        for n in self.nodes if nodes is None else nodes:
            self.client(n).collect(self.collect_record(n, outgoing), zeros())

    def sign(self, node: int, survivors: list[int]) -> bytes:
        """``node``'s signature on ``survivors`` (its consistency answer)."""
        record = ConfigRecord({"round": self.server_round, "survivors": survivors})
        return self.client(node).consistency(record)["signature"]


def shared_keys(nodes: list[int], threshold: int) -> tuple[dict[int, ConfigRecord], dict[int, dict]]:
    """Client states after setup and share-keys on the complete graph, and each client's outgoing shares."""
    cohort = Cohort(nodes, threshold)
    return cohort.states, cohort.share_keys()


def test_fewer_than_t_shares_do_not_rebuild_a_clients_mask_seed():
    nodes, t = [1, 2, 3, 4, 5], 3
    states, outgoing = shared_keys(nodes, t)
    for n in nodes:
        srcs = [s for s in nodes if s != n]
        ctxts = [outgoing[s]["ctxts"][outgoing[s]["dsts"].index(n)] for s in srcs]
        ClientRound(states[n], n).collect(ConfigRecord({"round": 1, "srcs": srcs, "ctxts": ctxts}), zeros())
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


DROP = object()
"""A field to leave out of the record."""


def bogus_share_keys(**fields) -> ConfigRecord:
    """A share-keys record for node 1 of the view [1, 2] (k = 2) with bogus keys and signatures, ``fields``
    replaced (:data:`DROP` removes one); ``ad-sigs`` and ``view-ids`` are sized to match unless given."""
    record = {"round": 1, "nids": [1, 2], "pk1s": [b"a", b"b"], "pk2s": [b"c", b"d"], "view": [1, 2]}
    record.update({"graph-seed": 0, "num-shares": 2, "honest": 1})
    record.update(fields)
    nids, view = record.get("nids"), record.get("view")
    if "ad-sigs" not in fields and isinstance(nids, list):
        record["ad-sigs"] = [bytes([i]) * 64 for i in range(len(nids))]
    if "view-ids" not in fields and isinstance(view, list):
        record["view-ids"] = [bytes([i]) * 32 for i in range(len(view))]
    return ConfigRecord({k: v for k, v in record.items() if v is not DROP})


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"pk1s": [b"a"]}, "'pk1s' must have 2 items"),
        ({"nids": [1, 1]}, "repeats"),
        ({"round": 2}, "after stage"),
        ({"round": True}, "must be int"),
        ({"view": DROP}, "'view' is missing"),
        ({"view": [2, 3]}, "does not hold this node"),
        ({"view": [1, 2, 3]}, "not this node's neighbourhood"),
        ({"ad-sigs": DROP}, "'ad-sigs' is missing"),
        ({"ad-sigs": [bytes(64)]}, "'ad-sigs' must have 2 items"),
        ({"view-ids": DROP}, "'view-ids' is missing"),
        ({"view-ids": [bytes(32)]}, "'view-ids' must have 2 items"),
        ({"view-ids": [bytes(32), bytes(32)]}, "'view-ids' repeats"),
        ({"honest": DROP}, "'honest' is missing"),
        ({"honest": 0}, "'honest' must be at least 1"),
        ({"graph-seed": 1}, "not the one committed to at setup"),
    ],
)
def test_a_client_refuses_malformed_or_out_of_order_instructions(fields, match):
    state = ConfigRecord()
    client = ClientRound(state, 1, run_id=RUN_ID)
    client.setup(
        ConfigRecord({"round": 1, "threshold": 2, "bits": 16, "colluders": 0, "graph-commit": graph_commitment(0)})
    )
    with pytest.raises(ProtocolError, match=match):
        client.share_keys(bogus_share_keys(**fields))


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"graph-commit": DROP}, "'graph-commit' is missing"),
        ({"graph-commit": bytes(31)}, "'graph-commit' must be 32 bytes"),
        ({"graph-commit": "00" * 32}, "'graph-commit' must be bytes"),
        ({"threshold": 1}, "'threshold' must be at least 2"),
        ({"colluders": 2, "threshold": 2}, "exceed the 2 colluders"),
        ({"colluders": -1}, "'colluders' must be at least 0"),
    ],
)
def test_a_client_refuses_a_malformed_setup(fields, match):
    record = {"round": 1, "threshold": 3, "bits": 16, "colluders": 0, "graph-commit": graph_commitment(0), **fields}
    with pytest.raises(ProtocolError, match=match):
        ClientRound(ConfigRecord(), 1).setup(ConfigRecord({k: v for k, v in record.items() if v is not DROP}))


def test_a_client_sets_up_once_per_round_and_signs_its_keys_for_that_round():
    guard, state = ConfigRecord(), ConfigRecord()
    identity = NodeIdentity.ephemeral()  # without a roster the client signs with a fresh key, not this one
    setup = {"round": 4, "threshold": 2, "bits": 16, "colluders": 0, "graph-commit": graph_commitment(0)}
    answer = ClientRound(state, 7, run_id=3, guard=guard, identity=identity).setup(ConfigRecord(setup))
    ad = advertisement(run_id=3, server_round=4, node_id=7, pk1=answer["pk1"], pk2=answer["pk2"])
    assert verify(answer["identity"], answer["ad-sig"], ad) and answer["identity"] != identity.public
    for other in (
        advertisement(run_id=0, server_round=4, node_id=7, pk1=answer["pk1"], pk2=answer["pk2"]),
        advertisement(run_id=3, server_round=5, node_id=7, pk1=answer["pk1"], pk2=answer["pk2"]),
        advertisement(run_id=3, server_round=4, node_id=8, pk1=answer["pk1"], pk2=answer["pk2"]),
    ):
        assert not verify(answer["identity"], answer["ad-sig"], other)
    for server_round in (4, 3):  # a second encoding of round 4, or an older round: refused, whatever the state
        with pytest.raises(ProtocolError, match="one setup per round"):
            ClientRound(ConfigRecord(), 7, guard=guard).setup(ConfigRecord({**setup, "round": server_round}))
    again = ClientRound(state, 7, run_id=3, guard=guard).setup(ConfigRecord({**setup, "round": 5}))
    assert again["pk1"] != answer["pk1"] and again["identity"] != answer["identity"]  # fresh keys, fresh signer
    # with a roster the client signs with its roster key
    roster = roster_identities([7])
    answer = ClientRound(ConfigRecord(), 7, identity=roster[7]).setup(ConfigRecord(setup))
    assert answer["identity"] == roster[7].public


def resigned(key: Ed25519PrivateKey, keys: dict, **where) -> bytes:
    """``key``'s signature on an advertisement of ``keys`` (pk1, pk2) for run/round/node ``where``."""
    binding = {"run_id": RUN_ID, "server_round": 1, "node_id": 2, **where}
    return key.sign(advertisement(pk1=keys["pk1"], pk2=keys["pk2"], **binding))


def signer_of(cohort: Cohort, node: int) -> Ed25519PrivateKey:
    """The key ``node`` signed its advertisement with (its roster key, else the fresh key in its state)."""
    if node in cohort.identities:
        return cohort.identities[node].signing_key
    return Ed25519PrivateKey.from_private_bytes(bytes(cohort.states[node]["id-sk"]))


@pytest.mark.parametrize("roster", [False, True])
@pytest.mark.parametrize(
    "forgery,match",
    [
        ("swapped-signatures", "node 2's key advertisement is not signed"),
        ("another-run", "node 2's key advertisement is not signed"),
        ("another-round", "node 2's key advertisement is not signed"),
        ("another-node", "node 2's key advertisement is not signed"),
        ("another-identity", "node 2's key advertisement is not signed"),
        ("another-pk2", "node 2's key advertisement is not signed"),
        ("own-identity-replaced", "holds other keys for this node"),
    ],
)
def test_a_client_refuses_a_neighbour_key_its_identity_did_not_sign_for_this_run_round_and_node(roster, forgery, match):
    nodes = [1, 2, 3]
    cohort = Cohort(nodes, 2, identities=roster_identities(nodes) if roster else None)
    record = cohort.share_keys_record(1)
    sigs, ids = list(record["ad-sigs"]), list(record["view-ids"])
    key2 = signer_of(cohort, 2)
    if forgery == "swapped-signatures":
        sigs[1], sigs[2] = sigs[2], sigs[1]
    elif forgery == "another-run":
        sigs[1] = resigned(key2, cohort.keys[2], run_id=RUN_ID + 1)
    elif forgery == "another-round":
        sigs[1] = resigned(key2, cohort.keys[2], server_round=0)
    elif forgery == "another-node":
        sigs[1] = resigned(key2, cohort.keys[2], node_id=3)
    elif forgery == "another-identity":
        ids[1] = public_bytes(generate_signing_key())
    elif forgery == "another-pk2":
        record["pk2s"] = [record["pk2s"][0], public_key_to_bytes(generate_key_pairs()[1]), record["pk2s"][2]]
    elif forgery == "own-identity-replaced":
        ids[0] = public_bytes(generate_signing_key())
    record["ad-sigs"], record["view-ids"] = sigs, ids
    if roster and forgery == "another-identity":
        match = "not in this client's roster"  # checked first: the key is not a member's
    with pytest.raises(ProtocolError, match=match):
        cohort.client(1).share_keys(record)


def test_only_a_roster_tells_an_invented_peer_from_a_real_one():
    """A server that plays node 3 itself (its own identity key, a valid advertisement of its own round keys): a
    client without a roster cannot tell and shares its keys; a client with a roster refuses the view."""
    nodes = [1, 2, 3]
    for roster in (False, True):
        cohort = Cohort(nodes, 2, identities=roster_identities(nodes) if roster else None)
        sybil = generate_signing_key()
        record = cohort.share_keys_record(1)
        record["view-ids"] = [*record["view-ids"][:2], public_bytes(sybil)]
        record["ad-sigs"] = [*record["ad-sigs"][:2], resigned(sybil, cohort.keys[3], node_id=3)]
        if roster:
            with pytest.raises(ProtocolError, match=r"nodes \[3\] of the view are not in this client's roster"):
                cohort.client(1).share_keys(record)
        else:
            assert cohort.client(1).share_keys(record)["dsts"] == [2, 3]


def statement(cohort: Cohort, survivors: list[int]) -> bytes:
    return survivors_statement(bytes(cohort.states[1]["digest"]), survivors)


@pytest.mark.parametrize("roster", [False, True])
def test_a_client_signs_one_survivor_set_it_may_sign_and_answers_its_unmask_once_never_with_both_shares(roster):
    """The consistency stage: node 1 refuses a survivor set without itself, with nodes outside the view, smaller
    than t, and signs a proper one once. The unmask: answered only with the signature on that same set of every
    member :func:`required_signers` names, once, for that set (whatever else the request says): for each held
    peer the share of its mask seed if it is in the set, of its key if not, never both."""
    nodes = [1, 2, 3, 4]
    cohort = Cohort(nodes, 3, identities=roster_identities(nodes) if roster else None)
    cohort.collect(cohort.share_keys())
    seeds = dict(zip(cohort.states[1]["seed-owners"], cohort.states[1]["seed-shares"]))
    sk1s = dict(zip(cohort.states[1]["sk1-owners"], cohort.states[1]["sk1-shares"]))
    for survivors, match in [
        ([2, 3, 4], "does not hold this node"),
        ([1, 2, 3, 9], "outside the round's view"),
        ([1, 2], "fewer than the threshold 3"),
        ([1, 2, 2], "'survivors' repeats"),
    ]:
        with pytest.raises(ProtocolError, match=match):
            cohort.sign(1, survivors)
    survivors = [1, 2, 3]  # node 4 dropped after its shares went out
    signature = cohort.sign(1, survivors)
    assert verify(cohort.keys[1]["identity"], signature, statement(cohort, survivors))
    with pytest.raises(ProtocolError, match="after stage"):  # signs once
        cohort.sign(1, [1, 2, 3, 4])
    given_ = {n: cohort.sign(n, survivors) for n in (2, 3)}
    key4 = signer_of(cohort, 4)
    other = {n: signer_of(cohort, n).sign(statement(cohort, [1, 2, 4])) for n in (2, 3)}  # another set

    def unmask(signers: list[int], signatures: list[bytes], **extra) -> dict:
        record = ConfigRecord({"round": 1, "signers": signers, "signatures": signatures, **extra})
        return cohort.client(1).unmask(record)

    for signers, signatures in [
        ([], []),  # no signature
        ([2], [given_[2]]),  # node 3's missing
        ([2, 3], [given_[3], given_[2]]),  # each under the other's name
        ([2, 3], [other[2], other[3]]),  # signatures on another survivor set
        ([2, 3], [given_[2], key4.sign(statement(cohort, survivors))]),  # node 3's signed by another key
    ]:
        with pytest.raises(ProtocolError, match="no valid signature of node"):
            unmask(signers, signatures)
    with pytest.raises(ProtocolError, match="'signatures' must have 2 items"):
        unmask([2, 3], [given_[2]])
    # the old request's fields name node 2 dropped: ignored, the answer is for the set node 1 signed
    answer = unmask([2, 3], [given_[2], given_[3]], active=[1, 3], dead=[2, 4])
    assert answer["nids"] == [1, 2, 3, 4]  # itself first, then the held peers in S, then those outside it
    assert answer["shares"] == [seeds[1], seeds[2], seeds[3], sk1s[4]]
    assert set(seeds.values()).isdisjoint(sk1s.values())
    with pytest.raises(ProtocolError, match="after stage"):  # answered once: a second request finds no state
        unmask([2, 3], [other[2], other[3]])
    assert cohort.states[1].get("seed-shares") is None and cohort.states[1].get("sk1-shares") is None


def test_a_client_refuses_to_sign_a_set_naming_a_neighbour_it_did_not_mask_with():
    """Node 3 got no ciphertext from node 4 (the server withheld it), so it did not mask with 4: it refuses any
    survivor set holding 4 (the sum would hold 4's unmatched mask, or the server would unmask 3 apart)."""
    nodes = [1, 2, 3, 4]
    cohort = Cohort(nodes, 3)
    outgoing = cohort.share_keys()
    cohort.client(3).collect(cohort.collect_record(3, outgoing, srcs=[1, 2]), zeros())
    with pytest.raises(ProtocolError, match=r"neighbours \[4\] are named survivors but this node did not mask"):
        cohort.sign(3, [1, 2, 3, 4])
    assert verify(
        cohort.keys[3]["identity"],
        cohort.sign(3, [1, 2, 3]),
        survivors_statement(cohort.states[3]["digest"], [1, 2, 3]),
    )


def test_a_forwarded_ciphertext_for_another_node_is_refused():
    nodes = [1, 2, 3]
    states, outgoing = shared_keys(nodes, 2)
    for_3 = outgoing[2]["ctxts"][outgoing[2]["dsts"].index(3)]
    with pytest.raises(ProtocolError, match="does not decrypt"):
        ClientRound(states[1], 1).collect(ConfigRecord({"round": 1, "srcs": [2], "ctxts": [for_3]}), zeros(4))


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
    """The secure round reveals Σ to_modular(k_u) where k_u is each client's clipped, rotated, scaled,
    conditionally rounded update plus its Skellam noise share, replayed from the same generator (a client
    refuses a zero share: its noise floor is positive)."""
    from flwr_dp_strategies.privacy.mechanisms.distributed_dp import (
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
    share = 1.0  # noise multiplier sqrt(n_h share) / rounding bound = 0.02, above the harness's floor
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
        "dp-noise-share": share,
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
        k = client_integer_vector(update, params, local_noise_variance=share, rng=replay)
        expected.append(to_modular(k, bits))
    np.testing.assert_array_equal(total, modular_sum(expected, params))
