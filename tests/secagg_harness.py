"""In-process Grid for secure-aggregation tests: each node runs a real ClientApp with its own Context.

Nodes can die at a chosen stage (their reply becomes an error reply, as a SuperLink returns for a
node that is gone) and replies can be tampered with before the server sees them.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_mods.distributed_dp_mod import make_distributed_dp_mod
from flwr_dp_strategies.secure_aggregation.protocol import RECORD, STAGE_KEY


def node_context(node: int) -> Context:
    return Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})


def stage_of_message(msg: Message) -> Optional[str]:
    if RECORD in msg.content:
        return msg.content[RECORD].get(STAGE_KEY)
    return None


class LoopbackGrid:
    """Delivers every message to ``app`` in process; ``die[node] = stage`` kills a node from that stage on."""

    def __init__(self, app: ClientApp, node_ids: list[int], *, die: Optional[dict[int, str]] = None,
                 tamper: Optional[Callable[[Message, Message], Message]] = None) -> None:
        self.app = app
        self.contexts = {n: node_context(n) for n in node_ids}
        self.die = dict(die or {})
        self.dead: set[int] = set()
        self.tamper = tamper
        self.apps: dict[int, ClientApp] = {}  # per-node apps that differ from ``app``
        self.sent: list[Message] = []
        self.errors: list[str] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            self.sent.append(msg)
            node = int(msg.metadata.dst_node_id)
            if node in self.die and self.die[node] == stage_of_message(msg):  # a plain message has stage None
                self.dead.add(node)
            if node in self.dead:
                reply = Message(Error(code=0, reason="node gone"), reply_to=msg)
            else:
                try:
                    reply = self.apps.get(node, self.app)(msg, self.contexts[node])
                except Exception as err:  # noqa: BLE001 - the runtime turns it into an error reply
                    self.errors.append(f"{node}: {err}")
                    reply = Message(Error(code=0, reason=str(err)), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = node
            if self.tamper is not None:
                reply = self.tamper(msg, reply)
            replies.append(reply)
        return replies


def shifting_app(deltas: dict[int, np.ndarray], *, rng=None, metrics: bool = True,
                 min_noise_multiplier: float = 0.0, max_colluding_clients: int = 0) -> ClientApp:
    """A ClientApp whose train adds ``deltas[node]`` (flattened over the arrays) to the received model,
    behind ``distributed_dp_mod``; it also returns a MetricRecord, which the mod must drop."""
    app = ClientApp()
    mod = make_distributed_dp_mod(rng=rng, min_noise_multiplier=min_noise_multiplier,
                                  max_colluding_clients=max_colluding_clients)

    @app.train(mods=[mod])
    def train(msg: Message, context: Context) -> Message:
        record = next(r for r in msg.content.values() if isinstance(r, ArrayRecord))
        delta = deltas[int(context.node_id)]
        out, offset = {}, 0
        for key, array in record.items():
            w = array.numpy()
            out[key] = Array((w.astype(np.float64) + delta[offset:offset + w.size].reshape(w.shape)).astype(w.dtype))
            offset += w.size
        content = RecordDict({"arrays": ArrayRecord(out)})
        if metrics:
            content["metrics"] = MetricRecord({"num-examples": 10, "train_loss": 0.5})
        return Message(content, reply_to=msg)

    return app
