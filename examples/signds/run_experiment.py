"""SignDS against FedAvg on digits and MNIST: accuracy, upload size and ε per round.

    python examples/signds/run_experiment.py                  # the committed run (~6 min on 2 cores)
    python examples/signds/run_experiment.py --quick          # a few rounds of everything (~2 min)
    python examples/signds/run_experiment.py --datasets digits --methods signds-eps10 \
        --num-clients 10 --rounds 3 --set initial-r-est=0.01 --results-dir /tmp/signds

For each dataset it runs the Flower app (``signds_app``) with ``flwr run`` on a
local SuperLink in simulation mode (Ray backend, 100 IID clients, all of them
every round, central evaluation every round) once per method of :data:`METHODS`:

* ``fedavg`` - Flower's FedAvg, dense upload of d float32 weights, no privacy;
* ``signds-default`` - SignDS at MindSpore's defaults (sign_k 0.01, sign_eps 100,
  thr 0.6, dim_out 0 → optimal h ≤ 100; MagRR ε_rr 5, initial r_est 1e-5, step
  3·N·r_est): ε = 105 per round;
* ``signds-eps10`` - SignDS at the best setting found with ε ≤ 10 per round and an
  upload ≤ 0.25 % of dense (``search.py``, the plain-loop emulation, found it).

All methods share the local training of the dataset (E epochs of SGD at lr).
The settings are the run config of each ``flwr run``
(``flwr_dp_experiments.simulation``); the app's per-round lines are printed, Flower's
and Ray's logs go to ``<results-dir>/flower.log``. Outputs in ``--results-dir`` (default
``examples/signds/results``): ``results.json`` (everything), ``results.md``
(tables), ``results.png`` (accuracy, r_est and cumulative ε against the round)
and one ``run-<method>-<dataset>.json`` log per run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:  # a plain checkout: flwr_dp_experiments next to examples/
    sys.path.insert(0, REPO)
#: The ServerApp's own lines (``[strategy/dataset] ...``), printed; Flower's log goes to the log file.
APP_LINES = r"^\["
UPLOAD_LIMIT = 0.0025  # the seed's ratio: 656 / 266 084 = 0.247 %

#: Per dataset: rounds of the committed run and of --quick.
DATASETS: dict[str, dict[str, int]] = {
    "digits": {"rounds": 60, "quick_rounds": 8},
    "mnist": {"rounds": 15, "quick_rounds": 3},
}

MINDSPORE_DEFAULTS: dict[str, Any] = {
    "strategy": "signds",
    "sign-k": 0.01,
    "sign-eps": 100.0,
    "sign-thr-ratio": 0.6,
    "sign-global-lr": 0.1,
    "sign-dim-out": 0,
    "max-dim-out": 100,
    "rr-eps": 5.0,
    "initial-r-est": 1e-5,
    "step-ratio": 3.0,
}
#: Local training: FedAvg's is the best of a small grid (search.py); both SignDS runs share SignDS' own.
FEDAVG_LOCAL = {"digits": {"local-epochs": 5, "lr": 1.0}, "mnist": {"local-epochs": 1, "lr": 0.3}}
SIGNDS_LOCAL = {"digits": {"local-epochs": 5, "lr": 0.5}, "mnist": {"local-epochs": 1, "lr": 0.1}}

#: Method -> dataset -> run-config overrides.
METHODS: dict[str, dict[str, dict[str, Any]]] = {
    "fedavg": {ds: {"strategy": "fedavg", **FEDAVG_LOCAL[ds]} for ds in DATASETS},
    "signds-default": {ds: {**MINDSPORE_DEFAULTS, **SIGNDS_LOCAL[ds]} for ds in DATASETS},
    "signds-eps10": {
        # ε 8 + 2 per round; h = 4 indices (6 values = 0.249 % of d = 2 410); step 2·N·r_est per vote
        "digits": {
            **MINDSPORE_DEFAULTS,
            **SIGNDS_LOCAL["digits"],
            "sign-eps": 8.0,
            "rr-eps": 2.0,
            "sign-k": 0.1,
            "sign-dim-out": 4,
            "max-dim-out": 4,
            "initial-r-est": 1e-3,
            "step-ratio": 2.0,
        },
        # ε 9 + 1 per round; h = 50 indices (52 values = 0.051 % of d = 101 770); step 6·N·r_est per vote
        "mnist": {
            **MINDSPORE_DEFAULTS,
            **SIGNDS_LOCAL["mnist"],
            "sign-eps": 9.0,
            "rr-eps": 1.0,
            "sign-k": 0.05,
            "sign-dim-out": 50,
            "max-dim-out": 100,
            "initial-r-est": 1e-2,
            "step-ratio": 6.0,
        },
    },
}
LABELS = {
    "fedavg": "FedAvg (dense, no DP)",
    "signds-default": "SignDS, MindSpore defaults (ε 105/round)",
    "signds-eps10": "SignDS, ε ≤ 10/round (searched)",
}


def _parse_value(text: str) -> Any:
    """``--set`` values: int, float, or string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds per dataset (a smoke run)")
    parser.add_argument("--datasets", nargs="+", choices=tuple(DATASETS), default=list(DATASETS))
    parser.add_argument("--methods", nargs="+", choices=tuple(METHODS), default=list(METHODS))
    parser.add_argument("--num-clients", type=int, default=100, help="simulated SuperNodes (all train every round)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds for every dataset (0: the dataset's own)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run-config override for every run (repeatable), e.g. initial-r-est=0.01",
    )
    parser.add_argument("--data-dir", default="", help="MNIST folder (default: ../shared/data/mnist of the repo)")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--client-cpus", type=int, default=1, help="CPUs per simulated client (Ray actor)")
    parser.add_argument(
        "--render", action="store_true", help="only rewrite results.md and results.png from an existing results.json"
    )
    return parser.parse_args(argv)


