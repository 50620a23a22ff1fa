"""ServerApp: AccountedFedAvg over DP-SGD clients; the ledger composes what each client declares.

Every round the strategy books each reply's declared DpEvent (this round's
``SelfComposed(PoissonSampled(q, Gaussian(z)), steps)``) under the replying node
and publishes ``privacy/epsilon`` (worst client, min of RDP and PLD) in the
round's train metrics, with ``privacy/epsilon/node-<id>`` per client. The
clients' ``dp-sgd/epsilon-opacus`` and ``dp-sgd/epsilon-round-only`` are
aggregated as their maximum (the worst client, like the ledger), with the
per-client values under ``<key>/clients``.

Prints one line per round and writes ``results.json`` and ``results.png`` to the
``results-dir`` run config.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from client_mods.dp_sgd import EPSILON_METRIC, NOISE_METRIC, ROUND_EPSILON_METRIC
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.strategy import AccountedFedAvg

from . import task
from .config import resolve_run_config
from .results import RoundLog, write_results

app = ServerApp()

CLIENT_KEYS = (
    "dataset",
    "data-dir",
    "hidden",
    "noise-multiplier",
    "target-epsilon",
    "target-delta",
    "max-grad-norm",
    "clipping",
    "batch-size",
    "sample-rate",
    "max-physical-batch-size",
    "grad-sample-mode",
    "local-epochs",
    "lr",
    "momentum",
    "noise-seed",
)


def aggregate_train_metrics(records: list[RecordDict], weighting_key: str) -> MetricRecord:
    """FedAvg's weighted mean, except the ε metrics (maximum over clients, plus the list) and z (minimum)."""
    metrics = aggregate_metricrecords(records, weighting_key)
    client_metrics = [next(iter(record.metric_records.values())) for record in records]
    for key in (EPSILON_METRIC, ROUND_EPSILON_METRIC):
        values = [float(metric[key]) for metric in client_metrics]
        metrics[key] = max(values)
        metrics[f"{key}/clients"] = values
    metrics[NOISE_METRIC] = min(float(metric[NOISE_METRIC]) for metric in client_metrics)
    return metrics


def build_strategy(config: dict[str, Any]) -> AccountedFedAvg:
    """AccountedFedAvg over all ``num-partitions`` clients, no federated evaluation (central instead)."""
    clients = int(config["num-partitions"])
    return AccountedFedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=clients,
        min_available_nodes=clients,
        weighted_by_key="num-examples",
        train_metrics_aggr_fn=aggregate_train_metrics,
        ledger=PrivacyLedger(float(config["target-delta"])),
        per_client_metrics=True,
    )


def client_config(config: dict[str, Any]) -> ConfigRecord:
    """The DP-SGD settings the ClientApp reads from each train message."""
    record = ConfigRecord({key: config[key] for key in CLIENT_KEYS})
    record["planned-rounds"] = int(config["num-server-rounds"])
    return record


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds, print the per-round line, write the results."""
    config = resolve_run_config(context)
    strategy = build_strategy(config)
    torch.manual_seed(int(config["seed"]))
    model = task.build_model(task.num_features(str(config["dataset"])), int(config["hidden"]))
    log = RoundLog(str(config["dataset"]), str(config["data-dir"]), int(config["hidden"]), strategy.ledger)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=client_config(config),
        evaluate_fn=log,
    )
    log.add_client_metrics(result.train_metrics_clientapp)
    path = write_results(log, config, os.path.abspath(str(config["results-dir"])))
    print(f"results written to {path}", flush=True)
