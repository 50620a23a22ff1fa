"""ServerApp: FedAvg made user-level DP with adaptive clipping; one line per round with C and ε.

The one line that differs from a plain Flower app is the strategy::

    strategy = AccountedAdaptiveClipping(FedAvg(...), z, m, C0, target_clipped_quantile, clip_norm_lr,
                                         num_clients=N, ledger=PrivacyLedger(delta))

(Flower's ``DifferentialPrivacyServerSideAdaptiveClipping`` takes the same positional
arguments in the same order.) Each round's train metrics carry ``dp/clipping-norm`` (the C
that round was clipped and noised with), ``dp/unclipped-fraction`` (the noisy fraction of
updates with norm ≤ C) and ``privacy/epsilon`` (the ledger's ε after that round, user-level:
add or remove one client's whole data, Poisson sampling with q = m/N). The server's own test
accuracy is computed in ``evaluate_fn``; nothing from the clients' data leaves un-noised.
"""

from __future__ import annotations

import math
import os

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result

from flwr_dp_experiments.results import write_run_results
from flwr_dp_strategies import AccountedAdaptiveClipping, AccountedClientSideAdaptiveClipping, PrivacyLedger

from . import task
from .config import resolve_run_config

app = ServerApp()


def build_strategy(config: dict) -> AccountedAdaptiveClipping:
    """Server- or client-side adaptive clipping over Poisson-sampled clients, with its ledger."""
    n = int(config["num-partitions"])
    fedavg = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n)
    max_epsilon = float(config["max-epsilon"])
    ledger = PrivacyLedger(float(config["target-delta"]), max_epsilon=max_epsilon if max_epsilon > 0 else None)
    cls = AccountedAdaptiveClipping if config["clipping"] == "server" else AccountedClientSideAdaptiveClipping
    return cls(
        fedavg,
        float(config["noise-multiplier"]),
        int(config["clients-per-round"]),
        float(config["initial-clipping-norm"]),
        float(config["target-clipped-quantile"]),
        float(config["clip-norm-lr"]),
        num_clients=n,
        ledger=ledger,
    )


def server_accuracy(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Test accuracy of the global model (the server's held-out split)."""
    model = task.build_model()
    model.load_state_dict(arrays.to_torch_state_dict())
    return MetricRecord({"accuracy": task.test_accuracy(model)})


def round_rows(result: Result) -> list[dict]:
    """Round, C, noisy unclipped fraction, ε and accuracy of every round that released a model."""
    return [
        {
            "round": rnd,
            "clipping_norm": float(metrics["dp/clipping-norm"]),
            "unclipped_fraction": float(metrics["dp/unclipped-fraction"]),
            "epsilon": float(metrics["privacy/epsilon"]),
            "accuracy": float(result.evaluate_metrics_serverapp.get(rnd, {}).get("accuracy", math.nan)),
        }
        for rnd, metrics in sorted(result.train_metrics_clientapp.items())
    ]


def round_lines(result: Result) -> list[str]:
    """``round r  C …  unclipped …  ε …  accuracy …`` for every round that released a model."""
    return [
        f"round {row['round']:3d}  C {row['clipping_norm']:.3f}  unclipped {row['unclipped_fraction']:.2f}  "
        f"epsilon {row['epsilon']:.3f}  accuracy {row['accuracy']:.3f}"
        for row in round_rows(result)
    ]


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds, then print C, the noisy unclipped fraction, ε and accuracy per round."""
    config = resolve_run_config(context)
    torch.manual_seed(int(config["seed"]))
    strategy = build_strategy(config)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(task.build_model().state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=ConfigRecord({key: config[key] for key in ("local-epochs", "lr", "batch-size", "seed")}),
        evaluate_fn=server_accuracy,
    )
    print("\n".join(round_lines(result)), flush=True)
    print(
        f"delta {strategy.ledger.target_delta:g}; user-level (one client's whole data), Poisson q = "
        f"{strategy.sampling_rate:.3g}",
        flush=True,
    )
    if config["results-dir"]:
        path = write_run_results(
            os.path.abspath(str(config["results-dir"])),
            f"adaptive clipping ({config['clipping']}-side)",
            round_rows(result),
            delta=strategy.ledger.target_delta,
            extra={"config": config},
            panels=[{"title": "clipping norm C", "ylabel": "C", "series": {"C used": "clipping_norm"}}],
        )
        print(f"results written to {path}", flush=True)