def run_settings(method: str, dataset: str, args: argparse.Namespace) -> dict[str, Any]:
    """The run config of one (method, dataset) run."""
    spec = DATASETS[dataset]
    rounds = args.rounds or (spec["quick_rounds"] if args.quick else spec["rounds"])
    settings = {
        "dataset": dataset,
        "num-partitions": args.num_clients,
        "num-server-rounds": rounds,
        "data-dir": os.path.abspath(args.data_dir) if args.data_dir else "",
        "results-dir": os.path.abspath(args.results_dir),
        "run-name": f"{method}-{dataset}",
        **METHODS[method][dataset],
    }
    for item in args.set:
        key, _, value = item.partition("=")
        settings[key.strip()] = _parse_value(value.strip())
    return settings


def simulate(settings: dict[str, Any], client_cpus: int = 1) -> dict[str, Any]:
    """Run the app with ``flwr run`` (settings as its run config); return the run log."""
    from flwr_dp_experiments.simulation import run_app

    path = os.path.join(settings["results-dir"], f"run-{settings['run-name']}.json")
    started = time.perf_counter()
    run = run_app(
        HERE,
        settings,
        num_supernodes=int(settings["num-partitions"]),
        num_cpus=client_cpus,
        echo=APP_LINES,
        results_path=path,
    )
    run["simulation_wall_s"] = time.perf_counter() - started
    return run


# ---------------------------------------------------------------------------------------------- summary
def summarise(run: dict[str, Any], fedavg: Optional[dict[str, Any]]) -> dict[str, Any]:
    """One method's line of the summary table."""
    rows = run["rounds"]
    last = rows[-1]
    accs = [row["accuracy"] for row in rows]
    out = {
        "rounds": len(rows),
        "final_accuracy": accs[-1],
        "best_accuracy": max(accs),
        "mean_last5_accuracy": sum(accs[-5:]) / len(accs[-5:]),
        "epsilon_per_round": last.get("epsilon_round"),
        "epsilon_total": last.get("epsilon"),
        "values_per_client": last["values_per_client"],
        "payload_bytes_per_client": last["payload_bytes_per_client"],
        "serialized_bytes_per_client": last["serialized_bytes_per_client"],
        "dense_values": last["dense_values"],
        "dense_payload_bytes": last["dense_payload_bytes"],
        "upload_fraction": last["values_per_client"] / last["dense_values"],
        "server_wall_s": run["wall_s"],
        "simulation_wall_s": run.get("simulation_wall_s"),
    }
    if rows[0].get("r_est") is not None:
        out["indices_per_client"] = [row["indices_per_client"] for row in rows]
        out["mean_indices_per_client"] = sum(out["indices_per_client"]) / len(rows)
        out["mean_values_per_client"] = sum(row["values_per_client"] for row in rows) / len(rows)
        out["upload_fraction"] = out["mean_values_per_client"] / last["dense_values"]
        out["shrink_phase_from_round"] = next((row["round"] for row in rows if row["is_reached"] == 1), None)
    if fedavg is not None:
        out["gap_final_to_fedavg"] = fedavg["rounds"][-1]["accuracy"] - accs[-1]
        fed5 = [row["accuracy"] for row in fedavg["rounds"][-5:]]
        out["gap_last5_to_fedavg"] = sum(fed5) / len(fed5) - out["mean_last5_accuracy"]
    return out


