"""Run configuration: :data:`DEFAULTS` < ``context.run_config`` (``flwr run``: pyproject.toml and ``--run-config``)."""

from __future__ import annotations

from typing import Any

from flwr.app import Context

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (a test checks it).
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 1,
    "num-partitions": 10,
    "num-canaries": 500,
    "noise-multiplier": 2.0,
    "clipping-norm": 1.0,
    "broken": False,
    "broken-noise-fraction": 0.5,
    "hidden-units": 320,
    "target-delta": 1e-5,
    "confidence": 0.95,
    "audit-seed": 7,
    "local-epochs": 1,
    "lr": 0.1,
    "batch-size": 32,
    "seed": 42,
    "results-dir": "results",
}


def resolve_run_config(context: Context) -> dict[str, Any]:
    """The app's settings; ``ValueError`` for a canary count below 1 or a noise fraction outside (0, 1]."""
    config = {**DEFAULTS, **dict(context.run_config)}
    if int(config["num-canaries"]) < 1:
        raise ValueError(f"num-canaries must be >= 1, got {config['num-canaries']!r}")
    if not 0 < float(config["broken-noise-fraction"]) <= 1:
        raise ValueError(f"broken-noise-fraction must be in (0, 1], got {config['broken-noise-fraction']!r}")
    return config
