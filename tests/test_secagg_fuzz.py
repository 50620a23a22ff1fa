"""Malformed secure-aggregation messages, both ways.

From clients to the server: any mix of malformed setup, share-keys, collect, consistency and unmask replies
either reveals exactly the sum of the survivors' vectors or aborts the round (SecureAggregationAborted); the
server never reveals a wrong sum and never raises anything else, and a reply it can check (a key advertisement,
a signature on the survivor set, the records of a reply) never leaves its sender among the survivors of a round
that reveals a sum. From a server to a client: any malformed instruction is refused with a ValueError
(ProtocolError) or answered as the protocol says; it never makes a client share keys with a peer whose
advertisement its identity did not sign, sign a survivor set its rules refuse, answer an unmask without the
signatures it needs or for a node it holds no share of, give both shares of one node, or answer twice.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_dp_strategies.secure_aggregation import SecureAggregationAborted, SecureAggregationRound
from flwr_dp_strategies.secure_aggregation.client_protocol import handle
from flwr_dp_strategies.secure_aggregation.identity import (
    NodeIdentity,
    advertisement,
    survivors_statement,
    verify,
)
from flwr_dp_strategies.secure_aggregation.protocol import (
    RECORD,
    STAGE_KEY,
    Stage,
    graph_commitment,
    min_threshold,
    required_signers,
    ring_neighbours,
)

from secagg_harness import LoopbackGrid, roster_identities
from test_secure_aggregation import RUN_ID, Cohort, integer_app, modular, vectors_for

pytestmark = pytest.mark.usefixtures("task_identity")

NODES, BITS, LENGTH = list(range(101, 109)), 12, 17


def _garbage(value):
    """``value`` altered: one byte of a byte string flipped, a list one item shorter, anything else a string."""
    if isinstance(value, bytes):
        return value[:3] + bytes([value[3] ^ 0xFF]) + value[4:] if len(value) > 4 else b"\x01" + value
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
ANY_VALUE = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.binary(max_size=96),
    st.text(max_size=4),
    st.booleans(),
    st.lists(st.integers(0, 2**40), max_size=6),
    st.lists(st.sampled_from(NODES), max_size=8),
    st.lists(st.binary(max_size=80), max_size=5),
)


def snapshot(content: RecordDict) -> dict:
    """What a reply holds, to tell whether a mutation changed it."""
    return {name: dict(record.items()) for name, record in content.items() if isinstance(record, ConfigRecord)} | {
        "records": sorted(content.keys())
    }


def mutate(reply: Message, how: str, pick: int, value: Any) -> Optional[str]:
    """Apply mutation ``how`` to ``reply`` (``value`` for the mutation "value"); what changed (the field's name,
    or "content" for a content mutation), None if the reply is unchanged."""
    before = snapshot(reply.content)
    key = "content"
    if how in CONTENT_MUTATIONS:
        CONTENT_MUTATIONS[how](reply)
    else:
        record = reply.content[RECORD]
        keys = sorted(k for k in record.keys() if k != STAGE_KEY)
        if not keys:
            return None
        key = keys[pick % len(keys)]
        if how == "value":
            record[key] = value
        else:
            FIELD_MUTATIONS[how](record, key)
    return key if snapshot(reply.content) != before else None


MUTATION = st.tuples(
    st.sampled_from(Stage.ORDER),
    st.sampled_from(sorted(FIELD_MUTATIONS) + ["value"] + sorted(CONTENT_MUTATIONS)),
    st.integers(0, 5),
    ANY_VALUE,
)
CHECKED = {
    Stage.SETUP: {"pk1", "pk2", "identity", "ad-sig"},
    Stage.SHARE_KEYS: {"seed-hash"},
    Stage.CONSISTENCY: {"signature"},
}
"""The reply fields the server can tell from honest ones once changed: the signed key advertisement, the signature
on the survivor set, and the seed's hash (checked against the rebuilt seed at the unmask); a changed ``dsts``
or ``ctxts`` (encrypted for the peers) only makes the peers refuse the forwarded ciphertexts."""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(NODES), MUTATION, max_size=3),
    st.sampled_from([(8, 5), (5, 3)]),
    st.booleans(),
)
def test_malformed_client_replies_reveal_the_exact_survivors_sum_or_abort(mutations, graph, roster):
    vectors = vectors_for(NODES, BITS, LENGTH, seed=len(mutations))
    changed: dict[int, tuple[str, str]] = {}  # node -> (stage, what) its mutation changed

    def tamper(msg: Message, reply: Message) -> Message:
        node = int(msg.metadata.dst_node_id)
        if reply.has_error() or node not in mutations:
            return reply
        stage, how, pick, value = mutations[node]
        if reply.content[RECORD].get(STAGE_KEY) == stage:
            what = mutate(reply, how, pick, value)
            if what is not None:
                changed[node] = (stage, what)
        return reply

    identities = roster_identities(NODES) if roster else None
    grid = LoopbackGrid(integer_app(vectors, BITS, identities), NODES, tamper=tamper)
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
    assert secure.consistent == sorted(secure.survivors)
    for node, (stage, what) in changed.items():  # refused, or (a seed hash) caught at the unmask
        if what in CHECKED.get(stage, ()) or (what == "content" and stage != Stage.UNMASK):
            assert node not in secure.survivors, (node, mutations[node])


# ---------------------------------------------------------------------------------------------- server → client
CLIENT_NODES, THRESHOLD, GRAPH_SEED = [1, 2, 3, 4, 5], 3, 3
SURVIVORS = [1, 2, 3]
"""The survivor set the transcript's node 1 signs: node 4 dropped after the collect stage (node 1 holds its
shares and masked with it), node 5's ciphertext never reached node 1 (it holds nothing of 5, nor masked with it)."""

