r"""User-level DP that learns: MNIST over 1 000 clients, ~100 sampled per round, ledger ε ∈ {0.5, 1, 2, 8}.

    python flwr_dp_benchmarks/bench_user_level.py [--quick | --tiny] [--out flwr_dp_benchmarks/user_level]
        [--jobs K]

**Protocol** (issue 18). MNIST's 60 000 training images split IID into N = 1 000
clients of 60; every round each client is sampled independently with q = 0.1
(ours) or m = 100 clients are drawn uniformly (Flower's FedAvg sampling, for the
Flower rows); ``rounds`` rounds; δ = 1e-5; each client runs ``local_epochs`` of
SGD (batch ``local_batch``, rate ``local_lr``) on the 784-64-10 MLP from the
global model and the server averages updates over the public denominator m.
The noise multiplier z of every DP method is calibrated (bisection on the
:class:`~flwr_dp_strategies.privacy.PrivacyLedger`, min of RDP and PLD) so that
the rounds compose to the target ε; the **achieved** ε is read afterwards from
the ledger of the run.

**Methods** (every one user-level: add or remove one client's whole data):

* ``fedavg`` -- non-private FedAvg, m = 100 per round (reference, ε = ∞).
* ``flower-fixed`` -- Flower's ``DifferentialPrivacyServerSideFixedClipping`` (through
  :class:`~flwr_dp_strategies.AccountedServerSideFixedClipping`), m = 100 per round,
  ``GaussianDpEvent(z)`` per round (no amplification: Flower's accountant refuses
  sampling with fixed-size samples), at the best C of ``FLOWER_C_GRID`` for each ε
  (chosen on test accuracy: favourable to Flower).
* ``flower-adaptive`` -- Flower's ``DifferentialPrivacyServerSideAdaptiveClipping``
  (its defaults: C₀ = 0.1, target_clipped_quantile = 0.5, η = 0.2, σ_b = m/20). Flower's
  accountant refuses adaptive clipping, so it has no ε of its own; the ledger books
  what its release really is: each round a Gaussian mechanism on (sum, *uncentred*
  count) with sensitivity 1 for the count, i.e. combined multiplier
  :math:`z_{true} = (z_\Delta^{-2} + \sigma_b^{-2})^{-1/2}` for Flower's
  :math:`z_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}` (Flower claims z), calibrated to
  the target. Flower also draws the sum's noise with the *next* round's C, which the
  ledger cannot see (when C shrinks the noise is below z_Δ·C_t/m): this row's ε is a
  lower bound.
* ``ours-fixed`` -- :class:`~flwr_dp_strategies.AccountedPoissonFixedClipping`, Poisson
  q = 0.1, m = 100, ``PoissonSampled(q, Gaussian(z))`` per round (amplified), C =
  ``OURS_FIXED_C``.
* ``ours-adaptive`` -- :class:`~flwr_dp_strategies.AccountedAdaptiveClipping`, the
  same Poisson sampling and event with z the combined multiplier of the sum and the
  centred count (Andrew et al. 2021), C₀ = 0.1, target_clipped_quantile = 0.5
  (γ = 0.5 of the updates unclipped), η = 0.2, σ_b = max(m/20, z) (the split needs z < 2σ_b).

**Tuning (stated honestly).** The local learning rate, epochs and batch were chosen
once, for non-private FedAvg (a rate that learns in few rounds without diverging),
and are the same for every method and ε. C for ``ours-fixed`` was chosen once at
ε = 1 among ``FLOWER_C_GRID`` on test accuracy; Flower's fixed row gets the best C
per ε. No held-out split: the MNIST test set is used for both (the same advantage
for every row); the adaptive rows have no C to tune. The number of rounds, 40, was
chosen after a first full run at 100 rounds (kept in ``user_level/rounds100``), looking
at the DP rows' test accuracy: with a fixed ε, fewer rounds mean less noise per round
(z = 2.68 instead of 3.95 at ε = 1), and at 100 rounds the adaptive C drifted upward
under the noise. Non-private FedAvg is run with the same 40 rounds (0.926; 0.945 at 100).

Everything is seeded (``--seed``): this is a benchmark, not a deployment.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from flwr_dp_benchmarks._common import quiet_loggers  # noqa: E402
from flwr_dp_benchmarks.bench_privacy_utility import (  # noqa: E402
    DELTA,
    Federation,
    Grid,
    _TaskIdentity,
    arrays_params,
    calibrate,
    fl_round,
    ledger_epsilon,
    make_federation,
    mlp_arrays,
    params_reply,
)

EPSILONS = (0.5, 1.0, 2.0, 8.0)
METHODS = ("fedavg", "flower-fixed", "flower-adaptive", "ours-fixed", "ours-adaptive")
FLOWER_C_GRID = (0.3, 1.0, 3.0)
OURS_FIXED_C = 1.0
ADAPTIVE = dict(initial_clipping_norm=0.1, target_clipped_quantile=0.5, clip_norm_lr=0.2)

CONFIG: dict[str, Any] = dict(
    num_clients=1000, sample_rate=0.1, hidden=64, local_lr=0.1, local_batch=20, local_epochs=2, rounds=40
)
MODES: dict[str, dict[str, Any]] = {
    "full": {"epsilons": EPSILONS, "overrides": {}},
    "quick": {"epsilons": (1.0,), "overrides": {"rounds": 40}},
    "tiny": {"epsilons": (1.0,), "overrides": {"num_clients": 50, "rounds": 2, "max_train": 3000}},
}
LABELS = {
    "fedavg": "FedAvg (non-private)",
    "flower-fixed": "Flower fixed clipping (best C)",
    "flower-adaptive": "Flower adaptive clipping",
    "ours-fixed": "ours: fixed clipping, Poisson",
    "ours-adaptive": "ours: adaptive clipping, Poisson",
}


# ============================================================================ one run
def _local(fed: Federation, cfg: dict[str, Any], i: int, params: list, rnd: int, seed: int) -> list:
    from flwr_dp_experiments.baselines import local_sgd

    x, y = fed.shards[i]
    return local_sgd(
        params,
        x,
        y,
        epochs=cfg["local_epochs"],
        lr=cfg["local_lr"],
        batch_size=cfg["local_batch"],
        seed=seed * 1_000_003 + rnd * 1009 + i,
    )


def _train(fed: Federation, cfg: dict[str, Any], strategy: Any, seed: int) -> tuple[list[float], list[float]]:
    """``cfg['rounds']`` in-process Flower rounds; test accuracy and the C of each round's release."""
    from flwr_dp_experiments.baselines import evaluate, get_params, make_mlp

    def reply(i: int, msg: Any, rnd: int) -> Any:
        return params_reply(msg, _local(fed, cfg, i, arrays_params(msg.content["arrays"]), rnd, seed), fed.shard_size)

    arrays = mlp_arrays(get_params(make_mlp(fed.input_dim, cfg["hidden"], fed.num_classes, seed=seed)))
    grid, accuracy, clip = Grid(fed.num_clients), [], []
    for rnd in range(1, cfg["rounds"] + 1):
        before = getattr(strategy, "clipping_norm", math.nan)
        arrays, metrics = fl_round(strategy, rnd, arrays, grid, reply)
        accuracy.append(float(evaluate(arrays_params(arrays), fed.x_test, fed.y_test)))
        published = (metrics or {}).get("dp/clipping-norm") if metrics is not None else None
        clip.append(float(published) if published is not None else float(before))
    return accuracy, clip


