r"""The server's side of one SecAgg+ round over a Flower ``Grid`` (Message API).

Bell, Bonawitz, Gascón, Lepoint & Raykova, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020 (SecAgg+); Bonawitz et al., CCS 2017 (SecAgg,
the complete-graph case). Built on Flower's primitives (see :mod:`.client_protocol`).

Node sets, as in the papers: :math:`U_0` the sampled nodes, :math:`U_1 \subseteq U_0`
those that sent public keys, :math:`U_2 \subseteq U_1` those that sent their encrypted
shares, :math:`U_3 \subseteq U_2` those whose masked vector was accepted. Each node's
neighbours :math:`N(u)` are the nodes around it on a ring over :math:`U_1` in the order of a
public random seed (SecAgg+; all nodes when ``num_shares`` ≥ |U_1|: SecAgg); every client
recomputes its own (:func:`~.protocol.ring_neighbours`). The revealed value is

.. math:: \sum_{u \in U_3} y_u \bmod 2^b,

obtained from :math:`\sum_{u\in U_3} z_u` by removing each survivor's own mask
(:math:`b_u` rebuilt from t of its shares) and, for each node
:math:`v \in U_2 \setminus U_3` that dropped after sharing its keys, the pairwise
masks the survivors hold with it (:math:`sk1_v` rebuilt from t shares, checked
against the public key it registered; a rebuilt seed is checked against the SHA-256
the node sent with its shares). A node is never asked for both kinds of share for
one peer, so a corrupt share aborts the round instead of unmasking a wrong sum.

Failure handling. A failed reply (a SuperNode that died), a reply from a node that
was not asked, a second reply, or a malformed one (wrong types, a public key that
does not parse, a masked vector of the wrong shape, dtype or range) drops its
sender from the round; the sender is counted under ``rejected``. The round
aborts (:class:`SecureAggregationAborted`: nothing is revealed, nothing is booked)
when fewer than ``min_survivors`` nodes remain at any stage, when a connected component
of the survivors' graph holds fewer than ``min_survivors`` nodes (the server could
unmask that component's sum on its own: checked before any share is asked for), or
when a secret cannot be rebuilt from the shares received.

Trust model: see :mod:`.client_protocol` for what every client enforces and
``docs/distributed-dp.md`` for what each adversary learns. This class is the honest
server: it follows the protocol, so it reveals the sum of at least ``min_survivors``
clients, never a smaller partial sum.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections import Counter
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any, Optional

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, public_key_to_bytes

from ..rounds.exchange import exchange
from ..npy_codec import npy_view
from . import shamir
from .client_protocol import check_public_key, mask_keys, private_key_from_scalar
from .identity import SIGNATURE_BYTES, advertisement, parse_public, survivors_statement, verify
from .masks import add_prg_mask, check_bits, packed_size, pairwise_sign, reduce_mod, unpack_bits
from .protocol import (
    MASKED_KEY,
    MASKED_RECORD,
    RECORD,
    STAGE_KEY,
    ProtocolError,
    Stage,
    distinct,
    graph_commitment,
    list_field,
    min_threshold,
    neighbourhood_size,
    required_signers,
    ring_neighbours,
    ring_order,
    stage_record,
    survivor_set_flaw,
    view_digest,
)

PROTOCOL_REJECTION = "secure-aggregation"
"""The reason counted for a malformed protocol reply (its sender is dropped from the round)."""


class SecureAggregationAborted(RuntimeError):
    """The round cannot reveal the sum (too few survivors or shares); nothing was revealed."""


def components(nodes: set[int], neighbours: dict[int, set[int]]) -> list[set[int]]:
    """The connected components of the graph ``neighbours`` restricted to ``nodes``."""
    left, out = set(nodes), []
    while left:
        frontier = [left.pop()]
        part = set(frontier)
        while frontier:
            for peer in neighbours[frontier.pop()] & left:
                left.discard(peer)
                part.add(peer)
                frontier.append(peer)
        out.append(part)
    return out


def _public_key(value: bytes) -> bytes:
    return check_public_key(value, "a public key")


class SecureAggregationRound:
    """One round of SecAgg+ with a Grid; call :meth:`setup`, :meth:`share_keys`, build the collect
    messages with :meth:`collect_messages`, hand each reply to :meth:`add_masked`, then :meth:`unmask`.

    Args:
        server_round: Flower's round number (the messages' group id).
        node_ids: U_0, the sampled nodes.
        num_shares: neighbourhood parameter k (≥ 2; ≥ |U_1| gives the complete graph).
        threshold: t, shares needed to rebuild a secret; at least :func:`~.protocol.min_threshold` of
            the neighbourhood size and ``colluders`` (clients refuse less), at most the neighbourhood size.
        min_survivors: the round aborts below this many nodes (≥ t), and when a component of the
            survivors' graph is smaller.
        colluders: c, the clients that may pool their shares with the server (declared to the clients).
        bits: b, the modulus 2^b of the sum.
        length: D, the length of every masked vector.
        timeout: seconds each stage waits for replies (``Grid.send_and_receive``).
    """

    # pylint: disable=too-many-arguments,too-many-instance-attributes
    def __init__(
        self,
        server_round: int,
        node_ids: Iterable[int],
        *,
        num_shares: int,
        threshold: int,
        min_survivors: int,
        bits: int,
        length: int,
        timeout: Optional[float],
        colluders: int = 0,
        honest: int = 1,
        rng: Optional[random.Random] = None,
    ) -> None:
        self.server_round = int(server_round)
        self.sampled = sorted(set(int(n) for n in node_ids))
        self.bits = check_bits(bits)
        self.length = int(length)
        self.threshold = int(threshold)
        self.min_survivors = max(int(min_survivors), self.threshold)
        self.num_shares = int(num_shares)
        self.colluders = int(colluders)
        if self.num_shares < 2:
            raise ValueError(f"num_shares must be an integer >= 2, got {num_shares!r}")
        size = neighbourhood_size(len(self.sampled), self.num_shares)
        if not min_threshold(size, self.colluders) <= self.threshold <= size:
            raise ValueError(
                f"threshold must be an integer in [{min_threshold(size, self.colluders)}, {size}] for "
                f"neighbourhoods of {size} nodes and {self.colluders} colluders, got {threshold!r}"
            )
        self.honest = int(honest)
        if self.honest < 1:
            raise ValueError(f"honest must be an integer >= 1, got {honest!r}")
        self.timeout = timeout
        self.graph_seed = rng.getrandbits(62) if rng is not None else secrets.randbits(62)
        self.run_id = 0  # read from the setup replies
        self.identities: dict[int, tuple[bytes, bytes]] = {}  # node -> (identity key, signed advertisement)
        self.consistent: list[int] = []  # S, the survivor set every member signed
        self.survivor_signatures: dict[int, bytes] = {}
        self.neighbours: dict[int, set[int]] = {}
        self.public_keys: dict[int, tuple[bytes, bytes]] = {}
        self.alive_keys: set[int] = set()  # U_1
        self.forwarded: dict[int, list[tuple[int, bytes]]] = {}
        self.seed_hashes: dict[int, bytes] = {}
        self.shared: set[int] = set()  # U_2
        self.survivors: set[int] = set()  # U_3
        self.masked_sum = np.zeros(self.length, dtype=np.uint64)
        self.rejected: Counter[str] = Counter()
        self.collect_sent: set[int] = set()

    # ------------------------------------------------------------------ helpers
    def _message(self, node: int, record: dict[str, Any], content: Optional[RecordDict] = None) -> Message:
        content = RecordDict() if content is None else content
        content[RECORD] = ConfigRecord({STAGE_KEY: record.pop(STAGE_KEY), "round": self.server_round, **record})
        return Message(
            content=content, dst_node_id=node, message_type=MessageType.TRAIN, group_id=str(self.server_round)
        )

    def _exchange(
        self,
        grid: Any,
        messages: list[Message],
        stage: str,
        read: Callable[..., None],
        *,
        with_run: bool = False,
    ) -> set[int]:
        """Send, then ``read`` each reply's protocol record (and its run id, ``with_run``); the nodes whose
        reply was read."""
        asked = {int(m.metadata.dst_node_id) for m in messages}
        replies = exchange(grid, messages, self.timeout)  # a node that leaves is not waited for (Flower 1.43)

        def read_reply(node: int, reply: Message) -> None:
            if set(reply.content.keys()) != {RECORD}:
                raise ProtocolError(f"a {stage} reply must hold the protocol record only")
            record = stage_record(reply.content)
            if record.get(STAGE_KEY) != stage:
                raise ProtocolError(f"a reply to the {stage} stage names stage {record.get(STAGE_KEY)!r}")
            if with_run:
                read(node, record, int(reply.metadata.run_id))
            else:
                read(node, record)

        return self._screen(replies, asked, read_reply, stage)

    def _screen(
        self, replies: Iterable[Message], asked: set[int], read: Callable[[int, Message], None], stage: str
    ) -> set[int]:
        good: set[int] = set()
        seen: set[int] = set()
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            if reply.has_error():
                self.rejected["error"] += 1
                continue
            if node not in asked or node in seen:
                self.rejected["identity"] += 1
                continue
            seen.add(node)
            try:
                read(node, reply)
            except (ProtocolError, ValueError, TypeError, KeyError) as err:
                self.rejected[PROTOCOL_REJECTION] += 1
                log(
                    WARNING,
                    "Round %d, secure aggregation %s: reply from node %s rejected (%s)",
                    self.server_round,
                    stage,
                    node,
                    err,
                )
                continue
            good.add(node)
        return good

    def _require(self, nodes: set[int], stage: str) -> None:
        if len(nodes) < self.min_survivors:
            raise SecureAggregationAborted(
                f"round {self.server_round}: {len(nodes)} nodes left after the "
                f"{stage} stage, fewer than {self.min_survivors}"
            )

    # ------------------------------------------------------------------ stages
    def setup(self, grid: Any) -> set[int]:
        """Stage 0: collect two public keys from every sampled node; U_1."""
        self._require(set(self.sampled), Stage.SETUP)
        messages = [
            self._message(
                n,
                {
                    STAGE_KEY: Stage.SETUP,
                    "threshold": self.threshold,
                    "bits": self.bits,
                    "colluders": self.colluders,
                    "graph-commit": graph_commitment(self.graph_seed),
                },
            )
            for n in self.sampled
        ]
        run_ids: dict[int, int] = {}

        def read(node: int, record: ConfigRecord, run_id: int) -> None:
            pk1, pk2 = record["pk1"], record["pk2"]
            identity, signature = record["identity"], record["ad-sig"]
            if not isinstance(pk1, bytes) or not isinstance(pk2, bytes) or pk1 == pk2:
                raise ProtocolError("pk1 and pk2 must be two different public keys")
            keys = (_public_key(pk1), _public_key(pk2))
            parse_public(identity, "the identity key")  # ValueError if malformed
            ad = advertisement(run_id=run_id, server_round=self.server_round, node_id=node, pk1=pk1, pk2=pk2)
            if not verify(identity, signature, ad):
                raise ProtocolError("the key advertisement's signature does not verify")
            self.public_keys[node] = keys
            self.identities[node] = (bytes(identity), bytes(signature))
            run_ids[node] = run_id

        alive = self._exchange(grid, messages, Stage.SETUP, read, with_run=True)
        if len(set(run_ids.values())) > 1:
            raise SecureAggregationAborted(f"round {self.server_round}: setup replies name several runs")
        self.run_id = next(iter(run_ids.values()), 0)
        every_key = [k for node in alive for k in (*self.public_keys[node], self.identities[node][0])]
        if len(set(every_key)) != len(every_key):  # a node replaying another's key: drop all that share one
            counts = Counter(every_key)
            clash = {
                node
                for node in alive
                if any(counts[k] > 1 for k in (*self.public_keys[node], self.identities[node][0]))
            }
            self.rejected[PROTOCOL_REJECTION] += len(clash)
            alive -= clash
        self._require(alive, Stage.SETUP)
        self.alive_keys = alive
        return alive

    def share_keys(self, grid: Any) -> set[int]:
        """Stage 1: the ring over U_1 (public seed); send each node the view, the seed and its neighbours'
        keys, collect the encrypted shares; U_2."""
        alive = self.alive_keys
        view = sorted(alive)
        self.neighbours = ring_neighbours(view, self.num_shares, self.graph_seed)
        view_ids = [self.identities[node][0] for node in view]
        expected: dict[int, set[int]] = {}
        messages = []
        for node in view:
            peers = sorted(self.neighbours[node])
            expected[node] = set(peers) - {node}
            messages.append(
                self._message(
                    node,
                    {
                        STAGE_KEY: Stage.SHARE_KEYS,
                        "nids": peers,
                        "view": view,
                        "graph-seed": self.graph_seed,
                        "num-shares": self.num_shares,
                        "honest": self.honest,
                        "pk1s": [self.public_keys[p][0] for p in peers],
                        "pk2s": [self.public_keys[p][1] for p in peers],
                        "view-ids": view_ids,
                        "ad-sigs": [self.identities[p][1] for p in peers],
                    },
                )
            )
        outgoing: dict[int, list[tuple[int, bytes]]] = {}

        def read(node: int, record: ConfigRecord) -> None:
            dsts = list_field(record, "dsts", int)
            ctxts = list_field(record, "ctxts", bytes, length=len(dsts))
            seed_hash = record.get("seed-hash")
            distinct("dsts", dsts)
            if set(dsts) != expected[node]:
                raise ProtocolError("the shares are not addressed to exactly the node's neighbours")
            if not isinstance(seed_hash, bytes) or len(seed_hash) != 32:
                raise ProtocolError("field 'seed-hash' must be 32 bytes")
            outgoing[node] = list(zip(dsts, ctxts))
            self.seed_hashes[node] = seed_hash

        self.shared = self._exchange(grid, messages, Stage.SHARE_KEYS, read)
        self._require(self.shared, Stage.SHARE_KEYS)
        self.forwarded = {node: [] for node in self.shared}
        for src in sorted(self.shared):
            for dst, ciphertext in outgoing[src]:
                if dst in self.shared:
                    self.forwarded[dst].append((src, ciphertext))
        return self.shared

    def collect_messages(
        self, content_for: Callable[[int], RecordDict], public: Optional[dict[str, Any]] = None
    ) -> list[Message]:
        """Stage 2's messages: ``content_for(node)`` (e.g. the train content) plus the ciphertexts
        forwarded to the node and the ``public`` fields (same for every node)."""
        messages = []
        for node in sorted(self.shared):
            srcs = [src for src, _ in self.forwarded[node]]
            ctxts = [c for _, c in self.forwarded[node]]
            messages.append(
                self._message(
                    node, {STAGE_KEY: Stage.COLLECT, "srcs": srcs, "ctxts": ctxts, **(public or {})}, content_for(node)
                )
            )
        self.collect_sent = set(self.shared)
        return messages

    def masked_vector(self, content: RecordDict) -> np.ndarray:
        """The masked vector of a collect reply: exactly one ArrayRecord :data:`MASKED_RECORD` holding
        ⌈D·b/8⌉ packed bytes under :data:`MASKED_KEY`, unpacked (ProtocolError otherwise)."""
        return unpack_bits(self.packed_vector(content), self.bits, self.length)

    def packed_vector(self, content: RecordDict) -> np.ndarray:
        """The packed bytes of a collect reply, checked as :meth:`masked_vector` checks them (any ⌈D·b/8⌉
        bytes unpack to D values in [0, 2^b), so a reply that passes here unpacks): the screening's check,
        without unpacking every vector twice."""
        if stage_record(content).get(STAGE_KEY) != Stage.COLLECT:
            raise ProtocolError("the reply is not a collect-stage reply")
        if set(content.keys()) != {RECORD, MASKED_RECORD}:
            raise ProtocolError(f"a collect reply must hold the records {RECORD!r} and {MASKED_RECORD!r} only")
        if MASKED_RECORD not in content or not isinstance(content[MASKED_RECORD], ArrayRecord):
            raise ProtocolError(f"the reply holds no ArrayRecord {MASKED_RECORD!r}")
        record = content[MASKED_RECORD]
        expected = packed_size(self.length, self.bits)
        if list(record.keys()) != [MASKED_KEY] or not isinstance(record[MASKED_KEY], Array):
            raise ProtocolError(f"ArrayRecord {MASKED_RECORD!r} must hold exactly {MASKED_KEY!r}")
        array = record[MASKED_KEY]
        if array.dtype != "uint8" or tuple(array.shape) != (expected,) or len(array.data) > expected + 256:
            raise ProtocolError(
                f"the masked vector must be {expected} packed uint8 values, got {array.dtype} {tuple(array.shape)}"
            )
        try:
            packed = npy_view(array)
        except Exception as err:  # noqa: BLE001 - an undecodable payload is malformed
            raise ProtocolError(f"the masked vector does not decode ({err})") from err
        if packed.dtype != np.uint8 or packed.shape != (expected,):
            raise ProtocolError(f"the masked vector does not decode (a {packed.dtype} {packed.shape} payload)")
        return packed

    def add_vector(self, node: int, vector: np.ndarray) -> None:
        """Add one accepted masked vector (from :meth:`masked_vector`) of a node sent the collect stage."""
        if node not in self.collect_sent or node in self.survivors:
            raise ValueError(f"node {node} was not sent the collect stage, or already added")
        self.masked_sum += vector
        self.survivors.add(node)

    def add_masked(self, replies: Iterable[Message]) -> set[int]:
        """Screen the collect replies (errors, identity, :meth:`masked_vector`) and add the accepted; U_3."""
        self._screen(
            replies,
            self.collect_sent,
            lambda node, reply: self.add_vector(node, self.masked_vector(reply.content)),
            Stage.COLLECT,
        )
        return self.survivors

    def digest(self) -> bytes:
        """The round's view digest, as every client computed it (:func:`~.protocol.view_digest`)."""
        return view_digest(
            run_id=self.run_id,
            honest=self.honest,
            server_round=self.server_round,
            threshold=self.threshold,
            bits=self.bits,
            colluders=self.colluders,
            num_shares=self.num_shares,
            graph_seed=self.graph_seed,
            view=sorted(self.alive_keys),
            identities=[self.identities[node][0] for node in sorted(self.alive_keys)],
        )

    def partners_ok(self, node: int, survivors: set[int]) -> bool:
        """Whether ``node`` will sign ``survivors`` (the clients' rule :func:`~.protocol.survivor_set_flaw`, with
        the declared colluders)."""
        flaw = survivor_set_flaw(
            node,
            survivors,
            neighbourhood=self.neighbours[node],
            masked_with=[src for src, _ in self.forwarded[node]],
            view_size=len(self.alive_keys),
            num_shares=self.num_shares,
            colluders=self.colluders,
            honest=self.honest,
        )
        return flaw is None

    def consistency(self, grid: Any) -> list[int]:
        """Stage 3: every survivor signs the survivor set S = U_3; the round aborts unless every member's
        signature arrives and verifies (a holder reveals a survivor's seed only with its signature on S)."""
        self._require(self.survivors, Stage.COLLECT)
        small = [part for part in components(self.survivors, self.neighbours) if len(part) < self.min_survivors]
        if small:
            raise SecureAggregationAborted(
                f"round {self.server_round}: the survivors' graph splits into parts of "
                f"{sorted(len(p) for p in components(self.survivors, self.neighbours))} nodes; a part of fewer "
                f"than {self.min_survivors} would be unmasked on its own (no share asked for)"
            )
        survivors_set = frozenset(self.survivors)
        short = sorted(node for node in self.survivors if not self.partners_ok(node, survivors_set))
        if short:
            raise SecureAggregationAborted(
                f"round {self.server_round}: survivors {short[:10]} would refuse to sign the survivor set "
                f"(too many absent neighbours, or fewer than n_h = {self.honest} honest survivors)"
            )
        survivors = sorted(self.survivors)
        statement = survivors_statement(self.digest(), survivors)
        messages = [self._message(n, {STAGE_KEY: Stage.CONSISTENCY, "survivors": survivors}) for n in survivors]
        signatures: dict[int, bytes] = {}

        def read(node: int, record: ConfigRecord) -> None:
            signature = record.get("signature")
            if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
                raise ProtocolError("field 'signature' must be 64 bytes")
            if not verify(self.identities[node][0], signature, statement):
                raise ProtocolError("the survivor set's signature does not verify")
            signatures[node] = signature

        signed = self._exchange(grid, messages, Stage.CONSISTENCY, read)
        missing = sorted(self.survivors - signed)
        if missing:
            raise SecureAggregationAborted(
                f"round {self.server_round}: survivors {missing[:10]} did not sign the survivor set; without "
                "every member's signature no holder reveals a seed"
            )
        self.consistent, self.survivor_signatures = survivors, signatures
        return survivors

    def unmask(self, grid: Any) -> np.ndarray:
        """Stages 3 and 4: the survivor set signed (:meth:`consistency`), then the shares collected and every
        mask removed; Σ_{u∈U_3} y_u mod 2^b."""
        self.consistency(grid)
        dropped = self.shared - self.survivors
        holds = {node: {src for src, _ in self.forwarded[node]} for node in self.shared}
        messages, asked_for = [], {}
        order = ring_order(self.alive_keys, self.graph_seed)
        position = {node: i for i, node in enumerate(order)}
        signed = frozenset(self.consistent)
        for node in sorted(self.survivors):
            active = sorted((holds[node] | {node}) & self.survivors)
            dead = sorted(holds[node] & dropped)
            asked_for[node] = (set(active), set(dead))
            signers = required_signers(
                node,
                signed,
                view=self.alive_keys,
                num_shares=self.num_shares,
                graph_seed=self.graph_seed,
                order=order,
                position=position,
            )
            messages.append(
                self._message(
                    node,
                    {
                        STAGE_KEY: Stage.UNMASK,
                        "signers": signers,
                        "signatures": [self.survivor_signatures[p] for p in signers],
                    },
                )
            )
        # x of holder u in owner v's shares: u's position in v's sorted neighbourhood, plus one
        position = {v: {u: i + 1 for i, u in enumerate(sorted(self.neighbours[v]))} for v in self.shared}
        seed_shares: dict[int, list[tuple[int, bytes]]] = {}
        sk1_shares: dict[int, list[tuple[int, bytes]]] = {}

        def read(node: int, record: ConfigRecord) -> None:
            nids = list_field(record, "nids", int)
            shares = list_field(record, "shares", bytes, length=len(nids))
            distinct("nids", nids)
            active, dead = asked_for[node]
            if set(nids) != active | dead:
                raise ProtocolError("the shares are not for exactly the nodes asked for")
            for owner, share in zip(nids, shares):
                if shamir.SCHEME.x_of(share) != position[owner][node]:  # ValueError if malformed
                    raise ProtocolError(f"the share of node {owner}'s secret is not at this node's point")
            for owner, share in zip(nids, shares):
                (seed_shares if owner in active else sk1_shares).setdefault(owner, []).append(
                    (position[owner][node], share)
                )

        self._exchange(grid, messages, Stage.UNMASK, read)
        total = self.masked_sum.copy()
        seeds = self._rebuild_all(seed_shares, sorted(self.survivors), 32, "its mask seed")
        for node in sorted(self.survivors):
            if hashlib.sha256(seeds[node]).digest() != self.seed_hashes[node]:
                raise SecureAggregationAborted(
                    f"round {self.server_round}: node {node}'s mask seed rebuilt "
                    "from its shares does not match its commitment (corrupt shares)"
                )
            add_prg_mask(total, seeds[node], -1)
        holders_of = {node: sorted(u for u in self.survivors if node in holds[u]) for node in sorted(dropped)}
        needed = [node for node in sorted(dropped) if holders_of[node]]
        scalars = self._rebuild_all(sk1_shares, needed, 48, "its key")
        for node in needed:
            sk1 = self._check_private_key(scalars[node], node)
            holders = holders_of[node]
            for survivor, key in zip(holders, mask_keys(sk1, [self.public_keys[u][0] for u in holders])):
                add_prg_mask(total, key, -pairwise_sign(survivor, node))
        log(
            INFO,
            "Round %d, secure aggregation: sum of %d masked vectors revealed (%d sampled, %d dropped "
            "after sharing keys)",
            self.server_round,
            len(self.survivors),
            len(self.sampled),
            len(dropped),
        )
        return reduce_mod(total, self.bits)

    def _rebuild_all(
        self, shares: dict[int, list[tuple[int, bytes]]], owners: list[int], length: int, what: str
    ) -> dict[int, bytes]:
        """The secret of every owner, from the t shares of its holders with the smallest x: the owners whose
        holders sit at the same points share one set of Lagrange coefficients, and are rebuilt together
        (any t shares determine a secret; more only cost time)."""
        groups: dict[tuple[int, ...], list[tuple[int, list[bytes]]]] = {}
        for node in owners:
            points = sorted(shares.get(node, []))
            if len(points) < self.threshold:
                raise SecureAggregationAborted(
                    f"round {self.server_round}: {len(points)} shares of node {node}'s "
                    f"{what}, fewer than the threshold {self.threshold}"
                )
            points = points[: self.threshold]
            xs = tuple(x for x, _ in points)
            groups.setdefault(xs, []).append((node, [share for _, share in points]))
        out: dict[int, bytes] = {}
        for xs, members in groups.items():
            try:
                secrets_ = shamir.SCHEME.reconstruct(xs, [row for _, row in members], length)
            except Exception as err:  # noqa: BLE001 - malformed shares
                raise SecureAggregationAborted(
                    f"round {self.server_round}: the {what} of nodes {[n for n, _ in members]} cannot be "
                    f"rebuilt from their shares ({err})"
                ) from err
            out.update((node, secret) for (node, _), secret in zip(members, secrets_))
        return out

    def _check_private_key(self, scalar: bytes, node: int) -> bytes:
        """The PEM key of a rebuilt secret scalar, checked against the node's registered pk1."""
        try:
            sk1 = private_key_from_scalar(scalar)
            public = public_key_to_bytes(bytes_to_private_key(sk1).public_key())
        except Exception as err:  # noqa: BLE001
            raise SecureAggregationAborted(
                f"round {self.server_round}: node {node}'s key rebuilt from its shares does not parse (corrupt shares)"
            ) from err
        if public != self.public_keys[node][0]:
            raise SecureAggregationAborted(
                f"round {self.server_round}: node {node}'s key rebuilt from its "
                "shares does not match its public key (corrupt shares)"
            )
        return sk1


__all__ = ["PROTOCOL_REJECTION", "SecureAggregationAborted", "SecureAggregationRound", "components", "ring_neighbours"]
