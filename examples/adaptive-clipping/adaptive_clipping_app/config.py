"""Run configuration: :data:`DEFAULTS` < ``context.run_config`` (``flwr run``: pyproject.toml and ``--run-config``)."""

from __future__ import annotations

from typing import Any

from flwr.app import Context

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (a test checks it).
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 15,
    "num-partitions": 50,
    "clients-per-round": 20,
    "clipping": "server",
    "noise-multiplier": 1.0,
    "initial-clipping-norm": 0.1,
    "target-clipped-quantile": 0.5,
    "clip-norm-lr": 0.5,
    "target-delta": 1e-5,
    "max-epsilon": 0.0,
    "local-epochs": 2,
    "lr": 0.5,
    "batch-size": 16,
    "seed": 42,
    "results-dir": "results",
}
CLIPPING = ("server", "client")


def resolve_run_config(context: Context) -> dict[str, Any]:
    """The app's settings; ``ValueError`` naming an unknown ``clipping``."""
    config = {**DEFAULTS, **dict(context.run_config)}
    if config["clipping"] not in CLIPPING:
        raise ValueError(f"clipping must be one of {CLIPPING}, got {config['clipping']!r}")
    return config
