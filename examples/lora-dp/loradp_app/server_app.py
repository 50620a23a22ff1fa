"""ServerApp: client-level central DP (``AccountedPoissonFixedClipping``) over record-level DP-SGD clients.

The global model is the set of LoRA adapters (the B matrices with FFA-LoRA's frozen A): the server never
holds, sends or receives the base weights, which every party builds from the public ``base-seed``.
Every round each of the N connected nodes is sampled with probability q = m/N (m = ``clients-per-round``),
each sampled client's update (its DP-SGD-trained adapters minus the global ones) is clipped to C_c
(``client-clipping-norm``), the clipped updates are summed, Gaussian noise of std z_c C_c
(``client-noise-multiplier``) is added and the sum is divided by m. The strategy books that release for the
federation and each reply's declared DP-SGD event under its node, in one ledger.

Round metrics: the strategy's train metrics carry the ledger's ``privacy/epsilon`` (per node: the composition
of the central releases and the node's own DP-SGD events; see :mod:`.privacy`); the server-side evaluation of
every round (``evaluate_fn``) adds the central test accuracy and the two guarantees apart,
``privacy/epsilon-client-level`` and ``privacy/epsilon-record-level``. One line per round is printed and
``results.json`` / ``results.png`` are written to ``results-dir``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flwr_dp_experiments.results import write_run_results
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.strategy import AccountedPoissonFixedClipping

from . import task
from .config import resolve_run_config
from .privacy import privacy_split, published

app = ServerApp()

CLIENT_KEYS = (
    "size",
    "freeze-a",
    "base-seed",
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
    """``evaluate_fn``: central test accuracy and both guarantees after every round."""

    config: dict[str, Any]
    ledger: PrivacyLedger
    initial_accuracy: float | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    latest: dict[str, Any] | None = None  # the privacy split after the last round

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = _model(self.config)
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
        split = self.latest = privacy_split(self.ledger)
        metrics.update(published(split))
        self.rows.append({"round": server_round, "accuracy": accuracy, "loss": loss, **_row(split)})
        print(
            f"round {server_round}  accuracy {accuracy:.3f}  client-level epsilon {_fmt(split['client_level'])}  "
            f"record-level epsilon {_fmt(split['record_level'])}  ledger (combined) {_fmt(split['combined'])}  "
            f"(delta {split['delta']:g})",
            flush=True,
        )
        return metrics


def _model(config: dict[str, Any]):
    return task.build_model(str(config["size"]), int(config["base-seed"]), bool(config["freeze-a"]))


def _row(split: dict[str, Any]) -> dict[str, Any]:
    return {
        "epsilon_client_level": split["client_level"],
        "epsilon_record_level": split["record_level"],
        "epsilon_ledger": split["combined"],
        "central_releases": split["central_releases"],
        "dp_sgd_releases": split["dp_sgd_releases"],
    }


def _fmt(value: float | None) -> str:
    return "inf" if value is None else f"{value:.3g}"


def write_results(log: RoundLog, results_dir: str) -> str:
    """results.json (rows, config, the final privacy split) and results.png."""
    return write_run_results(
        results_dir,
        "lora-dp",
        log.rows,
        initial_accuracy=log.initial_accuracy,
        extra={
            "config": log.config,
            "parameters": task.count_parameters(_model(log.config)),
            "privacy": log.latest if log.latest is not None else privacy_split(log.ledger),
        },
        title=f"LoRA transformer ({log.config['size']}): DP-SGD clients, central DP server",
        epsilon_series={
            "client level (central releases only)": "epsilon_client_level",
            "record level (DP-SGD events only, worst node)": "epsilon_record_level",
            "ledger: both composed (worst node)": "epsilon_ledger",
        },
        epsilon_title=f"epsilon at delta={log.ledger.target_delta:g}",
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds, print one line per round, write the results."""
    config = resolve_run_config(context)
    strategy = build_strategy(config)
    model = _model(config)
    log = RoundLog(config, strategy.ledger)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=client_config(config),
        evaluate_fn=log,
    )
    path = write_results(log, os.path.abspath(str(config["results-dir"])))
    print(f"results written to {path}", flush=True)
