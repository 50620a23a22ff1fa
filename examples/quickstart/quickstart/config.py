"""Run configuration with defaults, for `flwr run`, and for apps started without a run config.

Precedence (later wins): :data:`DEFAULTS` < JSON in the ``QUICKSTART_RUN_CONFIG``
environment variable (for apps started some other way) < ``context.run_config``
(filled by ``flwr run`` from pyproject.toml and ``--run-config``; ``run_demo.py``
passes its options that way).
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context

from flwr_dp_experiments.simulation import resolve_run_config as resolve

ENV_VAR = "QUICKSTART_RUN_CONFIG"
MECHANISMS = ("central-dp", "central-dp-poisson", "local-dp", "dp-sgd", "none")

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (a test checks it).
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 5,
    "num-partitions": 10,
    "mechanism": "central-dp",
    "noise-multiplier": 0.5,
    "clipping-norm": 1.0,
    "clients-per-round": 5,
    "local-noise-multiplier": 0.05,
    "dp-sgd-noise-multiplier": 1.0,
    "dp-sgd-sample-rate": 0.2,
    "min-clients": 0,
    "target-delta": 1e-5,
    "max-epsilon": 0.0,
    "ledger-path": "",
    "resume-ledger": False,
    "model": "logreg",
    "local-epochs": 3,
    "lr": 0.2,
    "batch-size": 32,
    "fraction-evaluate": 1.0,
    "seed": 42,
    "results-dir": "results",
    "mechanisms": "",
}


def resolve_run_config(context: Context | None = None) -> dict[str, Any]:
    """DEFAULTS, overridden by the environment variable, overridden by the app's run config."""
    config = resolve(DEFAULTS, ENV_VAR, None if context is None else context.run_config)
    for mechanism in [config["mechanism"], *mechanisms(config)]:
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    return config


def mechanisms(config: dict[str, Any]) -> list[str]:
    """The ``mechanisms`` run config as a list (empty: run ``mechanism`` only)."""
    return [name.strip() for name in str(config.get("mechanisms", "")).split(",") if name.strip()]
