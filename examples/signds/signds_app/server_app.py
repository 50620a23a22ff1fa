"""ServerApp: plain FedAvg or SignDS (``strategy`` in the run config), central evaluation every round.

* ``fedavg``: Flower's own :class:`flwr.serverapp.strategy.FedAvg`; clients
  upload their dense trained weights (d float32 values); no privacy (ε = ∞).
* ``signds``: :class:`flwr_dp_strategies.SignDS` with every parameter from the
  run config (``sign-k``, ``sign-eps``, ``sign-thr-ratio``, ``sign-global-lr``,
  ``sign-dim-out``, ``max-dim-out``, and ``rr-eps``, ``initial-r-est`` and
  ``step-ratio`` of :class:`~flwr_dp_strategies.signds.MagRRConfig`) and a
  ``PrivacyLedger(1e-5, neighboring_relation="replace_one")``: each client
  uploads h ≤ ``max-dim-out`` indices, one sign and one MagRR bit, and spends
  ``sign-eps + rr-eps`` per round (local DP), composed over rounds by the ledger.

Every round it prints one line (``round r/N``, accuracy, ε, r_est and phase,
values uploaded per client against dense, elapsed seconds) and at the end writes
``<results-dir>/run-<name>.json`` and ``run-<name>.png`` (accuracy and ε against
the round; see :mod:`.results`).
"""

from __future__ import annotations

import os
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from . import task
from .config import resolve_run_config, run_name
from .results import RoundLog, write_run

app = ServerApp()

TRAIN_KEYS = ("dataset", "data-dir", "hidden", "local-epochs", "lr", "batch-size", "seed")


def build_strategy(config: dict[str, Any]) -> FedAvg:
    """FedAvg or SignDS over ``fraction-train`` of ``num-partitions`` clients, no federated evaluation."""
    clients = int(config["num-partitions"])
    sampled = max(1, int(clients * float(config["fraction-train"])))
    common = {
        "fraction_train": float(config["fraction-train"]),
        "fraction_evaluate": 0.0,
        "min_train_nodes": sampled,
        "min_available_nodes": clients,
        "weighted_by_key": "num-examples",
    }
    if config["strategy"] == "fedavg":
        return FedAvg(**common)
    from flwr_dp_strategies import PrivacyLedger, SignDS
    from flwr_dp_strategies.signds import MagRRConfig

    return SignDS(
        sign_k=float(config["sign-k"]),
        sign_eps=float(config["sign-eps"]),
        sign_thr_ratio=float(config["sign-thr-ratio"]),
        sign_global_lr=float(config["sign-global-lr"]),
        sign_dim_out=int(config["sign-dim-out"]),
        max_dim_out=int(config["max-dim-out"]),
        magrr=MagRRConfig(
            rr_epsilon=float(config["rr-eps"]),
            initial_r_est=float(config["initial-r-est"]),
            step_ratio=float(config["step-ratio"]),
        ),
        ledger=PrivacyLedger(1e-5, neighboring_relation="replace_one"),
        **common,
    )


def train_config(config: dict[str, Any]) -> ConfigRecord:
    """What the ClientApp's trainer reads from each train message."""
    return ConfigRecord({key: config[key] for key in TRAIN_KEYS})


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds with per-round logging; write the run log."""
    config = resolve_run_config(context)
    strategy = build_strategy(config)
    model = task.initial_model(str(config["dataset"]), int(config["hidden"]), int(config["seed"]))
    log = RoundLog(config)
    log.attach(strategy)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=train_config(config),
        evaluate_fn=log,
    )
    path = write_run(log, strategy, os.path.abspath(str(config["results-dir"])), run_name(config))
    print(f"run log written to {path} (plot: {path[: -len('.json')]}.png)", flush=True)
