"""Run one Flower app folder in simulation, the way ``flwr run`` runs it, and report what happened as JSON.

Usage: ``python run_example.py APP_DIR OUT_JSON NUM_SUPERNODES RUN_CONFIG_JSON``

This is the code path of Flower's simulation process (``flwr/simulation/app.py``, which
``flwr run`` starts through the SuperLink): the app's ``[tool.flwr.app.components]`` are loaded
from ``APP_DIR`` by ``flwr.simulation.run_simulation._run_simulation(..., is_app=True)``, and
the ServerApp's and the ClientApps' ``context.run_config`` is the app's
``[tool.flwr.app.config]`` fused with ``RUN_CONFIG_JSON`` (``flwr run --run-config``). What is
left out is the SuperLink, the FAB upload and its process launch (about 30 s a run on 2 cores).
The public ``flwr.simulation.run_simulation`` cannot run these apps: it hands them an empty run
config, and Flower's examples read ``context.run_config["num-server-rounds"]``.

It runs in its own process (one per app run) so that nothing leaks between runs: imported app
packages, ``sys.path``, Ray, and the root logging handlers it checks.

The JSON holds, for each ``Strategy.start`` the ServerApp made, the Result's per-round metric
records; every Python warning raised in this process (category, message, file); and the root
logging handlers present at the end that were not there before anything was imported.
"""

from __future__ import annotations

import logging
import sys

ROOT_HANDLERS_AT_START = list(logging.getLogger().handlers)

import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import warnings  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_DISABLE_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


def _number(value):
    """JSON has no inf/nan: keep them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _records(by_round) -> dict:
    return {str(rnd): {key: _number(val) for key, val in dict(record).items()} for rnd, record in by_round.items()}


def main(app_dir: str, out_json: str, num_supernodes: int, run_config: dict) -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    # offline_shims (local data, torch transforms) for this process and the Ray workers
    sys.path.insert(0, HERE)
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                         if p])
    caught = warnings.catch_warnings(record=True)
    recorded = caught.__enter__()
    warnings.simplefilter("always")

    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir, get_project_config
    from flwr.common.constant import RUN_ID_NUM_BYTES, SUPERLINK_NODE_ID, TASK_ID_NUM_BYTES
    from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
    from flwr.serverapp.strategy import Strategy
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    results = []

    def recording(start):
        def recording_start(self, *args, **kwargs):
            result = start(self, *args, **kwargs)
            results.append({"strategy": type(self).__name__,
                            "train_metrics_clientapp": _records(result.train_metrics_clientapp),
                            "evaluate_metrics_clientapp": _records(result.evaluate_metrics_clientapp),
                            "evaluate_metrics_serverapp": _records(result.evaluate_metrics_serverapp)})
            return result
        return recording_start

    Strategy.start = recording(Strategy.start)
    try:  # our strategies run their own start (the template owns the run): recorded the same way
        from flwr_dp_strategies.rounds.template import AccountedRound
        AccountedRound.start = recording(AccountedRound.start)
    except ImportError:  # Flower's own example, without this package on the path
        pass

    # As flwr/simulation/app.py: a Run with the --run-config overrides, the fused config in the context
    run = Run.create_empty(run_id=generate_rand_int_from_bytes(RUN_ID_NUM_BYTES))
    run.primary_task_id = generate_rand_int_from_bytes(TASK_ID_NUM_BYTES)
    run.federation_id = NOOP_FEDERATION_ID
    run.override_config = dict(run_config)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run.run_id, SUPERLINK_NODE_ID, 1
    components = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"]
    context = Context(run_id=run.run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                      run_config=get_fused_config_from_dir(app_dir, run.override_config))
    error = None
    try:
        _run_simulation(
            server_app_attr=components["serverapp"],
            client_app_attr=components["clientapp"],
            num_supernodes=num_supernodes,
            backend_name="ray",
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
            app_dir=app_dir,
            run=run,
            server_app_context=context,
            is_app=True,
            exit_event=EventType.FLWR_SIMULATION_RUN_LEAVE,
        )
    except BaseException as exc:  # reported in the JSON, re-raised below
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        caught.__exit__(None, None, None)
        added = [repr(h) for h in logging.getLogger().handlers if h not in ROOT_HANDLERS_AT_START]
        with open(out_json, "w") as handle:
            json.dump({"results": results, "error": error, "root_handlers_added": added,
                       "warnings": [{"category": w.category.__name__, "message": str(w.message),
                                     "filename": str(w.filename), "lineno": w.lineno} for w in recorded]},
                      handle, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))
