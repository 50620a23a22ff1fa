"""Run the quickstart ServerApp and ClientApp in-process (Flower simulation, Ray backend).

    python examples/quickstart/run_demo.py [--rounds 5] [--num-clients 10]
        [--noise-multiplier 0.5] [--mechanism central-dp|central-dp-poisson|local-dp|none]
        [--results-dir DIR]

``flwr.simulation.run_simulation`` gives the apps an empty run config, so the
settings travel as JSON in the ``QUICKSTART_RUN_CONFIG`` environment variable
(read by ``quickstart.config.resolve_run_config``; Ray workers inherit it).
At the end a table of accuracy and epsilon per round is printed.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SCOPE = {
    "central-dp": "central DP, every client every round (no sampling amplification)",
    "central-dp-poisson": "central DP, Poisson client sampling (amplified)",
    "local-dp": "local DP per client (worst client)",
    "none": "",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: those of quickstart/config.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="server rounds")
    parser.add_argument("--num-clients", type=int, default=10, help="simulated SuperNodes (all train every round)")
    parser.add_argument("--noise-multiplier", type=float, default=0.5, help="z; noise std on the mean is z*C/clients")
    parser.add_argument("--clipping-norm", type=float, default=1.0, help="C, L2 bound on each client update")
    parser.add_argument("--max-epsilon", type=float, default=0.0, help="privacy budget (0: none)")
    parser.add_argument("--mechanism", choices=("central-dp", "central-dp-poisson", "local-dp", "none"),
                        default="central-dp")
    parser.add_argument("--clients-per-round", type=int, default=5, help="central-dp-poisson: expected m")
    parser.add_argument("--local-noise-multiplier", type=float, default=0.05, help="local-dp: z (std z*2C)")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> dict[str, Any]:
    """Run-config overrides for the apps."""
    return {
        "num-server-rounds": args.rounds,
        "num-partitions": args.num_clients,
        "noise-multiplier": args.noise_multiplier,
        "clipping-norm": args.clipping_norm,
        "max-epsilon": args.max_epsilon,
        "mechanism": args.mechanism,
        "clients-per-round": args.clients_per_round,
        "local-noise-multiplier": args.local_noise_multiplier,
        "results-dir": os.path.abspath(args.results_dir),
    }


def simulate(settings: dict[str, Any]) -> dict[str, Any]:
    """Run the apps in-process (settings via ``QUICKSTART_RUN_CONFIG``) and return their results JSON."""
    from flwr_dp_strategies.simulation import prepare_process, run_in_process

    prepare_process([HERE])
    from quickstart.client_app import app as client_app
    from quickstart.config import ENV_VAR
    from quickstart.results import RESULTS_JSON
    from quickstart.server_app import app as server_app

    return run_in_process(server_app, client_app, num_supernodes=int(settings["num-partitions"]),
                          settings=settings, env_var=ENV_VAR,
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
        lines.append(f"epsilon: user-level ({privacy['neighboring_relation']}, one client's whole data), "
                     f"delta={privacy['delta']:g}, {privacy['method']} of RDP/PLD, {SCOPE[results['mechanism']]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse options, simulate, print the table; return the results."""
    args = parse_args(argv)
    start = time.perf_counter()
    results = simulate(settings_from(args))
    print()
    print(format_table(results))
    print(f"wall time {time.perf_counter() - start:.1f} s; results in {os.path.abspath(args.results_dir)}")
    return results


if __name__ == "__main__":
    main()
