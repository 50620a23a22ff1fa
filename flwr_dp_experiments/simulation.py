"""Running a Flower app in-process with settings: the glue every example shares.

``flwr.simulation.run_simulation`` hands the apps an *empty* run config, and
its Ray workers import the apps by module path. So an in-process runner must

1. make the app's folder (and the checkout) importable in this process and in
   the Ray workers (``sys.path`` and ``PYTHONPATH``), offline (no telemetry,
   no Hugging Face downloads);
2. pass the settings some other way: as JSON in an environment variable, which
   the apps read with :func:`resolve_run_config` (Ray workers inherit it);
3. read back what the ServerApp wrote.

With ``flwr run`` the same apps get their settings from ``context.run_config``,
which :func:`resolve_run_config` applies last.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Optional

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_DISABLE_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


def prepare_process(folders: Iterable[str]) -> None:
    """Make ``folders`` importable here and in Ray workers; switch Flower, Ray and HF offline."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for folder in folders:
        folder = os.path.abspath(folder)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        if folder not in paths:
            paths.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def resolve_run_config(defaults: Mapping[str, Any], env_var: str, run_config: Optional[Mapping[str, Any]] = None
                       ) -> dict[str, Any]:
    """``defaults`` < JSON in ``env_var`` < ``run_config`` (later wins)."""
    config = dict(defaults)
    config.update(json.loads(os.environ.get(env_var, "") or "{}"))
    if run_config is not None:
        config.update(run_config)
    return config


def run_in_process(
    server_app: Any,
    client_app: Any,
    *,
    num_supernodes: int,
    settings: Mapping[str, Any],
    env_var: str,
    results_path: str,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
) -> dict[str, Any]:
    """Run the apps with ``run_simulation`` (settings in ``env_var``); return the JSON at ``results_path``.

    ``results_path`` is removed first, so a stale file is never mistaken for this run's output.
    """
    from flwr.simulation import run_simulation

    os.environ[env_var] = json.dumps(dict(settings))
    if os.path.exists(results_path):
        os.remove(results_path)
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=int(num_supernodes),
        backend_config={"client_resources": {"num_cpus": num_cpus, "num_gpus": num_gpus}},
    )
    if not os.path.exists(results_path):
        raise RuntimeError(f"the ServerApp did not write {results_path}; see the Flower log above")
    with open(results_path) as handle:
        return json.load(handle)


__all__ = ["OFFLINE_ENV", "prepare_process", "resolve_run_config", "run_in_process"]
