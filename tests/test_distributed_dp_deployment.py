"""Deployment end-to-end of examples/distributed-dp: a SuperNode dies during the collect stage of SecAgg+.

A real SuperLink and 4 SuperNodes (``tests/deployment_harness.py``) run the example
with ``flwr run`` for one round with m = 3 (``min-survivors``) and t = 3
(``reconstruction-threshold``, the least clients accept for 4 share holders). The node with partition 3 is told (run config
``straggler-partition``) to sleep before it trains, so it is still inside its train
function when the test SIGKILLs it (SuperNode, SuperExec and ClientApp): it has sent
its public keys and its encrypted shares, its masked vector never comes.

How the dead node is noticed: by silence, not by an error reply. The SuperLink marks a
SIGKILLed node unavailable only 40-60 s after its last heartbeat (see
tests/test_deployment.py); long before that the collect stage's timeout (the
example's ``round-timeout``, the ``timeout`` of ``Strategy.start``) returns the
three replies that came. The unmask stage then rebuilds the dead node's pairwise
mask key from the survivors' shares and reveals the sum of 3 vectors, and the round
books its Skellam event (ε is reported).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flwr_dp_strategies.cli import write_demo_roster  # noqa: E402 - after the imports above

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deployment_harness import (  # noqa: E402
    CONNECTION,
    LocalDeployment,
    finished_run,
    roster_node_config,
    kill_while_training,
    missing_binaries,
    no_reply_counts,
    run_config,
)

APP = Path(__file__).resolve().parents[1] / "examples" / "distributed-dp"
NUM_NODES, VICTIM = 4, 3
FLOOR = {"dp-min-noise-multiplier": 0.05}  # each node's own floor (node config): the run asks for z = 0.1

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing_binaries()), reason=f"Flower executables missing: {missing_binaries()}"),
    pytest.mark.skipif(sys.platform != "linux", reason="the harness tracks processes through /proc"),
]


def test_a_supernode_killed_during_collect_is_dropped_and_the_round_still_unmasks(tmp_path):
    started = time.monotonic()
    results_dir = tmp_path / "results"
    config = run_config(
        **{
            "num-server-rounds": 1,
            "num-partitions": NUM_NODES,
            "min-clients": NUM_NODES,
            "min-survivors": 3,
            "reconstruction-threshold": 3,
            "noise-multiplier": 0.1,
            "dataset": "digits",
            "stage-timeout": 30.0,
            "round-timeout": 25.0,
            "straggler-partition": VICTIM,
            "straggler-seconds": 120.0,
            "results-dir": results_dir,
        }
    )
    roster = tmp_path / "roster"
    write_demo_roster(roster, NUM_NODES)  # the operator admits the 5 SuperNodes; each gets its key by node config
    with LocalDeployment(tmp_path / "deploy") as dep:
        dep.start_superlink()
        with ThreadPoolExecutor(NUM_NODES) as pool:  # each waits for its registration; in parallel
            nodes = list(
                pool.map(
                    lambda i: dep.start_supernode(i, NUM_NODES, node_config=roster_node_config(roster, i, **FLOOR)),
                    range(NUM_NODES),
                )
            )
        victim = nodes[VICTIM]
        cli = dep.flwr_background("run", str(APP), CONNECTION, "--run-config", config, "--stream")

        # setup, share-keys, collect: the victim's third train message is the collect stage; it sleeps in
        # train, having answered setup and share-keys
        kill_while_training(dep, victim, cli, nth_message=3, timeout=120)
        killed_at = time.monotonic()
        print(f"killed at {killed_at - started:.0f} s")

        cli.popen.wait(timeout=120)
        ended_after = time.monotonic() - killed_at
        output = cli.log_text()
        finished_run(dep, output, interval=1)

    # the ServerApp's log is streamed to the CLI
    assert "secure aggregation: sum of 3 masked vectors revealed (4 sampled, 1 dropped after sharing keys)" in output, (
        output[-6000:]
    )
    assert re.search(r"round   1  sum revealed +epsilon \d+\.\d+  accuracy", output), output[-6000:]
    assert "Traceback" not in output and "ERROR" not in output, output[-6000:]

    results = json.loads((results_dir / "results.json").read_text())
    (row,) = results["rounds"]
    assert row["released"] and "secagg/survivors" not in results["train_metrics"]["1"]
    assert math.isfinite(row["epsilon"]) and row["epsilon"] > 0
    assert row["epsilon"] == pytest.approx(results["privacy"]["epsilon"])
    assert row["accuracy"] > results["initial_accuracy"]  # the revealed mean is a usable update (z = 0.1)
    metrics = results["train_metrics"]["1"]
    assert no_reply_counts(metrics)  # counts stay in the server log
    print(
        f"distributed-DP deployment test: {time.monotonic() - started:.0f} s; the run ended "
        f"{ended_after:.0f} s after the kill"
    )
