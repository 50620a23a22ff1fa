"""ServerApp: FedAvg under secure aggregation with distributed DP; one line per round: revealed or not, ε, accuracy.

The strategy is FedAvg's arguments plus the DP and protocol settings::

    strategy = DistributedDpFedAvg(1.0, 0.0, n, 0, n,              # FedAvg: fraction_train ... min_available_nodes
                                   noise_multiplier=z, clipping_norm=C, bits=20,
                                   num_shares=1.0, min_survivors=0.8,  # t: the least clients accept
                                   ledger=PrivacyLedger(delta))

Each round runs four SecAgg+ stages: setup and share-keys inside ``configure_train``
(``stage-timeout`` each), collect as Flower's train round (``round-timeout``, the
``timeout`` of ``Strategy.start``) and unmask inside ``aggregate_train``
(``stage-timeout``). A node that does not answer a stage in time is dropped from the
round; the sum of the survivors' vectors is still revealed while at least
``min-survivors`` remain (how many is in the server log only: dropouts can depend on
data). The round's train metrics carry ``dp/noise-multiplier``, ``secagg/peak-fraction``
and ``privacy/epsilon`` (the ledger's ε after that round). The server's test accuracy
is computed in ``evaluate_fn`` on the held-out split, which also prints one progress line
per round as it ends: ε so far, accuracy, the round's wall time (from the end of the
previous evaluation: the four stages, local training and the server's unmasking) and
the bytes each client uploaded (its packed masked vector, ⌈d·b/8⌉) against a dense
float32 update (4·d).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from flwr_dp_experiments.results import write_run_results
from flwr_dp_strategies import DistributedDpFedAvg, PrivacyLedger

from . import task
from .config import min_clients, resolve_run_config

app = ServerApp()


def _fraction_or_count(value: Any) -> int | float | None:
    """A run-config value as the strategy reads it: a float is a fraction, an int a count, 0 the library's
    own choice (None)."""
    value = value if isinstance(value, (int, float)) and not isinstance(value, bool) else float(value)
    return None if value == 0 else value


def build_strategy(config: dict[str, Any]) -> DistributedDpFedAvg:
    """Every connected node trains (at least ``min-clients``); no client-side evaluation (it would be un-noised)."""
    n = min_clients(config)
    return DistributedDpFedAvg(
        1.0,
        0.0,
        n,
        0,
        n,  # fraction_train, fraction_evaluate, min_train/evaluate/available_nodes (FedAvg's)
        noise_multiplier=float(config["noise-multiplier"]),
        clipping_norm=float(config["clipping-norm"]),
        bits=int(config["bits"]),
        num_shares=_fraction_or_count(config["num-shares"]),
        reconstruction_threshold=_fraction_or_count(config["reconstruction-threshold"]),
        min_survivors=_fraction_or_count(config["min-survivors"]),
        rotation_seed=int(config["rotation-seed"]),
        stage_timeout=float(config["stage-timeout"]),
        ledger=PrivacyLedger(float(config["target-delta"])),
    )


def round_rows(result: Result, num_rounds: int) -> list[dict[str, Any]]:
    """Round, effective noise multiplier, ε and accuracy of every round (``released`` False: the round aborted)."""
    rows = []
    for rnd in range(1, num_rounds + 1):
        metrics = result.train_metrics_clientapp.get(rnd, {})
        accuracy = result.evaluate_metrics_serverapp.get(rnd, {}).get("accuracy", math.nan)
        z = metrics.get("dp/noise-multiplier")
        rows.append(
            {
                "round": rnd,
                "noise_multiplier": None if z is None else float(z),
                "epsilon": float(metrics["privacy/epsilon"]) if "privacy/epsilon" in metrics else None,
                "accuracy": float(accuracy),
                "released": z is not None,
            }
        )
    return rows


def round_lines(rows: list[dict[str, Any]]) -> list[str]:
    """``round r  sum revealed  epsilon e  accuracy a  time t s`` per round (``aborted`` if nothing was revealed)."""
    lines = []
    for row in rows:
        eps = "n/a" if row["epsilon"] is None else f"{row['epsilon']:.3f}"
        secagg = "sum revealed             " if row["released"] else "aborted: nothing revealed"
        seconds = f"  time {row['round_s']:.1f} s" if row.get("round_s") is not None else ""
        lines.append(f"round {row['round']:3d}  {secagg}  epsilon {eps}  accuracy {row['accuracy']:.3f}{seconds}")
    return lines


def bytes_line(upload: int, dim: int, bits: int) -> str:
    """One client's upload against a dense float32 update of ``dim`` values."""
    return (
        f"upload {upload:,} B per client (masked vector, {bits} bits x {dim:,} values) = "
        f"{upload / (4 * dim):.3f}x dense float32 ({4 * dim:,} B)"
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds, then print per round whether the sum was revealed, ε and accuracy."""
    config = resolve_run_config(context)
    dataset = task.resolve_dataset(str(config["dataset"]), str(config["data-dir"]))
    _, _, x_test, y_test = task.load_data(dataset, str(config["data-dir"]))
    strategy = build_strategy(config)
    initial_model = task.initial_arrays(
        task.num_features(dataset), str(config["model"]), int(config["hidden"]), int(config["seed"])
    )
    dim = task.model_size(initial_model)
    upload = strategy.upload_bytes(dim)
    print(f"{strategy!r} on {dataset}, {min_clients(config)} clients, {config['model']} of {dim:,} values", flush=True)
    print(bytes_line(upload, dim, int(config["bits"])), flush=True)
    clock = {"last": time.perf_counter()}
    round_seconds: dict[int, float] = {}

    def server_accuracy(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        acc = task.accuracy(task.from_record(arrays), x_test, y_test)
        now = time.perf_counter()
        if server_round > 0:
            round_seconds[server_round] = now - clock["last"]
            print(
                f"[round {server_round}] epsilon {strategy.ledger.epsilon():.3f}  accuracy {acc:.3f}  "
                f"time {round_seconds[server_round]:.1f} s  upload {upload:,} B/client "
                f"({upload / (4 * dim):.3f}x dense float32)",
                flush=True,
            )
        clock["last"] = time.perf_counter()
        return MetricRecord({"accuracy": acc})

    train_config = ConfigRecord(
        {
            "dataset": dataset,
            "data-dir": str(config["data-dir"]),
            **{key: config[key] for key in ("local-epochs", "lr", "batch-size", "seed", "samples-per-client")},
        }
    )
    num_rounds = int(config["num-server-rounds"])
    initial = task.to_record(initial_model)
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=num_rounds,
        timeout=float(config["round-timeout"]),
        train_config=train_config,
        evaluate_fn=server_accuracy,
    )
    rows = round_rows(result, num_rounds)
    for row in rows:
        row["round_s"] = round_seconds.get(row["round"])
        row["upload_bytes_per_client"] = upload
    print("\n".join(round_lines(rows)), flush=True)
    report = strategy.ledger.report()
    print(
        f"epsilon {report.epsilon:.3f} at delta {report.delta:g} (add/remove one client's data; the server sees "
        f"only the secure sum)",
        flush=True,
    )
    if config["results-dir"]:
        initial_accuracy = result.evaluate_metrics_serverapp.get(0, {}).get("accuracy")
        path = write_run_results(
            os.path.abspath(str(config["results-dir"])),
            "distributed DP (SecAgg+ and Skellam)",
            rows,
            initial_accuracy=None if initial_accuracy is None else float(initial_accuracy),
            delta=report.delta,
            extra={
                "config": {**config, "dataset": dataset},
                "model_values": dim,
                "upload_bytes_per_client": upload,
                "dense_float32_bytes": 4 * dim,
                "privacy": {"epsilon": report.epsilon, "delta": report.delta},
                "train_metrics": {str(r): dict(m) for r, m in result.train_metrics_clientapp.items()},
            },
            panels=[
                {"title": "distributed DP", "ylabel": "effective noise multiplier", "series": {"z": "noise_multiplier"}}
            ],
        )
        print(f"results written to {path}", flush=True)
