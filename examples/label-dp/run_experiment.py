"""Accuracy of vertical FL with label DP against ε: run the sweep and write the results.

    python examples/label-dp/run_experiment.py [--eps 0.5 1 2 4 8 inf] [--repeats 2]
        [--rounds 80] [--results-dir DIR]

Runs the label party (ServerApp) and 2 feature parties (ClientApps) with
``flwr run`` on a local SuperLink in simulation mode (Ray backend): one run for
the whole sweep (the app's ``sweep-file`` run config, see
``label_dp_app/sweep.py``), one experiment per (ε, repeat); repeat r uses
model/batch seed ``seed + r``, and the label randomisation is drawn from fresh
OS entropy each time. ``inf`` means no label DP (training on the true labels).
The base settings are pyproject's run config; the sweep's own settings override
them. The app's progress lines are printed; Flower's and Ray's logs go to
``<results-dir>/flower.log``.

Writes ``<results-dir>/results.json`` (every run, plus mean/min/max test accuracy
per ε) and ``<results-dir>/accuracy_vs_eps.png``, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:  # a plain checkout: flwr_dp_experiments next to examples/
    sys.path.insert(0, REPO)
#: The ServerApp's own lines, printed; Flower's log goes to the log file.
APP_LINES = r"^(experiment \d|round \d|label eps|sweep of)"
RESULTS_JSON = "results.json"
RESULTS_PNG = "accuracy_vs_eps.png"


def parse_eps(text: str) -> float:
    """A label ε in (0, inf]; ``inf`` = no label DP."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"eps must be in (0, inf], got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--eps",
        type=parse_eps,
        nargs="+",
        default=[0.5, 1.0, 2.0, 4.0, 8.0, math.inf],
        help="label epsilons to run (inf: no label DP)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per epsilon (model seeds seed, seed+1, ...)")
    parser.add_argument("--rounds", type=int, default=80, help="train steps per run")
    parser.add_argument("--eval-every", type=int, default=20, help="test accuracy every this many rounds")
    parser.add_argument("--seed", type=int, default=42, help="model/batch seed of the first repeat")
    parser.add_argument("--rr-seed", type=int, default=-1, help="label randomisation seed (-1: OS entropy)")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--plot-only", action="store_true", help="only redraw the PNG from <results-dir>/results.json (no simulation)"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be >= 1")
    return args


