"""Run configuration with defaults, for `flwr run`, and for apps started without a run config.

Precedence (later wins): :data:`DEFAULTS` < JSON in the ``DPSGD_RUN_CONFIG``
environment variable (set by ``run_demo.py``) < ``context.run_config`` (filled
by ``flwr run`` from pyproject.toml and ``--run-config``).
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context

from flwr_dp_experiments.simulation import resolve_run_config as resolve

from .task import DATASETS

ENV_VAR = "DPSGD_RUN_CONFIG"

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (a test checks it).
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 5,
    "num-partitions": 5,
    "dataset": "digits",
    "data-dir": "",
    "hidden": 32,
    "noise-multiplier": 1.0,
    "target-epsilon": 0.0,
    "target-delta": 1e-5,
    "max-grad-norm": 1.0,
    "clipping": "flat",
    "batch-size": 32,
    "sample-rate": 0.1,
    "max-physical-batch-size": 0,
    "grad-sample-mode": "auto",
    "local-epochs": 2,
    "lr": 0.5,
    "momentum": 0.5,
    "noise-seed": -1,
    "seed": 42,
    "results-dir": "results",
}


def resolve_run_config(context: Context | None = None) -> dict[str, Any]:
    """DEFAULTS, overridden by the environment variable, overridden by the app's run config."""
    config = resolve(DEFAULTS, ENV_VAR, None if context is None else context.run_config)
    if config["dataset"] not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {config['dataset']!r}")
    return config
