"""Run the benchmark suite: ``python flwr_dp_benchmarks/run.py [--quick] [--out flwr_dp_benchmarks/results]``.

Writes ``results.json`` (machine + every row with all measured times),
``results.md`` (a markdown table) and ``ratios.png`` (ratio to baseline per row,
log scale, with targets). Every figure is a ratio measured in this process
against a baseline (medians of interleaved runs); absolute times are only noted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from flwr_dp_benchmarks import bench_aggregation, bench_ledger, bench_noise, bench_signds  # noqa: E402
from flwr_dp_benchmarks import bench_audit, bench_dpsgd, bench_scale, bench_simulation  # noqa: E402
from flwr_dp_benchmarks import bench_model_scale, bench_secagg_model_scale  # noqa: E402
from flwr_dp_benchmarks._common import machine, write_outputs  # noqa: E402

#: name -> (function, kwargs per mode). "tiny" is for the smoke test only (not meaningful timings).
BENCHMARKS = {
    "signds_encode": (
        bench_signds.run,
        {
            "full": {"dims": (10**5, 10**6, 10**7), "repeats": 7},
            "quick": {"dims": (10**5, 10**6), "repeats": 5},
            "tiny": {"dims": (2000,), "repeats": 1},
        },
    ),
    "ledger": (
        bench_ledger.run,
        {
            "full": {"clients": 1000, "rounds": 1000, "repeats": 5},
            "quick": {"clients": 1000, "rounds": 1000, "repeats": 3},
            "tiny": {"clients": 8, "rounds": 5, "repeats": 1},
        },
    ),
    "aggregation": (
        bench_aggregation.run,
        {
            "full": {"ns": (100, 1000), "d": 10**6, "repeats": 5, "busy": 3},
            "quick": {"ns": (100,), "d": 10**6, "repeats": 3, "busy": 3},
            "tiny": {"ns": (3,), "d": 1000, "repeats": 1, "busy": 1},
        },
    ),
    # Server aggregation at model scale (issue 40 item 1): every central strategy vs Flower's FedAvg on the same
    # replies at d = 1e6-1e8 float32, 10 and 100 clients; its own table: bench_model_scale.py, results/model_scale/.
    "model_scale": (bench_model_scale.run, bench_model_scale.MODES),
    # Secure aggregation at model scale (issue 40 item 2): a distributed-DP client's upload stage by stage and the
    # server's unmask of 100 clients at d = 1e6, 1e7; its own table: bench_secagg_model_scale.py, distributed_dp/.
    "secagg_model_scale": (bench_secagg_model_scale.suite_run, bench_secagg_model_scale.MODES),
    "noise": (
        bench_noise.run,
        {
            "full": {"d": 10**6, "repeats": 9},
            "quick": {"d": 10**6, "repeats": 5},
            "tiny": {"d": 1000, "repeats": 1},
        },
    ),
    # DP-SGD step time: our DpSgdTrainer vs Opacus alone (same mode) and vs non-private training.
    "dpsgd": (bench_dpsgd.run, bench_dpsgd.MODES),
    # Flower simulations (Ray): every strategy/mod vs Flower's FedAvg, alternated round by round in one
    # simulation; 1000 clients with the Laplace cluster evaluation vs FedAvg rounds. "tiny": one 2-client
    # round per variant, and the scale duel at 2 clients in the same simulation (one Ray start for both).
    "simulation": (
        bench_simulation.run,
        {
            "full": {"clients": 100, "rounds": 6, "passes": 3},
            "quick": {"clients": 100, "rounds": 5, "passes": 1},
            "tiny": {"clients": 2, "rounds": 1, "passes": 1, "strict": True, "with_scale_rounds": 2},
        },
    ),
    # Canary audit (Andrew et al. 2024) of every central/distributed strategy and three broken ones: the audited
    # run's time vs the same run without canaries; the audit's figures ride in each row's "audit" (the audit's own
    # table: bench_audit.py, results/audit/).
    "audit": (bench_audit.run, bench_audit.MODES),
    "scale": (
        bench_scale.run,
        {
            "full": {"clients": 1000, "rounds": 4},
            "quick": {"clients": 1000, "rounds": 2},
            "tiny": {"clients": 2, "rounds": 2, "strict": True},
        },
    ),
}


def run_all(mode: str, only: tuple[str, ...] = ()) -> dict:
    rows, durations = [], {}
    for name, (fn, modes) in BENCHMARKS.items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        rows += fn(**modes[mode])
        durations[name] = time.perf_counter() - t0
        print(f"[{name}] done in {durations[name]:.1f} s", file=sys.stderr, flush=True)
    return {
        "mode": mode,
        "machine": machine(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "durations_s": durations,
        "rows": rows,
    }


def _fmt(value: float, metric: str) -> str:
    if metric == "time_s":
        return f"{value * 1e3:.3g} ms"
    if value >= 2**20:
        return f"{value / 2**20:.3g} MiB"
    return f"{value:.4g} B"


def _ratio(r: dict) -> str:
    ratio = r["ratio"]
    return f"{ratio * 100:.3g} %" if r["metric"] == "bytes" else f"{ratio:.3g}×"


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Benchmark results ({result['mode']} run, {result['created']})",
        "",
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs, "
        f"{(m.get('memory_total_bytes') or 0) / 2**30:.1f} GiB; Python {m['python']}, numpy {m['numpy']}, "
        f"torch {m.get('torch')}, flwr {m.get('flwr')}, dp-accounting {m.get('dp-accounting')}.",
        "Figures are medians of interleaved runs in one process; the ratio is median / baseline median. "
        "Absolute times are for orientation only (shared, noisy machine).",
        "",
        *[f"Note: {note}." for note in result.get("notes", [])],
        *([""] if result.get("notes") else []),
        "| benchmark | case | value | baseline | baseline value | ratio | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        met = {True: "yes", False: "**NO**", None: "–"}[r["target_met"]]
        lines.append(
            f"| {r['benchmark']} | {r['case']} | {_fmt(r['value'], r['metric'])} | {r['baseline']} | "
            f"{_fmt(r['baseline_value'], r['metric'])} | {_ratio(r)} | {r['target']} | {met} |"
        )
    notes = [f"- {r['case']}: {r['notes']}" for r in result["rows"] if r["notes"]]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["metric"] == "time_s" and math.isfinite(r["ratio"]) and r["ratio"] > 0]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    labels = [f"{r['benchmark']}: {r['case']}" for r in rows]
    colors = ["tab:green" if r["target_met"] else ("tab:red" if r["target_met"] is False else "tab:gray") for r in rows]
    ax.barh(range(len(rows)), [r["ratio"] for r in rows], color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("time / baseline time (median, log scale); green: target met, red: missed")
    ax.set_title(f"flwr-dp-strategies benchmarks ({result['mode']}, {result['machine']['cpu_count']} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, out: Path) -> list[Path]:
    return write_outputs(result, out, "ratios.png", markdown, plot)


def merge(old: dict, new: dict) -> dict:
    """``old`` with the rows of the benchmarks in ``new`` replaced (a rerun in the same mode), noted."""
    if old["mode"] != new["mode"]:
        raise ValueError(f"cannot merge a {new['mode']} run into a {old['mode']} results file")
    names = {r["benchmark"] for r in new["rows"]}
    rows = [r for r in old["rows"] if r["benchmark"] not in names] + new["rows"]
    note = f"rows of {', '.join(sorted(names))} rerun {new['created']}"
    return {
        **old,
        "rows": rows,
        "durations_s": {**old.get("durations_s", {}), **new["durations_s"]},
        "notes": old.get("notes", []) + [note],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (no d=1e7, no n=1000)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes for the smoke test (timings meaningless)")
    parser.add_argument("--only", nargs="*", default=(), choices=sorted(BENCHMARKS), help="run only these")
    parser.add_argument("--out", type=Path, default=ROOT / "flwr_dp_benchmarks" / "results")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --only: replace only those benchmarks' rows in OUT/results.json (same mode)",
    )
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    result = run_all(mode, tuple(args.only))
    if args.merge:
        result = merge(json.loads((args.out / "results.json").read_text()), result)
    for path in write(result, args.out):
        print(path)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
