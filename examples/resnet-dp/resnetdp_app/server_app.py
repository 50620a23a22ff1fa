"""ServerApp: client-level central DP (``AccountedPoissonFixedClipping``) over record-level DP-SGD clients.

Every round each of the N connected nodes is sampled with probability q = m/N (m = ``clients-per-round``),
each sampled client's update (its DP-SGD output minus the global model) is clipped to C_c
(``client-clipping-norm``), the clipped updates are summed, Gaussian noise of std z_c C_c
(``client-noise-multiplier``) is added and the sum is divided by m. The strategy books that release for the
federation and each reply's declared DP-SGD event under its node, in one ledger.

Round metrics: the strategy's train metrics carry the ledger's figures: ``privacy/epsilon`` (per node the
composition of the central releases and the node's own DP-SGD events, a bound on either loss) and, since the
clients declare their DP-SGD releases with ``unit="record"``, the two guarantees apart, published by the
library (:meth:`~flwr_dp_strategies.privacy.PrivacyLedger.metrics`): ``privacy/epsilon-client-level`` (the
central releases: they take every reply clipped and noised) and ``privacy/epsilon-record-level`` (each
node's own DP-SGD events, worst node). The server-side evaluation of every round (``evaluate_fn``) adds the
central test accuracy. One line per round is printed, and ``results.json`` / ``results.png`` (the accuracy
and the three published figures per round) are written to ``results-dir``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result

from flwr_dp_experiments.results import write_run_results
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.strategy import AccountedPoissonFixedClipping

from . import task
from .config import resolve_run_config

app = ServerApp()

CLIENT_KEYS = (
    "size",
    "examples-per-client",
    "signal",
    "data-seed",
    "noise-multiplier",
    "max-grad-norm",
    "batch-size",
    "sample-rate",
    "local-epochs",
    "lr",
    "momentum",
    "target-delta",
    "noise-seed",
)


def build_strategy(config: dict[str, Any]) -> AccountedPoissonFixedClipping:
    """Poisson-sampled fixed clipping around FedAvg (uniform weights: every reply weighs the public 1.0)."""
    clients = int(config["num-partitions"])
    seed = int(config["server-seed"])
    return AccountedPoissonFixedClipping(
        FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_available_nodes=clients,
            min_train_nodes=1,
            weighted_by_key="num-examples",
        ),
        float(config["client-noise-multiplier"]),
        float(config["client-clipping-norm"]),
        int(config["clients-per-round"]),
        num_clients=clients,
        ledger=PrivacyLedger(float(config["target-delta"])),
        per_client_metrics=True,
        rng=None if seed < 0 else seed,
    )


def client_config(config: dict[str, Any]) -> ConfigRecord:
    """The DP-SGD settings the ClientApp reads from each train message."""
    return ConfigRecord({key: config[key] for key in CLIENT_KEYS})


@torch.no_grad()
def evaluate(model: torch.nn.Module, x, y, batch_size: int = 250) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) on (x, y), in batches, on CUDA when the server has it."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    loss = correct = 0.0
    for start in range(0, len(y), batch_size):
        inputs = torch.as_tensor(x[start : start + batch_size], device=device)
        targets = torch.as_tensor(y[start : start + batch_size], device=device)
        logits = model(inputs)
        loss += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        correct += float((logits.argmax(dim=1) == targets).sum())
    return loss / len(y), correct / len(y)


@dataclass
class RoundLog:
    """``evaluate_fn``: central test accuracy after every round."""

    config: dict[str, Any]
    initial_accuracy: float | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = task.build_model(str(self.config["size"]))
        model.load_state_dict(arrays.to_torch_state_dict())
        x, y = task.load_test(
            str(self.config["size"]),
            int(self.config["test-examples"]),
            float(self.config["signal"]),
            int(self.config["data-seed"]),
        )
        loss, accuracy = evaluate(model, x, y)
        metrics = MetricRecord({"accuracy": accuracy, "loss": loss})
        if server_round == 0:
            self.initial_accuracy = accuracy
            return metrics
        self.rows.append({"round": server_round, "accuracy": accuracy, "loss": loss})
        print(f"round {server_round}  accuracy {accuracy:.3f}", flush=True)
        return metrics


#: results.json's column -> the key the strategy publishes in every round's train metrics
PRIVACY_COLUMNS = {
    "epsilon_client_level": "privacy/epsilon-client-level",
    "epsilon_record_level": "privacy/epsilon-record-level",
    "epsilon_ledger": "privacy/epsilon",
}


def _finite(value: Any) -> float | None:
    """A published ε for JSON (None stands for ε = ∞)."""
    return float(value) if value is not None and math.isfinite(float(value)) else None


def privacy_figures(result: Result, ledger: PrivacyLedger) -> dict[str, Any]:
    """Each round's published figures joined to its row's columns, and those of the last round."""
    rounds = {
        rnd: {column: _finite(record.get(key)) for column, key in PRIVACY_COLUMNS.items()}
        for rnd, record in sorted(result.train_metrics_clientapp.items())
    }
    last = rounds[max(rounds)] if rounds else {column: None for column in PRIVACY_COLUMNS}
    return {
        "rounds": rounds,
        "delta": ledger.target_delta,
        "client_level": last["epsilon_client_level"],
        "record_level": last["epsilon_record_level"],
        "combined": last["epsilon_ledger"],
        "keys": dict(PRIVACY_COLUMNS),
    }


def write_results(log: RoundLog, results_dir: str, result: Result, ledger: PrivacyLedger) -> str:
    """results.json (rows with the published figures, config, the last round's figures) and results.png."""
    figures = privacy_figures(result, ledger)
    for row in log.rows:
        row.update(figures["rounds"].get(row["round"], {}))
    for row in log.rows:
        print(
            f"round {row['round']}  accuracy {row['accuracy']:.3f}  client-level epsilon "
            f"{_fmt(row.get('epsilon_client_level'))}  record-level epsilon {_fmt(row.get('epsilon_record_level'))}  "
            f"ledger (composed) {_fmt(row.get('epsilon_ledger'))}  (delta {ledger.target_delta:g})",
            flush=True,
        )
    privacy = {key: value for key, value in figures.items() if key != "rounds"}
    return write_run_results(
        results_dir,
        "resnet-dp",
        log.rows,
        initial_accuracy=log.initial_accuracy,
        extra={
            "config": log.config,
            "parameters": task.count_parameters(task.build_model(str(log.config["size"]))),
            "privacy": privacy,
        },
        title=f"ResNet-18 (GroupNorm, {log.config['size']}): DP-SGD clients, central DP server",
        epsilon_series={
            "privacy/epsilon-client-level (central releases)": "epsilon_client_level",
            "privacy/epsilon-record-level (DP-SGD events, worst node)": "epsilon_record_level",
            "privacy/epsilon: both composed (worst node)": "epsilon_ledger",
        },
        epsilon_title=f"epsilon at delta={ledger.target_delta:g}",
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds, print one line per round, write the results."""
    config = resolve_run_config(context)
    strategy = build_strategy(config)
    model = task.build_model(str(config["size"]), int(config["seed"]))
    torch.manual_seed(int(config["seed"]))
    log = RoundLog(config)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=client_config(config),
        evaluate_fn=log,
    )
    path = write_results(log, os.path.abspath(str(config["results-dir"])), result, strategy.ledger)
    print(f"results written to {path}", flush=True)


def _fmt(value: float | None) -> str:
    return "inf" if value is None else f"{value:.3g}"
