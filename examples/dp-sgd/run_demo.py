"""Run the DP-SGD Flower app once (``flwr run`` on a local SuperLink in simulation mode, Ray backend).

    python examples/dp-sgd/run_demo.py [--rounds 5] [--num-clients 5] [--noise-multiplier 1.0]
        [--target-epsilon EPS] [--dataset digits|mnist] [--data-dir DIR] [--results-dir DIR] ...

The options become the run config of ``flwr run``
(``flwr_dp_experiments.simulation.run_app`` starts a private SuperLink, submits the
app and ends the SuperLink after the run). The app's per-round lines are printed;
Flower's and Ray's logs go to ``<results-dir>/flower.log``. At the end a table is
printed: accuracy, the ledger's ε, Opacus' cumulative ε and the per-round ε that
Flower's Opacus example would report.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:  # a plain checkout: flwr_dp_experiments next to examples/
    sys.path.insert(0, REPO)
#: The ServerApp's per-round line (dpsgd_app/results.py), printed; Flower's log goes to the log file.
APP_LINES = r"^round \d+  accuracy"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: those of dpsgd_app/config.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="server rounds")
    parser.add_argument("--num-clients", type=int, default=5, help="simulated SuperNodes (all train every round)")
    parser.add_argument("--noise-multiplier", type=float, default=1.0, help="z (ignored with --target-epsilon)")
    parser.add_argument("--target-epsilon", type=float, default=0.0, help="calibrate z once for all rounds (0: off)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="C, per-sample clipping bound")
    parser.add_argument("--clipping", choices=("flat", "per_layer"), default="flat")
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="expected Poisson batch size")
    parser.add_argument("--sample-rate", type=float, default=0.1, help="public Poisson rate q")
    parser.add_argument("--max-physical-batch-size", type=int, default=0, help="> 0: virtual steps")
    parser.add_argument("--grad-sample-mode", choices=("auto", "hooks", "ghost", "functorch"), default="auto")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--dataset", choices=("digits", "mnist"), default="digits")
    parser.add_argument("--data-dir", default="", help="MNIST folder (default: ../shared/data/mnist of the repo)")
    parser.add_argument("--hidden", type=int, default=None, help="MLP hidden units (default 32 digits, 64 MNIST)")
    parser.add_argument("--noise-seed", type=int, default=-1, help=">= 0 only for reproducible runs")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument(
        "--client-cpus",
        type=int,
        default=1,
        help="CPUs per simulated client (Ray actor); 2 on a 2-core machine means one actor",
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> dict[str, Any]:
    """Run-config overrides for the apps."""
    return {
        "num-server-rounds": args.rounds,
        "num-partitions": args.num_clients,
        "noise-multiplier": args.noise_multiplier,
        "target-epsilon": args.target_epsilon,
        "max-grad-norm": args.max_grad_norm,
        "clipping": args.clipping,
        "local-epochs": args.local_epochs,
        "batch-size": args.batch_size,
        "sample-rate": args.sample_rate,
        "max-physical-batch-size": args.max_physical_batch_size,
        "grad-sample-mode": args.grad_sample_mode,
        "lr": args.lr,
        "dataset": args.dataset,
        "data-dir": os.path.abspath(args.data_dir) if args.data_dir else "",
        "hidden": args.hidden if args.hidden is not None else (64 if args.dataset == "mnist" else 32),
        "noise-seed": args.noise_seed,
        "results-dir": os.path.abspath(args.results_dir),
    }


def simulate(settings: dict[str, Any], client_cpus: int = 1) -> dict[str, Any]:
    """Run the app with ``flwr run`` (settings as its run config) and return its results JSON."""
    from flwr_dp_experiments.results import RESULTS_JSON
    from flwr_dp_experiments.simulation import run_app

    return run_app(
        HERE,
        settings,
        num_supernodes=int(settings["num-partitions"]),
        num_cpus=client_cpus,
        echo=APP_LINES,
        results_path=os.path.join(settings["results-dir"], RESULTS_JSON),
    )


def _fmt(value: float | None) -> str:
    return "inf" if value is None else f"{value:.2f}"


def format_table(results: dict[str, Any]) -> str:
    """Round | accuracy | ledger ε | Opacus cumulative ε | Flower-example per-round ε."""
    lines = [
        f"initial accuracy: {results['initial_accuracy']:.3f}",
        f"{'round':>5}  {'accuracy':>8}  {'ledger eps':>10}  {'Opacus eps':>10}  {'Flower-example eps':>18}",
    ]
    for row in results["rounds"]:
        lines.append(
            f"{row['round']:>5}  {row['accuracy']:>8.3f}  {_fmt(row['epsilon_ledger']):>10}  "
            f"{_fmt(row.get('epsilon_opacus_max')):>10}  {_fmt(row.get('epsilon_flower_example')):>18}"
        )
    privacy = results["privacy"]
    lines.append(
        f"epsilon: record level ({privacy['neighboring_relation']}, one example of a client), "
        f"delta={privacy['delta']:g}; ledger = {privacy['method']} of RDP/PLD over the declared events; "
        "Opacus = its RDP accountant over all rounds (worst client); Flower's example = one round only"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse options, simulate, print the table; return the results."""
    args = parse_args(argv)
    start = time.perf_counter()
    results = simulate(settings_from(args), args.client_cpus)
    print()
    print(format_table(results))
    print(f"wall time {time.perf_counter() - start:.1f} s; results in {os.path.abspath(args.results_dir)}")
    return results


if __name__ == "__main__":
    main()
