"""An active (and Sybil) server, for the adversary tests: the real server protocol, with every field it sends
under the attacker's control, against nodes that run the real client mod.

:class:`ActiveServer` drives one SecAgg+ round stage by stage as
:class:`~flwr_dp_strategies.secure_aggregation.SecureAggregationRound` does, but lets the attacker choose
which ciphertexts each node receives at collect, which survivor set each node is asked to sign, which
signatures go with each unmask request, and which extra nodes it plays itself (Sybils: nodes in the grid
whose context the attacker reads). :meth:`ActiveServer.read` then tries to recover one node's encoded vector
from what the attack gathered; :func:`record_encodings` keeps what each mod encoded, to compare bit for bit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

import importlib
from flwr_dp_strategies.privacy.mechanisms.distributed_dp import DistributedDpParams
from flwr_dp_strategies.secure_aggregation import shamir
from flwr_dp_strategies.secure_aggregation.client_protocol import agreed_key, private_key_from_scalar
from flwr_dp_strategies.secure_aggregation.masks import apply_mask, pairwise_sign, prg_mask, reduce_mod
from flwr_dp_strategies.secure_aggregation.protocol import (
    RECORD,
    STAGE_KEY,
    STATE_RECORD,
    Stage,
    min_threshold,
    neighbourhood_size,
)
from flwr_dp_strategies.secure_aggregation.server_protocol import SecureAggregationRound

mod_module = importlib.import_module("client_mods.distributed_dp_mod")  # the package re-exports a function of that name

D, BITS, SCALE = 64, 24, 200.0
PARAMS = DistributedDpParams(dim=D, clip_norm=1.0, scale=SCALE, bits=BITS, rotation_seed=5)


def public(share: float) -> dict:
    """The collect stage's public DP fields, with noise share ``share`` (a variance per coordinate)."""
    return {
        "dp-dim": D,
        "dp-clip-norm": 1.0,
        "dp-scale": SCALE,
        "dp-rotation-seed": 5,
        "dp-beta": PARAMS.beta,
        "dp-noise-share": float(share),
    }


def record_encodings(monkeypatch) -> dict[int, tuple[np.ndarray, float]]:
    """{node: (the vector its mod encoded, before the masks; the noise share it added)}, filled as nodes encode."""
    seen: dict[int, tuple[np.ndarray, float]] = {}
    original = mod_module._encode

    def spy(msg, ctxt, call_next, state, floor, generator):
        vector = original(msg, ctxt, call_next, state, floor, generator)
        share = float(msg.content[RECORD]["dp-noise-share"])
        seen[int(ctxt.node_id)] = (np.array(vector, dtype=np.uint64, copy=True), share)
        return vector

    monkeypatch.setattr(mod_module, "_encode", spy)
    return seen


@dataclass
class Gathered:
    """What the attack holds: seed and key shares by owner (x, share), pooled from answers and colluders."""

    seeds: dict[int, dict[int, bytes]] = field(default_factory=dict)
    keys: dict[int, dict[int, bytes]] = field(default_factory=dict)

    def add(self, kind: str, owner: int, share: bytes) -> None:
        table = self.seeds if kind == "seed" else self.keys
        table.setdefault(int(owner), {})[shamir.SCHEME.x_of(share)] = share

    def secret(self, kind: str, owner: int, threshold: int, length: int) -> Optional[bytes]:
        table = self.seeds if kind == "seed" else self.keys
        shares = list(table.get(int(owner), {}).values())
        if len(shares) < threshold:
            return None
        return shamir.reconstruct(shares[:threshold], length)