def _f(value: Optional[float], spec: str = ".3f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def _g(value: Optional[float]) -> str:
    """Numbers for tables: thousands separated by spaces from 10 000 up, at most 2 decimals below."""
    if value is None:
        return "∞"
    if abs(value) >= 1e4:
        return f"{value:,.0f}".replace(",", " ")
    return f"{round(value, 2):g}"


def markdown(results: dict[str, Any]) -> str:
    """The tables of results.md."""
    lines = [
        "# SignDS vs FedAvg: accuracy, upload and ε per round",
        "",
        f"{results['num_clients']} IID clients (flwr-datasets IidPartitioner), all of them every round; central "
        "test accuracy after every round; `flwr run` on a local SuperLink in simulation mode (Ray), "
        f"{results['client_cpus']:g} CPU per client, 2 cores. Total wall time {results['wall_s']:.0f} s"
        f"{' (--quick)' if results['quick'] else ''}.",
        "",
        "ε: local DP per client (any two updates of a client are neighbours, `replace_one`), δ = 1e-5; per "
        "round ε = sign_eps (index set, exponential mechanism) + rr_eps (MagRR bit); the ledger composes the "
        "rounds (min of RDP and PLD; for pure-ε events that is the sum). FedAvg releases the dense update: "
        "no DP (ε = ∞).",
        "",
    ]
    for dataset, block in results["datasets"].items():
        runs, summary = block["runs"], block["summary"]
        any_run = next(iter(runs.values()))
        cfg = any_run["config"]
        lines += [
            f"## {dataset}: MLP {('64' if dataset == 'digits' else '784')}-{any_run['hidden']}-10, "
            f"d = {_g(any_run['d'])}, {len(any_run['rounds'])} rounds, batch {cfg['batch-size']}",
            "",
        ]
        lines += [
            "| method | ε / round | ε after all rounds | final acc | mean acc last 5 "
            "| FedAvg − this, points (last 5) | indices / client | values / client | payload bytes / client "
            "| serialized bytes / client | % of dense values | run wall s (server loop) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method, s in summary.items():
            indices = _f(s.get("mean_indices_per_client"), ".1f") if "mean_indices_per_client" in s else "—"
            values = s.get("mean_values_per_client", s["values_per_client"])
            payload = round(8 * values if method != "fedavg" else s["payload_bytes_per_client"])
            gap = s.get("gap_last5_to_fedavg") if method != "fedavg" else None
            lines.append(
                f"| {LABELS[method]} | {_g(s['epsilon_per_round'])} | {_g(s['epsilon_total'])} "
                f"| {s['final_accuracy']:.3f} | {s['mean_last5_accuracy']:.3f} "
                f"| {'—' if gap is None else _f(100 * gap, '.1f')} | {indices} "
                f"| {_g(round(values, 1))} | {_g(payload)} "
                f"| {_g(s['serialized_bytes_per_client'])} | {100 * s['upload_fraction']:.3f} % "
                f"| {s['simulation_wall_s']:.0f} ({s['server_wall_s']:.0f}) |"
            )
        lines += [""]
        for method in runs:
            c = runs[method]["config"]
            local = f"E = {c['local-epochs']} local epochs of SGD at lr {c['lr']}"
            if method == "fedavg":
                lines.append(f"* {LABELS[method]}: {local}.")
                continue
            lines.append(
                f"* {LABELS[method]}: {local}; sign_k {c['sign-k']}, sign_eps {c['sign-eps']}, "
                f"rr_eps {c['rr-eps']}, sign_thr_ratio {c['sign-thr-ratio']}, sign_dim_out "
                f"{c['sign-dim-out']}, max_dim_out {c['max-dim-out']}, initial r_est {c['initial-r-est']:g}, "
                f"step {c['step-ratio']:g}·N·r_est, sign_global_lr {c['sign-global-lr']} (fallback only)."
            )
        lines += [
            "",
            "Per round: central test accuracy, r_est the round was encoded and rebuilt with (phase g = "
            "growth, s = shrink), cumulative ε (ledger).",
            "",
        ]
        methods = list(runs)
        signds = [m for m in methods if m != "fedavg"]
        header = (
            "| round | "
            + " | ".join(f"acc {m}" for m in methods)
            + " | "
            + " | ".join(f"r_est {m}" for m in signds)
            + " | "
            + " | ".join(f"ε {m}" for m in signds)
            + " |"
        )
        lines += [header, "|" + "---|" * (1 + len(methods) + 2 * len(signds))]
        lines.append(
            "| 0 | "
            + " | ".join(_f(runs[m]["initial_accuracy"]) for m in methods)
            + " | "
            + " | ".join("" for _ in signds)
            + " | "
            + " | ".join("0" for _ in signds)
            + " |"
        )
        for i in range(max(len(runs[m]["rounds"]) for m in methods)):
            cells = [str(i + 1)]
            for m in methods:
                rows = runs[m]["rounds"]
                cells.append(_f(rows[i]["accuracy"]) if i < len(rows) else "")
            for m in signds:
                rows = runs[m]["rounds"]
                cells.append(f"{rows[i]['r_est']:.3g} {'gs'[rows[i]['is_reached']]}" if i < len(rows) else "")
            for m in signds:
                rows = runs[m]["rounds"]
                cells.append(_g(rows[i]["epsilon"]) if i < len(rows) and rows[i]["epsilon"] else "")
            lines.append("| " + " | ".join(cells) + " |")
        lines += [""]
    lines += [
        "The seed (MindSpore, LeNet, d = 266 084) uploads 656 values per client instead of 266 084 "
        "(0.247 %); the tables above give the same ratio for these models (h indices + sign + b̂ against d). "
        "Payload bytes count int64 indices (8 B) and float32 weights (4 B); serialized bytes are Flower's "
        "`Array.data` (a 128-byte .npy header per array).",
        "",
    ]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    """Per dataset: accuracy vs round (all methods), r_est vs round, cumulative ε vs round (SignDS runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(results["datasets"])
    fig, axes = plt.subplots(len(datasets), 3, figsize=(15, 4.0 * len(datasets)), squeeze=False)
    styles = {"fedavg": ("k", "o"), "signds-default": ("tab:red", "s"), "signds-eps10": ("tab:blue", "^")}
    for row_axes, dataset in zip(axes, datasets):
        runs = results["datasets"][dataset]["runs"]
        ax_acc, ax_r, ax_eps = row_axes
        for method, run in runs.items():
            color, marker = styles.get(method, (None, "x"))
            rounds = [0] + [row["round"] for row in run["rounds"]]
            ax_acc.plot(
                rounds,
                [run["initial_accuracy"]] + [row["accuracy"] for row in run["rounds"]],
                color=color,
                marker=marker,
                markersize=3,
                label=LABELS.get(method, method),
            )
            if method == "fedavg":
                continue
            rr = [row["round"] for row in run["rounds"]]
            ax_r.plot(
                rr,
                [row["r_est"] for row in run["rounds"]],
                color=color,
                marker=marker,
                markersize=3,
                label=LABELS.get(method, method),
            )
            shrink = [row["round"] for row in run["rounds"] if row["is_reached"] == 1]
            if shrink:
                ax_r.axvline(shrink[0], color=color, linestyle=":", linewidth=0.8)
            ax_eps.plot(
                rr,
                [row["epsilon"] for row in run["rounds"]],
                color=color,
                marker=marker,
                markersize=3,
                label=f"{LABELS.get(method, method)}",
            )
        ax_acc.set(xlabel="round", ylabel="central test accuracy", ylim=(0, 1), title=f"{dataset}: accuracy")
        ax_r.set(
            xlabel="round",
            ylabel="r_est (a vote moves step_ratio·r_est)",
            yscale="log",
            title=f"{dataset}: MagRR r_est (dotted: shrink phase starts)",
        )
        ax_eps.set(
            xlabel="round",
            ylabel="ε per client (LDP, cumulative)",
            yscale="log",
            title=f"{dataset}: privacy spent (FedAvg: ∞)",
        )
        for axis in row_axes:
            axis.legend(fontsize=7)
            axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    """Run every (dataset, method); write results.json, results.md, results.png."""
    args = parse_args(argv)
    os.makedirs(args.results_dir, exist_ok=True)
    if args.render:
        with open(os.path.join(args.results_dir, "results.json")) as handle:
            results = json.load(handle)
        return _write_outputs(results, args.results_dir)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "quick": args.quick,
        "num_clients": args.num_clients,
        "client_cpus": args.client_cpus,
        "upload_limit": UPLOAD_LIMIT,
        "overrides": args.set,
        "datasets": {},
    }
    for dataset in args.datasets:
        runs = {method: simulate(run_settings(method, dataset, args), args.client_cpus) for method in args.methods}
        fedavg = runs.get("fedavg")
        results["datasets"][dataset] = {"runs": runs, "summary": {m: summarise(r, fedavg) for m, r in runs.items()}}
    results["wall_s"] = time.perf_counter() - started
    with open(os.path.join(args.results_dir, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    _write_outputs(results, args.results_dir)
    print(f"wall time {results['wall_s']:.1f} s; results in {os.path.abspath(args.results_dir)}")
    return results


def _write_outputs(results: dict[str, Any], results_dir: str) -> dict[str, Any]:
    """results.md and results.png from the results dict; print the tables."""
    text = markdown(results)
    with open(os.path.join(results_dir, "results.md"), "w") as handle:
        handle.write(text)
    plot(results, os.path.join(results_dir, "results.png"))
    print()
    print(text)
    return results


if __name__ == "__main__":
    main()
