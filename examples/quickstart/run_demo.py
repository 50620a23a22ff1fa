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
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_DISABLE_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


def _make_importable() -> None:
    """Let this process and the Ray workers ``import quickstart`` from a plain checkout."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if HERE not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([HERE, *paths])
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


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
    """Run the apps with ``run_simulation`` and return the results JSON they wrote."""
    _make_importable()
    from flwr.simulation import run_simulation

    from quickstart.config import ENV_VAR
    from quickstart.results import RESULTS_JSON

    os.environ[ENV_VAR] = json.dumps(settings)
    path = os.path.join(settings["results-dir"], RESULTS_JSON)
    if os.path.exists(path):
        os.remove(path)
    from quickstart.client_app import app as client_app
    from quickstart.server_app import app as server_app

    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=int(settings["num-partitions"]),
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    if not os.path.exists(path):
        raise RuntimeError(f"the ServerApp did not write {path}; see the Flower log above")
    with open(path) as handle:
        return json.load(handle)


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
