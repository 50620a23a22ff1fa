"""``bench_audit --tiny`` (issue 28.4): every configuration is audited, and gross breaks raise the alarm.

At the tiny size (k = 50 canaries, 3 rounds) the 95 % lower bound cannot exceed ≈ 1.8, so only a gross break can
be caught against a claimed ε = 1: the server that books z and adds z/100, and the client that declares Gaussian(z)
and sends its update un-noised. z/3 and the halved client noise are reported, not asserted (their true ε is below
what k canaries can certify; see the benchmark's docstring).
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

pytestmark = pytest.mark.integration  # the rows come from the session's run.py --tiny (a Ray simulation among them)


@pytest.fixture(scope="module")
def tiny_audit(tiny_benchmarks):
    """bench_audit's tiny rows, as run.py --tiny ran them for the benchmark smoke tests (run once per session),
    and the table bench_audit writes for them."""
    from flwr_dp_benchmarks import bench_audit

    rows = [
        r["audit"]
        for r in json.loads((tiny_benchmarks / "results.json").read_text())["rows"]
        if r["benchmark"] == bench_audit.NAME
    ]
    size = bench_audit.MODES["tiny"]
    result = {
        "mode": "tiny",
        "size": size,
        "rows": rows,
        "max_lower_bound": bench_audit.max_lower_bound(size["canaries"]),
    }
    out = tiny_benchmarks / "audit"
    out.mkdir(exist_ok=True)
    (out / "results.md").write_text(
        bench_audit.markdown(
            {**result, "created": "", "machine": {"cpu_count": "?"}, "seconds": 0.0, "max_lower_bound_ddp": 0.0}
        )
    )
    return out, result


def test_every_configuration_has_a_row(tiny_audit):
    out, result = tiny_audit
    rows = result["rows"]
    pairs = {(r["kind"], r["broken"], r["target_epsilon"]) for r in rows}
    for kind in ("poisson-fixed", "adaptive", "server-fixed", "ddp"):
        assert {(kind, "", 1.0), (kind, "", 8.0)} <= pairs, kind
    assert {
        ("ddp", "client-half-noise", 1.0),
        ("server-fixed", "server-z/3", 1.0),
        ("server-fixed", "server-z/100", 1.0),
        ("declared", "declared-unnoised", 1.0),
    } <= pairs
    for r in rows:
        assert r["canary_errors"] == 0 and r["real_errors"] == 0, r
        assert r["ledger_epsilon"] == pytest.approx(r["target_epsilon"], rel=0.02), r  # calibrated on the ledger
        for key in ("lower_bound_final", "lower_bound_all_iterates"):
            assert 0 <= r[key] <= result["max_lower_bound"] + 1e-9, (key, r)
        assert not math.isnan(r["estimate_final"]) and not math.isnan(r["estimate_all_iterates"])
        if r["kind"] in ("poisson-fixed", "adaptive"):
            assert 0.2 < r["canary_participation_rate"] < 0.8  # Poisson, q = 0.5
        else:
            assert r["canary_participation_rate"] == 1.0
    assert (out / "results.md").read_text().count("\n|") == len(rows) + 2


def test_gross_breaks_raise_the_alarm_and_correct_runs_do_not(tiny_audit):
    _, result = tiny_audit
    rows = {(r["kind"], r["broken"], r["target_epsilon"]): r for r in result["rows"]}
    server = rows[("server-fixed", "server-z/100", 1.0)]
    assert server["alarm"] and max(server["lower_bound_final"], server["lower_bound_all_iterates"]) > 1.0
    assert rows[("declared", "declared-unnoised", 1.0)]["alarm"]
    assert not any(r["alarm"] for r in result["rows"] if not r["broken"])
