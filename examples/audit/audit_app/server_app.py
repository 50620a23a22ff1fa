"""ServerApp: a central-DP FedAvg run with k canary clients, then the audit's figures and its plot.

The strategy is the one a real run would use (user-level central DP, fixed clipping, every node asked each round)::

    strategy = AccountedServerSideFixedClipping(FedAvg(...), z, C, N + k, ledger=PrivacyLedger(delta))

and :class:`~flwr_dp_strategies.audit.CanaryAudit` drives it with k canary clients next to the N real ones
(Andrew et al., ICLR 2024). The run is a *rehearsal*: the same configuration as the real run, plus canaries; the real
model is trained without them. ``broken = true`` swaps in :class:`UnderNoisedFixedClipping`, which books z but adds
``broken-noise-fraction · z`` (half by default): the misconfiguration the audit is there to catch.

The audit's work (the canaries' directions and cosines, d-sized vectors) runs with one BLAS thread: next to the
simulation's workers, NumPy's default thread pool made it about eight times slower.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from threadpoolctl import threadpool_limits

from flwr_dp_strategies import AccountedServerSideFixedClipping, PrivacyLedger
from flwr_dp_strategies.audit import AuditReport, CanaryAudit, plot_audit

from . import task
from .config import resolve_run_config

app = ServerApp()


class UnderNoisedFixedClipping(AccountedServerSideFixedClipping):
    """A deliberate bug: the ledger books ``noise_multiplier`` z, the release adds ``release_fraction · z · C / m``."""

    def __init__(self, *args, release_fraction: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release_fraction = float(release_fraction)

    def release_noise_multiplier(self) -> float:
        """The z the release actually uses."""
        return self.noise_multiplier * self.release_fraction

    def _fixed_release(self, summed, generator):
        booked = self.noise_multiplier
        self.noise_multiplier = self.release_noise_multiplier()
        try:
            return super()._fixed_release(summed, generator)
        finally:
            self.noise_multiplier = booked


def build_strategy(config: dict) -> AccountedServerSideFixedClipping:
    """Fixed clipping over all N + k nodes (real clients and canaries), with its ledger; under-noised if ``broken``."""
    n, k = int(config["num-partitions"]), int(config["num-canaries"])
    fedavg = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n + k)
    args = (fedavg, float(config["noise-multiplier"]), float(config["clipping-norm"]), n + k)
    ledger = PrivacyLedger(float(config["target-delta"]))
    if config["broken"]:
        return UnderNoisedFixedClipping(*args, ledger=ledger, release_fraction=float(config["broken-noise-fraction"]))
    return AccountedServerSideFixedClipping(*args, ledger=ledger)


def build_audit(strategy: AccountedServerSideFixedClipping, config: dict) -> CanaryAudit:
    """k canaries of norm 10 C (the default: clipped to C by the release), seeded from ``audit-seed``."""
    seed = int(config["audit-seed"])
    return CanaryAudit(
        strategy,
        num_canaries=int(config["num-canaries"]),
        seed=None if seed < 0 else seed,
        confidence=float(config["confidence"]),
        delta=float(config["target-delta"]),
    )


def server_accuracy(config: dict):
    """``evaluate_fn``: test accuracy of the global model (the server's held-out split)."""

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = task.build_model(int(config["hidden-units"]))
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": task.test_accuracy(model)})

    return evaluate


def report_json(report: AuditReport, config: dict, dim: int) -> dict:
    """The report's figures, the setting they refer to, and the cosines (for re-plotting)."""
    return {
        "method": "canary audit (Andrew et al. 2024)",
        "config": config,
        "model-dimension": dim,
        "report": dict(report.metric_record()),
        "seed": report.seed,
        "delta": report.delta,
        "confidence": report.confidence,
        "num-canaries": report.num_canaries,
        "cosines": {
            name: np.asarray(getattr(report, name)).tolist()
            for name in ("inserted_final", "null_final", "inserted_all_iterates", "null_all_iterates")
        },
    }


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train with the canaries, log the audit, write ``audit.json`` and the figure ``audit.png``."""
    config = resolve_run_config(context)
    torch.manual_seed(int(config["seed"]))
    strategy = build_strategy(config)
    audit = build_audit(strategy, config)
    initial = ArrayRecord(task.build_model(int(config["hidden-units"])).state_dict())
    dim = sum(int(np.prod(a.shape)) for a in initial.values())
    print(
        f"audit rehearsal: {config['num-partitions']} clients + {audit.num_canaries} canaries, model d = {dim}, "
        f"z booked {strategy.noise_multiplier:g}"
        + (f", z released {strategy.release_noise_multiplier():.3g} (broken)" if config["broken"] else ""),
        flush=True,
    )
    with threadpool_limits(limits=1):
        result, report = audit.start(
            grid,
            initial,
            num_rounds=int(config["num-server-rounds"]),
            train_config=ConfigRecord({key: config[key] for key in ("local-epochs", "lr", "batch-size", "seed")}),
            evaluate_fn=server_accuracy(config),
        )
    accuracy = result.evaluate_metrics_serverapp.get(max(result.evaluate_metrics_serverapp, default=0), {})
    print(f"final accuracy {float(accuracy.get('accuracy', float('nan'))):.3f}", flush=True)
    for key, value in report.metric_record().items():
        print(f"{key} {value:.4f}", flush=True)
    if config["results-dir"]:
        out = os.path.abspath(str(config["results-dir"]))
        os.makedirs(out, exist_ok=True)
        figure = os.path.join(out, "audit.png")
        plot_audit(report, figure)
        with open(os.path.join(out, "audit.json"), "w", encoding="utf-8") as handle:
            json.dump(report_json(report, config, dim), handle)
        print(f"audit figure written to {figure}", flush=True)
