"""ClientApp: local SGD on a strongly non-IID shard; evaluation uploads the mean softmax vector.

Every hyperparameter comes from the server's ConfigRecord (the ClientApp needs no
run config of its own); the partition comes from ``node_config``
(``partition-id``, ``num-partitions``: filled by the simulation engine, or
``--node-config`` for a deployed SuperNode).

Evaluate replies hold the client's inference result, the mean softmax vector
over its local evaluation samples, in the ArrayRecord ``"inference"``, and one
MetricRecord (``num-examples``, ``eval-acc``, ``eval-loss``; identical keys on
every client, as FedAvg requires). :class:`client_mods.LaplaceInferenceMod` is
attached to ``evaluate`` only (with ``rng=None`` each release draws fresh OS
entropy, also in the copies the simulation pickles per message): it adds Laplace noise to ``"inference"`` with the
ε the server asks for (``privacy-eval-type = LAPLACE``, ``laplace-eval-eps``) at
L1 sensitivity 2 and declares the release, or passes it through unprotected in
``NOT_ENCRYPT`` mode. Training replies are not touched.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from client_mods import LaplaceInferenceMod

from . import task

INFERENCE_KEY = "inference"

app = ClientApp()


def _partition(msg: Message, context: Context) -> dict[str, np.ndarray]:
    """This node's local train/eval data."""
    partition_id, num_partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    return task.load_partition(partition_id, num_partitions, dict(msg.content["config"]))


def _load_model(msg: Message) -> tuple[nn.Module, ConfigRecord]:
    """The global model from the message, and the message's ConfigRecord."""
    config = msg.content["config"]
    model = task.build_model(str(config["model"]), task.num_features(str(config["dataset"])))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model, config


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model for ``local-epochs`` epochs on the local training data."""
    model, config = _load_model(msg)
    data = _partition(msg, context)
    seed = int(config["seed"]) + 1000 * int(config["server-round"]) + int(context.node_config["partition-id"])
    loss = task.train(
        model,
        data["x_train"],
        data["y_train"],
        epochs=int(config["local-epochs"]),
        lr=float(config["lr"]),
        batch_size=int(config["batch-size"]),
        seed=seed,
    )
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(data["y_train"])})
    return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


# rng=None: every release draws a fresh OS-entropy generator, also in the copies
# of this mod that the simulation pickles to its workers for every message.
@app.evaluate(mods=[LaplaceInferenceMod()])
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate locally; reply with the mean softmax vector (``"inference"``) and the metrics."""
    model, _ = _load_model(msg)
    data = _partition(msg, context)
    loss, accuracy, mean_softmax = task.evaluate(model, data["x_eval"], data["y_eval"])
    metrics = MetricRecord({"eval-loss": loss, "eval-acc": accuracy, "num-examples": len(data["y_eval"])})
    inference = ArrayRecord({"mean-softmax": Array(mean_softmax)})
    return Message(content=RecordDict({INFERENCE_KEY: inference, "metrics": metrics}), reply_to=msg)
