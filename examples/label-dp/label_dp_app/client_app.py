"""ClientApp: a feature party (holds a slice of the features and a bottom model, never any label).

Every message from the label party (the ServerApp) may carry

* ``grad``: the gradient of the loss w.r.t. the embeddings this party sent for
  the previous train batch. The party recomputes those embeddings (its model has
  not changed since, and there is no dropout, so they are identical), backprops
  the gradient into its bottom model and takes an Adam step;
* a request for new embeddings: of the train samples in ``batch`` (a
  ``train`` message) or of the whole test split (an ``evaluate`` message).

The reply holds the embeddings (``embeddings``) and the party id (``party``).
The bottom model, its Adam state and the pending batch indices persist in
``context.state``, since the ClientApp is rebuilt for each message. A new
``experiment`` tag in the config (a sweep run in one simulation) starts a fresh
bottom model.

What this party learns about the labels: only gradients computed by the label
party from its ε-label-DP randomised labels (post-processing of randomized
response), and batch indices drawn independently of the labels.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from . import task

app = ClientApp()

MODEL_KEY = "bottom.model"
OPTIM_KEY = "bottom.optimizer"
PENDING_KEY = "bottom.pending"
EXPERIMENT_KEY = "bottom.experiment"


def _partition(context: Context) -> tuple[int, int]:
    """(party id, number of parties) from ``node_config`` (filled by the simulation or ``--node-config``)."""
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


def _check_parties(context: Context, config: ConfigRecord) -> None:
    """The federation must have exactly ``num-parties`` SuperNodes (one per feature party)."""
    num_parties = int(config["num-parties"])
    if _partition(context)[1] != num_parties:
        raise ValueError(
            f"num-parties={num_parties} but this federation has {_partition(context)[1]} SuperNodes "
            "(num-partitions); run with num-supernodes equal to num-parties"
        )


def _restore(context: Context, config: ConfigRecord, in_features: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The bottom model and its Adam optimizer from ``context.state`` (initialised on the first message)."""
    party_id = _partition(context)[0]
    torch.manual_seed(int(config["seed"]) + 1000 * (party_id + 1))
    model = task.build_bottom(in_features, int(config["hidden-dim"]), int(config["embedding-dim"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config["lr"]))
    if MODEL_KEY in context.state.array_records:
        model.load_state_dict(context.state.array_records[MODEL_KEY].to_torch_state_dict())
        optimizer_state = context.state.config_records[OPTIM_KEY]["adam"]
        task.optimizer_from_bytes(optimizer, optimizer_state)  # type: ignore[arg-type]
    return model, optimizer


def _start_experiment(context: Context, config: ConfigRecord) -> None:
    """Forget the bottom model when the label party starts a new experiment (a sweep in one simulation)."""
    tag = str(config.get("experiment", ""))
    stored = context.state.config_records.get(EXPERIMENT_KEY)
    if stored is not None and stored["tag"] == tag:
        return
    for key in (MODEL_KEY, OPTIM_KEY, PENDING_KEY):
        if key in context.state:
            del context.state[key]
    context.state[EXPERIMENT_KEY] = ConfigRecord({"tag": tag})


def _save(context: Context, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    context.state[MODEL_KEY] = ArrayRecord(model.state_dict())
    context.state[OPTIM_KEY] = ConfigRecord({"adam": task.optimizer_to_bytes(optimizer)})


def _apply_gradient(
    context: Context, model: nn.Module, optimizer: torch.optim.Optimizer, x_train: np.ndarray, grad: np.ndarray
) -> None:
    """Backprop ``grad`` (d loss / d embeddings of the pending batch) into the bottom model; one Adam step."""
    if PENDING_KEY not in context.state.array_records:
        raise ValueError("received a gradient but no train batch is pending")
    indices = context.state.array_records[PENDING_KEY]["indices"].numpy()
    if grad.shape[0] != indices.shape[0]:
        raise ValueError(f"gradient has {grad.shape[0]} rows, the pending batch {indices.shape[0]}")
    optimizer.zero_grad()
    embeddings = model(torch.from_numpy(x_train[indices]))
    embeddings.backward(torch.from_numpy(grad).to(embeddings.dtype))
    optimizer.step()
    del context.state[PENDING_KEY]


def _handle(msg: Message, context: Context, split: str) -> Message:
    """Apply the pending gradient (if sent), then return embeddings of the requested samples."""
    torch.set_num_threads(1)
    config = msg.content[task.CONFIG]
    _check_parties(context, config)
    party_id, num_parties = _partition(context)
    data = task.load_party_features(
        party_id,
        num_parties,
        float(config["test-fraction"]),
        int(config["split-seed"]),
        str(config.get("dataset", "digits")),
        str(config.get("data-dir", "")),
    )
    _start_experiment(context, config)
    model, optimizer = _restore(context, config, data["train"].shape[1])
    if task.GRAD in msg.content.array_records:
        _apply_gradient(context, model, optimizer, data["train"], msg.content[task.GRAD]["grad"].numpy())
    if split == "train":
        indices = msg.content[task.BATCH]["indices"].numpy().astype(np.int64)
        context.state[PENDING_KEY] = ArrayRecord({"indices": Array(indices)})
        x = data["train"][indices]
    else:
        x = data["test"]
    with torch.no_grad():
        embeddings = model(torch.from_numpy(x)).numpy()
    _save(context, model, optimizer)
    content = RecordDict(
        {
            task.EMBEDDINGS: ArrayRecord({"embeddings": Array(np.ascontiguousarray(embeddings))}),
            task.PARTY: ConfigRecord({"party-id": party_id}),
        }
    )
    return Message(content=content, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Apply the previous batch's gradient, then send the embeddings of the next train batch."""
    return _handle(msg, context, "train")


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Apply the pending gradient, then send the embeddings of the test split."""
    return _handle(msg, context, "test")
