"""ServerApp: DELM over a Flower Grid, every release booked in one record-level ledger.

1. LDP federated PCA (:class:`~flwr_dp_strategies.federated_pca.LdpFederatedPCA`, messages
   ``train.pca`` and ``train.pca_projection``): the projection V (d × q) from the
   mean of the clients' noisy second moments; skipped when ``components`` = 0
   (V = I: the head sits on the pixels and FM gets the whole budget).
2. Rounds of the chosen strategy on the FM heads W (q × c), which start at 0:
   ``basic`` AccountedFedAvg, ``enhanced`` MinDivergenceExpSampling (ε-EM picks),
   ``enhanced-nosampling`` (the k lowest divergences), ``shuffle`` ShuffleAmplifiedFedAvg
   (no amplification is claimed: FM releases are record-level, see its docstring),
   ``sum`` NoisyObjectiveSum (clients upload their noisy objectives; the server
   repairs and solves their sum with a noise-adapted ridge).
3. Central accuracy of (x V) W and the ledger's ε after every round; results.json
   and results.png in ``results-dir``.

The ledger uses the paper's replace-one relation. The enhanced scheme's server-side
selection is a separate release with its own ledger (``selection/epsilon``): it
protects which clients were chosen, not a client's records.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from flwr_dp_strategies import AccountedFedAvg, MinDivergenceExpSampling, NoisyObjectiveSum, ShuffleAmplifiedFedAvg
from flwr_dp_strategies.federated_pca import LdpFederatedPCA
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import fm_noise_std
from flwr_dp_strategies.rounds.client_accounting import resolve_ledger

from . import task
from .config import fm_epsilon, resolve_run_config
from .results import RoundLog, write_results

app = ServerApp()
RELATION = "replace_one"
SUM_RIDGE_FRACTION = 0.5  # NoisyObjectiveSum's ridge: half the summed noise's spectral edge (README.md)


def wait_for_nodes(grid: Grid, count: int, timeout: float = 600.0) -> list[int]:
    """The connected node ids once at least ``count`` are there (``TimeoutError`` after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while len(nodes := list(grid.get_node_ids())) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(nodes)} of {count} nodes connected after {timeout:.0f} s")
        time.sleep(1.0)
    return nodes


def build_strategy(
    config: dict[str, Any], ledger: PrivacyLedger, clients: int, head_shape: tuple[int, int]
) -> Strategy:
    """The strategy of ``config["variant"]`` over every connected client, booking into ``ledger``."""
    nodes = {
        "fraction_train": 1.0,
        "fraction_evaluate": 0.0,
        "min_train_nodes": clients,
        "min_available_nodes": clients,
        "ledger": ledger,
    }
    variant = config["variant"]
    if variant == "sum":
        q, classes = head_shape
        noise_std = fm_noise_std(
            q,
            classes,
            epsilon=fm_epsilon(config),
            noise=str(config["fm-noise"]),
            delta=float(config["target-delta"]),
            neighboring_relation=RELATION,
            calibration=str(config["fm-calibration"]),
        )
        return NoisyObjectiveSum(
            **nodes, num_classes=classes, client_noise_std=noise_std, ridge_fraction=SUM_RIDGE_FRACTION
        )
    if variant == "basic":
        return AccountedFedAvg(**nodes)
    if variant == "shuffle":
        return ShuffleAmplifiedFedAvg(**nodes, reports_are_ldp=False)
    selected = min(int(config["num-selected"]), max(1, clients // 2))
    epsilon: Optional[float] = float(config["selection-epsilon"]) if variant == "enhanced" else None
    return MinDivergenceExpSampling(num_selected=selected, epsilon=epsilon, **nodes)


def federated_projection(
    grid: Grid,
    config: dict[str, Any],
    dim: int,
    ledger: PrivacyLedger,
    ledger_path: Optional[str],
    resume: bool = False,
) -> tuple[np.ndarray, PrivacyLedger]:
    """LDP-FPCA's projection (d × q) and the ledger it booked into; the identity when ``components`` = 0."""
    components = min(int(config["components"]), dim)
    if components == 0:
        restored = resolve_ledger(ledger, ledger_path, resume=resume)
        print(f"no PCA: FM on the {dim} unit-norm pixel features", flush=True)
        return np.eye(dim), restored
    fpca = LdpFederatedPCA(dim, components, ledger=ledger, ledger_path=ledger_path, resume=resume)
    projection = fpca.run(grid)
    print(
        f"LDP-FPCA: projection {dim} x {components}; epsilon so far {fpca.ledger.epsilon():.3f}",
        flush=True,
    )
    return projection, fpca.ledger


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Federated PCA, then the FM rounds; print progress, write the results."""
    config = resolve_run_config(context)
    clients = int(config["min-clients"]) or int(config["num-partitions"])
    ledger_path = str(config["ledger-path"]) or None
    wait_for_nodes(grid, clients)
    dim, classes = task.input_dim(config), task.num_classes(config)
    ledger = PrivacyLedger(float(config["target-delta"]), neighboring_relation=RELATION)
    projection, ledger = federated_projection(grid, config, dim, ledger, ledger_path, config["resume-ledger"])
    components = projection.shape[1]
    strategy = build_strategy(config, ledger, clients, (components, classes))
    strategy.ledger_path = ledger_path  # the same ledger, saved after every round
    rounds = int(config["num-server-rounds"])
    log = RoundLog(config, projection, ledger, rounds)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({"head.weight": Array(np.zeros((components, classes)))}),
        num_rounds=rounds,
        train_config=ConfigRecord(),
        evaluate_fn=log,
    )
    extra = {
        "selection_epsilon": (
            float(strategy.selection_ledger.epsilon()) if hasattr(strategy, "selection_ledger") else None
        ),
        "train_metrics": {str(r): dict(m) for r, m in result.train_metrics_clientapp.items()},
    }
    path = write_results(log, extra, os.path.abspath(str(config["results-dir"])))
    print(f"results written to {path}", flush=True)
