"""Accuracy of vertical FL with label DP against ε: run the sweep in-process and write the results.

    python examples/label-dp/run_experiment.py [--eps 0.5 1 2 4 8 inf] [--repeats 2]
        [--rounds 80] [--results-dir DIR]

Runs the label party (ServerApp) and 2 feature parties (ClientApps) with
Flower's ``run_simulation`` (Ray backend): one simulation for the whole sweep
(see ``label_dp_app/sweep.py``), one experiment per (ε, repeat); repeat r uses
model/batch seed ``seed + r``, and the label randomisation is drawn from fresh
OS entropy each time. ``inf`` means no label DP (training on the true labels).
``run_simulation`` gives the apps an empty run config: the base settings are
``label_dp_app/config.py: DEFAULTS`` (= pyproject's), optionally overridden by
JSON in ``LABEL_DP_RUN_CONFIG``; the sweep's own settings override both.

Writes ``<results-dir>/results.json`` (every run, plus mean/min/max test accuracy
per ε) and ``<results-dir>/accuracy_vs_eps.png``, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
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
    parser.add_argument("--eps", type=parse_eps, nargs="+", default=[0.5, 1.0, 2.0, 4.0, 8.0, math.inf],
                        help="label epsilons to run (inf: no label DP)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per epsilon (model seeds seed, seed+1, ...)")
    parser.add_argument("--rounds", type=int, default=80, help="train steps per run")
    parser.add_argument("--eval-every", type=int, default=20, help="test accuracy every this many rounds")
    parser.add_argument("--seed", type=int, default=42, help="model/batch seed of the first repeat")
    parser.add_argument("--rr-seed", type=int, default=-1, help="label randomisation seed (-1: OS entropy)")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--plot-only", action="store_true",
                        help="only redraw the PNG from <results-dir>/results.json (no simulation)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be >= 1")
    return args


def experiments(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One run-config override per (ε, repeat)."""
    return [{"label-epsilon": eps, "seed": args.seed + r, "num-server-rounds": args.rounds,
             "eval-every": args.eval_every, "rr-seed": args.rr_seed}
            for eps in args.eps for r in range(args.repeats)]


def simulate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run all experiments in one simulation; return each run's results."""
    from flwr.simulation import run_simulation

    from flwr_dp_experiments.simulation import prepare_process

    prepare_process([HERE])

    from label_dp_app.client_app import app as client_app
    from label_dp_app.config import resolve_run_config
    from label_dp_app.sweep import build_sweep_app

    sink: list[dict[str, Any]] = []
    run_simulation(
        server_app=build_sweep_app(runs, sink),
        client_app=client_app,
        num_supernodes=int(resolve_run_config()["num-parties"]),  # one SuperNode per feature party
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    if len(sink) != len(runs):
        raise RuntimeError(f"only {len(sink)} of {len(runs)} runs finished; see the Flower log above")
    return sink


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ε: test accuracies of the repeats, mean/min/max, ledger ε and label-change rates."""
    table: dict[str, dict[str, Any]] = {}
    for run in runs:
        key = str(run["label_epsilon"])
        row = table.setdefault(key, {"label_epsilon": run["label_epsilon"], "accuracies": [],
                                     "ledger_epsilon": run["privacy"]["ledger_epsilon"],
                                     "ledger_events": len(run["privacy"]["events"]),
                                     "changed_fraction": [],
                                     "expected_changed_fraction": run["privacy"]["expected_changed_fraction"]})
        row["accuracies"].append(run["final_accuracy"])
        row["changed_fraction"].append(run["privacy"]["changed_fraction"])
    for row in table.values():
        accs = row["accuracies"]
        row.update(mean_accuracy=sum(accs) / len(accs), min_accuracy=min(accs), max_accuracy=max(accs))
    return list(table.values())


def format_table(summary: list[dict[str, Any]]) -> str:
    """Markdown table: ε | test accuracy mean (min-max) | labels changed | ledger ε."""
    lines = ["| label ε | test accuracy, mean (min–max) | labels changed: measured / expected | ledger ε |",
             "|---|---|---|---|"]
    for row in summary:
        eps = row["label_epsilon"]
        changed = sum(row["changed_fraction"]) / len(row["changed_fraction"])
        ledger = "–" if row["ledger_epsilon"] is None else f"{row['ledger_epsilon']:.3f}"
        name = "∞ (no label DP)" if eps == "inf" else f"{eps:g}"
        lines.append(f"| {name} | {row['mean_accuracy']:.3f} ({row['min_accuracy']:.3f}–{row['max_accuracy']:.3f}) "
                     f"| {changed:.3f} / {row['expected_changed_fraction']:.3f} | {ledger} |")
    return "\n".join(lines)


def plot(summary: list[dict[str, Any]], path: str) -> None:
    """Test accuracy against ε (log axis); no label DP as a dashed line, chance as a dotted one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [row for row in summary if row["label_epsilon"] != "inf"]
    fig, ax = plt.subplots(figsize=(6, 4))
    eps = [row["label_epsilon"] for row in finite]
    ax.errorbar(eps, [row["mean_accuracy"] for row in finite],
                yerr=[[row["mean_accuracy"] - row["min_accuracy"] for row in finite],
                      [row["max_accuracy"] - row["mean_accuracy"] for row in finite]],
                marker="o", capsize=3, label="label DP (randomized response)")
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
    runs = simulate(experiments(args))
    summary = summarise(runs)
    wall = time.perf_counter() - start
    results = {"summary": summary, "runs": runs, "repeats": args.repeats, "rounds": args.rounds,
               "wall_s": wall, "num_parties": runs[0]["config"]["num-parties"]}
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
