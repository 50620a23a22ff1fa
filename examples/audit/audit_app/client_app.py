"""ClientApp: local SGD on the client's shard; returns the trained model (the server clips and noises).

The canaries are not SuperNodes: :class:`~flwr_dp_strategies.audit.CanaryAudit` runs them in the ServerApp's
process, behind the same strategy, so this ClientApp is the real clients' only.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from . import task

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """``local-epochs`` of SGD from the global model on this node's shard."""
    config = msg.content["config"]
    model = task.build_model(int(context.run_config["hidden-units"]))
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