def experiments(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One run-config override per (ε, repeat)."""
    return [
        {
            "label-epsilon": eps,
            "seed": args.seed + r,
            "num-server-rounds": args.rounds,
            "eval-every": args.eval_every,
            "rr-seed": args.rr_seed,
        }
        for eps in args.eps
        for r in range(args.repeats)
    ]


def simulate(runs: list[dict[str, Any]], results_dir: str) -> list[dict[str, Any]]:
    """Run all experiments in one ``flwr run`` (the app's ``sweep-file``); return each run's results."""
    from flwr_dp_experiments.simulation import app_config, run_app

    results_dir = os.path.abspath(results_dir)
    os.makedirs(results_dir, exist_ok=True)
    sweep_file = os.path.join(results_dir, "sweep.json")
    with open(sweep_file, "w") as handle:
        json.dump(runs, handle)  # label-epsilon inf is written as Infinity, which json reads back
    out = os.path.join(results_dir, "sweep-results.json")
    results = run_app(
        HERE,
        {"sweep-file": sweep_file, "results-file": out, "results-dir": results_dir},
        num_supernodes=int(app_config(HERE)["num-parties"]),  # one SuperNode per feature party
        results_path=out,
        echo=APP_LINES,
    )
    if len(results) != len(runs):
        raise RuntimeError(f"only {len(results)} of {len(runs)} runs finished; see {results_dir}/flower.log")
    for path in (sweep_file, out):  # results.json (written by main) holds every run
        os.remove(path)
    return results


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ε: test accuracies of the repeats, mean/min/max, ledger ε and label-change rates."""
    table: dict[str, dict[str, Any]] = {}
    for run in runs:
        key = str(run["label_epsilon"])
        row = table.setdefault(
            key,
            {
                "label_epsilon": run["label_epsilon"],
                "accuracies": [],
                "ledger_epsilon": run["privacy"]["ledger_epsilon"],
                "ledger_events": len(run["privacy"]["events"]),
                "changed_fraction": [],
                "expected_changed_fraction": run["privacy"]["expected_changed_fraction"],
            },
        )
        row["accuracies"].append(run["final_accuracy"])
        row["changed_fraction"].append(run["privacy"]["changed_fraction"])
    for row in table.values():
        accs = row["accuracies"]
        row.update(mean_accuracy=sum(accs) / len(accs), min_accuracy=min(accs), max_accuracy=max(accs))
    return list(table.values())


def format_table(summary: list[dict[str, Any]]) -> str:
    """Markdown table: ε | test accuracy mean (min-max) | labels changed | ledger ε."""
    lines = [
        "| label ε | test accuracy, mean (min–max) | labels changed: measured / expected | ledger ε |",
        "|---|---|---|---|",
    ]
    for row in summary:
        eps = row["label_epsilon"]
        changed = sum(row["changed_fraction"]) / len(row["changed_fraction"])
        ledger = "–" if row["ledger_epsilon"] is None else f"{row['ledger_epsilon']:.3f}"
        name = "∞ (no label DP)" if eps == "inf" else f"{eps:g}"
        lines.append(
            f"| {name} | {row['mean_accuracy']:.3f} ({row['min_accuracy']:.3f}–{row['max_accuracy']:.3f}) "
            f"| {changed:.3f} / {row['expected_changed_fraction']:.3f} | {ledger} |"
        )
    return "\n".join(lines)


def plot(summary: list[dict[str, Any]], path: str) -> None:
    """Test accuracy against ε (log axis); no label DP as a dashed line, chance as a dotted one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [row for row in summary if row["label_epsilon"] != "inf"]
    fig, ax = plt.subplots(figsize=(6, 4))
    eps = [row["label_epsilon"] for row in finite]
    ax.errorbar(
        eps,
        [row["mean_accuracy"] for row in finite],
        yerr=[
            [row["mean_accuracy"] - row["min_accuracy"] for row in finite],
            [row["max_accuracy"] - row["mean_accuracy"] for row in finite],
        ],
        marker="o",
        capsize=3,
        label="label DP (randomized response)",
    )
    for row in summary:
        if row["label_epsilon"] == "inf":
            ax.axhline(row["mean_accuracy"], linestyle="--", color="gray", label="no label DP")
    ax.axhline(0.1, linestyle=":", color="black", label="chance (10 classes)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(eps, [f"{e:g}" for e in eps])
    ax.minorticks_off()
    ax.set_xlabel("label ε (each label ε-label-DP)")
    ax.set_ylabel("test accuracy (true labels)")
    ax.set_ylim(0, 1)
    runs = max(len(row["accuracies"]) for row in summary)
    ax.set_title(f"Vertical FL on digits (mean and range of {runs} run{'s' if runs > 1 else ''} per ε)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse options, simulate, write results.json (and the plot), print the table."""
    args = parse_args(argv)
    if args.plot_only:
        with open(os.path.join(args.results_dir, RESULTS_JSON)) as handle:
            results = json.load(handle)
        plot(results["summary"], os.path.join(args.results_dir, RESULTS_PNG))
        print(format_table(results["summary"]))
        return results
    start = time.perf_counter()
    runs = simulate(experiments(args), args.results_dir)
    summary = summarise(runs)
    wall = time.perf_counter() - start
    results = {
        "summary": summary,
        "runs": runs,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "wall_s": wall,
        "num_parties": runs[0]["config"]["num-parties"],
    }
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, RESULTS_JSON), "w") as handle:
        json.dump(results, handle, indent=2)
        handle.write("\n")
    if not args.no_plot:
        plot(summary, os.path.join(args.results_dir, RESULTS_PNG))
    print()
    print(format_table(summary))
    print(f"wall time {wall:.1f} s; results in {os.path.abspath(args.results_dir)}")
    return results


if __name__ == "__main__":
    main()