STAGE_FIELDS = {
    Stage.SETUP: ["round", "threshold", "bits", "colluders", "graph-commit"],
    Stage.SHARE_KEYS: [
        "round",
        "nids",
        "pk1s",
        "pk2s",
        "ad-sigs",
        "view",
        "view-ids",
        "graph-seed",
        "num-shares",
        "honest",
    ],
    Stage.COLLECT: ["round", "srcs", "ctxts"],
    Stage.CONSISTENCY: ["round", "survivors"],
    Stage.UNMASK: ["round", "signers", "signatures"],
}
FIELDS = [(stage, key) for stage in Stage.ORDER for key in STAGE_FIELDS[stage]]


def copy(record: ConfigRecord) -> ConfigRecord:
    return ConfigRecord({k: list(v) if isinstance(v, list) else v for k, v in record.items()})


@dataclass(frozen=True)
class Transcript:
    """An honest round seen by node 1: the server's record for each stage (``records[i]`` for ``Stage.ORDER[i]``)
    and node 1's state and guard before each stage (``before[i]``; ``before[5]``: after the unmask)."""

    records: list[ConfigRecord]
    before: list[tuple[ConfigRecord, ConfigRecord]]
    identity: NodeIdentity
    roster_keys: frozenset[bytes]
    pools: dict[type, list[Any]]  # honest values of other fields and sets, for substitutions


@functools.cache
def transcript() -> Transcript:
    identities = roster_identities(CLIENT_NODES)
    before = [(ConfigRecord(), ConfigRecord())]
    cohort = Cohort(CLIENT_NODES, THRESHOLD, graph_seed=GRAPH_SEED, bits=BITS, identities=identities)
    keep = lambda: before.append((copy(cohort.states[1]), copy(cohort.guards[1])))  # noqa: E731
    keep()
    records = [copy(cohort.setup_record), cohort.share_keys_record(1)]
    outgoing = cohort.share_keys()
    keep()
    records.append(cohort.collect_record(1, outgoing, srcs=[2, 3, 4]))
    cohort.client(1).collect(copy(records[-1]), lambda: np.zeros(LENGTH, dtype=np.uint64))
    cohort.collect(outgoing, nodes=[2, 3])
    keep()
    records.append(ConfigRecord({"round": 1, "survivors": SURVIVORS}))
    signatures = {n: cohort.sign(n, SURVIVORS) for n in SURVIVORS}
    keep()
    signers = required_signers(1, SURVIVORS, view=CLIENT_NODES, num_shares=len(CLIENT_NODES), graph_seed=GRAPH_SEED)
    records.append(ConfigRecord({"round": 1, "signers": signers, "signatures": [signatures[n] for n in signers]}))
    cohort.client(1).unmask(copy(records[-1]))
    keep()
    digest = bytes(before[4][0]["digest"])
    elsewhere = [identities[n].sign(survivors_statement(digest, [1, 2, 4])) for n in signers]  # another set
    lists = [v for r in records for v in r.values() if isinstance(v, list) and v and isinstance(v[0], bytes)]
    scalars = [v for r in records for v in r.values() if isinstance(v, bytes)]
    pools = {bytes: [*scalars, graph_commitment(GRAPH_SEED + 1), *signatures.values()], list: [*lists, elsewhere]}
    return Transcript(records, before, identities[1], identities[1].roster.keys(), pools)


