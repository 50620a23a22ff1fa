"""Run configuration: :data:`DEFAULTS` < ``context.run_config`` (``flwr run``: pyproject.toml and ``--run-config``)."""

from __future__ import annotations

from typing import Any

from flwr.app import Context

DATASETS = ("auto", "digits", "mnist")

# Keep in sync with [tool.flwr.app.config] in pyproject.toml.
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 5,
    "num-partitions": 10,
    "min-clients": 0,
    "noise-multiplier": 0.5,
    "clipping-norm": 1.0,
    "bits": 20,
    "num-shares": 1.0,
    "reconstruction-threshold": 0,
    "min-survivors": 0.8,
    "rotation-seed": 0,
    "stage-timeout": 120.0,
    "round-timeout": 600.0,
    "target-delta": 1e-5,
    "dataset": "auto",
    "data-dir": "",
    "local-epochs": 1,
    "lr": 0.5,
    "batch-size": 32,
    "seed": 42,
    "straggler-partition": -1,
    "straggler-seconds": 0.0,
    "results-dir": "results",
}


def resolve_run_config(context: Context) -> dict[str, Any]:
    """The app's settings; ``ValueError`` naming an unknown ``dataset``."""
    config = {**DEFAULTS, **dict(context.run_config)}
    if config["dataset"] not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {config['dataset']!r}")
    return config


def min_clients(config: dict[str, Any]) -> int:
    """Connected nodes a round waits for: ``min-clients``, or ``num-partitions`` when it is 0."""
    return int(config["min-clients"]) or int(config["num-partitions"])
