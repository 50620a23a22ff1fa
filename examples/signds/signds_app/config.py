"""Run configuration with defaults, for `flwr run`, and for apps started without a run config.

Precedence (later wins): :data:`DEFAULTS` < JSON in the ``SIGNDS_RUN_CONFIG``
environment variable (set by ``run_experiment.py``) < ``context.run_config``
(filled by ``flwr run`` from pyproject.toml and ``--run-config``).
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context

from flwr_dp_experiments.simulation import resolve_run_config as resolve

from .task import DATASETS

ENV_VAR = "SIGNDS_RUN_CONFIG"
STRATEGIES = ("fedavg", "signds")

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (a test checks it).
DEFAULTS: dict[str, Any] = {
    "strategy": "signds",
    "num-server-rounds": 30,
    "num-partitions": 100,
    "fraction-train": 1.0,
    "dataset": "digits",
    "data-dir": "",
    "hidden": 0,
    "local-epochs": 1,
    "lr": 0.1,
    "batch-size": 32,
    "seed": 42,
    "sign-k": 0.01,
    "sign-eps": 100.0,
    "sign-thr-ratio": 0.6,
    "sign-global-lr": 0.1,
    "sign-dim-out": 0,
    "max-dim-out": 100,
    "rr-eps": 5.0,
    "initial-r-est": 1e-5,
    "step-ratio": 3.0,
    "results-dir": "results",
    "run-name": "",
}


def resolve_run_config(context: Context | None = None) -> dict[str, Any]:
    """DEFAULTS, overridden by the environment variable, overridden by the app's run config."""
    config = resolve(DEFAULTS, ENV_VAR, None if context is None else context.run_config)
    if config["dataset"] not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {config['dataset']!r}")
    if config["strategy"] not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {config['strategy']!r}")
    return config


def run_name(config: dict[str, Any]) -> str:
    """File stem of this run's log: ``run-name`` or ``<strategy>-<dataset>``."""
    return str(config["run-name"]) or f"{config['strategy']}-{config['dataset']}"
