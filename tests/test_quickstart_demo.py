"""End-to-end: examples/quickstart/run_demo.py (local SuperLink in simulation mode + ``flwr run``, Ray backend).

The demo runs as a script in a subprocess, as the README tells users to run it
(one ``flwr run`` whose ServerApp runs the methods one after the other),
so that its stdout is exactly what a user sees: a short header, one progress
bar per method, the table and the plot's path; Flower's and Ray's logs go to
``<results-dir>/flower.log``. 3 methods x 2 rounds x 3 clients: about 1.5 min
on 2 cores; the Ctrl-C test about 20 s more.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"
MARKER = "FLWR_DP_LOCAL_SIMULATION"  # flwr_dp_experiments.simulation.MARKER: "<demo pid>-<ns>" in every child


def test_pyproject_run_config_matches_code_defaults():
    """The code defaults (for apps started without a run config) must equal pyproject's."""
    sys.path.insert(0, str(QUICKSTART))
    try:
        from quickstart.config import DEFAULTS
    finally:
        sys.path.remove(str(QUICKSTART))
    with open(QUICKSTART / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert pyproject["tool"]["flwr"]["app"]["config"] == DEFAULTS
    components = pyproject["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "quickstart.server_app:app", "clientapp": "quickstart.client_app:app"}
    assert any(dep.startswith("flwr-dp-strategies") for dep in pyproject["project"]["dependencies"])


def leftover_processes(demo_pid: int) -> list[str]:
    """Processes still alive that the demo's LocalSimulation started (their environment carries its marker)."""
    needle = f"\0{MARKER}={demo_pid}-".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if needle in b"\0" + environ and "\nState:\tZ" not in status:  # zombies are gone, only not yet reaped
            found.append(entry + " " + Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100])
    return found


def demo_env() -> dict[str, str]:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", RAY_DISABLE_USAGE_STATS="1")
    env.pop("COLUMNS", None)
    return env


@pytest.mark.integration
def test_run_demo_is_quiet_and_compares_methods(tmp_path):
    """The README command: short output, a table with every method, logs in the log file, nothing left running."""
    # Small noise (z = 0.1, C = 2) so that 2 rounds x 3 clients learn reliably: this checks
    # the wiring (strategy, ledger, metrics, results), not a useful privacy level.
    methods = ["none", "central-dp", "dp-sgd"]
    proc = subprocess.Popen(
        [
            sys.executable,
            str(QUICKSTART / "run_demo.py"),
            "--mechanism",
            *methods,
            "--rounds",
            "2",
            "--num-clients",
            "3",
            "--noise-multiplier",
            "0.1",
            "--clipping-norm",
            "2.0",
            "--results-dir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, stdout[-4000:] + stderr[-4000:]

    # What the user sees: header, one bar per method, the table, the plot; nothing twice, nothing deprecated.
    lines = stdout.splitlines()
    assert len(lines) < 40, stdout
    assert stderr.strip() == "", stderr[-4000:]
    assert "DEPRECATED" not in stdout + stderr
    printed = [line for line in lines if line.strip()]
    assert len(printed) == len(set(printed)), stdout  # no line twice (a root log handler would double Flower's)
    assert "INFO" not in stdout and "WARNING" not in stdout, stdout  # Flower's log lines went to the file
    titles = {"none": "FedAvg (no DP)", "central-dp": "central DP, fixed clipping", "dp-sgd": "DP-SGD (Opacus)"}
    for title in titles.values():
        bar = [line for line in lines if line.startswith(title) and "round 2/2" in line]
        assert len(bar) == 1, stdout  # the progress bar: round, accuracy, eps
        assert "accuracy 0." in bar[0] and " eps " in bar[0], bar
        assert sum(line.startswith(f"| {title} |") for line in lines) == 1, stdout  # its row in the table
    assert f"plot: {tmp_path / 'summary.png'}" in stdout
    assert (tmp_path / "summary.png").stat().st_size > 0

    # The log file holds Flower's and Ray's lines.
    log = (tmp_path / "flower.log").read_text()
    assert "Starting Flower SuperLink" in log and "[ROUND 2/2]" in log, log[-3000:]
    assert "DEPRECATED" not in log

    # The table: every method, finite ε for the DP rows, and what it protects.
    rows = {row["mechanism"]: row for row in json.loads((tmp_path / "summary.json").read_text())}
    assert set(rows) == set(methods)
    assert rows["none"]["epsilon"] is None and rows["none"]["protects"] == "nothing"
    for mechanism in ("central-dp", "dp-sgd"):
        assert 0 < rows[mechanism]["epsilon"] < math.inf, rows[mechanism]
        assert f"| {rows[mechanism]['epsilon']:.2f} |" in stdout
    assert rows["central-dp"]["protects"] == "user-level" and rows["dp-sgd"]["protects"] == "record-level"
    assert (tmp_path / "summary.md").read_text() in stdout

    # Each method's results (written by the ServerApp with flwr_dp_experiments.results).
    for mechanism in methods:
        results = json.loads((tmp_path / mechanism / "results.json").read_text())
        assert (tmp_path / mechanism / "results.png").stat().st_size > 0
        assert results["method"] == results["mechanism"] == mechanism
        assert results["config"]["num-server-rounds"] == 2 and results["config"]["num-partitions"] == 3  # run config
        assert [row["round"] for row in results["rounds"]] == [1, 2]
        assert results["rounds"][-1]["accuracy"] > 0.2, results["rounds"]  # 10 classes: chance is 0.1
        assert rows[mechanism]["accuracy"] == pytest.approx(results["rounds"][-1]["accuracy"])
    central = json.loads((tmp_path / "central-dp" / "results.json").read_text())
    epsilons = [row["epsilon"] for row in central["rounds"]]
    assert 0 < epsilons[0] < epsilons[1] < math.inf and all(row["released"] for row in central["rounds"])
    assert central["privacy"]["delta"] == 1e-5 and central["privacy"]["releases"] == 2
    assert central["privacy"]["epsilon"] == pytest.approx(epsilons[-1])
    dp_sgd = json.loads((tmp_path / "dp-sgd" / "results.json").read_text())
    assert dp_sgd["rounds"][0]["epsilon"] < dp_sgd["rounds"][1]["epsilon"]  # the accountant persists

    assert leftover_processes(proc.pid) == []


@pytest.mark.integration
def test_run_demo_ctrl_c_leaves_no_process_behind(tmp_path):
    """Ctrl-C during a run ends the SuperLink, the simulation and Ray too."""
    # 1 000 rounds: the run cannot end on its own before the signal, however slow the machine. SIGINT is
    # reset to its default in the child: a test run started in the background by a non-interactive shell
    # (``.ci/run &``) inherits SIGINT ignored, Python then installs no KeyboardInterrupt handler, and the
    # demo would (rightly) ignore Ctrl-C - CI once failed so, exit 0 after 50 rounds.
    proc = subprocess.Popen(
        [
            sys.executable,
            str(QUICKSTART / "run_demo.py"),
            "--mechanism",
            "central-dp",
            "--rounds",
            "1000",
            "--num-clients",
            "3",
            "--results-dir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log = tmp_path / "flower.log"
    deadline = time.monotonic() + 240
    while not (log.exists() and "[ROUND 1/1000]" in log.read_text()):  # the simulation and Ray are up
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted" in stderr
    assert leftover_processes(proc.pid) == []
