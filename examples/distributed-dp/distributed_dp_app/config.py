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
    "model": "logreg",
    "hidden": 64,
    "samples-per-client": 0,
    "local-epochs": 1,
    "lr": 0.5,
    "batch-size": 32,
    "seed": 42,
    "straggler-partition": -1,
    "straggler-seconds": 0.0,
    "results-dir": "results",
    "fail-plan": "",
}


MODELS = ("logreg", "mlp")
STAGES = ("setup", "share-keys", "collect", "unmask")


def resolve_run_config(context: Context) -> dict[str, Any]:
    """The app's settings; ``ValueError`` naming an unknown ``dataset`` or ``model``, or a bad ``fail-plan``."""
    config = {**DEFAULTS, **dict(context.run_config)}
    if config["dataset"] not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {config['dataset']!r}")
    if config["model"] not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {config['model']!r}")
    fail_plan(str(config["fail-plan"]))
    return config


def fail_plan(text: str) -> dict[tuple[int, str], set[int]]:
    """``fail-plan`` parsed: ``"round:stage:p,p;..."`` -> {(round, stage): partition ids that fail there}.

    A node whose partition is listed raises in its ClientApp when it receives that stage's message in
    that round, so Flower answers the server with an error reply: the node drops out of the round at
    that stage (a demo and test of dropouts; empty: nobody fails). ValueError naming ``fail-plan``.
    """
    plan: dict[tuple[int, str], set[int]] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        try:
            rnd, stage, parts = item.split(":")
            key = (int(rnd), stage.strip())
            ids = {int(p) for p in parts.split(",") if p.strip()}
        except ValueError as err:
            raise ValueError(f"fail-plan must be 'round:stage:p,p;...', got {text!r}") from err
        if key[1] not in STAGES or key[0] < 1:
            raise ValueError(f"fail-plan stages must be one of {STAGES} and rounds >= 1, got {item!r}")
        plan.setdefault(key, set()).update(ids)
    return plan


def min_clients(config: dict[str, Any]) -> int:
    """Connected nodes a round waits for: ``min-clients``, or ``num-partitions`` when it is 0."""
    return int(config["min-clients"]) or int(config["num-partitions"])
