"""ClientApp: local gradient descent on the node's shard; replies with the trained model (the server clips
the update and adds the correlated noise)."""

from __future__ import annotations

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from . import task

app = ClientApp()


def _data(context: Context):
    return task.shard(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))


def _model(msg: Message) -> dict:
    return {key: array.numpy() for key, array in msg.content["arrays"].items()}


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = task.run_config(context)
    x, y = _data(context)
    trained = task.train(_model(msg), x, y, int(config["local-epochs"]), float(config["lr"]))
    metrics = MetricRecord({"num-examples": len(y), "unit-weight": 1.0})
    return Message(
        RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in trained.items()}), "metrics": metrics}), reply_to=msg
    )


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    x, y = _data(context)
    metrics = MetricRecord({"num-examples": len(y), "unit-weight": 1.0, "accuracy": task.accuracy(_model(msg), x, y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
