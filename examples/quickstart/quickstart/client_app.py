"""ClientApp: local SGD on the client's IID shard of sklearn digits.

Every hyperparameter comes from the server's ConfigRecord (so the ClientApp needs
no run config of its own); the partition comes from
``node_config`` (``partition-id``, ``num-partitions``: filled by the simulation
engine, or ``--node-config`` for a deployed SuperNode).

Replies carry exactly one ArrayRecord and one MetricRecord with the same keys on
every client, including ``num-examples`` and ``unit-weight`` (= 1.0, the weight
FedAvg uses under central DP so that all clients weigh the same).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from torch import nn

from client_mods import LocalUpdateNoiseMod

from . import task

if TYPE_CHECKING:
    from client_mods.dp_sgd import DpSgdTrainer

app = ClientApp()


def _partition(context: Context) -> tuple[int, int]:
    """(partition id, number of partitions) of this node."""
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


def _load_model(msg: Message) -> tuple[nn.Module, ConfigRecord]:
    """The global model from the message, and the message's ConfigRecord."""
    config = msg.content["config"]
    model = task.build_model(str(config["model"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model, config


def local_dp_when_asked(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Apply :class:`LocalUpdateNoiseMod` (C and z from the server's config) when mechanism = local-dp."""
    config = msg.content["config"]
    if config.get("mechanism") != "local-dp":
        return call_next(msg, context)
    mod = LocalUpdateNoiseMod(float(config["clipping-norm"]), float(config["local-noise-multiplier"]))
    return mod(msg, context, call_next)


def dp_sgd_trainer(config: ConfigRecord) -> DpSgdTrainer:
    """DP-SGD (Opacus) with the server's hyperparameters; per-sample clipping norm = ``clipping-norm``.

    The noise is drawn from OS entropy (no seed): the data-order seed of the
    non-private path does not apply to the privacy noise. Opacus is imported here, when DP-SGD is asked for: a
    deployed SuperNode starts a fresh ClientApp process for every message, and the other mechanisms need none of it.
    """
    from client_mods.dp_sgd import DpSgdTrainer

    return DpSgdTrainer(
        lambda: task.build_model(str(config["model"])),
        lr=float(config["lr"]),
        noise_multiplier=float(config["dp-sgd-noise-multiplier"]),
        target_delta=float(config["target-delta"]),
        local_epochs=int(config["local-epochs"]),
        max_grad_norm=float(config["clipping-norm"]),
        batch_size=int(config["batch-size"]),
        sample_rate=float(config["dp-sgd-sample-rate"]),
    )  # device None: CUDA when the simulation gave this client a GPU


@app.train(mods=[local_dp_when_asked])
def train(msg: Message, context: Context) -> Message:
    """Train the received model for ``local-epochs`` epochs on the local shard (DP-SGD when asked)."""
    model, config = _load_model(msg)
    partition_id, num_partitions = _partition(context)
    x, y = task.load_partition(partition_id, num_partitions, "train")
    if config.get("mechanism") == "dp-sgd":
        from client_mods.dp_sgd import dp_sgd_train_reply

        return dp_sgd_train_reply(msg, context, dp_sgd_trainer(config), (x, y))
    seed = int(config["seed"]) + 1000 * int(config["server-round"]) + partition_id
    loss = task.train(
        model,
        x,
        y,
        epochs=int(config["local-epochs"]),
        lr=float(config["lr"]),
        batch_size=int(config["batch-size"]),
        seed=seed,
    )
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(y), "unit-weight": 1.0})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the client's shard of the test split."""
    model, _ = _load_model(msg)
    partition_id, num_partitions = _partition(context)
    x, y = task.load_partition(partition_id, num_partitions, "test")
    loss, accuracy = task.test(model, x, y)
    metrics = MetricRecord({"eval-loss": loss, "eval-acc": accuracy, "num-examples": len(y), "unit-weight": 1.0})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
