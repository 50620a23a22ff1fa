"""bench_secagg_model_scale (issue 40 item 2) at a toy size: every client stage and the server's unmask get a row
with CPU and wall time and a peak in model copies, the files are written, and the suite's rows are well formed
(nothing is timed here)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from flwr_dp_benchmarks import bench_secagg_model_scale as bench  # noqa: E402
from flwr_dp_benchmarks._common import ROW_KEYS  # noqa: E402


def test_the_tiny_run_writes_a_row_per_stage(tmp_path):
    (tmp_path / "tiny.md").write_text("old table\n\n### Hand-written notes\n\nkept\n")
    assert bench.main(["--tiny", "--out", str(tmp_path), "--name", "tiny"]) == 0
    rows = json.loads((tmp_path / "tiny.json").read_text())["rows"]
    client = [r for r in rows if r["side"] == "client"]
    assert [r["stage"] for r in client] == [*bench.CLIENT_STAGES, "encode_update (all)", "upload (all)"]
    for r in rows:
        assert r["d"] == 2000
        assert math.isfinite(r["cpu_s"]) and r["cpu_s"] >= 0 and r["wall_s"] > 0
        assert r["peak_bytes"] > 0 and r["peak_model_copies"] == r["peak_bytes"] / (4 * 2000)
    upload = client[-1]
    assert 5000 < upload["upload_bytes"] <= 5000 + 256  # ⌈2000·20/8⌉ packed bytes + the array's framing
    assert upload["upload_ratio"] == upload["upload_bytes"] / 8000 and upload["neighbours"] == 2
    assert upload["cpu_met"] in (True, False) and upload["memory_met"] in (True, False)
    server = [r for r in rows if r["side"] == "server"]
    assert len(server) == 4 and server[-1]["clients"] == 3
    assert server[-1]["fedavg_peak_bytes"] > 0 and server[-1]["floor_peak_bytes"] > 0
    md = (tmp_path / "tiny.md").read_text()
    assert "| client | 2e+03 | masks |" in md
    assert "old table" not in md and md.endswith("### Hand-written notes\n\nkept\n")  # the notes survive a rerun


def test_the_suite_rows_are_well_formed():
    rows = bench.suite_rows(bench.run(**bench.MODES["tiny"]))
    assert {r["metric"] for r in rows} == {"time_s", "peak_bytes", "bytes"}
    for r in rows:
        assert set(ROW_KEYS) <= set(r)
        for v in (*r["values"], *r["baseline_values"], r["value"], r["baseline_value"], r["ratio"]):
            assert math.isfinite(v) and v > 0, r
        assert r["target_met"] is None  # the goals are set at d = 1e7
