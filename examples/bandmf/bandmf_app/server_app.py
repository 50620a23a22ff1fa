"""ServerApp: FedAvg wrapped in AccountedBandedMatrixFactorization.

The N clients are split into b groups; round t trains group (t - 1) mod b, so every client trains at most
once every b rounds and at most ⌈T/b⌉ times (enforced: a reply that breaks it is refused). The public
denominator is the expected group size m = N / b. Prints ``round r  accuracy a  epsilon e`` per round.
"""

from __future__ import annotations

import math

from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flwr_dp_strategies import AccountedBandedMatrixFactorization, PrivacyLedger
from flwr_dp_strategies.rounds.client_metrics import AccountedMetrics

from . import task

app = ServerApp()


def build_strategy(config: dict) -> AccountedBandedMatrixFactorization:
    clients, bands, rounds = int(config["num-partitions"]), int(config["num-bands"]), int(config["num-server-rounds"])
    fedavg = FedAvg(
        fraction_train=1.0,  # the strategy picks the group; FedAvg makes the instruction
        fraction_evaluate=1.0,
        min_available_nodes=clients,
        min_train_nodes=1,
        weighted_by_key="unit-weight",
    )
    return AccountedBandedMatrixFactorization(
        fedavg,
        float(config["noise-multiplier"]),
        float(config["clipping-norm"]),
        math.ceil(clients / bands),  # m: the expected cohort, the public denominator
        num_bands=bands,
        num_rounds=rounds,
        factorization=str(config["factorization"]),
        ledger=PrivacyLedger(float(config["target-delta"])),
        ledger_path=str(config["ledger-path"]) or None,
        resume=bool(config["resume-ledger"]),
        # the clients' accuracy is a statistic of their data: released noised, in [0, 1], booked in the ledger
        evaluate_metrics=AccountedMetrics({"accuracy": (0.0, 1.0)}, float(config["eval-noise-multiplier"])),
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = task.run_config(context)
    strategy = build_strategy(config)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({k: Array(v) for k, v in task.initial_model().items()}),
        num_rounds=int(config["num-server-rounds"]),
        train_config=ConfigRecord(),
        evaluate_config=ConfigRecord(),
    )
    for rnd, metrics in sorted(result.evaluate_metrics_clientapp.items()):
        epsilon = metrics.get("privacy/epsilon", float("nan"))  # training and the noised accuracies so far
        print(f"round {rnd}  accuracy {metrics['dp-eval/accuracy']:.3f} (noised)  epsilon {epsilon:.2f}", flush=True)
