"""Per-round log of one run (central accuracy, ε, MagRR state, upload sizes) and its JSON file.

:class:`RoundLog` is the ``evaluate_fn`` of ``Strategy.start``; :meth:`RoundLog.attach`
wraps the strategy's ``aggregate_train`` (on the instance) to keep each round's
train metrics and, for SignDS, the MagRR state the round was *encoded and rebuilt
with* (``r_est`` sent to the clients; the strategy's ``signds/r-est`` metric is the
value for the *next* round).

:func:`write_run` writes ``run-<name>.json`` and ``run-<name>.png`` (accuracy and ε
against the round) at the end of every run.

Upload sizes per client: ``values`` (numbers sent: h indices + sign + b̂ for
SignDS, d floats for FedAvg), ``payload bytes`` (values × item size: int64 for
SignDS, float32 for FedAvg) and ``serialized bytes`` (Flower's ``Array.data``,
which adds a 128-byte ``.npy`` header per array).
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

from flwr.app import ArrayRecord, MetricRecord

from flwr_dp_experiments.results import write_run_results

from . import task

INT64_BYTES, FLOAT32_BYTES = 8, 4


def finite(value: Optional[float]) -> Optional[float]:
    """JSON-safe float: None for missing or non-finite values."""
    return None if value is None or not math.isfinite(float(value)) else float(value)


class RoundLog:
    """Central evaluation on the test split + one row per round; see the module docstring."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.dataset = str(config["dataset"])
        self.hidden = task.hidden_units(self.dataset, int(config["hidden"]))
        self.d = task.num_parameters(self.dataset, self.hidden)
        model = task.build_model(self.dataset, self.hidden)
        self.dense_serialized_bytes = sum(len(a.data) for a in ArrayRecord(model.state_dict()).values())
        self.signds = config["strategy"] == "signds"
        self.initial_accuracy: Optional[float] = None
        self.rows: list[dict[str, Any]] = []
        self.train_metrics: dict[int, dict[str, float]] = {}
        self.rejected: dict[int, dict[str, int]] = {}
        self.server_figures: dict[int, dict[str, float]] = {}
        self.state_used: dict[int, tuple[float, int]] = {}
        self.started = time.perf_counter()

    def attach(self, strategy: Any) -> None:
        """Keep every round's train metrics (and SignDS' MagRR state before the round)."""
        original = strategy.aggregate_train

        def aggregate_train(server_round: int, replies: Any) -> Any:
            if hasattr(strategy, "state"):
                self.state_used[server_round] = (float(strategy.state.r_est), int(strategy.state.is_reached))
            arrays, metrics = original(server_round, replies)
            self.train_metrics[server_round] = (
                {} if metrics is None else {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            )
            # rejection counts stay on the server (never in the round's metrics): read from the strategy
            self.rejected[server_round] = dict(getattr(strategy, "rejections", {}).get("train", {}))
            # counts that move with who replied (the debiased ones, the fallback flag): the server's log only
            self.server_figures[server_round] = dict(getattr(strategy, "server_figures", {}).get("train", {}))
            return arrays, metrics

        strategy.aggregate_train = aggregate_train

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the global model on the test split; log round >= 1."""
        model = task.build_model(self.dataset, self.hidden)
        model.load_state_dict(arrays.to_torch_state_dict())
        _, _, x_test, y_test = task.load_data(self.dataset, str(self.config["data-dir"]))
        loss, accuracy = task.test(model, x_test, y_test)
        if server_round == 0:
            self.initial_accuracy = accuracy
            self.started = time.perf_counter()
            print(
                f"[{self.config['strategy']}/{self.dataset}] d = {self.d}, initial accuracy {accuracy:.3f}", flush=True
            )
        else:
            row = self._row(server_round, accuracy, loss)
            self.rows.append(row)
            print(self.format_row(row), flush=True)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def _row(self, server_round: int, accuracy: float, loss: float) -> dict[str, Any]:
        metrics = self.train_metrics.get(server_round, {})
        row: dict[str, Any] = {
            "round": server_round,
            "accuracy": accuracy,
            "loss": loss,
            "elapsed_s": time.perf_counter() - self.started,
            "train_loss": finite(metrics.get("train-loss")),
            "dense_values": self.d,
            "dense_payload_bytes": FLOAT32_BYTES * self.d,
            "dense_serialized_bytes": self.dense_serialized_bytes,
        }
        if not self.signds:
            row.update(
                values_per_client=self.d,
                payload_bytes_per_client=FLOAT32_BYTES * self.d,
                serialized_bytes_per_client=self.dense_serialized_bytes,
                epsilon=None,
                epsilon_round=None,
            )
            return row
        r_est, phase = self.state_used.get(server_round, (float("nan"), -1))
        values = metrics.get("signds/values-per-client", float("nan"))
        row.update(
            epsilon=finite(metrics.get("privacy/epsilon")),
            epsilon_rdp=finite(metrics.get("privacy/epsilon-rdp")),
            epsilon_pld=finite(metrics.get("privacy/epsilon-pld")),
            epsilon_round=float(self.config["sign-eps"]) + float(self.config["rr-eps"]),
            r_est=r_est,
            is_reached=phase,
            r_est_next=finite(metrics.get("signds/r-est")),
            is_reached_next=finite(metrics.get("signds/is-reached")),
            step=finite(metrics.get("signds/step")),
            majority=finite(metrics.get("signds/majority")),
            debiased_ones=finite(self.server_figures.get(server_round, {}).get("signds/debiased-ones")),
            fallback=finite(self.server_figures.get(server_round, {}).get("signds/fallback")),
            values_per_client=finite(values),
            indices_per_client=finite(values - 2.0),
            payload_bytes_per_client=finite(INT64_BYTES * values),
            serialized_bytes_per_client=finite(metrics.get("signds/bytes-per-client")),
            rejected=self.rejected.get(server_round, {}),
        )
        return row

    def format_row(self, row: dict[str, Any]) -> str:
        """One line per round: ``round r/N``, accuracy, ε, r_est, upload, elapsed seconds."""
        head = (
            f"[{self.config['strategy']}/{self.dataset}] round {row['round']:>3}/{self.config['num-server-rounds']}"
            f"  accuracy {row['accuracy']:.3f}"
        )
        upload = (
            f"upload/client {row['values_per_client']:g} values ({row['payload_bytes_per_client']:g} B) "
            f"vs dense {row['dense_values']} ({row['dense_payload_bytes']} B)  [{row['elapsed_s']:.0f} s]"
        )
        if not self.signds:
            return f"{head}  eps inf (not private)  {upload}"
        phase = {0: "growth", 1: "shrink"}.get(row["is_reached"], "?")
        eps = "n/a" if row["epsilon"] is None else f"{row['epsilon']:.1f}"
        return f"{head}  eps {eps} (+{row['epsilon_round']:g}/round)  r_est {row['r_est']:.3g} ({phase})  {upload}"


def privacy_summary(strategy: Any) -> Optional[dict[str, Any]]:
    """The ledger's final figures (None for plain FedAvg: nothing is accounted, ε = ∞)."""
    ledger = getattr(strategy, "ledger", None)
    if ledger is None:
        return None
    report = ledger.report()
    return {
        "epsilon": finite(report.epsilon),
        "epsilon_rdp": finite(report.epsilon_rdp),
        "epsilon_pld": finite(report.epsilon_pld),
        "delta": report.delta,
        "method": report.method,
        "neighboring_relation": ledger.neighboring_relation,
        "clients": len(ledger.clients),
        "unit": "a client's whole update in one round (local DP: any two updates are neighbours)",
    }


def write_run(log: RoundLog, strategy: Any, results_dir: str, name: str) -> str:
    """Write ``run-<name>.json`` and its plot ``run-<name>.png`` into ``results_dir`` (the shared writer)."""
    privacy = privacy_summary(strategy)
    extra = {
        "name": name,
        "config": log.config,
        "d": log.d,
        "hidden": log.hidden,
        "wall_s": time.perf_counter() - log.started,
        "privacy": privacy,
    }
    return write_run_results(
        results_dir,
        str(log.config["strategy"]),
        log.rows,
        extra=extra,
        initial_accuracy=log.initial_accuracy,
        delta=1e-5,
        title=f"{log.config['strategy']} on {log.config['dataset']}",
        epsilon_label="epsilon per client (LDP, cumulative)",
        no_dp_text="FedAvg: no DP, epsilon = inf",
        json_name=f"run-{name}.json",
        png_name=f"run-{name}.png",
    )