def run_stage(stage: str, record: ConfigRecord, state: ConfigRecord, guard: ConfigRecord):
    """Node 1's answer to ``record`` at ``stage`` (``handle``, as the mod calls it): (fields, masked vector)."""
    encode = lambda: np.zeros(LENGTH, dtype=np.uint64)  # noqa: E731
    return handle(state, 1, stage, record, encode, identity=transcript().identity, run_id=RUN_ID, guard=guard)


def check_answer(stage: str, record: ConfigRecord, before: ConfigRecord, fields: dict, after: ConfigRecord) -> None:
    """What node 1 may answer to ``record`` at ``stage``, with ``before`` its state when it got it."""
    ids = transcript()
    if stage == Stage.SETUP:
        ad = advertisement(run_id=RUN_ID, server_round=record["round"], node_id=1, pk1=fields["pk1"], pk2=fields["pk2"])
        assert fields["identity"] == ids.identity.public and verify(fields["identity"], fields["ad-sig"], ad)
        assert 2 <= after["threshold"] and after["colluders"] < after["threshold"]
        assert after["graph-commit"] == record["graph-commit"] and len(after["graph-commit"]) == 32
    elif stage == Stage.SHARE_KEYS:
        view, nids = record["view"], record["nids"]
        identity_of = dict(zip(view, record["view-ids"]))
        assert graph_commitment(record["graph-seed"]) == before["graph-commit"]
        assert set(record["view-ids"]) <= ids.roster_keys and len(set(view)) == len(view)
        assert set(nids) == ring_neighbours(view, record["num-shares"], record["graph-seed"])[1]
        assert before["threshold"] >= min_threshold(len(nids), before["colluders"])
        for nid, pk1, pk2, sig in zip(nids, record["pk1s"], record["pk2s"], record["ad-sigs"]):
            ad = advertisement(run_id=RUN_ID, server_round=before["round"], node_id=nid, pk1=pk1, pk2=pk2)
            assert verify(identity_of[nid], sig, ad), nid
        assert sorted(fields["dsts"]) == sorted(set(nids) - {1}) and len(fields["ctxts"]) == len(fields["dsts"])
    elif stage == Stage.COLLECT:
        assert set(after["included"]) == set(record["srcs"]) <= set(before["peer-nids"]) - {1}
    elif stage == Stage.CONSISTENCY:
        survivors, view = record["survivors"], before["view"]
        assert 1 in survivors and set(survivors) <= set(view) and len(set(survivors)) >= before["threshold"]
        assert (set(survivors) & set(before["peer-nids"])) - {1} <= set(before["included"])
        statement = survivors_statement(before["digest"], survivors)
        assert verify(ids.identity.public, fields["signature"], statement)
        assert sorted(after["survivors"]) == sorted(survivors)
    else:
        survivors = list(before["survivors"])
        statement = survivors_statement(before["digest"], survivors)
        identity_of = dict(zip(before["view"], before["view-ids"]))
        given_ = dict(zip(record["signers"], record["signatures"]))
        needed = required_signers(
            1,
            survivors,
            view=before["view"],
            num_shares=before["num-shares"],
            graph_seed=before["graph-seed"],
        )
        assert needed and all(verify(identity_of[n], given_.get(n), statement) for n in needed)
        held = list(before["included"])
        seeds = dict(zip(before["seed-owners"], before["seed-shares"]))
        sk1s = dict(zip(before["sk1-owners"], before["sk1-shares"]))
        alive = sorted(n for n in held if n in survivors)
        dead = sorted(n for n in held if n not in survivors)
        assert fields["nids"] == [1, *alive, *dead]  # each held node once, itself first
        assert fields["shares"] == [seeds[n] for n in [1, *alive]] + [sk1s[n] for n in dead]
        assert after.get("seed-shares") is None and after.get("sk1-shares") is None


def answer_or_refuse(stage: str, record: ConfigRecord, state: ConfigRecord, guard: ConfigRecord) -> bool:
    """Run node 1's stage: False if refused with a ValueError; else check the answer, that the state moved on
    and that the same instruction is then refused (answered once), and return True."""
    before = copy(state)
    try:
        fields, vector = run_stage(stage, copy(record), state, guard)
    except ValueError:
        return False  # ProtocolError is a ValueError: Flower turns it into an error reply
    assert (vector is not None) == (stage == Stage.COLLECT)
    assert state["stage"] == stage
    check_answer(stage, record, before, fields, state)
    with pytest.raises(ValueError):
        run_stage(stage, copy(record), state, guard)
    return True


