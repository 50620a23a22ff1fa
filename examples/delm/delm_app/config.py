"""Run configuration with defaults, for `flwr run`, and for apps started without a run config.

Precedence (later wins): :data:`DEFAULTS` < JSON in ``DELM_RUN_CONFIG`` (set by
``run_demo.py``) < ``context.run_config`` (``flwr run``: pyproject.toml and ``--run-config``).
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context

from flwr_dp_experiments.simulation import resolve_run_config as resolve

ENV_VAR = "DELM_RUN_CONFIG"
VARIANTS = ("basic", "enhanced", "enhanced-nosampling", "shuffle", "sum")
DATASETS = ("digits", "mnist", "emnist-letters")
FEATURES = ("pixels", "hog")

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (a test checks it).
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 20,
    "num-partitions": 20,
    "min-clients": 0,
    "dataset": "digits",
    "data-dir": "",
    "scheme": "iid",
    "variant": "basic",
    "epsilon": 1.0,
    "target-delta": 1e-5,
    "pool": 2,
    "features": "pixels",
    "components": 0,
    "fm-noise": "gaussian",
    "fm-calibration": "sound",
    "local-steps": 5,
    "max-lr": 5.0,
    "ridge": 1e-4,
    "num-selected": 10,
    "selection-epsilon": 1.0,
    "ledger-path": "",
    "resume-ledger": False,
    "seed": 42,
    "results-dir": "results",
}


def fm_epsilon(config: dict[str, Any]) -> float:
    """FM's share of the budget: 2ε/3 after LDP-FPCA, all of ε without PCA (``components`` = 0)."""
    epsilon = float(config["epsilon"])
    return 2.0 * epsilon / 3.0 if int(config["components"]) > 0 else epsilon


def _check_choice(config: dict[str, Any], key: str, allowed: tuple[str, ...]) -> None:
    if config[key] not in allowed:
        raise ValueError(f"{key} must be one of {allowed}, got {config[key]!r}")


def resolve_run_config(context: Context | None = None) -> dict[str, Any]:
    """DEFAULTS, overridden by the environment variable, overridden by the app's run config."""
    config = resolve(DEFAULTS, ENV_VAR, None if context is None else context.run_config)
    _check_choice(config, "variant", VARIANTS)
    _check_choice(config, "dataset", DATASETS)
    _check_choice(config, "features", FEATURES)
    if not float(config["epsilon"]) > 0:
        raise ValueError(f"epsilon must be in (0, inf), got {config['epsilon']!r}")
    return config
