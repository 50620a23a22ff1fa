"""Compare FedAvg and four DP mechanisms on the quickstart Flower app: one progress bar each, then a table.

    python examples/quickstart/run_demo.py [--rounds 5] [--num-clients 10]
        [--mechanism none central-dp central-dp-poisson local-dp dp-sgd] [--noise-multiplier 0.5]
        [--results-dir DIR] [--verbose]

The mechanisms named (default: all five) run the Flower app in this folder the
way Flower 1.41 supports (``flwr run``): a local SuperLink in simulation mode is
started (it and everything it started are ended on exit, on an error and on
Ctrl-C) and the app is submitted to it once with ``flwr run . <connection>
--run-config ... --federation-config num-supernodes=N`` (see
``flwr_dp_experiments.simulation``); its ``mechanisms`` run config makes the
ServerApp run them one after the other, each from the same initial model with
a fresh strategy and ledger (one simulation start instead of one per method).
The ServerApp writes ``DIR/<mechanism>/results.{json,png}``; at the end a table
compares the methods (final accuracy, ε, and what ε protects) and is saved as
``DIR/summary.{json,md,png}``. With a single mechanism the results go to ``DIR``
itself.

The terminal shows a progress bar per method (round, accuracy, ε), the table
and where the plot is; Flower's and Ray's logs go to ``DIR/flower.log``
(``--verbose`` prints them too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import time
from typing import Any, Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:  # a plain checkout: flwr_dp_experiments next to examples/
    sys.path.insert(0, REPO)
LOG_FILE = "flower.log"
#: The ServerApp's per-round line (quickstart/results.py: format_row) and its line before each mechanism.
ROUND_LINE = re.compile(r"^round (\d+)  accuracy ([0-9.]+)  epsilon (\S+)")
MECHANISM_LINE = re.compile(r"^mechanism (\S+)$")
MECHANISMS = ("none", "central-dp", "central-dp-poisson", "local-dp", "dp-sgd")
TITLES = {
    "none": "FedAvg (no DP)",
    "central-dp": "central DP, fixed clipping",
    "central-dp-poisson": "central DP, Poisson clients",
    "local-dp": "local DP (noisy updates)",
    "dp-sgd": "DP-SGD (Opacus)",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: those of quickstart/config.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="server rounds")
    parser.add_argument("--num-clients", type=int, default=10, help="simulated SuperNodes (all train every round)")
    parser.add_argument("--noise-multiplier", type=float, default=0.5, help="z; noise std on the mean is z*C/clients")
    parser.add_argument("--clipping-norm", type=float, default=1.0, help="C, L2 bound on each client update")
    parser.add_argument("--max-epsilon", type=float, default=0.0, help="privacy budget (0: none)")
    parser.add_argument(
        "--mechanism",
        "--mechanisms",
        dest="mechanisms",
        nargs="+",
        choices=MECHANISMS,
        default=list(MECHANISMS),
        help="one or more; all five by default",
    )
    parser.add_argument("--clients-per-round", type=int, default=5, help="central-dp-poisson: expected m")
    parser.add_argument("--local-noise-multiplier", type=float, default=0.05, help="local-dp: z (std z*2C)")
    parser.add_argument("--dp-sgd-noise-multiplier", type=float, default=1.0, help="dp-sgd: z (std z*C per batch)")
    parser.add_argument(
        "--client-gpus",
        type=float,
        default=0.0,
        help="GPUs per simulated client (Ray client resources; e.g. 0.1 puts 10 clients on one GPU)",
    )
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument(
        "--verbose", action="store_true", help="print Flower's and Ray's logs too (they always go to DIR/flower.log)"
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace, mechanism: str, results_dir: str) -> dict[str, Any]:
    """Run-config overrides for the apps."""
    return {
        "num-server-rounds": args.rounds,
        "num-partitions": args.num_clients,
        "noise-multiplier": args.noise_multiplier,
        "clipping-norm": args.clipping_norm,
        "max-epsilon": args.max_epsilon,
        "mechanism": mechanism,
        "clients-per-round": args.clients_per_round,
        "local-noise-multiplier": args.local_noise_multiplier,
        "dp-sgd-noise-multiplier": args.dp_sgd_noise_multiplier,
        "results-dir": os.path.abspath(results_dir),
    }


def simulate(
    sim: Any,
    settings: dict[str, Any],
    mechanisms: list[str],
    num_gpus: float = 0.0,
    on_line: Optional[Callable[[str], None]] = None,
) -> dict[str, dict[str, Any]]:
    """Run the app once with ``flwr run`` on the started LocalSimulation ``sim``; return each mechanism's results.

    One mechanism: ``settings["mechanism"]``, results in ``settings["results-dir"]``; several: the
    ``mechanisms`` run config, results in ``<results-dir>/<mechanism>/``. ``on_line`` gets every line.
    """
    from flwr_dp_experiments.results import RESULTS_JSON
    from flwr_dp_experiments.simulation import run_app

    root = settings["results-dir"]
    folders = {m: root if len(mechanisms) == 1 else os.path.join(root, m) for m in mechanisms}
    for folder in folders.values():  # a stale results.json is never mistaken for this run's
        if os.path.exists(os.path.join(folder, RESULTS_JSON)):
            os.remove(os.path.join(folder, RESULTS_JSON))
    settings = {**settings, "mechanism": mechanisms[0]}
    if len(mechanisms) > 1:
        settings["mechanisms"] = ",".join(mechanisms)
    run_app(
        HERE,
        settings,
        num_supernodes=int(settings["num-partitions"]),
        simulation=sim,
        num_gpus=num_gpus,
        on_line=on_line,
        results_path=os.path.join(folders[mechanisms[-1]], RESULTS_JSON),
    )
    results = {}
    for mechanism, folder in folders.items():
        path = os.path.join(folder, RESULTS_JSON)
        if not os.path.exists(path):
            raise RuntimeError(f"the ServerApp did not write {path}; see the Flower log {sim.log_file}")
        with open(path) as handle:
            results[mechanism] = json.load(handle)
    return results


def summary_rows(all_results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per mechanism: final accuracy, final ε and δ, what ε protects."""
    rows = []
    for mechanism, results in all_results.items():
        privacy = results["privacy"]
        rows.append(
            {
                "mechanism": mechanism,
                "method": TITLES[mechanism],
                "accuracy": results["rounds"][-1]["accuracy"] if results["rounds"] else results["initial_accuracy"],
                "epsilon": None if privacy is None else privacy["epsilon"],
                "delta": None if privacy is None else privacy["delta"],
                "protects": "nothing" if privacy is None else privacy["unit"].split(" (")[0],
                "rounds": len(results["rounds"]),
            }
        )
    return rows


