"""Deployment end-to-end: a real ``flower-superlink`` and two ``flower-supernode`` processes.

Both tests start the daemons on 127.0.0.1 in insecure mode with runtime
dependency installation off (``tests/deployment_harness.py``), run
``examples/quickstart`` with ``flwr run`` against them, check the run's status
with ``flwr ls`` (``flwr run --stream`` exits 0 even for a failed run), and stop
exactly the processes they started (checked: none of them is left).

How Flower 1.41 handles a SuperNode that dies in the middle of a round (found by
reading flwr 1.41 and by the second test):

* The SuperNode sends a heartbeat every 17.5-22.5 s ((30 s - 5 s) x 0.7..0.9)
  and the SuperLink keeps it online until ``HEARTBEAT_PATIENCE (2) x 30 s`` after
  the last one. Neither interval can be set from the command line
  (``flower-supernode``/``flower-superlink`` have no heartbeat flags;
  ``HEARTBEAT_DEFAULT_INTERVAL`` is a constant in ``flwr.common.constant``).
* So about 40-60 s after a node is killed (SIGKILL: it cannot deactivate itself; in these tests about
  20 s: tests/deployment_site/sitecustomize.py sets the interval to Flower's 10 s minimum)
  the SuperLink answers the ServerApp's pull for that node's message with an
  error reply, ``ErrorCode.NODE_UNAVAILABLE`` (5), "The destination node failed
  to report a heartbeat within 2 x its expected interval". ``Grid.send_and_receive``
  returns it with the other replies; the strategy's default timeout (3600 s) is
  not involved.
* The error reply's source is the SuperLink (node ID 1), not the dead node; the
  node is found through ``reply_to_message_id`` (the quickstart's ``ReplyLog``
  does this). Plain ``FedAvg`` logs "aggregate_train: Received 1 results and 1
  failures"; our strategies drop the error reply, count it in the server's log
  (never in the round's metrics) and book nothing for that node
  in that round; the round's aggregate is the remaining reply.
* From then on ``grid.get_node_ids()`` lists only online nodes, so later rounds
  sample the surviving node only; with ``min-clients=1`` they do not wait for
  the dead one.
* A node whose SuperLink restarts reconnects by itself (it retries), and with
  ``flower-superlink --database FILE`` it keeps its node ID, so its privacy
  ledger entries continue under the same ID.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest
from flwr import __version__ as _flower_version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deployment_harness import (  # noqa: E402
    CONNECTION,
    LocalDeployment,
    finished_run,
    kill_while_training,
    missing_binaries,
    no_reply_counts,
    run_config,
)

from flwr_dp_strategies.privacy import PrivacyLedger  # noqa: E402

APP = Path(__file__).resolve().parents[1] / "examples" / "quickstart"
NODE_UNAVAILABLE = 5  # flwr.common.constant.ErrorCode.NODE_UNAVAILABLE
FLOWER = tuple(int(part) for part in _flower_version.split(".")[:2])

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing_binaries()), reason=f"Flower executables missing: {missing_binaries()}"),
    pytest.mark.skipif(sys.platform != "linux", reason="the harness tracks processes through /proc"),
]


def run_to_completion(dep: LocalDeployment, config: str, timeout: float) -> str:
    """``flwr run APP --stream`` with ``config``; asserts it exits 0 and ``flwr ls`` shows it
    finished:completed; returns the streamed output."""
    proc = dep.flwr("run", str(APP), CONNECTION, "--run-config", config, "--stream", timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:] + dep.diagnostics()
    finished_run(dep, output)
    return output


def assert_all_stopped(dep: LocalDeployment, seen: set[int]) -> None:
    """Nothing the deployment started is alive after ``close()``."""
    alive = {pid for pid in seen | dep.started_pids if _alive(pid)}
    assert not dep.leftovers and not alive, f"processes left: {dep.leftovers | alive}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_flwr_run_on_superlink_and_two_supernodes(tmp_path):
    """`flwr run` of the quickstart (central DP, 2 rounds) on a SuperLink and 2 SuperNodes."""
    results_dir, ledger_path = tmp_path / "results", tmp_path / "ledger.json"
    started = time.monotonic()
    with LocalDeployment(tmp_path / "deploy") as dep:
        dep.start_superlink()
        nodes = [dep.start_supernode(i, 2) for i in range(2)]
        config = run_config(
            **{
                "num-server-rounds": 2,
                "num-partitions": 2,
                "mechanism": "central-dp",
                "noise-multiplier": 0.1,
                "clipping-norm": 2.0,
                "results-dir": results_dir,
                "ledger-path": ledger_path,
            }
        )
        output = run_to_completion(dep, config, timeout=420)
        assert "round 2  accuracy" in output  # the ServerApp's log is streamed to the CLI
        seen = dep.our_pids()
        assert len(seen) >= 6, seen  # the 3 daemons and their SuperExecs
    assert_all_stopped(dep, seen)
    print(f"deployment test 1: {time.monotonic() - started:.0f} s")

    results = json.loads((results_dir / "results.json").read_text())
    rounds = results["rounds"]
    assert [row["round"] for row in rounds] == [1, 2]
    assert rounds[-1]["accuracy"] > max(0.2, results["initial_accuracy"])  # 10 classes: chance is 0.1
    epsilons = [row["epsilon"] for row in rounds]
    assert all(eps is not None and math.isfinite(eps) and eps > 0 for eps in epsilons)
    assert epsilons[0] < epsilons[1]
    for rnd in ("1", "2"):
        train = results["train_metrics"][rnd]
        assert train["privacy/epsilon"] == pytest.approx(epsilons[int(rnd) - 1])
        assert no_reply_counts(train)
        # the clients' own evaluate metrics are a statistic of their data: withheld unless declared (issue 37)
        assert (
            "eval-acc" not in results["evaluate_metrics"][rnd] and "privacy/epsilon" in results["evaluate_metrics"][rnd]
        )
    for row in results["replies"]:  # both nodes replied to every train and evaluate message
        assert (row["sent"], row["replies"], row["failed"]) == (2, 2, 0), results["replies"]
    assert {(row["round"], row["phase"]) for row in results["replies"]} == {
        (r, phase) for r in (1, 2) for phase in ("train", "evaluate")
    }
    ledger = PrivacyLedger.load(ledger_path)
    assert ledger.rounds() == [1, 2] and len(ledger.events()) == 2
    assert ledger.epsilon() == pytest.approx(results["privacy"]["epsilon"])
    assert {node.extra["node_id"] for node in nodes} and all(n.extra["node_id"] for n in nodes)


def test_supernode_dies_mid_round_and_ledger_survives_restart(tmp_path):
    """Kill a SuperNode during round 2: the round completes with the other node, the failure is
    reported, the ledger books exactly the replies received, and it is restored after a restart."""
    ledger_path, database = tmp_path / "ledger.json", tmp_path / "superlink-state.db"
    settings = {
        "num-partitions": 2,
        "min-clients": 1,
        "mechanism": "local-dp",
        "local-epochs": 1,
        "fraction-evaluate": 0.0,
        "ledger-path": ledger_path,
    }
    started = time.monotonic()
    with LocalDeployment(tmp_path / "deploy") as dep:
        superlink = dep.start_superlink(database=database)
        survivor, victim = dep.start_supernode(0, 2), dep.start_supernode(1, 2)
        ids = {"survivor": str(survivor.extra["node_id"]), "victim": str(victim.extra["node_id"])}

        # --- run 1: 2 rounds; the victim is killed while it trains in round 2
        config = run_config(**settings, **{"num-server-rounds": 2, "results-dir": tmp_path / "results-1"})
        cli = dep.flwr_background(
            "run", str(APP), CONNECTION, "--run-config", config, "--stream", log_name="flwr-run-1"
        )
        # kill it while its ClientApp process trains its round-2 message (it replied in round 1 only):
        # SuperNode, SuperExec and ClientApp all die
        kill_while_training(dep, victim, cli, nth_message=2, timeout=300)
        killed_at = time.monotonic()

        cli.popen.wait(timeout=300)
        ended_after = time.monotonic() - killed_at
        output = cli.log_text()
        finished_run(dep, output)
        # reported in the ServerApp's log (streamed by `flwr run`) and the results, not in the round's metrics
        results = json.loads((tmp_path / "results-1" / "results.json").read_text())
        train = {row["round"]: row for row in results["replies"] if row["phase"] == "train"}
        assert (train[1]["sent"], train[1]["replies"], train[1]["failed"]) == (2, 2, 0), results["replies"]
        # the dead node is either answered for by the SuperLink with an error reply (Flower 1.41-1.42, when that
        # reply comes first) or seen to have left the federation, and not waited for (Flower 1.43 drops its reply;
        # on 1.42 too when the node list drops it first): either way one node replied and the round went on
        row = train[2]
        assert (row["sent"], row["replies"], row["failed"] + row["missing"]) == (2, 1, 1), results["replies"]
        if row["failed"]:
            assert "round 2  train: 1 of 2 nodes replied, 1 failed" in output, dep.diagnostics()
            assert [(e["node"], e["code"]) for e in row["errors"]] == [(int(ids["victim"]), NODE_UNAVAILABLE)]
        else:
            assert "round 2  train: 1 of 2 nodes replied, 0 failed" in output, dep.diagnostics()
        assert FLOWER < (1, 43) or row["missing"] == 1
        assert no_reply_counts(results["train_metrics"]["1"]) and no_reply_counts(results["train_metrics"]["2"])
        assert [row["round"] for row in results["rounds"]] == [1, 2]
        assert all(row["released"] for row in results["rounds"])  # round 2 released a model (one reply)

        # the ledger holds exactly the releases of the replies that arrived
        ledger = PrivacyLedger.load(ledger_path)
        assert sorted(ledger.clients) == sorted(ids.values()), (ledger.clients, ids)
        assert len(ledger.events(ids["survivor"])) == 2 and ledger.rounds(ids["survivor"]) == [1, 2]
        assert len(ledger.events(ids["victim"])) == 1 and ledger.rounds(ids["victim"]) == [1]
        assert ledger.events() == []  # local DP: nothing central
        epsilon_1 = ledger.epsilon()
        assert 0 < epsilon_1 < math.inf
        assert epsilon_1 == pytest.approx(results["privacy"]["epsilon"])
        assert epsilon_1 == pytest.approx(ledger.epsilon(ids["survivor"]))  # the worst client has 2 releases

        # --- server restart: a new SuperLink on the same port and database; the survivor reconnects
        dep.stop(superlink)
        dep.start_superlink(name="superlink-restarted", port=superlink.port, database=database)
        config = run_config(
            **settings, **{"num-server-rounds": 1, "results-dir": tmp_path / "results-2", "resume-ledger": True}
        )
        run_to_completion(dep, config, timeout=300)
        seen = dep.our_pids()
    assert_all_stopped(dep, seen)

    # restored and extended: every old event is still there, plus the survivor's new one
    restored = PrivacyLedger.load(ledger_path)
    assert sorted(restored.clients) == sorted(ids.values()), (restored.clients, ids)
    assert len(restored.events(ids["survivor"])) == 3
    assert restored.events(ids["victim"]) == ledger.events(ids["victim"])
    assert sum(len(restored.events(c)) for c in restored.clients) == 1 + 2 + 1
    results_2 = json.loads((tmp_path / "results-2" / "results.json").read_text())
    assert results_2["privacy"]["epsilon"] == pytest.approx(restored.epsilon())
    assert restored.epsilon() > epsilon_1
    assert [row["replies"] for row in results_2["replies"]] == [1]
    print(f"deployment test 2: {time.monotonic() - started:.0f} s; run 1 ended {ended_after:.0f} s after the kill")
