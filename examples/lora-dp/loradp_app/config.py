"""Run configuration with defaults, for ``flwr run`` and for apps started without a run config.

Precedence (later wins): :data:`DEFAULTS` < JSON in the ``LORADP_RUN_CONFIG`` environment variable <
``context.run_config`` (``flwr run`` fills it from pyproject.toml and ``--run-config``).
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context

from flwr_dp_experiments.simulation import resolve_run_config as resolve

from .task import SIZES

ENV_VAR = "LORADP_RUN_CONFIG"

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (tests/test_large_model_examples.py checks it).
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 3,
    "num-partitions": 10,
    "clients-per-round": 5,
    "size": "full",
    "freeze-a": True,
    "base-seed": 0,
    "examples-per-client": 2048,
    "test-examples": 1000,
    "signal": 0.5,
    "data-seed": 0,
    "noise-multiplier": 1.0,
    "max-grad-norm": 1.0,
    "batch-size": 256,
    "sample-rate": 0.125,
    "local-epochs": 1,
    "lr": 8.0,
    "momentum": 0.0,
    "client-noise-multiplier": 0.01,
    "client-clipping-norm": 50.0,
    "target-delta": 1e-5,
    "noise-seed": -1,
    "server-seed": -1,
    "results-dir": "results",
}


def resolve_run_config(context: Context | None = None) -> dict[str, Any]:
    """DEFAULTS, overridden by the environment variable, overridden by the app's run config."""
    config = resolve(DEFAULTS, ENV_VAR, None if context is None else context.run_config)
    if config["size"] not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {config['size']!r}")
    return config
