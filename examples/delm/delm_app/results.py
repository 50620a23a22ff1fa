"""Per-round log of the DELM app (central accuracy, ε from the ledger, elapsed time), results JSON and plot."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord

from flwr_dp_experiments.results import RESULTS_JSON, RESULTS_PNG, write_run_results
from flwr_dp_experiments.results import finite as _finite
from flwr_dp_strategies.privacy import PrivacyLedger

from . import task


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
            row = {
                "round": server_round,
                "accuracy": accuracy,
                "epsilon": _finite(self.ledger.epsilon()),
                "elapsed_s": time.perf_counter() - self.started,
            }
            self.rows.append(row)
            print(
                f"round {server_round}/{self.num_rounds}  accuracy {accuracy:.3f}  epsilon "
                f"{row['epsilon'] if row['epsilon'] is None else round(row['epsilon'], 3)} "
                f"(record-level, delta {self.ledger.target_delta:g})  [{row['elapsed_s']:.0f} s]",
                flush=True,
            )
        return MetricRecord({"accuracy": accuracy})


def write_results(log: RoundLog, extra: dict[str, Any], results_dir: str) -> str:
    """results.json and results.png in ``results_dir`` (the shared writer); returns the JSON path."""
    report = log.ledger.report()
    privacy = {
        "epsilon": _finite(report.epsilon),
        "delta": report.delta,
        "method": report.method,
        "neighboring_relation": log.ledger.neighboring_relation,
        "unit": "record-level (one example of one client; worst client)",
        "clients": len(log.ledger.clients),
    }
    config = log.config
    return write_run_results(
        results_dir,
        f"DELM {config['variant']}",
        log.rows,
        extra={"config": config, "privacy": privacy, **extra},
        delta=report.delta,
        title=f"DELM {config['variant']} ({config['dataset']}, {config['scheme']})",
        epsilon_label="epsilon (record-level, replace-one)",
        json_name=RESULTS_JSON,
        png_name=RESULTS_PNG,
    )
