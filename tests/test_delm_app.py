"""The DELM Flower app (examples/delm/delm_app): run config consistency and an in-process simulation.

The simulation runs in a subprocess (Ray and Flower logging stay out of pytest):
6 clients, 3 rounds, digits, the enhanced variant, ε = 20 so that 225 records per
client can learn anything (at ε = 1 the record-level noise swamps digits' shards).
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

DELM = Path(__file__).resolve().parents[1] / "examples" / "delm"


def test_pyproject_run_config_matches_code_defaults():
    sys.path.insert(0, str(DELM))
    try:
        from delm_app.config import DEFAULTS, resolve_run_config
    finally:
        sys.path.remove(str(DELM))
    with open(DELM / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert pyproject["tool"]["flwr"]["app"]["config"] == DEFAULTS
    assert pyproject["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "delm_app.server_app:app",
        "clientapp": "delm_app.client_app:app",
    }
    os.environ.pop("DELM_RUN_CONFIG", None)
    with pytest.raises(ValueError, match="variant"):
        resolve_run_config(type("Ctx", (), {"run_config": {"variant": "fancy"}})())


@pytest.mark.integration
@pytest.mark.parametrize(
    # a flwr run each (about 30 s on 2 cores): "basic" (AccountedFedAvg over the same FM clients) is left to the
    # end-to-end runs of AccountedFedAvg in test_drop_in.py and test_flower_examples.py
    "variant, components, features",
    [("enhanced", 20, "pixels"), ("sum", 0, "hog")],
)
def test_delm_app_runs_pca_then_fm_rounds_and_books_each_release_once(tmp_path, variant, components, features):
    args = [
        "--variant",
        variant,
        "--components",
        str(components),
        "--rounds",
        "3",
        "--num-clients",
        "6",
        "--epsilon",
        "20",
        "--features",
        features,
        "--results-dir",
        str(tmp_path),
    ]
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", RAY_DISABLE_USAGE_STATS="1")
    proc = subprocess.run(
        [sys.executable, str(DELM / "run_demo.py"), *args],
        cwd=DELM,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.png").stat().st_size > 0
    rounds = results["rounds"]
    assert [row["round"] for row in rounds] == [1, 2, 3]
    epsilons = [row["epsilon"] for row in rounds]
    # PCA (ε/3) and FM (2ε/3) are each released once per client: ε does not grow after round 1,
    # and the composition of the two calibrated Gaussian releases stays within the budget.
    assert epsilons[0] == pytest.approx(epsilons[-1])
    assert 0 < epsilons[-1] <= 20 * (1 + 1e-6)
    assert results["privacy"]["neighboring_relation"] == "replace_one"
    assert results["privacy"]["clients"] == 6
    if variant == "enhanced":
        assert results["selection_epsilon"] is not None and math.isfinite(results["selection_epsilon"])
    assert ("LDP-FPCA: projection 64 x 20" in proc.stdout) == (components > 0)
    assert rounds[-1]["accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert "round 3/3  accuracy" in proc.stdout
