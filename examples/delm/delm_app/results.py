"""Per-round log of the DELM app (central accuracy, ε from the ledger, elapsed time), results JSON and plot."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from flwr.app import ArrayRecord, MetricRecord

from flwr_dp_strategies.privacy import PrivacyLedger

from . import task

RESULTS_JSON = "results.json"
RESULTS_PNG = "results.png"


def _finite(value: Optional[float]) -> Optional[float]:
    return None if value is None or not math.isfinite(value) else float(value)


@dataclass
class RoundLog:
    """``evaluate_fn`` for ``Strategy.start``: accuracy of (x V) W on the test split, and ε so far."""

    config: dict[str, Any]
    projection: np.ndarray
    ledger: PrivacyLedger
    num_rounds: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate; log and print one progress line for every round >= 1."""
        x_test, y_test = task.test_data(self.config)
        head = arrays["head.weight"].numpy()
        accuracy = task.accuracy(x_test, y_test, self.projection, head)
        if server_round > 0:
            row = {"round": server_round, "accuracy": accuracy, "epsilon": _finite(self.ledger.epsilon()),
                   "elapsed_s": time.perf_counter() - self.started}
            self.rows.append(row)
            print(f"round {server_round}/{self.num_rounds}  accuracy {accuracy:.3f}  epsilon "
                  f"{row['epsilon'] if row['epsilon'] is None else round(row['epsilon'], 3)} "
                  f"(record-level, delta {self.ledger.target_delta:g})  [{row['elapsed_s']:.0f} s]", flush=True)
        return MetricRecord({"accuracy": accuracy})


def write_results(log: RoundLog, extra: dict[str, Any], results_dir: str) -> str:
    """results.json and results.png in ``results_dir``; returns the JSON path."""
    os.makedirs(results_dir, exist_ok=True)
    report = log.ledger.report()
    data = {
        "config": log.config, "rounds": log.rows,
        "privacy": {"epsilon": _finite(report.epsilon), "delta": report.delta, "method": report.method,
                    "neighboring_relation": log.ledger.neighboring_relation,
                    "unit": "record-level (one example of one client; worst client)",
                    "clients": len(log.ledger.clients)},
        **extra,
    }
    path = os.path.join(results_dir, RESULTS_JSON)
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2)
    plot(data, os.path.join(results_dir, RESULTS_PNG))
    return path


def plot(data: dict[str, Any], path: str) -> None:
    """Accuracy and ε against the round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [row["round"] for row in data["rounds"]]
    fig, (ax_acc, ax_eps) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_acc.plot(rounds, [row["accuracy"] for row in data["rounds"]], marker=".")
    ax_acc.set(xlabel="round", ylabel="central test accuracy", ylim=(0, 1),
               title=f"DELM {data['config']['variant']} ({data['config']['dataset']}, {data['config']['scheme']})")
    ax_eps.plot(rounds, [row["epsilon"] for row in data["rounds"]], marker=".", color="tab:red")
    ax_eps.set(xlabel="round", ylabel="epsilon (record-level, replace-one)",
               title=f"privacy spent (delta={data['privacy']['delta']:g})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
