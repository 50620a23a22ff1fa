"""ServerApp: FedAvg training + MindSpore-style unsupervised evaluation of the clients' inference results.

Strategy: ``ClusterEvaluation.from_run_config(FedAvg(...), config, ledger=...)``.
Plain ``FedAvg`` trains (all ``num-partitions`` clients every round; training is
not private in this example, as in the seed: only the inference upload is
protected); ``ClusterEvaluation`` books the clients' Laplace declarations in its
:class:`PrivacyLedger` (``replace_one``: local DP, one client's vector replaced
by any other), so ``privacy/epsilon`` is the ε of the inference releases; it
sends the privacy mode (``privacy-eval-type``, ``laplace-eval-eps``) in the
evaluate config, clusters the (noisy) mean softmax vectors by argmax and
reports silhouette / Calinski-Harabasz / Davies-Bouldin.

Per round it prints::

    round 3/12  accuracy 0.284 (clients 0.301)  silhouette 0.031  CH 6.52  DB 1.520  labels 8/50  epsilon 6.9e+05 (LAPLACE)  [9 s]

``accuracy`` is the global model's accuracy on the central test split,
``clients`` the clients' weighted local evaluation accuracy, the three scores
those of the clustering (``unsupervised-eval`` is the ``eval-type`` one), and
``epsilon`` the worst client's composed LDP ε so far (one Laplace release per
evaluate round; ``inf`` in NOT_ENCRYPT mode, whose results leave unprotected and
are booked as nothing), then the seconds since round 1 started. At the end it
writes a JSON log holding, per round, those figures and the inference vectors
the server received, and a PNG of accuracy, the cluster scores and ε against
the round: ``results-file`` if set, else ``<results-dir>/run-<mode>.json`` (and
``.png``; see :mod:`.results`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flwr_dp_experiments.results import write_run_results
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.rounds.metrics import with_privacy_metrics
from flwr_dp_strategies.rounds.template import RoundRelease, Screened
from flwr_dp_strategies.strategy import ClusterEvaluation

from . import task
from .config import resolve_run_config
from .results import SCORES, results_paths

SCORE_KEYS = ("silhouette", "calinski-harabasz", "davies-bouldin")

app = ServerApp()


class RecordingClusterEvaluation(ClusterEvaluation):
    """:class:`ClusterEvaluation` that also keeps each round's received inference vectors and metrics.

    ``last_points``: (n, k) array of the vectors of the non-error replies of the
    last evaluate round, ordered by node id (as the server received them: noisy
    in LAPLACE mode); ``last_metrics``: that round's metrics with the ledger's
    figures as they stand when read (after the round's bookings).
    """

    last_points: Optional[np.ndarray] = None
    _released: Optional[MetricRecord] = None

    @property
    def last_metrics(self) -> Optional[MetricRecord]:
        """The last evaluate round's metrics with the ledger's figures (None before the first round)."""
        return None if self._released is None else with_privacy_metrics(self._released, self.ledger)

    def release_evaluate(self, server_round: int, screened: Screened) -> RoundRelease:
        """Record the inference vectors, then :meth:`ClusterEvaluation.release_evaluate`."""
        received = sorted(
            (
                reply.metadata.src_node_id,
                np.concatenate(
                    [np.asarray(a.numpy(), np.float64).ravel() for a in reply.content[self.inference_key].values()]
                ),
            )
            for reply in screened.replies
            if not reply.has_error() and self.inference_key in reply.content.array_records
        )
        self.last_points = np.stack([vector for _, vector in received]) if received else None
        release = super().release_evaluate(server_round, screened)
        self._released = release.metrics
        return release


def _finite(value: Optional[float]) -> Optional[float]:
    """JSON-safe float: None for missing or non-finite values."""
    return None if value is None or not math.isfinite(value) else float(value)


@dataclass
class RoundLog:
    """``evaluate_fn`` for ``Strategy.start``: central accuracy plus the round's cluster scores and ε."""

    strategy: RecordingClusterEvaluation
    config: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    initial_accuracy: Optional[float] = None
    started: float = field(default_factory=time.perf_counter)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the global model centrally; for round >= 1 log the clients' figures too."""
        dataset = str(self.config["dataset"])
        model = task.build_model(str(self.config["model"]), task.num_features(dataset))
        model.load_state_dict(arrays.to_torch_state_dict())
        _, _, x_test, y_test = task.load_data(dataset, str(self.config["data-dir"]))
        loss, accuracy, _ = task.evaluate(model, x_test, y_test)
        if server_round == 0:
            self.initial_accuracy = accuracy
            self.started = time.perf_counter()
            return MetricRecord({"accuracy": accuracy, "loss": loss})
        metrics = dict(self.strategy.last_metrics or {})
        protected = self.strategy.privacy_eval_type == "LAPLACE"
        row: dict[str, Any] = {
            "round": server_round,
            "accuracy": accuracy,
            "loss": loss,
            "client_accuracy": _finite(metrics.get("eval-acc")),
            "unsupervised_eval": _finite(metrics.get("unsupervised-eval")),
            **{name: _finite(metrics.get(f"cluster/{name}")) for name in SCORE_KEYS},
            # a count of the replies: kept in the server's log, never in the published metrics
            "points": int(getattr(self.strategy, "server_figures", {}).get("evaluate", {}).get("cluster/points", 0)),
            "labels": int(metrics.get("cluster/labels", 0)),
            "epsilon": _finite(metrics.get("privacy/epsilon")) if protected else None,
            "rejected": dict(getattr(self.strategy, "rejections", {}).get("evaluate", {})),  # server-side counts
            "metrics": {key: float(value) for key, value in metrics.items() if isinstance(value, (int, float))},
            "inference": None if self.strategy.last_points is None else self.strategy.last_points.tolist(),
            "elapsed_s": time.perf_counter() - self.started,
        }
        self.rows.append(row)
        print(format_row(row, self.strategy.privacy_eval_type, int(self.config["num-server-rounds"])), flush=True)
        return MetricRecord({"accuracy": accuracy, "loss": loss})


def format_row(row: dict[str, Any], mode: str, num_rounds: int) -> str:
    """One line per round: ``round r/N``, accuracy, the three cluster scores, labels, ε and elapsed seconds."""

    def num(value: Optional[float], fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    eps = "inf (NOT_ENCRYPT: sent without noise)" if row["epsilon"] is None else f"{row['epsilon']:.4g} ({mode})"
    return (
        f"round {row['round']}/{num_rounds}  accuracy {row['accuracy']:.3f} "
        f"(clients {num(row['client_accuracy'], '.3f')})  silhouette {num(row['silhouette'], '.3f')}  "
        f"CH {num(row['calinski-harabasz'], '.2f')}  DB {num(row['davies-bouldin'], '.3f')}  "
        f"labels {row['labels']}/{row['points']}  epsilon {eps}  [{row['elapsed_s']:.0f} s]"
    )


def build_strategy(config: dict[str, Any]) -> RecordingClusterEvaluation:
    """Plain FedAvg over all clients, wrapped in the cluster evaluation (replace-one LDP ledger of the
    inference releases; the training updates are not private here and not in this ledger)."""
    clients = int(config["num-partitions"])
    ledger = PrivacyLedger(float(config["target-delta"]), neighboring_relation="replace_one")
    fedavg = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=1.0,
        min_train_nodes=clients,
        min_evaluate_nodes=clients,
        min_available_nodes=clients,
    )
    # The ledger covers the inference releases only (the README says so); the training of the
    # wrapped FedAvg is not private, and we opt out of booking it as such explicitly.
    return RecordingClusterEvaluation.from_run_config(fedavg, config, ledger=ledger, book_unaccounted_training=False)


CLIENT_KEYS = (
    "model",
    "local-epochs",
    "lr",
    "batch-size",
    "seed",
    "partitioner",
    "classes-per-partition",
    "dirichlet-alpha",
    "eval-share",
    "dataset",
    "data-dir",
)


def client_config(config: dict[str, Any]) -> ConfigRecord:
    """What the ClientApp needs (hyperparameters and how to partition), sent with every message."""
    return ConfigRecord({key: config[key] for key in CLIENT_KEYS})


def write_log(
    path: str,
    log: RoundLog,
    strategy: RecordingClusterEvaluation,
    config: dict[str, Any],
    png_path: Optional[str] = None,
) -> None:
    """The run's JSON log: config, per-round rows (with the received vectors) and the privacy summary;
    with ``png_path``, also its plot (accuracy, cluster scores and ε against the round)."""
    report = strategy.ledger.report()
    data = {
        "config": config,
        "privacy_eval_type": strategy.privacy_eval_type,
        "laplace_eval_eps": strategy.laplace_eval_eps,
        "eval_type": strategy.eval_type,
        "initial_accuracy": log.initial_accuracy,
        "rounds": log.rows,
        "privacy": {
            "epsilon": _finite(report.epsilon),
            "delta": report.delta,
            "method": report.method,
            "neighboring_relation": strategy.ledger.neighboring_relation,
            "clients": report.num_clients,
            "releases": sum(len(strategy.ledger.events(c)) for c in strategy.ledger.clients),
            "unit": "one client's inference vector (local DP), composed over evaluate rounds",
        },
    }
    folder = os.path.dirname(os.path.abspath(path))
    mode = strategy.privacy_eval_type
    write_run_results(
        folder,
        mode,
        log.rows,
        extra=data,
        initial_accuracy=log.initial_accuracy,
        json_indent=None,
        json_name=os.path.basename(path),
        png_name=os.path.basename(png_path) if png_path else None,
        title=f"{config['dataset']}: training progress",
        accuracy_label="accuracy",
        accuracy_series={"central test": "accuracy", "clients (local eval)": "client_accuracy"},
        epsilon_label="epsilon per client (LDP, composed)",
        no_dp_text="NOT_ENCRYPT: sent without noise,\nepsilon = inf",
        epsilon_title=(
            f"privacy spent (LAPLACE, {strategy.laplace_eval_eps:g} per round)"
            if mode == "LAPLACE"
            else "privacy spent"
        ),
        panels=[{"title": title, "series": {key: key}} for key, title in SCORES],
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds, print one line per round, write the JSON log and its plot."""
    config = resolve_run_config(context)
    strategy = build_strategy(config)
    torch.manual_seed(int(config["seed"]))
    model = task.build_model(str(config["model"]), task.num_features(str(config["dataset"])))
    log = RoundLog(strategy, config)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=client_config(config),
        evaluate_config=client_config(config),
        evaluate_fn=log,
    )
    json_path, png_path = results_paths(config)
    write_log(json_path, log, strategy, config, png_path)
    print(f"run log written to {json_path}, plot to {png_path}", flush=True)
