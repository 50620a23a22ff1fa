"""ClientApp: plain local SGD; with ``strategy = "signds"`` the reply goes through ``signds_mod``.

The train function is an ordinary trainer: it loads the received weights, runs
``local-epochs`` of minibatch SGD on the client's IID shard and returns the
trained weights with ``num-examples``. Under SignDS the mod
(:func:`client_mods.signds_mod.signds_mod`) then replaces the weights by the
upload (``indices``, ``sign``, ``b-hat``) and declares the round's ε; no float of
the update leaves the client.

Whether the mod is applied is the *client's* decision, from its own run config
(``strategy``), not the server's train message: a client configured for SignDS
never sends dense weights, and fails loudly (error reply) if the server does
not send the SignDS parameters. The SignDS parameters themselves (sign_eps, ...)
do come from the server's ConfigRecord (that is how the mod works).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable

from client_mods.signds_mod import signds_mod

from . import task
from .config import resolve_run_config

app = ClientApp()


def signds_if_configured(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Apply ``signds_mod`` when this client's run config says ``strategy = "signds"``."""
    if resolve_run_config(context)["strategy"] == "signds":
        return signds_mod(msg, context, call_next)
    return call_next(msg, context)


def local_seed(seed: int, server_round: int, partition_id: int) -> int:
    """Shuffling seed of one client's local epochs in one round."""
    return int(np.random.SeedSequence([int(seed), int(server_round), int(partition_id)]).generate_state(1)[0])


@app.train(mods=[signds_if_configured])
def train(msg: Message, context: Context) -> Message:
    """E local epochs of SGD from the received weights; reply the trained weights and ``num-examples``."""
    torch.set_num_threads(1)
    config = msg.content["config"]
    dataset, hidden = str(config["dataset"]), int(config["hidden"])
    partition_id = int(context.node_config["partition-id"])
    x, y = task.load_partition(
        partition_id, int(context.node_config["num-partitions"]), dataset, str(config["data-dir"])
    )
    model = task.build_model(dataset, hidden)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss = task.train(
        model,
        x,
        y,
        epochs=int(config["local-epochs"]),
        lr=float(config["lr"]),
        batch_size=int(config["batch-size"]),
        seed=local_seed(int(config["seed"]), int(config["server-round"]), partition_id),
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": len(y), "train-loss": loss}),
        }
    )
    return Message(content=content, reply_to=msg)
