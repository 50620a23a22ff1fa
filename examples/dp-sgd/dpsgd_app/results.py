"""Per-round log (central accuracy, the ledger's ε, Opacus' ε), results JSON and plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, MetricRecord

from client_mods.dp_sgd import EPSILON_METRIC, NOISE_METRIC, ROUND_EPSILON_METRIC
from flwr_dp_experiments.results import RESULTS_JSON, RESULTS_PNG, write_run_results
from flwr_dp_experiments.results import finite as _finite
from flwr_dp_strategies.privacy import PrivacyLedger

from . import task


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
            self.rows.append(
                {
                    "round": server_round,
                    "accuracy": accuracy,
                    "loss": loss,
                    "epsilon_ledger": _finite(report.epsilon),
                    "epsilon_ledger_rdp": _finite(report.epsilon_rdp),
                    "epsilon_ledger_pld": _finite(report.epsilon_pld),
                }
            )
            print(
                f"round {server_round}  accuracy {accuracy:.3f}  ledger epsilon {report.epsilon:.2f} "
                f"(delta {self.ledger.target_delta:g})",
                flush=True,
            )
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
        "epsilon": _finite(report.epsilon),
        "delta": report.delta,
        "method": report.method,
        "epsilon_rdp": _finite(report.epsilon_rdp),
        "epsilon_pld": _finite(report.epsilon_pld),
        "neighboring_relation": ledger.neighboring_relation,
        "unit": "record (one training example of a client; the client's dataset size is public)",
        "per_client_epsilon": {c: _finite(ledger.epsilon(c)) for c in ledger.clients},
        "releases": len(ledger.events()) + sum(len(ledger.events(c)) for c in ledger.clients),
    }


def write_results(log: RoundLog, config: dict[str, Any], results_dir: str) -> str:
    """Write results.json and results.png into ``results_dir`` (the shared writer); return the JSON path."""
    curves = {
        "server ledger (declared events, min of RDP/PLD)": "epsilon_ledger",
        "server ledger, RDP only": "epsilon_ledger_rdp",
        "Opacus accountant, cumulative (max over clients)": "epsilon_opacus_max",
        "Flower's Opacus example: fresh engine per round": "epsilon_flower_example",
    }
    return write_run_results(
        results_dir,
        "dp-sgd",
        log.rows,
        initial_accuracy=log.initial_accuracy,
        extra={"config": config, "privacy": privacy_summary(log.ledger)},
        title=f"DP-SGD on {config['dataset']}",
        epsilon_label="epsilon (record level)",
        epsilon_series=curves,
        epsilon_title=f"privacy spent per client (delta={config['target-delta']:g})",
        json_name=RESULTS_JSON,
        png_name=RESULTS_PNG,
    )
