"""Run the DELM Flower app in-process (Flower simulation, Ray backend).

    python examples/delm/run_demo.py [--variant basic|enhanced|enhanced-nosampling|shuffle|sum]
        [--features pixels|hog] [--rounds 20] [--num-clients 20] [--dataset digits|mnist|emnist-letters] [--data-dir DIR]
        [--scheme iid|1-class|2-class] [--epsilon 1.0] [--results-dir DIR]

The same app runs with ``flwr run examples/delm`` (see README.md). The settings
travel as JSON in ``DELM_RUN_CONFIG`` (``run_simulation`` gives the apps an
empty run config); keys not given fall back to ``delm_app/config.py``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: those of delm_app/config.py)."""
    from delm_app.config import DATASETS, FEATURES, VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=VARIANTS, default="basic")
    parser.add_argument("--features", choices=FEATURES, default="pixels",
                        help="unit-norm pooled pixels, or histograms of oriented gradients (better on MNIST)")
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
    from flwr_dp_experiments.simulation import prepare_process, run_in_process

    prepare_process([HERE])
    args = parse_args(argv)
    from delm_app.client_app import app as client_app
    from delm_app.config import ENV_VAR
    from delm_app.results import RESULTS_JSON
    from delm_app.server_app import app as server_app

    settings = {"variant": args.variant, "num-server-rounds": args.rounds, "num-partitions": args.num_clients,
                "dataset": args.dataset, "data-dir": args.data_dir, "scheme": args.scheme, "epsilon": args.epsilon,
                "components": args.components, "features": args.features,
                "results-dir": os.path.abspath(args.results_dir)}
    start = time.perf_counter()
    results = run_in_process(server_app, client_app, num_supernodes=args.num_clients, settings=settings,
                             env_var=ENV_VAR, results_path=os.path.join(settings["results-dir"], RESULTS_JSON))
    last, privacy = results["rounds"][-1], results["privacy"]
    print(f"\nDELM {args.variant} on {args.dataset} ({args.scheme}, {args.num_clients} clients, {args.rounds} rounds): "
          f"accuracy {last['accuracy']:.3f}, epsilon {privacy['epsilon']:.3f} ({privacy['unit']}, "
          f"{privacy['neighboring_relation']}, delta {privacy['delta']:g}); wall {time.perf_counter() - start:.0f} s")
    return results


if __name__ == "__main__":
    main()
