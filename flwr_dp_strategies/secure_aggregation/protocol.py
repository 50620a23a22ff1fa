"""The wire format of the Message-API SecAgg+ round: stages, record names and their validation.

Every message of the protocol is a Flower ``train`` message whose content holds the
ConfigRecord :data:`RECORD` with the key ``"stage"``; the client's protocol state
lives in ``context.state.config_records[STATE_RECORD]``. What travels in the clear,
stage by stage (nothing of it depends on the client's data):

=================  ===============================================  ==============================================
stage              server → client                                  client → server
=================  ===============================================  ==============================================
``setup``          round, threshold t, bits b, colluders c          two fresh ECDH public keys (pk1, pk2)
``share-keys``     the view U_1 (node ids), the graph seed and k,    Shamir shares of b_u and sk1, each encrypted
                   the neighbours' node ids and public keys          for one neighbour (Fernet under ECDH(sk2, pk2)),
                                                                    bound to the view's digest; SHA-256(b_u), which
                                                                    lets the server check the rebuilt seed
``collect``        the model (Flower's train content), the           the masked vector (uint64 in [0, 2^b)) only:
                   ciphertexts addressed to this client, the         the ClientApp's metrics and ``num-examples`` are
                   public distributed-DP parameters                  dropped (they would leave un-noised)
``unmask``         which neighbours survived / dropped               the shares of b_v (survivors) or sk1_v
                                                                    (dropped), never both for one node
=================  ===============================================  ==============================================

Every validator raises :class:`ProtocolError` (a ``ValueError``) naming the field;
a client answers a malformed instruction with an error reply (the server counts
it as a dropout), the server rejects a malformed reply and treats its sender as
dropped.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Any, Iterable, Optional, Sequence

from flwr.app import ConfigRecord, RecordDict

RECORD = "secure-aggregation"
STATE_RECORD = "secure-aggregation-state"
MASKED_RECORD = "masked"
MASKED_KEY = "vector"
STAGE_KEY = "stage"


class Stage:
    """The four stages of one round, in order."""

    SETUP = "setup"
    SHARE_KEYS = "share-keys"
    COLLECT = "collect"
    UNMASK = "unmask"
    ORDER = (SETUP, SHARE_KEYS, COLLECT, UNMASK)


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
    An honest holder answers one unmask request per round and names each peer either alive or
    dropped, never both. A server that lies to different holders needs t − c honest "alive" and
    t − c honest "dropped" answers from the h − c honest holders: :math:`2(t - c) \le h - c`.
    With :math:`2t > h + c` this is impossible (the counting of Bonawitz et al. 2017's active-server
    analysis).
    It also gives t > c: the colluders alone never hold t shares of an honest client's secret."""
    return max(2, (holders + colluders) // 2 + 1)


def honest_shares_bound(view_size: int, threshold: int, colluders: int, *, complete: bool) -> int:
    r"""A lower bound on the honest clients in any sum that a server lying about dropouts (but relaying
    the public keys faithfully) can unmask, with up to c colluding clients; 1 (the client alone) when
    the graph is not complete.

    Complete graph of h nodes, every honest holder answering one request that names each peer it holds
    shares of as alive or dropped, with at least t alive (itself included). To read a sum over S the
    server must rebuild :math:`sk1_x` of every honest x outside S: t − c honest "dropped" answers each,
    from h − c honest holders with at most h − t "dropped" names each. So at most
    :math:`(h-c)(h-t)/(t-c)` honest clients are outside S, and at least

    .. math:: \left\lceil (h - c)\,\frac{2t - h - c}{t - c} \right\rceil

    are in it (≥ 1 once :func:`min_threshold` holds; = t − c only at t = h). In a sparse graph
    nodes far from u can answer for u's neighbours, and no bound better than u itself holds."""
    h, t, c = int(view_size), int(threshold), int(colluders)
    if not complete or 2 * t <= h + c:
        return 1
    return max(1, math.ceil((h - c) * (2 * t - h - c) / (t - c) - 1e-9))


def lying_server_threshold(holders: int, colluders: int, honest_target: int) -> int:
    """The smallest t ≥ :func:`min_threshold` whose complete-graph :func:`honest_shares_bound` reaches
    ``honest_target`` (t = ``holders`` always does when the target is at most holders − colluders)."""
    for t in range(min_threshold(holders, colluders), holders + 1):
        if honest_shares_bound(holders, t, colluders, complete=True) >= honest_target:
            return t
    return holders


def graph_failure_bound(n_nodes: int, num_shares: int, threshold: int, dropout_rate: float) -> float:
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
    missing = float(binom.cdf(threshold - 1, h - 1, 1.0 - dropout_rate))
    if h >= n_nodes:
        return missing
    return min(1.0, n_nodes * (missing + dropout_rate ** (num_shares // 2)))


def choose_num_shares(n_nodes: int, *, colluders: int, dropout_rate: float, failure_probability: float) -> int:
    r"""The smallest ring parameter k whose :func:`graph_failure_bound` (at t = :func:`min_threshold`) is at
    most ``failure_probability``; ``n_nodes`` (the complete graph) when none smaller is.

    Derivation (Bell et al. 2020, §3-4: a random Harary graph, here the ring of a public random order,
    with degree k, each node dropping independently with probability p). The round fails only if some
    node's secret has fewer than t live holders among its h − 1 ≈ k neighbours, or the survivors' graph
    splits; a union bound over the n nodes bounds the failure probability by

    .. math:: n\,\bigl(\Pr[\mathrm{Bin}(k, 1-p) < t] + p^{k/2}\bigr) \le \eta,

    with t ≈ k/2 + c/2 + 1 (:func:`min_threshold`: 2t > h + c, so no server gets both secrets of a node).
    By Chernoff, :math:`\Pr[\mathrm{Bin}(k, 1-p) < k/2] \le e^{-k\,D(1/2\,\|\,1-p)}` (D the binary
    relative entropy), so

    .. math:: k \ge \frac{\ln n + \ln(2/\eta)}{\min\{D(\tfrac12 \| 1-p),\ \tfrac12\ln(1/p)\}}

    suffices: the degree grows as O(log(n/η)) for a fixed dropout rate, as in Bell et al. (at p = 0.05,
    η = 1e-6: k = 22 at n = 100 and 300, 24 at 1 000, 26 at 10 000, 30 at 100 000). This function does not
    use the Chernoff form: it scans k with the exact binomial tail, which gives the smallest k the union
    bound allows. Security against a server colluding with c clients rests on 2t > h + c (checked by
    every client), not on the degree."""
    for k in range(2, n_nodes, 2):
        h = neighbourhood_size(n_nodes, k)
        t = min_threshold(h, colluders)
        if t <= h and graph_failure_bound(n_nodes, k, t, dropout_rate) <= failure_probability:
            return k
    return n_nodes


def view_digest(
    *,
    server_round: int,
    threshold: int,
    bits: int,
    colluders: int,
    num_shares: int,
    graph_seed: int,
    view: Sequence[int],
) -> bytes:
    """SHA-256 of what every client of one round must agree on: the round's parameters and U_1.

    Each encrypted share carries its sender's digest and the receiver checks it against its own, so
    two clients that exchange shares saw the same parameters, node set and graph (Fernet under their
    ECDH key: the server cannot rewrite it without substituting keys)."""
    text = f"secagg+|{server_round}|{threshold}|{bits}|{colluders}|{num_shares}|{graph_seed}|" + ",".join(
        str(int(n)) for n in sorted(view)
    )
    return hashlib.sha256(text.encode()).digest()


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
    "honest_shares_bound",
    "lying_server_threshold",
    "list_field",
    "min_threshold",
    "neighbourhood_size",
    "ring_neighbours",
    "ring_neighbours_of",
    "stage_of",
    "stage_record",
    "view_digest",
]