def format_summary(rows: list[dict[str, Any]]) -> str:
    """The per-method table printed at the end (markdown, so it is also the saved summary.md)."""
    lines = ["| method | accuracy | epsilon | delta | epsilon protects |", "|---|---|---|---|---|"]
    for row in rows:
        eps = "inf" if row["epsilon"] is None else f"{row['epsilon']:.2f}"
        delta = "-" if row["delta"] is None else f"{row['delta']:g}"
        lines.append(f"| {row['method']} | {row['accuracy']:.3f} | {eps} | {delta} | {row['protects']} |")
    return "\n".join(lines)


def plot_summary(all_results: dict[str, dict[str, Any]], path: str) -> None:
    """Accuracy against ε spent, one line per mechanism (FedAvg as a horizontal reference)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for mechanism, results in all_results.items():
        accuracy = [row["accuracy"] for row in results["rounds"]]
        if results["privacy"] is None:
            if accuracy:
                ax.axhline(accuracy[-1], color="gray", ls="--", label=TITLES[mechanism])
            continue
        eps = [row["epsilon"] for row in results["rounds"]]
        ax.plot(eps, accuracy, marker="o", label=f"{TITLES[mechanism]} ({results['privacy']['unit'].split(' (')[0]})")
    ax.set(
        xscale="log",
        xlabel="epsilon spent (log; delta=1e-5)",
        ylabel="central test accuracy",
        ylim=(0, 1),
        title="quickstart (digits): accuracy against privacy spent, per round",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_summary(all_results: dict[str, dict[str, Any]], results_dir: str) -> str:
    """summary.json, summary.md, summary.png in ``results_dir``; returns the markdown table."""
    rows = summary_rows(all_results)
    table = format_summary(rows)
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, "summary.json"), "w") as handle:
        json.dump(rows, handle, indent=2)
    with open(os.path.join(results_dir, "summary.md"), "w") as handle:
        handle.write(table + "\n")
    plot_summary(all_results, os.path.join(results_dir, "summary.png"))
    return table


def progress_bars(mechanisms: list[str], rounds: int) -> Any:
    """One rich progress bar per method: round, accuracy, ε, elapsed time (rich comes with flwr)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    width = max(len(TITLES[m]) for m in mechanisms)
    progress = Progress(
        TextColumn(f"{{task.description:<{width}}}"),
        BarColumn(bar_width=20),
        TextColumn("round"),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=Console(highlight=False),
        redirect_stderr=False,
    )
    tasks = {m: progress.add_task(TITLES[m], total=rounds, start=False, status="waiting") for m in mechanisms}
    return progress, tasks