def _fixed_size_fedavg(n: int, m: int) -> Any:
    from flwr.serverapp.strategy import FedAvg

    return FedAvg(fraction_train=m / n, fraction_evaluate=0.0, min_train_nodes=m, min_available_nodes=n)


def _flower_adaptive_true_z(z: float, sigma_b: float) -> float:
    """The combined multiplier Flower's adaptive release really has (uncentred count: sensitivity 1)."""
    z_delta = (z**-2 - (2.0 * sigma_b) ** -2) ** -0.5
    return (z_delta**-2 + sigma_b**-2) ** -0.5


def _count_std(z: float, m: int) -> float:
    """Flower's default σ_b = m/20, raised to z where Flower's noise split needs z < 2σ_b."""
    return max(m / 20.0, float(z))


@quiet_loggers()
def run_one(method: str, target: float, cfg: dict[str, Any], seed: int, clip: Optional[float] = None) -> dict:
    """One (method, ε) run: the calibrated z, the achieved ledger ε, accuracy and C per round."""
    from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg

    import flwr_dp_strategies as fds
    from flwr_dp_strategies import PrivacyLedger

    fed = make_federation("mnist", cfg["num_clients"], max_train=cfg.get("max_train"))
    n, rounds = fed.num_clients, cfg["rounds"]
    m = max(1, int(round(cfg["sample_rate"] * n)))
    q = m / n
    random.seed(seed)  # Flower samples nodes with `random` and draws its noise from np.random
    np.random.seed(seed)
    rng = np.random.default_rng([seed, 1])
    z, ledger, extra = math.nan, PrivacyLedger(DELTA), {}
    if method == "fedavg":
        strategy = fds.AccountedFedAvg(
            fraction_train=m / n, fraction_evaluate=0.0, min_train_nodes=m, min_available_nodes=n, ledger=ledger
        )
    elif method in ("ours-fixed", "ours-adaptive"):
        z, _ = calibrate(
            lambda x, how: ledger_epsilon(
                "add_or_remove_one", [PoissonSampledDpEvent(q, GaussianDpEvent(x))] * rounds, method=how
            ),
            target,
            increasing=False,
            lo=0.3,
            hi=3000.0,
        )
        if method == "ours-fixed":
            strategy = fds.AccountedPoissonFixedClipping(
                FedAvg(fraction_evaluate=0.0), z, clip or OURS_FIXED_C, m, num_clients=n, ledger=ledger, rng=rng
            )
        else:
            strategy = fds.AccountedAdaptiveClipping(
                FedAvg(fraction_evaluate=0.0),
                z,
                m,
                **ADAPTIVE,
                clipped_count_stddev=_count_std(z, m),
                num_clients=n,
                ledger=ledger,
                rng=rng,
            )
            extra.update(clipped_count_stddev=_count_std(z, m))
    elif method == "flower-fixed":
        z, _ = calibrate(
            lambda x, how: ledger_epsilon("add_or_remove_one", [GaussianDpEvent(x)] * rounds, method=how),
            target,
            increasing=False,
            lo=0.3,
            hi=3000.0,
        )
        strategy = fds.AccountedServerSideFixedClipping(
            _fixed_size_fedavg(n, m), z, clip, m, ledger=ledger, noise_sampler="flower"
        )
    elif method == "flower-adaptive":
        z, _ = calibrate(
            lambda x, how: ledger_epsilon(
                "add_or_remove_one",
                [GaussianDpEvent(_flower_adaptive_true_z(x, _count_std(x, m)))] * rounds,
                method=how,
            ),
            target,
            increasing=False,
            lo=0.3,
            hi=3000.0,
        )
        strategy = DifferentialPrivacyServerSideAdaptiveClipping(
            _fixed_size_fedavg(n, m), z, m, **ADAPTIVE, clipped_count_stddev=_count_std(z, m)
        )
        extra.update(z_true=_flower_adaptive_true_z(z, _count_std(z, m)), clipped_count_stddev=_count_std(z, m))
    else:
        raise ValueError(f"unknown method {method!r}")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 784-64-10 MLP on 20 examples: torch's thread pool only spins (25x slower loaded)
    t0 = time.perf_counter()
    try:
        with _TaskIdentity(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            accuracy, clips = _train(fed, cfg, strategy, seed)
    finally:
        torch.set_num_threads(threads)
    if method == "flower-adaptive":
        for rnd in range(1, rounds + 1):
            ledger.record(
                GaussianDpEvent(extra["z_true"]),
                server_round=rnd,
                neighboring_relation="add_or_remove_one",
                label="Flower adaptive clipping (as released)",
            )
    report = ledger.report()
    return {
        "method": method,
        "label": LABELS[method],
        "target_epsilon": target,
        "ledger_epsilon": float(report.epsilon),
        "noise_multiplier": z,
        "clip": clip,
        "accuracy": accuracy[-1],
        "accuracy_curve": accuracy,
        "clip_curve": clips,
        "rounds": rounds,
        "num_clients": n,
        "clients_per_round": m,
        "shard_size": fed.shard_size,
        "wall_s": time.perf_counter() - t0,
        **extra,
    }


# ============================================================================ the grid of runs
def jobs(epsilons: Sequence[float], methods: Sequence[str]) -> list[tuple[str, float, Optional[float]]]:
    """(method, target ε, C) of every run: Flower's fixed clipping once per C of its grid."""
    out: list[tuple[str, float, Optional[float]]] = [("fedavg", math.inf, None)] if "fedavg" in methods else []
    for eps in epsilons:
        for method in methods:
            if method == "flower-fixed":
                out += [(method, eps, c) for c in FLOWER_C_GRID]
            elif method != "fedavg":
                out.append((method, eps, OURS_FIXED_C if method == "ours-fixed" else None))
    return out


def run(
    mode: str = "full",
    seed: int = 0,
    methods: Sequence[str] = METHODS,
    workers: int = 1,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    on_row: Callable[[dict], None] = lambda row: None,
) -> dict:
    """Every run of ``mode``; Flower's fixed clipping keeps its best C per ε (all C kept in ``all_runs``).

    ``on_row`` sees each run as it finishes (the command line appends it to ``OUT/runs.jsonl``, so a run
    cut short keeps what finished).
    """
    cfg = {**CONFIG, **MODES[mode]["overrides"]}
    todo = jobs(MODES[mode]["epsilons"], methods)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _Serial() as pool:
        futures = [pool.submit(run_one, method, eps, cfg, seed, c) for method, eps, c in todo]
        rows = []
        for future in as_completed(futures) if workers > 1 else futures:
            row = future.result()
            rows.append(row)
            on_row(row)
            log(
                f"{row['method']:16s} target ε={row['target_epsilon']:<5g} ledger ε={row['ledger_epsilon']:.4g} "
                f"C={row['clip']} acc={row['accuracy']:.3f} ({row['wall_s']:.0f} s)"
            )
    best = {}
    for row in rows:
        key = (row["method"], row["target_epsilon"])
        if key not in best or row["accuracy"] > best[key]["accuracy"]:
            best[key] = row
    from flwr_dp_benchmarks._common import machine

    return {
        "mode": mode,
        "seed": seed,
        "config": cfg,
        "machine": machine(),
        "delta": DELTA,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "wall_s": time.perf_counter() - t0,
        "rows": list(best.values()),
        "all_runs": rows,
    }


class _Serial:
    """A ProcessPoolExecutor stand-in that runs each job at submit time (one worker)."""

    def __enter__(self) -> "_Serial":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Callable, *args: Any) -> Any:
        value = fn(*args)
        return type("Done", (), {"result": staticmethod(lambda: value)})()


