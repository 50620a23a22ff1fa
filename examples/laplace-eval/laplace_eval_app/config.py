"""Run configuration with defaults, for `flwr run`, and for apps started without a run config.

Precedence (later wins): :data:`DEFAULTS` < JSON in the ``LAPLACE_EVAL_RUN_CONFIG``
environment variable (set by ``run_experiment.py`` and the tests; Ray workers
inherit it) < ``context.run_config`` (filled by ``flwr run`` from pyproject.toml
and ``--run-config``).

The first four keys mirror the seed's (MindSpore's) yaml: ``encrypt.privacy_eval_type``,
``encrypt.laplace_eval.laplace_eval_eps``, ``unsupervised.cluster_client_num`` and
``unsupervised.eval_type``; :meth:`ClusterEvaluation.from_run_config` reads them.
"""

from __future__ import annotations

from typing import Any, Optional

from flwr.app import Context

from flwr_dp_experiments.simulation import resolve_run_config as resolve

ENV_VAR = "LAPLACE_EVAL_RUN_CONFIG"
PARTITIONERS = ("pathological", "dirichlet")

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (a test checks it).
DEFAULTS: dict[str, Any] = {
    "privacy-eval-type": "LAPLACE",
    "laplace-eval-eps": 230260.0,
    "cluster-client-num": 1000,
    "eval-type": "SILHOUETTE_SCORE",
    "num-server-rounds": 12,
    "num-partitions": 50,
    "partitioner": "pathological",
    "classes-per-partition": 1,
    "dirichlet-alpha": 0.1,
    "eval-share": 0.3,
    "dataset": "digits",
    "data-dir": "",
    "model": "logreg",
    "local-epochs": 1,
    "lr": 0.2,
    "batch-size": 16,
    "target-delta": 1e-5,
    "seed": 42,
    "results-dir": "results",
    "results-file": "",
}


def resolve_run_config(context: Optional[Context] = None) -> dict[str, Any]:
    """DEFAULTS, overridden by the environment variable, overridden by the app's run config."""
    config = resolve(DEFAULTS, ENV_VAR, None if context is None else context.run_config)
    if config["partitioner"] not in PARTITIONERS:
        raise ValueError(f"partitioner must be one of {PARTITIONERS}, got {config['partitioner']!r}")
    return config
