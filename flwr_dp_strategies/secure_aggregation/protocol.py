"""The wire format of the Message-API SecAgg+ round: stages, record names and their validation.

Every message of the protocol is a Flower ``train`` message whose content holds the
ConfigRecord :data:`RECORD` with the key ``"stage"``; the client's protocol state
lives in ``context.state.config_records[STATE_RECORD]``. What travels in the clear,
stage by stage (nothing of it depends on the client's data):

===============  =================================================  ==============================================
stage            server → client                                    client → server
===============  =================================================  ==============================================
``setup``        round, threshold t, bits b, colluders c, the       two fresh ECDH public keys (pk1, pk2), the
                 commitment to the graph seed                       node's identity key and its signature of both,
                                                                    bound to run, round and node id
``share-keys``   the view U_1 and each member's identity, the       Shamir shares of b_u and sk1, each encrypted
                 graph seed and k, n_h, the neighbours' node ids,   for one neighbour (Fernet under ECDH(sk2, pk2)),
                 public keys and signed advertisements              bound to the view's digest; SHA-256(b_u)
``collect``      the model (Flower's train content), the            the masked vector (uint64 in [0, 2^b)) only:
                 ciphertexts addressed to this client, the          the ClientApp's metrics and ``num-examples`` are
                 public distributed-DP parameters                   dropped (they would leave un-noised)
``consistency``  the survivor set S                                 the node's signature of S (once)
``unmask``       the signatures on S the node requires              the shares of b_v (v in S) or sk1_v (v not in
                                                                    S) for its held peers, never both for one node
===============  =================================================  ==============================================

Every validator raises :class:`ProtocolError` (a ``ValueError``) naming the field;
a client answers a malformed instruction with an error reply (the server counts
it as a dropout), the server rejects a malformed reply and treats its sender as
dropped.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Iterable, Optional, Sequence

from flwr.app import ConfigRecord, RecordDict

RECORD = "secure-aggregation"
STATE_RECORD = "secure-aggregation-state"
MASKED_RECORD = "masked"
MASKED_KEY = "vector"
STAGE_KEY = "stage"


class Stage:
    """The five stages of one round, in order."""

    SETUP = "setup"
    SHARE_KEYS = "share-keys"
    COLLECT = "collect"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    ORDER = (SETUP, SHARE_KEYS, COLLECT, CONSISTENCY, UNMASK)


def graph_commitment(graph_seed: int) -> bytes:
    """SHA-256 of the graph seed, sent at setup before any key is seen and checked at share-keys: the server
    cannot pick the ring after seeing the keys."""
    return hashlib.sha256(b"flwr-dp/secagg+/graph-seed|" + str(int(graph_seed)).encode()).digest()


class ProtocolError(ValueError):
    """A protocol message that does not follow the protocol (the field is named in the message)."""


def stage_record(content: RecordDict) -> ConfigRecord:
    """The protocol record of ``content`` (ProtocolError if absent or not a ConfigRecord)."""
    if RECORD not in content or not isinstance(content[RECORD], ConfigRecord):
        raise ProtocolError(f"the message holds no ConfigRecord {RECORD!r}")
    return content[RECORD]


def stage_of(content: RecordDict) -> str:
    """The stage named by ``content`` (ProtocolError if unknown)."""
    stage = stage_record(content).get(STAGE_KEY)
    if stage not in Stage.ORDER:
        raise ProtocolError(f"{STAGE_KEY} must be one of {Stage.ORDER}, got {stage!r}")
    return str(stage)


def field(record: ConfigRecord, key: str, kind: type) -> Any:
    """``record[key]``, checked to be exactly of type ``kind`` (bool is not an int)."""
    if key not in record:
        raise ProtocolError(f"field {key!r} is missing")
    value = record[key]
    if type(value) is not kind:  # noqa: E721 - exact type: bool must not pass as int
        raise ProtocolError(f"field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def list_field(record: ConfigRecord, key: str, kind: type, *, length: int | None = None) -> list[Any]:
    """``record[key]`` as a list whose items are exactly of type ``kind`` (an empty list is accepted)."""
    if key not in record:
        raise ProtocolError(f"field {key!r} is missing")
    value = record[key]
    if not isinstance(value, list) or any(type(item) is not kind for item in value):  # noqa: E721
        raise ProtocolError(f"field {key!r} must be a list of {kind.__name__}")
    if length is not None and len(value) != length:
        raise ProtocolError(f"field {key!r} must have {length} items, got {len(value)}")
    return list(value)


def distinct(key: str, values: Sequence[Any]) -> None:
    """ProtocolError if ``values`` repeat."""
    if len(set(values)) != len(values):
        raise ProtocolError(f"field {key!r} repeats a value")


def ring_neighbours(nodes: Iterable[int], num_shares: int, graph_seed: int) -> dict[int, set[int]]:
    """N(u) for each node: the nodes within ``num_shares // 2`` of u on a ring whose order is the sorted
    ``nodes`` shuffled by ``random.Random(graph_seed)`` (u included; every node when ``num_shares`` ≥ the
    number of nodes: SecAgg's complete graph). Public and deterministic: a client recomputes its own
    neighbourhood from the view and the seed and refuses any other (Bell et al. 2020 choose the graph
    at random; a server that picks it could surround a client with nodes of its choice)."""
    return ring_neighbours_of(nodes, num_shares, graph_seed, None)


def ring_neighbours_of(
    nodes: Iterable[int], num_shares: int, graph_seed: int, which: Optional[Iterable[int]]
) -> dict[int, set[int]]:
    """:func:`ring_neighbours` for the nodes ``which`` only (all when None): O(n + |which|·k), what a
    client needs (its own neighbourhood and its neighbours') without building the whole graph."""
    order = sorted(int(n) for n in nodes)
    random.Random(int(graph_seed)).shuffle(order)
    n = len(order)
    wanted = order if which is None else [int(u) for u in which]
    if num_shares >= n:
        everyone = set(order)
        return {u: set(everyone) for u in wanted}
    position = {u: i for i, u in enumerate(order)}
    half = num_shares // 2
    return {u: {order[(position[u] + k) % n] for k in range(-half, half + 1)} for u in wanted}


def neighbourhood_size(n_nodes: int, num_shares: int) -> int:
    """|N(u)| on a ring of ``n_nodes`` for neighbourhood parameter ``num_shares`` (u included)."""
    return n_nodes if num_shares >= n_nodes else min(n_nodes, 2 * (num_shares // 2) + 1)


def min_threshold(holders: int, colluders: int = 0) -> int:
    r"""The smallest threshold t a client accepts for ``holders`` share holders (itself included) and
    ``colluders`` c clients that may pool their shares with the server: :math:`2t > h + c`.

    Why: one secret of a client u is its mask seed :math:`b_u` (rebuilt when u survives), the other
    its key :math:`sk1_u` (rebuilt when u dropped); both together strip every mask of u's vector.
    An honest holder answers one unmask request per round, under the one survivor set it signed, so it
    gives either the seed or the key share of a peer, never both. A server that shows holders different
    sets needs t − c honest "in the set" and t − c honest "not in the set" answers from the h − c honest
    holders: :math:`2(t - c) \le h - c`.
    With :math:`2t > h + c` this is impossible (the counting of Bonawitz et al. 2017's active-server
    analysis).
    It also gives t > c: the colluders alone never hold t shares of an honest client's secret."""
    return max(2, (holders + colluders) // 2 + 1)


def ring_order(view: Iterable[int], graph_seed: int) -> list[int]:
    """The public ring: the sorted ``view`` shuffled by ``random.Random(graph_seed)`` (:func:`ring_neighbours`)."""
    order = sorted(int(n) for n in view)
    random.Random(int(graph_seed)).shuffle(order)
    return order


def required_signers(
    node: int,
    survivors: Iterable[int],
    *,
    view: Iterable[int],
    num_shares: int,
    graph_seed: int,
    order: Optional[Sequence[int]] = None,
    position: Optional[dict[int, int]] = None,
) -> list[int]:
    """The members of S whose signatures on S a holder demands before it answers the unmask: every other member
    in the complete graph; on the ring, every member within ring distance 3·⌊k/2⌋ of ``node`` (so that no
    member a server could use to strip a partner of a revealed node's masks can have signed another set:
    :func:`survivor_set_flaw`). ``order`` and ``position`` (:func:`ring_order` and each node's index in it):
    computed once by a caller that asks for many nodes."""
    members = survivors if isinstance(survivors, (set, frozenset)) else set(int(n) for n in survivors)
    if order is None:
        order = ring_order(view, graph_seed)
    n = len(order)
    if num_shares >= n:
        return sorted(members - {int(node)})
    at = position[int(node)] if position is not None else order.index(int(node))
    reach = 3 * (num_shares // 2)
    if 2 * reach + 1 >= n:
        return sorted(members - {int(node)})
    near = {order[(at + d) % n] for d in range(-reach, reach + 1)}
    return sorted((near & members) - {int(node)})


def survivor_set_flaw(
    node: int,
    survivors: Iterable[int],
    *,
    neighbourhood: Iterable[int],
    masked_with: Iterable[int],
    view_size: int,
    num_shares: int,
    colluders: int,
    honest: int,
) -> Optional[str]:
    r"""Why ``node`` must not sign the survivor set S (None when it may): the rule every client applies before
    it signs, once per round, the set whose members' mask seeds the holders will reveal.

    1. ``node`` ∈ S, and it masked with every neighbour in S (:math:`N(u) \cap S \setminus \{u\} \subseteq A_u`,
       A_u = ``masked_with``, the peers whose shares the server forwarded to it);
    2. :math:`|S| - c \ge n_h` (``honest``, the count the noise shares are calibrated for);
    3. on a ring (h < |view|): :math:`|N(u) \setminus S| + c < \lfloor k/2 \rfloor`.

    What it buys, with the holders' rules (an honest holder answers the unmask once, under the S it signed
    itself, and only with the signature on S of every member :func:`required_signers` names; 2t > h + c).
    Let u be honest and its seed :math:`b_u` revealed: t holders of u answered, t − c of them honest, all under
    the one S that u signed (they hold u's signature on it). *No member p of S next to u can be stripped*: the
    server would need t − c honest holders of p answering under another set. In the complete graph those and
    the t − c above are disjoint, :math:`2(t - c) \le h - c`, impossible. On a ring each lies within 3⌊k/2⌋
    of every holder of u above, who demanded its signature on S, so it did not sign another set and lies
    outside S: in :math:`N(p) \setminus S`, fewer than ⌊k/2⌋ − c by p's rule 3, while t − c > ⌊k/2⌋ − c.
    *The sum holds every honest member of S*: u's masks with its neighbours in S (rule 1) can only cancel
    inside the sum, so they are in it; they signed S too (their signatures were demanded), and so on from each;
    on a ring rule 3 and the demanded signatures leave no run of ⌊k/2⌋ positions without an honest signer of S,
    so the chain goes round the whole ring. So any sum holding u that any server can unmask holds at least
    :math:`|S| - c \ge n_h` honest noise shares (rule 2). Against Sybils this needs the roster: invented
    members would count as honest."""
    members = survivors if isinstance(survivors, (set, frozenset)) else set(int(n) for n in survivors)
    hood = set(int(n) for n in neighbourhood)
    node = int(node)
    c = int(colluders)
    if node not in members:
        return "the survivor set does not hold this node"
    missing_masks = (hood & members) - {node} - set(int(n) for n in masked_with)
    if missing_masks:
        return f"neighbours {sorted(missing_masks)[:5]} are named survivors but this node did not mask with them"
    if len(members) - c < int(honest):
        return f"{len(members)} survivors less {c} colluder(s) is fewer than the n_h = {honest} the noise assumes"
    if len(hood) < int(view_size):
        half = int(num_shares) // 2
        absent = len(hood - members)
        if absent + c >= half:
            return (
                f"{absent} of this node's neighbours are not survivors; with {c} colluder(s) that reaches "
                f"{half} = k/2, where a server could cut the ring and unmask a part"
            )
    return None


def graph_failure_bound(
    n_nodes: int, num_shares: int, threshold: int, dropout_rate: float, colluders: int = 0
) -> float:
    r"""An upper bound on the probability that a round on the ring of :func:`ring_neighbours` cannot
    unmask, or splits, when each node drops independently with probability p = ``dropout_rate``.

    A node's secret needs t live holders among its h = :func:`neighbourhood_size` neighbours
    (itself excluded when it dropped: :math:`\Pr[\mathrm{Bin}(h-1, 1-p) < t]`), and the survivors'
    graph splits only where ⌊k/2⌋ consecutive ring positions all dropped (:math:`p^{\lfloor k/2\rfloor}`);
    a union bound over the n nodes gives

    .. math:: n\,\bigl(\Pr[\mathrm{Bin}(h-1, 1-p) < t] + p^{\lfloor k/2 \rfloor}\bigr)

    (Bell et al. 2020, §3: logarithmic degree for a fixed dropout rate and failure probability).
    For the complete graph only the first term counts, once."""
    from scipy.stats import binom  # noqa: PLC0415 - scipy is only needed when sizes are derived

    h = neighbourhood_size(n_nodes, num_shares)
    if h >= n_nodes:
        return float(binom.cdf(threshold - 1, h - 1, 1.0 - dropout_rate))
    # t live holders, and (the signing rule) fewer than k/2 - c absent neighbours: k/2 + c + 1 live of h - 1
    need = max(int(threshold), h - 1 - (num_shares // 2 - int(colluders)) + 1)
    missing = float(binom.cdf(need - 1, h - 1, 1.0 - dropout_rate))
    return min(1.0, n_nodes * (missing + dropout_rate ** (num_shares // 2)))


def choose_num_shares(n_nodes: int, *, colluders: int, dropout_rate: float, failure_probability: float) -> int:
    r"""The smallest ring parameter k whose :func:`graph_failure_bound` (at t = :func:`min_threshold`) is at
    most ``failure_probability``; ``n_nodes`` (the complete graph) when none smaller is.

    Derivation (Bell et al. 2020, §3-4: a random Harary graph, here the ring of a public random order,
    with degree k, each node dropping independently with probability p). The round fails only if some
    node's secret has fewer than t live holders among its h − 1 ≈ k neighbours, or the survivors' graph
    splits; a union bound over the n nodes bounds the failure probability by

    .. math:: n\,\bigl(\Pr[\mathrm{Bin}(k, 1-p) < t] + p^{k/2}\bigr) \le \eta,

    with t ≈ k/2 + c/2 + 1 (:func:`min_threshold`: 2t > h + c, so no server gets both secrets of a node)
    and, for the survivors' signing rule (:func:`survivor_set_flaw`), at least k/2 + c + 1 live neighbours.
    By Chernoff, :math:`\Pr[\mathrm{Bin}(k, 1-p) < k/2] \le e^{-k\,D(1/2\,\|\,1-p)}` (D the binary
    relative entropy), so

    .. math:: k \ge \frac{\ln n + \ln(2/\eta)}{\min\{D(\tfrac12 \| 1-p),\ \tfrac12\ln(1/p)\}}

    suffices: the degree grows as O(log(n/η)) for a fixed dropout rate, as in Bell et al. (at p = 0.05,
    η = 1e-6: k = 22 at n = 100 and 300, 24 at 1 000, 26 at 10 000, 30 at 100 000). This function does not use the Chernoff form: it scans k with the exact binomial tail,
    which gives the smallest k the union bound allows. Security against the server rests on the clients'
    own checks (:mod:`.client_protocol`), not on the degree."""
    for k in range(2, n_nodes, 2):
        h = neighbourhood_size(n_nodes, k)
        t = min_threshold(h, colluders)
        if t <= h and graph_failure_bound(n_nodes, k, t, dropout_rate, colluders) <= failure_probability:
            return k
    return n_nodes


def view_digest(
    *,
    run_id: int = 0,
    honest: int = 1,
    server_round: int,
    threshold: int,
    bits: int,
    colluders: int,
    num_shares: int,
    graph_seed: int,
    view: Sequence[int],
    identities: Optional[Sequence[bytes]] = None,
) -> bytes:
    """SHA-256 of what every client of one round must agree on: the run, the round's parameters (n_h included),
    U_1 and each member's identity key (so two clients that exchanged shares agree on who every node is).

    Each encrypted share carries its sender's digest and the receiver checks it against its own, so
    two clients that exchange shares saw the same parameters, node set and graph (Fernet under their
    ECDH key: the server cannot rewrite it without substituting keys)."""
    text = (
        f"secagg+/2|{run_id}|{server_round}|{threshold}|{bits}|{colluders}|{honest}|{num_shares}|{graph_seed}|"
        + ",".join(str(int(n)) for n in sorted(view))
    )
    digest = hashlib.sha256(text.encode())
    if identities is not None:  # each view member's identity key, in sorted node order
        for _, identity in sorted(zip((int(n) for n in view), identities)):
            digest.update(bytes(identity))
    return digest.digest()


__all__ = [
    "MASKED_KEY",
    "MASKED_RECORD",
    "RECORD",
    "STAGE_KEY",
    "STATE_RECORD",
    "ProtocolError",
    "Stage",
    "choose_num_shares",
    "distinct",
    "field",
    "graph_failure_bound",
    "graph_commitment",
    "required_signers",
    "ring_order",
    "survivor_set_flaw",
    "list_field",
    "min_threshold",
    "neighbourhood_size",
    "ring_neighbours",
    "ring_neighbours_of",
    "stage_of",
    "stage_record",
    "view_digest",
]
