"""ClientApp: record-level DP-SGD (``DpSgdTrainer``, fused per-sample clipping) on the client's own images.

Every round the client trains the received ResNet with DP-SGD (each example's gradient clipped to C_r,
Gaussian noise of std z_r C_r on every step's sum, Poisson batches of the public rate ``sample-rate``) and
replies with the new weights, the public weight 1.0 and the declaration of this round's DP-SGD event, which
the server's strategy books under this node. ``sample_rate`` is given, so the event depends on public
settings only and nothing in the reply tells the shard's size. The fused step (``grad_sample_mode="auto"``)
clips the Conv2d, GroupNorm and Linear layers in one backward pass. The trainer picks CUDA when the
simulation gives this client a GPU (``client-resources-num-gpus``), else the CPU.

Settings come from the server's ConfigRecord so that the ClientApp needs no run config of its own; in a
deployment each client should fix its own privacy settings (``--node-config``): the guarantee protects its data.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from client_mods.dp_sgd import DpSgdTrainer, dp_sgd_train_reply

from . import task

app = ClientApp()


def noise_seed(config: ConfigRecord, partition_id: int) -> int | None:
    """None (OS entropy) unless ``noise-seed`` >= 0 (reproducible tests only); then one seed per client."""
    seed = int(config["noise-seed"])
    if seed < 0:
        return None
    return int(np.random.SeedSequence([seed, partition_id]).generate_state(1)[0])


def build_trainer(config: ConfigRecord, partition_id: int) -> DpSgdTrainer:
    """The DP-SGD trainer the server's ConfigRecord describes."""
    size = str(config["size"])
    return DpSgdTrainer(
        lambda: task.build_model(size),
        lr=float(config["lr"]),
        momentum=float(config["momentum"]),
        noise_multiplier=float(config["noise-multiplier"]),
        target_delta=float(config["target-delta"]),
        local_epochs=int(config["local-epochs"]),
        max_grad_norm=float(config["max-grad-norm"]),
        batch_size=int(config["batch-size"]),
        sample_rate=float(config["sample-rate"]),
        grad_sample_mode="fused",
        seed=noise_seed(config, partition_id),
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """DP-SGD on the local images; declare what was released."""
    config = msg.content["config"]
    partition_id = int(context.node_config["partition-id"])
    data = task.load_partition(
        partition_id,
        str(config["size"]),
        int(config["examples-per-client"]),
        float(config["signal"]),
        int(config["data-seed"]),
    )
    return dp_sgd_train_reply(msg, context, build_trainer(config, partition_id), data)
