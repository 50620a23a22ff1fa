"""Run the DELM Flower app once (``flwr run`` on a local SuperLink in simulation mode, Ray backend).

    python examples/delm/run_demo.py [--variant basic|enhanced|enhanced-nosampling|shuffle|sum]
        [--features pixels|hog] [--rounds 20] [--num-clients 20] [--dataset digits|mnist|emnist-letters] [--data-dir DIR]
        [--scheme iid|1-class|2-class] [--epsilon 1.0] [--results-dir DIR]

The options become the run config of ``flwr run`` (``flwr_dp_experiments.simulation.run_app``
starts a private SuperLink, submits the app and ends the SuperLink after the run); keys not
given fall back to pyproject.toml's ``[tool.flwr.app.config]``. The app's own lines (rounds,
PCA) are printed; Flower's and Ray's logs go to ``<results-dir>/flower.log``.
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
#: The ServerApp's own lines, printed; Flower's log goes to the log file.
APP_LINES = r"^(round \d|LDP-FPCA|no PCA)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: those of delm_app/config.py)."""
    from delm_app.config import DATASETS, FEATURES, VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=VARIANTS, default="basic")
    parser.add_argument(
        "--features",
        choices=FEATURES,
        default="pixels",
        help="unit-norm pooled pixels, or histograms of oriented gradients (better on MNIST)",
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--num-clients", type=int, default=20)
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--data-dir", default="", help="folder of the IDX files (MNIST / EMNIST letters)")
    parser.add_argument("--scheme", default="iid", help="iid, 1-class or 2-class")
    parser.add_argument("--epsilon", type=float, default=1.0, help="record-level budget per client")
    parser.add_argument("--components", type=int, default=0, help="q > 0: LDP-FPCA first; 0: no PCA")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results", "app"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Simulate the app with the options; print the last round; return the results JSON."""
    from flwr_dp_experiments.simulation import prepare_process, run_app

    prepare_process([REPO, HERE])
    args = parse_args(argv)
    from delm_app.results import RESULTS_JSON

    settings = {
        "variant": args.variant,
        "num-server-rounds": args.rounds,
        "num-partitions": args.num_clients,
        "dataset": args.dataset,
        "data-dir": args.data_dir,
        "scheme": args.scheme,
        "epsilon": args.epsilon,
        "components": args.components,
        "features": args.features,
        "results-dir": os.path.abspath(args.results_dir),
    }
    start = time.perf_counter()
    results = run_app(
        HERE,
        settings,
        num_supernodes=args.num_clients,
        echo=APP_LINES,
        results_path=os.path.join(settings["results-dir"], RESULTS_JSON),
    )
    last, privacy = results["rounds"][-1], results["privacy"]
    print(
        f"\nDELM {args.variant} on {args.dataset} ({args.scheme}, {args.num_clients} clients, {args.rounds} rounds): "
        f"accuracy {last['accuracy']:.3f}, epsilon {privacy['epsilon']:.3f} ({privacy['unit']}, "
        f"{privacy['neighboring_relation']}, delta {privacy['delta']:g}); wall {time.perf_counter() - start:.0f} s"
    )
    return results


if __name__ == "__main__":
    main()