# ============================================================================ outputs
def markdown(result: dict) -> str:
    """One table: method, target ε, achieved ledger ε, z, C, final accuracy."""
    cfg = result["config"]
    lines = [
        f"MNIST, {cfg['num_clients']} clients, q = {cfg['sample_rate']} (m = "
        f"{round(cfg['sample_rate'] * cfg['num_clients'])}), {cfg['rounds']} rounds, δ = {result['delta']:g}, "
        f"local: {cfg['local_epochs']} epochs, batch {cfg['local_batch']}, lr {cfg['local_lr']}",
        "",
        "| method | target ε | ledger ε | z | C (final) | accuracy |",
        "|---|---|---|---|---|---|",
    ]
    order = {m: i for i, m in enumerate(METHODS)}
    for row in sorted(result["rows"], key=lambda r: (r["target_epsilon"], order[r["method"]])):
        eps = "∞" if not math.isfinite(row["ledger_epsilon"]) else f"{row['ledger_epsilon']:.3f}"
        z = "-" if not math.isfinite(row["noise_multiplier"]) else f"{row['noise_multiplier']:.3g}"
        c = row["clip_curve"][-1] if row["clip_curve"] else math.nan
        lines.append(
            f"| {row['label']} | {row['target_epsilon']:g} | {eps} | {z} | "
            f"{'-' if not math.isfinite(c) else f'{c:.3g}'} | {row['accuracy']:.3f} |"
        )
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Accuracy and C per round at ε = 1 (or the first ε run), one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = 1.0 if any(r["target_epsilon"] == 1.0 for r in result["rows"]) else result["rows"][-1]["target_epsilon"]
    rows = [r for r in result["rows"] if r["target_epsilon"] in (eps, math.inf)]
    fig, (ax_acc, ax_c) = plt.subplots(1, 2, figsize=(11, 4))
    for row in rows:
        rounds = range(1, len(row["accuracy_curve"]) + 1)
        ax_acc.plot(rounds, row["accuracy_curve"], label=row["label"])
        if any(math.isfinite(c) for c in row["clip_curve"]):
            ax_c.plot(rounds, row["clip_curve"], label=row["label"])
    ax_acc.set(xlabel="round", ylabel="test accuracy", ylim=(0, 1), title=f"MNIST, 1 000 clients, ledger ε = {eps:g}")
    ax_c.set(xlabel="round", ylabel="clipping norm C of the release", yscale="log", title="C per round")
    ax_acc.legend(fontsize=7)
    ax_c.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    """Command line: ``[--quick | --tiny] [--out DIR] [--seed N] [--jobs K]``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="ε = 1 only")
    group.add_argument("--tiny", action="store_true", help="toy sizes for the smoke test")
    parser.add_argument("--out", type=Path, default=ROOT / "flwr_dp_benchmarks" / "user_level")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--rounds", type=int, help="override the mode's number of rounds")
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    if args.rounds is not None:
        MODES[mode]["overrides"]["rounds"] = int(args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.out / "runs.jsonl"
    runs.unlink(missing_ok=True)

    def append(row: dict) -> None:
        with runs.open("a") as handle:
            handle.write(json.dumps(row, default=float) + "\n")

    result = run(mode, args.seed, args.methods, args.jobs, on_row=append)
    (args.out / "results.json").write_text(json.dumps(result, indent=1, default=float))
    (args.out / "results.md").write_text(markdown(result) + "\n")
    plot(result, args.out / "accuracy_and_clip.png")
    print(markdown(result))
    print(f"wrote {args.out / 'results.md'} and {args.out / 'accuracy_and_clip.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
