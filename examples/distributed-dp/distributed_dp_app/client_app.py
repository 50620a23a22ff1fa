"""ClientApp: local SGD on the client's shard, behind ``distributed_dp_mod``.

The train function is a plain Flower one (receive the model, train, reply with the
new model). ``distributed_dp_mod`` answers the secure-aggregation stages itself and,
at the collect stage, turns the reply into the clipped, rotated, quantised, noised
and masked update; nothing else leaves the client (its metrics are dropped).

``straggler-partition`` / ``straggler-seconds`` (run config): the node with that
partition sleeps that long before it trains, to show (and test) a client that
drops out after the keys were shared. ``fail-plan`` (run config,
``"round:stage:p,p;..."``): :func:`fail_mod`, in front of ``distributed_dp_mod``,
raises on the listed partitions when that round's stage arrives, so Flower answers
with an error reply and the server drops the node from the round at that stage.
"""

from __future__ import annotations

import time

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable

from client_mods.distributed_dp_mod import make_distributed_dp_mod
from flwr_dp_strategies.secure_aggregation.identity import identity_from_environment
from flwr_dp_strategies.secure_aggregation.protocol import RECORD, STAGE_KEY

from . import task
from .config import fail_plan

app = ClientApp()

# What this client requires, whatever the server asks (client-side settings: this file, the node config, the
# node's environment; never the run config, which the server side writes):
# * noise multiplier >= 0.5 in any sum holding its update that any server can unmask (the run config's z is 0.5);
#   a node's operator can change it with the node config key ``dp-min-noise-multiplier``;
# * peers authenticated by the operator's roster: the node config keys ``dp-signing-key``, ``dp-roster`` and
#   ``dp-roster-signer`` (deployment), or in simulation the directory ``FLWR_DP_ROSTER_DIR`` names
#   (``flwr-dp roster demo --nodes 10 --out DIR``). Without a roster the client counts only its own noise share
#   and refuses this run's shares: safe, but no round completes.
distributed_dp_mod = make_distributed_dp_mod(min_noise_multiplier=0.5, identity=identity_from_environment)


def _round_of(msg: Message) -> int:
    """The server round of a secure-aggregation message: the group id, else the train config's ``server-round``."""
    if msg.metadata.group_id.isdigit():
        return int(msg.metadata.group_id)
    config = msg.content.config_records.get("config")
    return int(config["server-round"]) if config is not None and "server-round" in config else 0


def fail_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Raise (the node drops out) where ``fail-plan`` lists this node's partition for this round and stage."""
    plan = fail_plan(str(context.run_config.get("fail-plan", "")))
    if plan and msg.metadata.message_type == MessageType.TRAIN and RECORD in msg.content:
        stage = str(msg.content[RECORD].get(STAGE_KEY))
        partition_id = int(context.node_config["partition-id"])
        if partition_id in plan.get((_round_of(msg), stage), ()):
            raise RuntimeError(f"fail-plan: partition {partition_id} drops out at {stage} of round {_round_of(msg)}")
    return call_next(msg, context)


@app.train(mods=[fail_mod, distributed_dp_mod])
def train(msg: Message, context: Context) -> Message:
    """``local-epochs`` of SGD from the global model on this node's shard."""
    config = msg.content["config"]
    partition_id, num_partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    if partition_id == int(context.run_config.get("straggler-partition", -1)):
        time.sleep(float(context.run_config.get("straggler-seconds", 0.0)))
    x, y = task.partition(
        partition_id,
        num_partitions,
        str(config["dataset"]),
        str(config["data-dir"]),
        int(config.get("samples-per-client", 0)),
    )
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
