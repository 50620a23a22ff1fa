"""ServerApp: FedAvg, or one of the accounted DP strategies, chosen by the ``mechanism`` run config.

* ``central-dp``: AccountedServerSideFixedClipping (Flower's wrapper, every client every round);
* ``central-dp-poisson``: AccountedPoissonFixedClipping (Poisson client sampling, amplified ε);
* ``local-dp``: AccountedFedAvg; the clients' LocalUpdateNoiseMod declares each noisy update;
* ``dp-sgd``: AccountedFedAvg; the clients train with DpSgdTrainer (Opacus) and declare each
  round's record-level event (the ledger then reports record-level ε);
* ``none``: plain FedAvg.

Prints one line per round (``round r  accuracy 0.xxx  epsilon y.yy (delta 1e-05)``), and one
per phase in which nodes failed to reply, and writes ``results.json`` (with the per-round train
and evaluate metrics and reply counts) and ``results.png`` to the ``results-dir`` run config.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.strategy import (
    AccountedFedAvg,
    AccountedPoissonFixedClipping,
    AccountedServerSideFixedClipping,
)

from . import task
from .config import mechanisms, resolve_run_config
from .results import ReplyLog, RoundLog, write_results

app = ServerApp()


def min_clients(config: dict[str, Any]) -> int:
    """Connected nodes a round waits for: ``min-clients``, or ``num-partitions`` when it is 0."""
    return int(config["min-clients"]) or int(config["num-partitions"])


def node_counts(config: dict[str, Any]) -> dict[str, Any]:
    """FedAvg's node arguments: every connected node trains; at least ``min_clients`` are awaited."""
    clients = min_clients(config)
    fraction_evaluate = float(config["fraction-evaluate"])
    return {
        "fraction_train": 1.0,
        "fraction_evaluate": fraction_evaluate,
        "min_train_nodes": clients,
        "min_evaluate_nodes": max(1, int(clients * fraction_evaluate)) if fraction_evaluate > 0 else 0,
        "min_available_nodes": clients,
    }


def build_fedavg(config: dict[str, Any]) -> FedAvg:
    """FedAvg over all connected clients; equal weights (``unit-weight``) under central DP."""
    weighted_by = "unit-weight" if config["mechanism"].startswith("central-dp") else "num-examples"
    return FedAvg(**node_counts(config), weighted_by_key=weighted_by)


def build_strategy(config: dict[str, Any]) -> Strategy:
    """The strategy of ``config["mechanism"]`` (see the module docstring)."""
    mechanism = config["mechanism"]
    if mechanism == "none":
        return build_fedavg(config)
    max_epsilon = float(config["max-epsilon"])
    # The relation the mechanism's sensitivity is computed for: local DP bounds a replaced update
    # (Δ₂ = 2C); DP-SGD (Opacus) and the central strategies add or remove one record / client.
    relation = "replace_one" if mechanism == "local-dp" else "add_or_remove_one"
    ledger = PrivacyLedger(
        float(config["target-delta"]),
        max_epsilon=max_epsilon if max_epsilon > 0 else None,
        neighboring_relation=relation,
    )
    ledger_path = str(config["ledger-path"]) or None
    files = {"ledger_path": ledger_path, "resume": config["resume-ledger"]}  # resume: a bool, checked
    if mechanism in ("local-dp", "dp-sgd"):
        return AccountedFedAvg(**node_counts(config), ledger=ledger, **files)
    central = AccountedPoissonFixedClipping if mechanism == "central-dp-poisson" else AccountedServerSideFixedClipping
    clients = int(config["clients-per-round"] if mechanism == "central-dp-poisson" else config["num-partitions"])
    return central(
        build_fedavg(config),
        float(config["noise-multiplier"]),
        float(config["clipping-norm"]),
        clients,
        ledger=ledger,
        **files,
    )


def client_config(config: dict[str, Any]) -> ConfigRecord:
    """Hyperparameters the ClientApp reads from each train/evaluate message."""
    return ConfigRecord(
        {
            "model": str(config["model"]),
            "local-epochs": int(config["local-epochs"]),
            "lr": float(config["lr"]),
            "batch-size": int(config["batch-size"]),
            "seed": int(config["seed"]),
            "mechanism": str(config["mechanism"]),
            "clipping-norm": float(config["clipping-norm"]),
            "local-noise-multiplier": float(config["local-noise-multiplier"]),
            "dp-sgd-noise-multiplier": float(config["dp-sgd-noise-multiplier"]),
            "dp-sgd-sample-rate": float(config["dp-sgd-sample-rate"]),
            "target-delta": float(config["target-delta"]),
        }
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``mechanism``, or each of ``mechanisms`` one after the other (``mechanism <name>`` line first).

    Each mechanism of ``mechanisms`` starts from the same initial model with a fresh strategy and
    ledger and writes to ``<results-dir>/<name>/``; one run saves a simulation start per mechanism.
    """
    config = resolve_run_config(context)
    names = mechanisms(config)
    if not names:
        run_mechanism(grid, config)
        return
    for name in names:
        print(f"mechanism {name}", flush=True)
        run_mechanism(
            grid,
            {
                **config,
                "mechanism": name,
                "mechanisms": "",
                "results-dir": os.path.join(str(config["results-dir"]), name),
            },
        )


def run_mechanism(grid: Grid, config: dict[str, Any]) -> None:
    """Run the rounds of ``config["mechanism"]``, print the per-round line, write the results."""
    strategy = build_strategy(config)
    torch.manual_seed(int(config["seed"]))
    model = task.build_model(str(config["model"]))
    log = RoundLog(str(config["model"]), getattr(strategy, "ledger", None))
    replies = ReplyLog(grid)  # counts the replies and failed replies (e.g. a node that died) per round
    result = strategy.start(
        grid=replies,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=client_config(config),
        evaluate_config=client_config(config),
        evaluate_fn=log,
    )
    path = write_results(log, config, os.path.abspath(str(config["results-dir"])), result, replies)
    print(f"results written to {path}", flush=True)
