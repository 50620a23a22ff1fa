"""Smoke tests of the DP-SGD step-time and privacy–utility benchmarks (toy sizes; nothing is timed here).

Calibration tolerance: the benchmark stops its root finding once the ledger ε is in
[target·(1 − 0.3 %), target]; the tests allow 1 % below and nothing above (up to
float rounding), so an ε computed by another accountant or for other events fails.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest.importorskip("opacus")
pytest.importorskip("matplotlib")

from flwr_dp_benchmarks import bench_dpsgd, bench_privacy_utility  # noqa: E402

TOLERANCE = 0.01


# ---------------------------------------------------------------------- DP-SGD step time
def test_dpsgd_modes_are_run_kwargs():
    from flwr_dp_benchmarks import run as bench_run

    assert bench_run.BENCHMARKS[bench_dpsgd.NAME] == (bench_dpsgd.run, bench_dpsgd.MODES)  # rows of dpsgd_rows
    assert set(bench_dpsgd.MODES) == {"full", "quick", "tiny"}
    for kwargs in bench_dpsgd.MODES.values():
        assert set(kwargs) <= {"models", "batch_sizes", "num_examples", "repeats", "seed"}


# ---------------------------------------------------------------------- privacy-utility
@pytest.fixture(scope="module")
def utility_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("privacy_utility")
    assert bench_privacy_utility.main(["--tiny", "--out", str(out)]) == 0
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow  # the tiny privacy-utility run: about 35 s
def test_utility_writes_its_files(utility_run):
    out, result = utility_run
    for name in ("results.json", "results.md", "accuracy_vs_epsilon.png"):
        assert (out / name).stat().st_size > 0, name
    assert result["mode"] == "tiny" and result["delta"] == 1e-5
    table = (out / "results.md").read_text()
    assert "| method | dataset | neighbouring relation | target ε | achieved ledger ε | accuracy | notes |" in table
    assert table.count("\n| ") >= len(result["rows"]) + 1


@pytest.mark.slow
def test_utility_rows_state_relation_and_hit_the_target(utility_run):
    _, result = utility_run
    tiny = bench_privacy_utility.MODES["tiny"]
    rows = result["rows"]
    private = [r for r in rows if r["method"] != bench_privacy_utility.REFERENCE]
    assert {(r["method"], r["target_epsilon"]) for r in private} == {
        (m, e) for m in bench_privacy_utility.METHODS for e in tiny["epsilons"]
    }
    for r in rows:
        assert r["neighbouring_relation"] == bench_privacy_utility.RELATIONS[r["method"]]
        assert 0.0 <= r["accuracy"] <= 1.0 and len(r["accuracy_curve"]) == r["rounds"]
    for r in private:
        target, achieved = r["target_epsilon"], r["ledger_epsilon"]
        assert target * (1 - TOLERANCE) <= achieved <= target * (1 + 1e-9), r
        assert achieved <= r["ledger_epsilon_rdp"] * (1 + 1e-9), r  # best = min(RDP, PLD)
    reference = [r for r in rows if r["method"] == bench_privacy_utility.REFERENCE]
    assert reference and all(math.isinf(r["ledger_epsilon"]) for r in reference)


@pytest.mark.slow
def test_utility_rerun_of_one_method_replaces_only_its_rows(utility_run):
    out, result = utility_run
    before = {(r["method"], r["target_epsilon"]): r for r in result["rows"]}
    assert bench_privacy_utility.main(["--tiny", "--out", str(out), "--methods", "ours-delm-fm"]) == 0
    merged = json.loads((out / "results.json").read_text())
    after = {(r["method"], r["target_epsilon"]): r for r in merged["rows"]}
    assert set(after) == set(before)
    for key, row in after.items():
        if key[0] == "ours-delm-fm":
            assert row["wall_s"] != before[key]["wall_s"]  # rerun (a new measurement)
        else:
            assert row == before[key]  # kept as it was
    assert merged["reran"][-1]["methods"] == ["ours-delm-fm"]
    assert "rerun on" in (out / "results.md").read_text()
    with pytest.raises(ValueError, match="cannot merge"):
        bench_privacy_utility.merge_rerun({**merged, "mode": "full"}, merged, ["ours-delm-fm"])


@pytest.mark.slow
def test_utility_own_accountants_are_reported(utility_run):
    _, result = utility_run
    for r in result["rows"]:
        if r["method"] in ("flower-central", "dp-sgd"):
            # Flower's and Opacus' accountants are RDP only: never below the ledger's min(RDP, PLD)
            assert r["own_epsilon"] >= r["ledger_epsilon"] * (1 - 1e-6), r


@pytest.mark.parametrize("target", [0.1, 1.0, 8.0])
def test_calibration_hits_the_ledger_target(target):
    from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent

    rounds = 7

    def eps_of(z: float, method: str) -> float:
        return bench_privacy_utility.ledger_epsilon(
            "add_or_remove_one", [PoissonSampledDpEvent(0.3, GaussianDpEvent(z))] * rounds, method=method
        )

    z, eps = bench_privacy_utility.calibrate(eps_of, target, increasing=False, lo=0.1, hi=3000.0)
    assert target * (1 - TOLERANCE) <= eps <= target
    assert eps_of(z, "best") == pytest.approx(eps, rel=1e-12)