def test_the_transcript_holds_every_field_the_fuzz_names_and_node_1_answers_it():
    ids = transcript()
    for index, stage in enumerate(Stage.ORDER):
        assert sorted(ids.records[index].keys()) == sorted(STAGE_FIELDS[stage])
        state, guard = map(copy, ids.before[index])
        assert answer_or_refuse(stage, ids.records[index], state, guard), stage


@pytest.mark.parametrize("how", sorted(FIELD_MUTATIONS))
@pytest.mark.parametrize("stage,key", FIELDS, ids=[f"{s}-{k}" for s, k in FIELDS])
def test_a_client_refuses_a_malformed_instruction_with_a_value_error(stage, key, how):
    """Every field of every stage's instruction deleted, mistyped, altered or repeated: refused, or (only where
    the field still holds a value the protocol allows) answered as the protocol says."""
    ids = transcript()
    index = Stage.ORDER.index(stage)
    state, guard = map(copy, ids.before[index])
    record = copy(ids.records[index])
    FIELD_MUTATIONS[how](record, key)
    answered = answer_or_refuse(stage, record, state, guard)
    assert not (answered and how in ("delete", "wrong-type")), "a missing or mistyped field was answered"
    if answered and how == "garbage":  # a setup commits to any 32 bytes: the seed is checked against it later
        assert (stage, key) == (Stage.SETUP, "graph-commit"), (stage, key)


def flip(value: bytes, bit: int) -> bytes:
    if not value:
        return b"\x00"
    index = (bit // 8) % len(value)
    return value[:index] + bytes([value[index] ^ (1 << (bit % 8))]) + value[index + 1 :]


def variants(value: Any) -> st.SearchStrategy:
    """Values like ``value`` (an int, bytes, a list of ints or of bytes) with one thing changed, and others of
    its kind from elsewhere in the round."""
    pools = transcript().pools
    ids = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 2**40])
    if isinstance(value, int):
        return st.one_of(st.sampled_from([value - 1, value + 1, 0, -1, 2, 2**62]), st.integers(-(2**63), 2**63 - 1))
    if isinstance(value, bytes):
        return st.one_of(
            st.integers(0, 8 * len(value) - 1).map(lambda bit: flip(value, bit)),
            st.integers(0, len(value) - 1).map(lambda n: value[:n]),
            st.sampled_from(pools[bytes]),
            st.binary(min_size=len(value), max_size=len(value)),
        )
    if value and isinstance(value[0], int):
        return st.one_of(
            st.permutations(value),
            st.integers(0, len(value) - 1).map(lambda i: value[:i] + value[i + 1 :]),
            ids.map(lambda n: [*value, n]),
            st.lists(ids, max_size=7),
        )
    return st.one_of(
        st.permutations(value),
        st.tuples(st.integers(0, len(value) - 1), st.integers(0, 8 * 64)).map(
            lambda p: [flip(v, p[1]) if i == p[0] else v for i, v in enumerate(value)]
        ),
        st.integers(0, len(value) - 1).map(lambda i: value[:i] + value[i + 1 :]),
        st.sampled_from(pools[list]),
        st.lists(st.binary(max_size=70), max_size=6),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FIELDS), st.booleans(), st.data())
def test_a_client_answers_an_altered_instruction_only_as_the_protocol_allows(field, shaped, data):
    """One field of one stage's instruction replaced by a value drawn for it (a flipped bit, a permutation, a
    subset or superset of node ids, another field's or another set's signatures) or by any value: refused with
    a ValueError, or answered as the protocol says (checked by :func:`check_answer`, and answered once)."""
    stage, key = field
    ids = transcript()
    index = Stage.ORDER.index(stage)
    state, guard = map(copy, ids.before[index])
    record = copy(ids.records[index])
    record[key] = data.draw(variants(record[key]) if shaped else ANY_VALUE, label=key)
    answer_or_refuse(stage, record, state, guard)


OUT_OF_ORDER = [(done, stage) for done in range(6) for stage in Stage.ORDER if done == 5 or Stage.ORDER[done] != stage]


@pytest.mark.parametrize("done,stage", OUT_OF_ORDER)
def test_a_client_refuses_any_instruction_out_of_order(done, stage):
    """Node 1, having answered the first ``done`` stages, gets the honest instruction of ``stage`` other than the
    next one: refused (a replayed setup included: one setup per round; after the unmask, everything)."""
    ids = transcript()
    state, guard = map(copy, ids.before[done])
    with pytest.raises(ValueError):
        run_stage(stage, copy(ids.records[Stage.ORDER.index(stage)]), state, guard)
