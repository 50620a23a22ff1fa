"""ClientApp: DP-SGD (Opacus) on the client's IID shard, accountant kept in ``context.state``.

The ClientApp is rebuilt for every message, so the trainer is too; what must
survive between rounds -- Opacus' accountant history and, with a target ε, the
noise multiplier calibrated on the first round -- lives in ``context.state``
(see :mod:`client_mods.dp_sgd`). The reply carries the new weights, the
metrics ``num-examples`` (the public weight 1.0, not the shard's size), ``dp-sgd/epsilon-opacus`` (cumulative),
``dp-sgd/epsilon-round-only`` (what Flower's Opacus example would print) and
``dp-sgd/noise-multiplier``, and the declaration of this round's DpEvent, which
the server's AccountedFedAvg books in its ledger.

Settings come from the server's ConfigRecord (the ClientApp needs no run config
of its own). In a real deployment a client should fix its own privacy
settings (e.g. from ``--node-config``) rather than take them from the server:
the guarantee protects the client's data, so the client decides.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from client_mods.dp_sgd import DpSgdTrainer, dp_sgd_train_reply

from . import task

app = ClientApp()


def _seed(config: ConfigRecord, partition_id: int) -> int | None:
    """None (OS entropy) unless ``noise-seed`` >= 0; then a distinct seed per client."""
    seed = int(config["noise-seed"])
    if seed < 0:
        return None
    return int(np.random.SeedSequence([seed, partition_id]).generate_state(1)[0])


def build_trainer(config: ConfigRecord, partition_id: int) -> DpSgdTrainer:
    """The DP-SGD trainer described by the server's ConfigRecord."""
    features, hidden = task.num_features(str(config["dataset"])), int(config["hidden"])
    target = float(config["target-epsilon"])
    physical = int(config["max-physical-batch-size"])
    return DpSgdTrainer(
        lambda: task.build_model(features, hidden),
        lr=float(config["lr"]),
        momentum=float(config["momentum"]),
        noise_multiplier=None if target > 0 else float(config["noise-multiplier"]),
        target_epsilon=target if target > 0 else None,
        target_delta=float(config["target-delta"]),
        planned_rounds=int(config["planned-rounds"]),
        local_epochs=int(config["local-epochs"]),
        max_grad_norm=float(config["max-grad-norm"]),
        batch_size=int(config["batch-size"]),
        sample_rate=float(config["sample-rate"]),
        max_physical_batch_size=physical if physical > 0 else None,
        clipping=str(config["clipping"]),
        grad_sample_mode=str(config["grad-sample-mode"]),
        seed=_seed(config, partition_id),
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model with DP-SGD on the local shard; declare what was released."""
    config = msg.content["config"]
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    x, y = task.load_partition(partition_id, num_partitions, str(config["dataset"]), str(config["data-dir"]))
    return dp_sgd_train_reply(msg, context, build_trainer(config, partition_id), (x, y))
