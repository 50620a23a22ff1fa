"""Run the quickstart ServerApp and ClientApp in-process (Flower simulation, Ray backend).

    python examples/quickstart/run_demo.py [--rounds 5] [--num-clients 10]
        [--mechanism none central-dp central-dp-poisson local-dp dp-sgd] [--noise-multiplier 0.5]
        [--results-dir DIR]

Every mechanism named (default: all five) is one simulation of ``--rounds``
rounds; each prints its per-round accuracy and ε, writes its results JSON and
plot to ``DIR/<mechanism>/``, and at the end a table compares the methods
(final accuracy, ε, and what ε protects) and is saved as ``DIR/summary.{json,md,png}``.
With a single mechanism the results go to ``DIR`` itself.

``flwr.simulation.run_simulation`` gives the apps an empty run config, so the
settings travel as JSON in the ``QUICKSTART_RUN_CONFIG`` environment variable
(read by ``quickstart.config.resolve_run_config``; Ray workers inherit it).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MECHANISMS = ("none", "central-dp", "central-dp-poisson", "local-dp", "dp-sgd")
SCOPE = {
    "central-dp": "central DP, every client every round (no sampling amplification)",
    "central-dp-poisson": "central DP, Poisson client sampling (amplified)",
    "local-dp": "local DP per client (worst client)",
    "dp-sgd": "DP-SGD on every client (Poisson-sampled batches, amplified; worst client)",
    "none": "",
}
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
    parser.add_argument("--mechanism", "--mechanisms", dest="mechanisms", nargs="+", choices=MECHANISMS,
                        default=list(MECHANISMS), help="one or more; all five by default")
    parser.add_argument("--clients-per-round", type=int, default=5, help="central-dp-poisson: expected m")
    parser.add_argument("--local-noise-multiplier", type=float, default=0.05, help="local-dp: z (std z*2C)")
    parser.add_argument("--dp-sgd-noise-multiplier", type=float, default=1.0, help="dp-sgd: z (std z*C per batch)")
    parser.add_argument("--client-gpus", type=float, default=0.0,
                        help="GPUs per simulated client (Ray client resources; e.g. 0.1 puts 10 clients on one GPU)")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
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


def simulate(settings: dict[str, Any], num_gpus: float = 0.0) -> dict[str, Any]:
    """Run the apps in-process (settings via ``QUICKSTART_RUN_CONFIG``) and return their results JSON."""
    from flwr_dp_experiments.simulation import prepare_process, run_in_process

    prepare_process([HERE])
    from quickstart.client_app import app as client_app
    from quickstart.config import ENV_VAR
    from quickstart.results import RESULTS_JSON
    from quickstart.server_app import app as server_app

    return run_in_process(server_app, client_app, num_supernodes=int(settings["num-partitions"]),
                          settings=settings, env_var=ENV_VAR, num_gpus=num_gpus,
                          results_path=os.path.join(settings["results-dir"], RESULTS_JSON))


def format_table(results: dict[str, Any]) -> str:
    """Round | accuracy | epsilon, plus what epsilon means."""
    privacy = results["privacy"]
    lines = [f"mechanism: {results['mechanism']}   initial accuracy: {results['initial_accuracy']:.3f}",
             f"{'round':>5}  {'accuracy':>8}  {'epsilon':>8}"]
    for row in results["rounds"]:
        eps = "inf" if row["epsilon"] is None else f"{row['epsilon']:.2f}"
        note = "" if row["released"] else "  (budget exhausted, no release)"
        lines.append(f"{row['round']:>5}  {row['accuracy']:>8.3f}  {eps:>8}{note}")
    if privacy is not None:
        lines.append(f"epsilon: {privacy['unit']}, {privacy['neighboring_relation']}, "
                     f"delta={privacy['delta']:g}, {privacy['method']} of RDP/PLD, {SCOPE[results['mechanism']]}")
    return "\n".join(lines)


def summary_rows(all_results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per mechanism: final accuracy, final ε and δ, what ε protects."""
    rows = []
    for mechanism, results in all_results.items():
        privacy = results["privacy"]
        rows.append({
            "mechanism": mechanism, "method": TITLES[mechanism],
            "accuracy": results["rounds"][-1]["accuracy"] if results["rounds"] else results["initial_accuracy"],
            "epsilon": None if privacy is None else privacy["epsilon"],
            "delta": None if privacy is None else privacy["delta"],
            "protects": "nothing" if privacy is None else privacy["unit"].split(" (")[0],
            "rounds": len(results["rounds"]),
        })
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
    ax.set(xscale="log", xlabel="epsilon spent (log; delta=1e-5)", ylabel="central test accuracy", ylim=(0, 1),
           title="quickstart (digits): accuracy against privacy spent, per round")
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


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Parse options, simulate each mechanism, print the tables; return the results per mechanism."""
    args = parse_args(argv)
    mechanisms = list(dict.fromkeys(args.mechanisms))
    start = time.perf_counter()
    all_results = {}
    for mechanism in mechanisms:
        results_dir = args.results_dir if len(mechanisms) == 1 else os.path.join(args.results_dir, mechanism)
        print(f"\n=== {TITLES[mechanism]} ({mechanism}) ===", flush=True)
        all_results[mechanism] = simulate(settings_from(args, mechanism, results_dir), args.client_gpus)
        print()
        print(format_table(all_results[mechanism]), flush=True)
    if len(mechanisms) > 1:
        print(f"\n{args.num_clients} clients, {args.rounds} rounds, digits; final round:")
        print(write_summary(all_results, args.results_dir))
    print(f"wall time {time.perf_counter() - start:.1f} s; results in {os.path.abspath(args.results_dir)}")
    return all_results


if __name__ == "__main__":
    main()
