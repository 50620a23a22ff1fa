"""bench_model_scale (issue 40 item 1) at a toy size: every central strategy is timed against Flower's FedAvg on
the same replies, with a peak-memory row in model copies, and the files are written (nothing is timed here)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from flwr_dp_benchmarks import bench_model_scale as bench  # noqa: E402


@pytest.mark.slow  # 10-24 s on 2 cores: every central strategy and its memory pass
def test_every_strategy_gets_a_time_row_and_a_memory_row(tmp_path):
    assert bench.main(["--tiny", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["rows"]
    timed = {r["params"]["strategy"] for r in rows if r["metric"] == "time_s"}
    assert timed | {r["params"]["strategy"] for r in rows if r["metric"] == "not_run"} >= set(bench.CASES)
    assert timed >= {name for name, case in bench.CASES.items() if not case.column_only}
    for r in rows:
        if r["metric"] == "not_run":
            continue
        assert r["params"]["n"] == 3 and r["params"]["d"] == 2000
        assert r["values"] and all(math.isfinite(v) and v > 0 for v in r["values"] + r["baseline_values"])
        if r["metric"] == "peak_bytes":
            assert r["params"]["model_copies"] == r["value"] / (4 * 2000)
    table = (tmp_path / "results.md").read_text()
    for name in timed:
        assert f"| {name}, RDP-only ledger | 3 | 2e+03 |" in table  # tiny: no PLD accounting


def test_sizes_that_do_not_fit_are_listed_not_estimated():
    rows = bench.run(sizes=(), not_run=((100, 10**8),))
    assert [r["metric"] for r in rows] == ["not_run"]
    assert "40 GB" in rows[0]["notes"] and math.isnan(rows[0]["value"])
    assert "not run" in bench.table(rows)
