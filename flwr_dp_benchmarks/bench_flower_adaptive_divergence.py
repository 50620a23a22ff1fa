r"""Flower's adaptive clipping moves C the wrong way: a reproduction with Flower's own class.

    python flwr_dp_benchmarks/bench_flower_adaptive_divergence.py [--rounds 60] [--out flwr_dp_benchmarks/adaptive_divergence]

**Setup.** 50 clients a round, every one asked (the 50 nodes of the grid), each
replying ``current + Δ`` with ‖Δ‖ log-normal around a median of 1.0
(``ln‖Δ‖ ~ N(0, 0.5²)``, fresh every round); C₀ = 0.1, ``target_clipped_quantile``
= 0.5, η = ``clip_norm_lr`` = 0.2, z = 1.0, σ_b = m/20 (Flower's defaults but z).
Both strategies are driven through their public ``configure_train`` /
``aggregate_train`` with the same replies; C is read after each round
(``clipping_norm`` for Flower, ``dp/clipping-norm`` of the next round for ours).

**What it shows.** Andrew et al. (2021) update C ← C·exp(−η(b̄ − γ)) where b̄ is
the (noisy) fraction of *unclipped* updates and γ the target unclipped quantile.
Flower 1.41's ``DifferentialPrivacyServerSideAdaptiveClipping`` counts the
*clipped* updates (``adaptive_clip_inputs_inplace`` returns ``scaling_factor < 1``)
and plugs that fraction into the same rule: when most updates are clipped
(C below the median) it *shrinks* C further, so from C₀ = 0.1 below a median
of 1 it decays geometrically toward 0 instead of rising to 1. Ours
(:class:`~flwr_dp_strategies.AccountedAdaptiveClipping`) rises to the median.
This is a benchmark reproduction, not an assertion on Flower: Flower's count
noise draws from numpy's global generator, seeded here for repeatability.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from flwr_dp_benchmarks._common import quiet_loggers  # noqa: E402
from flwr_dp_benchmarks.bench_privacy_utility import Grid, _TaskIdentity  # noqa: E402

CLIENTS = 50
SETUP = dict(noise_multiplier=1.0, initial_clipping_norm=0.1, target_clipped_quantile=0.5, clip_norm_lr=0.2)
REPORT_ROUNDS = (1, 10, 30, 60)
DIM = 8


def _updates(rng: np.random.Generator, m: int) -> list[np.ndarray]:
    """m updates with log-normal norms (median 1.0) in random directions."""
    norms = np.exp(rng.normal(0.0, 0.5, m))
    directions = rng.normal(size=(m, DIM))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    return list(directions * norms[:, None])


def _round(strategy: Any, rnd: int, current: np.ndarray, updates: list[np.ndarray], grid: Grid) -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    messages = list(strategy.configure_train(rnd, ArrayRecord([current]), ConfigRecord(), grid))
    replies = [
        Message(
            RecordDict({"arrays": ArrayRecord([current + update]), "metrics": MetricRecord({"num-examples": 1.0})}),
            reply_to=msg,
        )
        for msg, update in zip(messages, updates)
    ]
    return strategy.aggregate_train(rnd, replies)


@quiet_loggers(level=logging.WARNING)  # Flower logs one INFO line per reply
def run(rounds: int = 60, seed: int = 0) -> dict:
    """C after each round for Flower's strategy and ours on the same replies."""
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg

    from flwr_dp_strategies import AccountedAdaptiveClipping
    from flwr_dp_strategies.privacy import PrivacyLedger

    args = (
        SETUP["noise_multiplier"],
        CLIENTS,
        SETUP["initial_clipping_norm"],
        SETUP["target_clipped_quantile"],
        SETUP["clip_norm_lr"],
    )
    fedavg = dict(fraction_train=1.0, min_train_nodes=CLIENTS, min_available_nodes=CLIENTS)
    flower = DifferentialPrivacyServerSideAdaptiveClipping(FedAvg(**fedavg), *args)
    ours = AccountedAdaptiveClipping(
        FedAvg(**fedavg),
        *args,
        num_clients=CLIENTS,
        sampling="fixed",
        rng=seed,
        ledger=PrivacyLedger(1e-5, accounting="rdp"),
    )
    np.random.seed(seed)  # Flower's count noise: numpy's global generator (benchmark only)
    rng, grid, current = np.random.default_rng(seed + 1), Grid(CLIENTS), np.zeros(DIM)
    c_flower, c_ours = [], []
    with _TaskIdentity():
        for rnd in range(1, rounds + 1):
            updates = _updates(rng, CLIENTS)
            _round(flower, rnd, current, updates, grid)
            c_flower.append(float(flower.clipping_norm))
            _round(ours, rnd, current, updates, grid)
            c_ours.append(float(ours.clipping_norm))
    return {
        "setup": {
            **SETUP,
            "clients_per_round": CLIENTS,
            "norm_median": 1.0,
            "log_norm_std": 0.5,
            "rounds": rounds,
            "seed": seed,
        },
        "flower_c": c_flower,
        "ours_c": c_ours,
    }


def markdown(result: dict) -> str:
    """C after rounds 1 / 10 / 30 / 60 (those that ran)."""
    shown = [r for r in REPORT_ROUNDS if r <= len(result["flower_c"])]
    lines = [
        "| C after round | " + " | ".join(str(r) for r in shown) + " |",
        "|---|" + "---|" * len(shown),
        "| Flower 1.41 `DifferentialPrivacyServerSideAdaptiveClipping` | "
        + " | ".join(f"{result['flower_c'][r - 1]:.3g}" for r in shown)
        + " |",
        "| ours `AccountedAdaptiveClipping` | " + " | ".join(f"{result['ours_c'][r - 1]:.3g}" for r in shown) + " |",
    ]
    s = result["setup"]
    return (
        f"C₀ = {s['initial_clipping_norm']}, update norms log-normal with median {s['norm_median']}, "
        f"{s['clients_per_round']} clients a round, target_clipped_quantile = {s['target_clipped_quantile']}, "
        f"η = {s['clip_norm_lr']}, z = {s['noise_multiplier']}, seed {s['seed']}.\n\n" + "\n".join(lines) + "\n"
    )


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    rounds = range(1, len(result["flower_c"]) + 1)
    ax.semilogy(rounds, result["flower_c"], label="Flower 1.41 adaptive clipping")
    ax.semilogy(rounds, result["ours_c"], label="ours (Andrew et al. 2021)")
    ax.axhline(1.0, color="grey", ls="--", lw=0.8, label="median update norm")
    ax.set_xlabel("round")
    ax.set_ylabel("clipping norm C")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "flwr_dp_benchmarks" / "adaptive_divergence")
    args = parser.parse_args(argv)
    result = run(args.rounds, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "results.md").write_text(markdown(result))
    plot(result, args.out / "clipping_norm.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
