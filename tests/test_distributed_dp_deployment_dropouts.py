"""Deployment end-to-end of examples/distributed-dp: one SuperNode in five drops out at each SecAgg+ stage.

A real SuperLink and 5 SuperNodes (``tests/deployment_harness.py``) run the example with
``flwr run`` for two rounds, complete graph, t = 3 (the least clients accept for 5 share
holders) and m = 3. The example's ``fail-plan`` makes a node's ClientApp raise when a given
stage of a given round reaches it, so Flower answers the server with an error reply and the
node is out of the round from that stage on:

* round 1: partition 1 fails at ``share-keys`` (it sent public keys, no shares: the others
  never mask with it), partition 2 fails at ``collect`` (it shared its keys and sent no
  vector: the server must rebuild its key from 3 survivors' shares and strip its pairwise
  masks); the sum of the 3 others is revealed;
* round 2: partition 3 fails at ``unmask`` (it sent its masked vector, then no shares: the
  server rebuilds every survivor's self-mask seed from the other 4 holders); the sum of all
  5 vectors is revealed.

(One round cannot hold all three: 5 → 4 → 3 → 2 unmask answers is below t = 3, as it must be;
with 10 nodes the least t is 6 and 10 → 8 → 6 → 4 fails the same way.)

Each round books its Skellam event and improves the model. Every node runs with its own key of a demo
roster and its own noise floor (node config). One ClientApp process per message per node (about 45 here,
with the consistency stage) is most of the time: 112 s on 2 idle cores before that stage, 133 s in CI after.
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
    missing_binaries,
    no_reply_counts,
    run_config,
)

APP = Path(__file__).resolve().parents[1] / "examples" / "distributed-dp"
NUM_NODES = 5
FLOOR = {"dp-min-noise-multiplier": 0.05}  # each node's own floor (node config): the run asks for z = 0.1
FAIL_PLAN = "1:share-keys:1;1:collect:2;2:unmask:3"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing_binaries()), reason=f"Flower executables missing: {missing_binaries()}"),
    pytest.mark.skipif(sys.platform != "linux", reason="the harness tracks processes through /proc"),
]


def test_one_supernode_in_five_drops_at_each_secagg_stage_and_every_round_still_unmasks(tmp_path):
    started = time.monotonic()
    results_dir = tmp_path / "results"
    config = run_config(
        **{
            "num-server-rounds": 2,
            "num-partitions": NUM_NODES,
            "min-clients": NUM_NODES,
            "min-survivors": 3,
            "reconstruction-threshold": 3,
            "noise-multiplier": 0.1,
            "dataset": "digits",
            "stage-timeout": 60.0,
            "round-timeout": 60.0,
            "fail-plan": FAIL_PLAN,
            "results-dir": results_dir,
        }
    )
    roster = tmp_path / "roster"
    write_demo_roster(roster, NUM_NODES)  # the operator admits the 5 SuperNodes; each gets its key by node config
    with LocalDeployment(tmp_path / "deploy") as dep:
        dep.start_superlink()
        with ThreadPoolExecutor(NUM_NODES) as pool:  # each waits for its registration; in parallel
            list(
                pool.map(
                    lambda i: dep.start_supernode(i, NUM_NODES, node_config=roster_node_config(roster, i, **FLOOR)),
                    range(NUM_NODES),
                )
            )
        cli = dep.flwr_background("run", str(APP), CONNECTION, "--run-config", config, "--stream")
        cli.popen.wait(timeout=240)
        output = cli.log_text()
        finished_run(dep, output, interval=1)
        node_logs = {d.name: d.log_text() for d in dep.daemons if d.name.startswith("supernode-")}

    revealed = re.findall(r"Round (\d), secure aggregation: sum of (\d) masked vectors revealed \((\d) sampled", output)
    assert revealed == [("1", "3", "5"), ("2", "5", "5")], output[-6000:]
    assert "(5 sampled, 1 dropped after sharing keys)" in output  # round 1: partition 2's key rebuilt
    for rnd in (1, 2):
        assert re.search(rf"round +{rnd}  sum revealed +epsilon \d+\.\d+  accuracy", output), output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    # the failures were the planned ones, at the planned stages, and nowhere else
    assert "fail-plan: partition 1 drops out at share-keys of round 1" in node_logs["supernode-1"] + output
    failing = {name for name, text in node_logs.items() if "fail-plan: partition" in text}
    assert failing <= {"supernode-1", "supernode-2", "supernode-3"}, failing

    results = json.loads((results_dir / "results.json").read_text())
    rows = results["rounds"]
    assert [r["released"] for r in rows] == [True, True]
    assert 0 < rows[0]["epsilon"] < rows[1]["epsilon"] == pytest.approx(results["privacy"]["epsilon"])
    assert all(math.isfinite(r["accuracy"]) for r in rows)
    assert rows[-1]["accuracy"] > results["initial_accuracy"]
    assert all(no_reply_counts(results["train_metrics"][str(r)]) for r in (1, 2))
    print(f"distributed-DP dropout deployment test: {time.monotonic() - started:.0f} s")
