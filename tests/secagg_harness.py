"""In-process Grid for secure-aggregation tests: each node runs a real ClientApp with its own Context.

Nodes can die at a chosen stage (their reply becomes an error reply, as a SuperLink returns for a
node that is gone) and replies can be tampered with before the server sees them.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import loopback
from client_mods.distributed_dp_mod import make_distributed_dp_mod
from flwr_dp_strategies.secure_aggregation.identity import (
    InProcessRoster,
    NodeIdentity,
    Roster,
    generate_signing_key,
    public_bytes,
)
from flwr_dp_strategies.secure_aggregation.protocol import RECORD, STAGE_KEY


def stage_of_message(msg: Message) -> Optional[str]:
    if RECORD in msg.content:
        return msg.content[RECORD].get(STAGE_KEY)
    return None


class LoopbackGrid(loopback.LoopbackGrid):
    """Every node runs ``app`` (``apps[node]`` where set); ``die[node] = stage`` kills a node from that stage on.

    A dead node's reply, and that of a node whose app raised, is an error reply (code 0) from that node.
    """

    def __init__(
        self,
        app: ClientApp,
        node_ids: list[int],
        *,
        die: Optional[dict[int, str]] = None,
        tamper: Optional[Callable[[Message, Message], Message]] = None,
    ) -> None:
        super().__init__(app, node_ids, tamper=tamper)
        self.app = app
        self.die = dict(die or {})
        self.dead: set[int] = set()
        self.apps: dict[int, ClientApp] = {}  # per-node apps that differ from ``app``

    def deliver(self, node: int, msg: Message) -> Message:
        if node in self.die and self.die[node] == stage_of_message(msg):  # a plain message has stage None
            self.dead.add(node)
        if node in self.dead:
            return self.stamp(node, Message(Error(code=0, reason="node gone"), reply_to=msg))
        return super().deliver(node, msg)

    def call_client(self, node: int, msg: Message) -> Message:
        return self.apps.get(node, self.app)(msg, self.contexts[node])

    def raised_reply(self, node: int, msg: Message, err: Exception) -> Message:
        return self.stamp(node, Message(Error(code=0, reason=str(err)), reply_to=msg))


def roster_identities(nodes, *, federation: str = "test", extra: int = 0) -> dict[int, NodeIdentity]:
    """An operator-signed roster of ``nodes`` (plus ``extra`` admitted members that never join) and each node's
    identity in it: what each node's operator would give it through its node config."""
    operator = generate_signing_key()
    keys = {int(n): generate_signing_key() for n in nodes}
    others = [generate_signing_key() for _ in range(extra)]
    members = [(f"node-{n}", public_bytes(k)) for n, k in keys.items()]
    members += [(f"spare-{i}", public_bytes(k)) for i, k in enumerate(others)]
    roster = Roster.sign(federation, members, operator)
    return {n: NodeIdentity(k, roster) for n, k in keys.items()}


LazyRoster = InProcessRoster
"""An operator-signed roster handed to node ids as they first ask (canaries included)."""


TEST_FLOOR = 1e-3
"""The noise floor the harness's clients require unless a test sets one (the tests below it are not about it)."""


def shifting_app(
    deltas: dict[int, np.ndarray],
    *,
    rng=None,
    metrics: bool = True,
    min_noise_multiplier: float = TEST_FLOOR,
    max_colluding_clients: int = 0,
    identities: Optional[dict[int, NodeIdentity]] | LazyRoster | bool = True,
) -> ClientApp:
    """A ClientApp whose train adds ``deltas[node]`` (flattened over the arrays) to the received model,
    behind ``distributed_dp_mod``; it also returns a MetricRecord, which the mod must drop. ``identities``:
    True (default) a fresh roster of the nodes of ``deltas`` (with spare keys), a :class:`LazyRoster`, a dict
    node -> identity, or False (no roster)."""
    app = ClientApp()
    if identities is True:
        identities = LazyRoster(len(deltas) + 64)
    if isinstance(identities, LazyRoster):
        source = identities
    else:
        table = identities or {}
        source = lambda ctxt: table.get(int(ctxt.node_id))  # noqa: E731
    app.roster = source  # type: ignore[attr-defined] - for tests that add nodes (canaries) to the same roster
    mod = make_distributed_dp_mod(
        rng=rng,
        min_noise_multiplier=min_noise_multiplier,
        max_colluding_clients=max_colluding_clients,
        identity=source,
    )

    @app.train(mods=[mod])
    def train(msg: Message, context: Context) -> Message:
        record = next(r for r in msg.content.values() if isinstance(r, ArrayRecord))
        delta = deltas[int(context.node_id)]
        out, offset = {}, 0
        for key, array in record.items():
            w = array.numpy()
            out[key] = Array((w.astype(np.float64) + delta[offset : offset + w.size].reshape(w.shape)).astype(w.dtype))
            offset += w.size
        content = RecordDict({"arrays": ArrayRecord(out)})
        if metrics:
            content["metrics"] = MetricRecord({"num-examples": 10, "train_loss": 0.5})
        return Message(content, reply_to=msg)

    return app
