"""Per-round log (central accuracy, the ledger's ε, Opacus' ε), results JSON and plot."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, MetricRecord

from client_mods.dp_sgd import EPSILON_METRIC, NOISE_METRIC, ROUND_EPSILON_METRIC
from flwr_dp_strategies.privacy import PrivacyLedger

from . import task

RESULTS_JSON = "results.json"
RESULTS_PNG = "results.png"


def _finite(value: float | None) -> float | None:
    """JSON-safe float: None for missing or non-finite values."""
    return None if value is None or not math.isfinite(value) else float(value)


@dataclass
class RoundLog:
    """``evaluate_fn`` for ``Strategy.start``: central test accuracy and the ledger's ε, per round."""

    dataset: str
    data_dir: str
    hidden: int
    ledger: PrivacyLedger
    initial_accuracy: float | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the global model on the server's test split; log round >= 1."""
        model = task.build_model(task.num_features(self.dataset), self.hidden)
        model.load_state_dict(arrays.to_torch_state_dict())
        _, _, x_test, y_test = task.load_data(self.dataset, self.data_dir)
        loss, accuracy = task.test(model, x_test, y_test)
        if server_round == 0:
            self.initial_accuracy = accuracy
        else:
            report = self.ledger.report()
            self.rows.append({
                "round": server_round, "accuracy": accuracy, "loss": loss,
                "epsilon_ledger": _finite(report.epsilon), "epsilon_ledger_rdp": _finite(report.epsilon_rdp),
                "epsilon_ledger_pld": _finite(report.epsilon_pld),
            })
            print(f"round {server_round}  accuracy {accuracy:.3f}  ledger epsilon {report.epsilon:.2f} "
                  f"(delta {self.ledger.target_delta:g})", flush=True)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def add_client_metrics(self, train_metrics: dict[int, MetricRecord]) -> None:
        """Merge the aggregated client metrics of every round (Opacus' ε, the per-round ε) into the rows."""
        for row in self.rows:
            metrics = train_metrics.get(row["round"])
            if metrics is None:
                continue
            row["privacy_epsilon_metric"] = _finite(float(metrics["privacy/epsilon"]))
            row["epsilon_opacus_max"] = _finite(float(metrics[EPSILON_METRIC]))
            row["epsilon_opacus_clients"] = [float(v) for v in metrics[f"{EPSILON_METRIC}/clients"]]
            row["epsilon_flower_example"] = _finite(float(metrics[ROUND_EPSILON_METRIC]))
            row["noise_multiplier"] = float(metrics[NOISE_METRIC])


def privacy_summary(ledger: PrivacyLedger) -> dict[str, Any]:
    """What the final ε means, for the results JSON."""
    report = ledger.report()
    return {
        "epsilon": _finite(report.epsilon), "delta": report.delta, "method": report.method,
        "epsilon_rdp": _finite(report.epsilon_rdp), "epsilon_pld": _finite(report.epsilon_pld),
        "neighboring_relation": ledger.neighboring_relation,
        "unit": "record (one training example of a client; the client's dataset size is public)",
        "per_client_epsilon": {c: _finite(ledger.epsilon(c)) for c in ledger.clients},
        "releases": len(ledger.events()) + sum(len(ledger.events(c)) for c in ledger.clients),
    }


def write_results(log: RoundLog, config: dict[str, Any], results_dir: str) -> str:
    """Write results.json and results.png into ``results_dir``; return the JSON path."""
    os.makedirs(results_dir, exist_ok=True)
    data = {"config": config, "initial_accuracy": log.initial_accuracy, "rounds": log.rows,
            "privacy": privacy_summary(log.ledger)}
    path = os.path.join(results_dir, RESULTS_JSON)
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2)
    plot_results(data, os.path.join(results_dir, RESULTS_PNG))
    return path


def plot_results(data: dict[str, Any], path: str) -> None:
    """Accuracy and ε against the round (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rounds"]
    rounds = [row["round"] for row in rows]
    fig, (ax_acc, ax_eps) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_acc.plot([0] + rounds, [data["initial_accuracy"]] + [row["accuracy"] for row in rows], marker="o")
    ax_acc.set(xlabel="round", ylabel="central test accuracy", ylim=(0, 1),
               title=f"DP-SGD on {data['config']['dataset']}")
    curves = [("epsilon_ledger", "server ledger (declared events, min of RDP/PLD)", "-", "o", 1.5),
              ("epsilon_ledger_rdp", "server ledger, RDP only", "-", "", 0.8),
              ("epsilon_opacus_max", "Opacus accountant, cumulative (max over clients)", "--", "s", 1.5),
              ("epsilon_flower_example", "Flower's Opacus example: fresh engine per round", ":", "x", 1.5)]
    for key, label, style, marker, width in curves:
        ax_eps.plot(rounds, [row.get(key) for row in rows], linestyle=style, marker=marker or None,
                    linewidth=width, label=label)
    target = float(data["config"].get("target-epsilon", 0.0))
    if target > 0:
        ax_eps.axhline(target, color="grey", linewidth=0.8, label=f"target epsilon {target:g}")
    ax_eps.set(xlabel="round", ylabel="epsilon (record level)", ylim=(0, None),
               title=f"privacy spent per client (delta={data['config']['target-delta']:g})")
    ax_eps.legend(fontsize=7)
    for axis in (ax_acc, ax_eps):
        axis.set_xticks([0] + rounds if axis is ax_acc else rounds)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