class ActiveServer:
    """One round played by an attacker; ``sybils`` are nodes of the grid the attacker controls (it reads their
    state, so every share they receive is its own)."""

    def __init__(
        self,
        grid,
        nodes: Iterable[int],
        *,
        num_shares: int,
        threshold: Optional[int] = None,
        honest: int = 1,
        colluders: int = 0,
        sybils: Iterable[int] = (),
    ) -> None:
        self.grid = grid
        self.nodes = sorted(int(n) for n in nodes)
        self.sybils = set(int(n) for n in sybils)
        size = neighbourhood_size(len(self.nodes), num_shares)
        self.secure = SecureAggregationRound(
            1,
            self.nodes,
            num_shares=num_shares,
            threshold=min_threshold(size, colluders),
            min_survivors=2,
            bits=BITS,
            length=PARAMS.padded_dim,
            timeout=None,
            colluders=colluders,
            honest=honest,
            rng=random.Random(7),
        )
        if threshold is not None:  # a server that ignores the library's own check
            self.secure.threshold = threshold
        self.secure.min_survivors = 2
        self.masked: dict[int, np.ndarray] = {}
        self.gathered = Gathered()
        self.signatures: dict[tuple[int, ...], dict[int, bytes]] = {}
        self.signed_set: dict[int, tuple[int, ...]] = {}
        self.own_keys: dict[int, bytes] = {}  # the sk1 of nodes the attacker plays (Sybils, colluders)

    @property
    def threshold(self) -> int:
        return self.secure.threshold

    def keys(self) -> set[int]:
        """Setup and share-keys, as the honest server runs them; U_2."""
        self.secure.setup(self.grid)
        return self.secure.share_keys(self.grid)

    def collect(self, share: float, forward: Optional[Callable[[int, list[int]], list[int]]] = None) -> set[int]:
        """Collect with noise share ``share``; ``forward(node, srcs)`` picks the ciphertexts a node receives."""
        if forward is not None:
            for node, items in self.secure.forwarded.items():
                keep = set(forward(node, [src for src, _ in items]))
                self.secure.forwarded[node] = [(src, c) for src, c in items if src in keep]
        model = ArrayRecord({"w": Array(np.zeros(D, np.float32))})
        messages = self.secure.collect_messages(
            lambda node: RecordDict({"arrays": model, "config": ConfigRecord()}), public(share)
        )
        replies = self.grid.send_and_receive(messages)
        for reply in replies:
            if not reply.has_error():
                self.masked[int(reply.metadata.src_node_id)] = self.secure.masked_vector(reply.content)
        self.secure.add_masked(replies)
        for node in self.sybils | set(self._colluders):
            self.pool(node)
        return set(self.masked)

    _colluders: tuple[int, ...] = ()

    def collude(self, nodes: Iterable[int]) -> None:
        """Clients that hand the server every share they hold (read from their state before the unmask)."""
        self._colluders = tuple(int(n) for n in nodes)

    def pool(self, node: int) -> None:
        """Every share ``node`` holds (a Sybil's or a colluder's), read from its state."""
        state = self.grid.contexts[node].state.get(STATE_RECORD)
        if state is None or "sk1" not in state:
            return
        self.own_keys[int(node)] = bytes(state["sk1"])
        for kind in ("seed", "sk1"):
            for owner, share in zip(state.get(f"{kind}-owners", []), state.get(f"{kind}-shares", [])):
                self.gathered.add("seed" if kind == "seed" else "key", owner, share)

    def sign(self, sets: dict[int, Iterable[int]]) -> dict[int, bool]:
        """Ask each node to sign the survivor set ``sets[node]``; whether it signed. Signatures are kept by set."""
        messages, asked = [], {}
        for node, members in sets.items():
            key = tuple(sorted(int(n) for n in members))
            asked[node] = key
            messages.append(self.secure._message(node, {STAGE_KEY: Stage.CONSISTENCY, "survivors": list(key)}))
        signed = {}
        for reply in self.grid.send_and_receive(messages):
            node = int(reply.metadata.src_node_id)
            ok = not reply.has_error()
            signed[node] = ok
            if ok:
                self.signatures.setdefault(asked[node], {})[node] = reply.content[RECORD]["signature"]
                self.signed_set[node] = asked[node]
        return signed

    def unmask(self, nodes: Iterable[int], *, forge: Optional[dict[int, bytes]] = None) -> dict[int, bool]:
        """Ask each node for its shares, handing it every signature the attack holds on the set it signed (and
        ``forge``: any bytes for nodes whose signature it lacks); whether it answered."""
        messages = []
        for node in nodes:
            key = self.signed_set.get(node, tuple(self.nodes))
            sigs = dict(forge or {})
            sigs.update(self.signatures.get(key, {}))
            signers = sorted(n for n in sigs if n != node)
            messages.append(
                self.secure._message(
                    node, {STAGE_KEY: Stage.UNMASK, "signers": signers, "signatures": [sigs[n] for n in signers]}
                )
            )
        answered = {}
        for reply in self.grid.send_and_receive(messages):
            node = int(reply.metadata.src_node_id)
            answered[node] = not reply.has_error()
            if reply.has_error():
                continue
            record = reply.content[RECORD]
            members = set(self.signed_set[node])
            for owner, share in zip(record["nids"], record["shares"]):
                self.gathered.add("seed" if owner in members else "key", owner, share)
        return answered

    def read(self, target: int) -> Optional[np.ndarray]:
        """The target's encoded vector, if the gathered shares strip every mask of its upload: its seed, and either
        its own key or the key of every peer it masked with; None otherwise."""
        t = self.threshold
        seed = self.gathered.secret("seed", target, t, 32)
        if seed is None or target not in self.masked:
            return None
        partners = [src for src, _ in self.secure.forwarded[target]]
        own = self.gathered.secret("key", target, t, 48)
        vector = self.masked[target].copy()
        apply_mask(vector, prg_mask(seed, PARAMS.padded_dim, BITS), -1)
        for peer in partners:
            if own is not None:
                key = agreed_key(private_key_from_scalar(own), self.secure.public_keys[peer][0])
            elif peer in self.own_keys:
                key = agreed_key(self.own_keys[peer], self.secure.public_keys[target][0])
            else:
                scalar = self.gathered.secret("key", peer, t, 48)
                if scalar is None:
                    return None
                key = agreed_key(private_key_from_scalar(scalar), self.secure.public_keys[target][0])
            apply_mask(vector, prg_mask(key, PARAMS.padded_dim, BITS), -pairwise_sign(target, peer))
        return reduce_mod(vector, BITS)
