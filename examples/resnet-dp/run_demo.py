"""Run the example once with ``flwr run`` (a private local SuperLink in simulation mode, Ray backend).

    python examples/resnet-dp/run_demo.py [--size full|reduced] [--rounds 3] [--num-clients 10]
        [--clients-per-round 5] [--federation auto|local-gpu|local-cpu] [--set KEY=VALUE ...] [--results-dir DIR]

The federation's client resources come from pyproject.toml's ``[tool.flwr-dp-strategies.federations]``
(``auto``: ``local-gpu``, a quarter of a GPU per client, when torch sees CUDA, else ``local-cpu``); the
options and ``--set`` become the run config. The app's per-round lines are printed; Flower's and Ray's logs
go to ``<results-dir>/flower.log``.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
import tomllib
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:  # a plain checkout: flwr_dp_experiments next to examples/
    sys.path.insert(0, REPO)
APP_LINES = r"^round \d+  accuracy"


def federation(name: str = "auto") -> dict[str, Any]:
    """``{"num-supernodes", "num-cpus", "num-gpus"}`` of a federation in pyproject.toml (``auto``: GPU if any)."""
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as handle:
        table = tomllib.load(handle)["tool"]["flwr-dp-strategies"]["federations"]
    if name == "auto":
        import torch

        name = table["default"] if torch.cuda.is_available() else "local-cpu"
    options = table[name]["options"]
    resources = options["backend"]["client-resources"]
    return {
        "name": name,
        "num-supernodes": int(options["num-supernodes"]),
        "num-cpus": int(resources["num-cpus"]),
        "num-gpus": float(resources["num-gpus"]),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("full", "reduced"), default="full")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-clients", type=int, default=None, help="N (default: the federation's supernodes)")
    parser.add_argument("--clients-per-round", type=int, default=5, help="m, the expected Poisson cohort")
    parser.add_argument("--federation", choices=("auto", "local-gpu", "local-cpu"), default="auto")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other run-config key")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace, clients: int) -> dict[str, Any]:
    """Run-config overrides."""
    settings: dict[str, Any] = {
        "size": args.size,
        "num-server-rounds": args.rounds,
        "num-partitions": clients,
        "clients-per-round": args.clients_per_round,
        "results-dir": os.path.abspath(args.results_dir),
    }
    for item in args.set:
        key, _, value = item.partition("=")
        if value in ("true", "false"):  # TOML's booleans
            settings[key] = value == "true"
            continue
        try:
            settings[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            settings[key] = value
    return settings


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from flwr_dp_experiments.results import RESULTS_JSON
    from flwr_dp_experiments.simulation import run_app

    args = parse_args(argv)
    fed = federation(args.federation)
    clients = args.num_clients or fed["num-supernodes"]
    settings = settings_from(args, clients)
    print(f"federation {fed['name']}: {clients} clients, {fed['num-cpus']} CPU and {fed['num-gpus']:g} GPU each")
    start = time.perf_counter()
    results = run_app(
        HERE,
        settings,
        num_supernodes=clients,
        num_cpus=fed["num-cpus"],
        num_gpus=fed["num-gpus"],
        echo=APP_LINES,
        results_path=os.path.join(settings["results-dir"], RESULTS_JSON),
    )
    privacy = results["privacy"]
    print(
        f"client-level epsilon {privacy['client_level']}, record-level epsilon {privacy['record_level']} "
        f"(worst node), ledger's combined epsilon {privacy['combined']}, delta {privacy['delta']:g}"
    )
    print(f"wall time {time.perf_counter() - start:.1f} s; results in {settings['results-dir']}")
    return results


if __name__ == "__main__":
    main()
