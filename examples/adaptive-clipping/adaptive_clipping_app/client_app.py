"""ClientApp: local SGD on the client's shard; returns the trained model (the server clips and noises).

With ``clipping = "client"`` the ``adaptive_clipping_mod`` clips the update to the C the
server sent and adds the unclipped bit the server counts (noised there).
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable

from client_mods import adaptive_clipping_mod

from . import task

app = ClientApp()


def clip_when_asked(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """``adaptive_clipping_mod`` when the server sends a clipping norm (client-side clipping)."""
    if "clipping_norm" in msg.content["config"]:
        return adaptive_clipping_mod(msg, context, call_next)
    return call_next(msg, context)


@app.train(mods=[clip_when_asked])
def train(msg: Message, context: Context) -> Message:
    """``local-epochs`` of SGD from the global model on this node's shard."""
    config = msg.content["config"]
    model = task.build_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id, num_partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    x, y = task.partition(partition_id, num_partitions)
    seed = int(config["seed"]) + 1000 * int(config["server-round"]) + partition_id
    task.train_sgd(
        model,
        x,
        y,
        epochs=int(config["local-epochs"]),
        lr=float(config["lr"]),
        batch_size=int(config["batch-size"]),
        seed=seed,
    )
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": 1.0})})
    return Message(content=content, reply_to=msg)
