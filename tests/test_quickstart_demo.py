"""End-to-end: examples/quickstart/run_demo.py (Flower simulation, Ray backend) on 2 rounds x 3 clients.

The demo runs in a subprocess so that Ray, the environment variables run_demo
sets and Flower's logging stay out of the pytest process. About 30 s on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"


def test_pyproject_run_config_matches_code_defaults():
    """run_simulation gives an empty run config: the code defaults must equal pyproject's."""
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


def run_demo(args: list[str]) -> subprocess.CompletedProcess:
    """run_demo.main(args) in a subprocess; asserts it exited 0."""
    code = "import sys, run_demo; run_demo.main(sys.argv[1:])"
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", RAY_DISABLE_USAGE_STATS="1")
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=QUICKSTART, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.integration
def test_run_demo_two_rounds_three_clients(tmp_path):
    # Small noise (z = 0.1, C = 2) so that 2 rounds x 3 clients learn reliably: this checks
    # the wiring (strategy, ledger, metrics, results), not a useful privacy level.
    proc = run_demo(["--mechanism", "central-dp", "--rounds", "2", "--num-clients", "3", "--noise-multiplier", "0.1",
                     "--clipping-norm", "2.0", "--results-dir", str(tmp_path)])

    results = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.png").stat().st_size > 0
    rounds = results["rounds"]
    assert [row["round"] for row in rounds] == [1, 2]
    epsilons = [row["epsilon"] for row in rounds]
    assert all(eps is not None and math.isfinite(eps) and eps > 0 for eps in epsilons)
    assert epsilons[0] < epsilons[1]
    assert all(row["released"] for row in rounds)
    assert rounds[-1]["accuracy"] > 0.2  # 10 classes: chance is 0.1
    assert results["privacy"]["delta"] == 1e-5
    assert results["privacy"]["epsilon"] == pytest.approx(epsilons[-1])
    assert results["privacy"]["releases"] == 2
    assert "round 2  accuracy" in proc.stdout  # the per-round line and the final table
    assert "round  accuracy   epsilon" in proc.stdout


@pytest.mark.integration
def test_run_demo_compares_methods_in_one_table(tmp_path):
    """Several mechanisms: one results folder each and a summary whose ε says what it protects."""
    proc = run_demo(["--mechanism", "none", "dp-sgd", "--rounds", "3", "--num-clients", "3",
                     "--results-dir", str(tmp_path)])
    rows = {row["mechanism"]: row for row in json.loads((tmp_path / "summary.json").read_text())}
    assert set(rows) == {"none", "dp-sgd"}
    assert rows["none"]["epsilon"] is None and rows["none"]["protects"] == "nothing"
    dp_sgd = json.loads((tmp_path / "dp-sgd" / "results.json").read_text())
    assert rows["dp-sgd"]["protects"] == "record-level"
    assert rows["dp-sgd"]["epsilon"] == pytest.approx(dp_sgd["privacy"]["epsilon"])
    assert 0 < dp_sgd["privacy"]["epsilon"] < math.inf
    assert dp_sgd["rounds"][0]["epsilon"] < dp_sgd["rounds"][1]["epsilon"]  # the accountant persists
    for mechanism in ("none", "dp-sgd"):
        assert rows[mechanism]["accuracy"] > 0.2, rows[mechanism]  # chance is 0.1
        assert (tmp_path / mechanism / "results.png").stat().st_size > 0
    assert (tmp_path / "summary.png").stat().st_size > 0
    table = (tmp_path / "summary.md").read_text()
    assert table in proc.stdout and "| DP-SGD (Opacus) |" in table
