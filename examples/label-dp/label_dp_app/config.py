"""Run configuration with defaults, for ``flwr run``, and for apps started without a run config.

Precedence (later wins): :data:`DEFAULTS` < JSON in the ``LABEL_DP_RUN_CONFIG``
environment variable (set by ``run_experiment.py``) < ``context.run_config``
(filled by ``flwr run`` from pyproject.toml and ``--run-config``).

Only the ServerApp (label party) reads the run config; it sends the feature
parties what they need (model sizes, learning rate, split seed) in every message.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from flwr.app import Context

from flwr_dp_experiments.simulation import resolve_run_config as resolve

from .task import DATASETS

ENV_VAR = "LABEL_DP_RUN_CONFIG"

# Keep in sync with [tool.flwr.app.config] in pyproject.toml (a test checks it).
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 80,
    "label-epsilon": 2.0,
    "num-parties": 2,
    "dataset": "digits",
    "data-dir": "",
    "batch-size": 256,
    "lr": 0.02,
    "hidden-dim": 32,
    "embedding-dim": 16,
    "eval-every": 20,
    "test-fraction": 0.2,
    "seed": 42,
    "split-seed": 42,
    "rr-seed": -1,
    "target-delta": 1e-5,
    "results-dir": "results",
    "results-file": "",
    "sweep-file": "",
}


def label_epsilon(config: dict[str, Any]) -> Optional[float]:
    """ε of the label randomisation, or None for "no label DP" (``label-epsilon = inf``)."""
    value = config["label-epsilon"]
    eps = float(value) if not isinstance(value, bool) else math.nan
    if math.isnan(eps) or eps <= 0:
        raise ValueError(f"label-epsilon must be in (0, inf] (inf: no label DP), got {value!r}")
    return None if math.isinf(eps) else eps


def resolve_run_config(context: Optional[Context] = None) -> dict[str, Any]:
    """DEFAULTS, overridden by the environment variable, overridden by the app's run config."""
    return validate_config(resolve(DEFAULTS, ENV_VAR, None if context is None else context.run_config))


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Check the values the apps rely on (ValueError naming the key and its range); return ``config``."""
    label_epsilon(config)
    if config["dataset"] not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {config['dataset']!r}")
    for key in ("num-server-rounds", "num-parties", "eval-every", "hidden-dim", "embedding-dim"):
        if int(config[key]) < 1:
            raise ValueError(f"{key} must be an integer in [1, inf), got {config[key]!r}")
    if not 0.0 < float(config["test-fraction"]) < 1.0:
        raise ValueError(f"test-fraction must be in (0, 1), got {config['test-fraction']!r}")
    return config