def status(accuracy: float, epsilon: float) -> str:
    """``accuracy 0.912  eps 3.05`` (``eps inf`` without DP)."""
    return f"accuracy {accuracy:.3f}  eps {'inf' if not math.isfinite(epsilon) else f'{epsilon:.2f}'}"


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Parse options, run each mechanism with a progress bar, print the table; return the results per mechanism."""
    from flwr_dp_experiments.simulation import LocalSimulation

    args = parse_args(argv)
    mechanisms = list(dict.fromkeys(args.mechanisms))
    results_dir = os.path.abspath(args.results_dir)
    os.makedirs(results_dir, exist_ok=True)
    log_file = os.path.join(results_dir, LOG_FILE)
    if os.path.exists(log_file):
        os.remove(log_file)
    start = time.perf_counter()
    print(
        f"quickstart: {len(mechanisms)} method{'s' * (len(mechanisms) > 1)}, {args.num_clients} clients, "
        f"{args.rounds} rounds on sklearn digits (Flower simulation: local SuperLink + flwr run)"
    )
    print(f"Flower and Ray logs: {log_file}" + ("" if args.verbose else " (--verbose prints them)"), flush=True)
    progress, tasks = progress_bars(mechanisms, args.rounds)
    current: list[Any] = []  # the task of the mechanism running now

    def switch(mechanism: str) -> None:
        if current and current[0] == tasks[mechanism]:
            return
        if current:
            progress.stop_task(current.pop())
        current.append(tasks[mechanism])
        progress.start_task(current[0])
        progress.update(current[0], status="starting")

    def on_line(line: str) -> None:
        if (match := MECHANISM_LINE.match(line)) and match.group(1) in tasks:
            switch(match.group(1))
        elif (match := ROUND_LINE.match(line)) and current:
            progress.update(
                current[0], completed=int(match.group(1)), status=status(float(match.group(2)), float(match.group(3)))
            )

    with LocalSimulation(log_file, verbose=args.verbose) as sim, progress:
        switch(mechanisms[0])
        all_results = simulate(
            sim, settings_from(args, mechanisms[0], results_dir), mechanisms, args.client_gpus, on_line
        )
        for mechanism, results in all_results.items():
            rows = results["rounds"]
            final = (
                status(rows[-1]["accuracy"], math.inf if rows[-1]["epsilon"] is None else rows[-1]["epsilon"])
                if rows
                else "no rounds"
            )
            progress.update(tasks[mechanism], completed=len(rows), status=final)
        progress.stop_task(current[0])
    print(f"\n{args.num_clients} clients, {args.rounds} rounds, digits; final round:")
    if len(mechanisms) > 1:
        print(write_summary(all_results, results_dir))
        plot = os.path.join(results_dir, "summary.png")
    else:
        print(format_summary(summary_rows(all_results)))
        plot = os.path.join(results_dir, "results.png")
    print(f"plot: {plot}  (wall time {time.perf_counter() - start:.0f} s; per-method results in {results_dir})")
    return all_results


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM ends the demo like Ctrl-C does: through the ``with`` blocks, so the SuperLink is ended too."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: the local SuperLink and its simulation were stopped", file=sys.stderr)
        sys.exit(130)
