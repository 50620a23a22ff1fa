"""ClientApp: local SGD on the client's shard, behind ``distributed_dp_mod``.

The train function is a plain Flower one (receive the model, train, reply with the
new model). ``distributed_dp_mod`` answers the secure-aggregation stages itself and,
at the collect stage, turns the reply into the clipped, rotated, quantised, noised
and masked update; nothing else leaves the client (its metrics are dropped).

``straggler-partition`` / ``straggler-seconds`` (run config): the node with that
partition sleeps that long before it trains, to show (and test) a client that
drops out after the keys were shared.
"""

from __future__ import annotations

import time

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client_mods.distributed_dp_mod import distributed_dp_mod

from . import task

app = ClientApp()


@app.train(mods=[distributed_dp_mod])
def train(msg: Message, context: Context) -> Message:
    """``local-epochs`` of SGD from the global model on this node's shard."""
    config = msg.content["config"]
    partition_id, num_partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    if partition_id == int(context.run_config.get("straggler-partition", -1)):
        time.sleep(float(context.run_config.get("straggler-seconds", 0.0)))
    x, y = task.partition(partition_id, num_partitions, str(config["dataset"]), str(config["data-dir"]))
    seed = int(config["seed"]) + 1000 * int(config["server-round"]) + partition_id
    arrays = task.train_sgd(
        task.from_record(msg.content["arrays"]),
        x,
        y,
        epochs=int(config["local-epochs"]),
        lr=float(config["lr"]),
        batch_size=int(config["batch-size"]),
        seed=seed,
    )
    return Message(content=RecordDict({"arrays": task.to_record(arrays)}), reply_to=msg)
