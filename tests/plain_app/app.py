"""An ordinary Flower 1.41 app: softmax regression on sklearn digits, FedAvg in the ServerApp.

The only line that changes per strategy is the expression :func:`make_strategy` evaluates: each strategy's
line is its ``drop_in`` in ``tests/strategy_registry.py`` (one registry entry per strategy, nothing to add
here). SignDS and client-side adaptive clipping also need their client mod, added to the ClientApp's train
function: the one client-side line. The ServerApp runs every strategy of the ``strategies`` run config (or
the ``PLAIN_APP_STRATEGIES`` environment variable): a JSON file ``{name: line}``, or ``FedAvg``; each for 2
rounds in one run, and writes the final metrics to ``out`` (or ``PLAIN_APP_OUT``), as JSON. The folder's
pyproject.toml makes it a Flower app for ``flwr run``.
"""

from __future__ import annotations

import json
import os

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from client_mods import adaptive_clipping_mod, signds_mod
import flwr_dp_strategies
from flwr_dp_experiments.datasets import iid_partition_indices, load_digits_split

NODES = 4
FEDAVG_ARGS = {
    "fraction_train": 1.0,
    "fraction_evaluate": 1.0,
    "min_train_nodes": NODES,
    "min_evaluate_nodes": NODES,
    "min_available_nodes": NODES,
}

BASELINE = {"FedAvg": "FedAvg(**FEDAVG_ARGS)"}


def make_strategy(line: str):
    """The one line an app changes: ``line`` evaluated with FedAvg, ``FEDAVG_ARGS``, ``NODES`` and the package's
    exports in scope (test glue: a user writes the expression itself)."""
    scope = {"FedAvg": FedAvg, "FEDAVG_ARGS": FEDAVG_ARGS, "NODES": NODES}
    scope.update({name: getattr(flwr_dp_strategies, name) for name in flwr_dp_strategies.__all__})
    return eval(line, scope)  # noqa: S307 - the registry's own lines, written by this project


def strategy_lines(spec: str) -> dict[str, str]:
    """``{name: line}`` from a JSON file's path, or :data:`BASELINE` for ``"FedAvg"``."""
    if spec == "FedAvg":
        return dict(BASELINE)
    with open(spec, encoding="utf-8") as handle:
        return {str(name): str(line) for name, line in json.load(handle).items()}


def _partition(context: Context) -> tuple[np.ndarray, np.ndarray]:
    x, y, _, _ = load_digits_split()
    idx = iid_partition_indices(len(y), int(context.node_config["num-partitions"]))[
        int(context.node_config["partition-id"])
    ]
    return x[idx], y[idx]


def _logits(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    return x @ weights[0] + weights[1]


def _sgd(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray, lr: float = 0.5, steps: int = 20):
    w, b = (a.astype(np.float64).copy() for a in weights)
    onehot = np.eye(10)[y]
    for _ in range(steps):
        z = x @ w + b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - onehot) / len(y)
        w -= lr * x.T @ grad
        b -= lr * grad.sum(axis=0)
    return [w.astype(np.float32), b.astype(np.float32)]


app = ClientApp()


def signds_when_asked(msg: Message, context: Context, call_next):
    """Test glue: one ClientApp serves every strategy; a SignDS client would simply use ``mods=[signds_mod]``."""
    config = next(iter(msg.content.config_records.values()), {})
    return signds_mod(msg, context, call_next) if "signds-sign-k" in config else call_next(msg, context)


def adaptive_clipping_when_asked(msg: Message, context: Context, call_next):
    """Test glue: a client of AccountedClientSideAdaptiveClipping would simply use ``mods=[adaptive_clipping_mod]``."""
    config = next(iter(msg.content.config_records.values()), {})
    return adaptive_clipping_mod(msg, context, call_next) if "clipping_norm" in config else call_next(msg, context)


@app.train(mods=[signds_when_asked, adaptive_clipping_when_asked])
def train(msg: Message, context: Context) -> Message:
    x, y = _partition(context)
    weights = _sgd(msg.content["arrays"].to_numpy_ndarrays(), x, y)
    return Message(
        RecordDict({"arrays": ArrayRecord(weights), "metrics": MetricRecord({"num-examples": len(y)})}), reply_to=msg
    )


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    x, y = _partition(context)
    accuracy = float((_logits(msg.content["arrays"].to_numpy_ndarrays(), x).argmax(axis=1) == y).mean())
    return Message(RecordDict({"metrics": MetricRecord({"accuracy": accuracy, "num-examples": len(y)})}), reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    out = {}
    spec = str(context.run_config.get("strategies", "")) or os.environ["PLAIN_APP_STRATEGIES"]
    for name, line in strategy_lines(spec).items():
        strategy = make_strategy(line)
        initial = ArrayRecord([np.zeros((64, 10), np.float32), np.zeros(10, np.float32)])
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=2, train_config=ConfigRecord())
        train = result.train_metrics_clientapp.get(2, {})
        evaluate = result.evaluate_metrics_clientapp.get(2, {})
        out[name] = {
            "train": {k: float(v) for k, v in dict(train).items() if isinstance(v, (int, float))},
            "evaluate": {k: float(v) for k, v in dict(evaluate).items() if isinstance(v, (int, float))},
            "changed": bool(np.abs(result.arrays.to_numpy_ndarrays()[0]).sum() > 0),
            "model": [float(np.abs(a).sum()) for a in result.arrays.to_numpy_ndarrays()],
        }
    with open(str(context.run_config.get("out", "")) or os.environ["PLAIN_APP_OUT"], "w") as handle:
        json.dump(out, handle)
