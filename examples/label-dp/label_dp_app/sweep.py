"""Several label-DP experiments one after the other in one run (the app's ``sweep-file`` run config).

Starting a Ray simulation costs about 25 s on 2 cores, far more than one run's
training (about 10 s), so ``run_experiment.py`` runs the whole ε sweep in one
run: it writes the experiments' overrides to a JSON file and submits the app
with ``sweep-file`` pointing at it; the ServerApp calls :func:`run_sweep` and
writes the list of results to ``results-file``. Each experiment is an independent vertical run: the label party
gets a fresh Context (so the labels are randomised anew with that experiment's
ε, and booked in that experiment's ledger) and the feature parties start fresh
bottom models when the ``experiment`` tag changes.

Note on privacy: the experiments of a sweep randomise the *same* labels once
per experiment, so the sweep as a whole composes (ε_total = Σ ε over the
experiments with label DP). Each experiment's ε is what one deployment with
that setting would spend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from flwr.app import Context, RecordDict
from flwr.serverapp import Grid

from .config import resolve_run_config, validate_config
from .server_app import run_vertical


def run_sweep(grid: Grid, context: Context, experiments: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run one experiment per override dict (on top of the run config); return their results."""
    torch.set_num_threads(1)
    base = resolve_run_config(context)
    results = []
    for number, overrides in enumerate(experiments):
        config = validate_config({**base, **overrides, "sweep-file": ""})
        fresh = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config=dict(context.node_config),
            state=RecordDict(),
            run_config=dict(context.run_config),
        )
        print(
            f"experiment {number + 1}/{len(experiments)}: label-epsilon {config['label-epsilon']}, "
            f"seed {config['seed']}",
            flush=True,
        )
        results.append(run_vertical(grid, fresh, config, experiment=str(number)))
    return results
