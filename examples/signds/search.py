"""Plain-loop emulation of the SignDS example (no Flower), used to search the ε ≤ 10 settings.

    python examples/signds/search.py --dataset digits --grid small [--rounds 40] [--out FILE] [--jobs 2]

It does what the Flower app does, in one process: every client runs the same
local SGD as ``signds_app.client_app`` (same shards, same shuffling seeds),
encodes its update with :func:`flwr_dp_strategies.signds.encode_update`, and
the server rebuilds exactly as :class:`flwr_dp_strategies.SignDS` does
(``step_ratio``·N·r_est per vote, weighted by ``num-examples``) and updates
MagRR with :func:`flwr_dp_strategies.signds.update_state`. No Ray, no message
serialisation: 10–30× faster than the simulation, so a grid of settings fits in
minutes. The settings it finds are then run for real (Flower) by
``run_experiment.py``. ``--grid`` names one of the grids in :data:`GRIDS`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _setup() -> None:
    for folder in (REPO, HERE):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    import torch

    torch.set_num_threads(1)


def emulate(setting: dict[str, Any], *, log_every: int = 0) -> dict[str, Any]:
    """Run one setting; return per-round accuracy, r_est, phase and the mean h."""
    _setup()
    import torch
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from flwr_dp_strategies.signds import MagRRConfig, MagRRState, encode_update, step_size, update_state
    from signds_app import task
    from signds_app.client_app import local_seed

    s = dict(setting)
    dataset, clients, rounds = s["dataset"], int(s["num-partitions"]), int(s["num-server-rounds"])
    model = task.initial_model(dataset, int(s.get("hidden", 0)), int(s.get("seed", 42)))
    w = parameters_to_vector(model.parameters()).detach().clone()
    shards = [task.load_partition(p, clients, dataset, s.get("data-dir", "")) for p in range(clients)]
    _, _, x_te, y_te = task.load_data(dataset, s.get("data-dir", ""))
    weights = np.array([len(y) for _, y in shards], dtype=np.float64)
    signds = s["strategy"] == "signds"
    magrr = MagRRConfig(
        rr_epsilon=float(s.get("rr-eps", 5.0)),
        initial_r_est=float(s.get("initial-r-est", 1e-5)),
        step_ratio=float(s.get("step-ratio", 3.0)),
    )
    state = MagRRState(r_est=magrr.initial_r_est)
    rng = np.random.default_rng(int(s.get("noise-seed", 0)))
    accs, r_ests, phases, hs, elapsed = [], [], [], [], []
    start = time.perf_counter()
    for rnd in range(1, rounds + 1):
        total = torch.zeros_like(w, dtype=torch.float64)
        ones, sizes = 0, []
        for p, (x, y) in enumerate(shards):
            vector_to_parameters(w.clone(), model.parameters())
            task.train(
                model,
                x,
                y,
                epochs=int(s["local-epochs"]),
                lr=float(s["lr"]),
                batch_size=int(s.get("batch-size", 32)),
                seed=local_seed(int(s.get("seed", 42)), rnd, p),
            )
            trained = parameters_to_vector(model.parameters()).detach()
            if not signds:
                total += weights[p] * trained.double()
                continue
            upload = encode_update(
                (trained.double() - w.double()).numpy(),
                sign_k=float(s["sign-k"]),
                sign_eps=float(s["sign-eps"]),
                sign_thr_ratio=float(s.get("sign-thr-ratio", 0.6)),
                sign_dim_out=int(s.get("sign-dim-out", 0)),
                r_est=state.r_est,
                is_reached=state.is_reached,
                rng=rng,
                max_dim_out=int(s.get("max-dim-out", 100)),
                magrr=magrr,
            )
            total[torch.from_numpy(upload.indices)] += weights[p] * upload.sign
            ones += upload.b_hat
            sizes.append(upload.indices.size)
        if signds:
            r_ests.append(state.r_est)
            phases.append(state.is_reached)
            step = step_size(state.r_est, clients, magrr)
            w = (w.double() + step * total / weights.sum()).float()
            state, _ = update_state(state, ones, clients, float(clients), float(s.get("sign-global-lr", 0.1)), magrr)
            hs.append(float(np.mean(sizes)))
        else:
            w = (total / weights.sum()).float()
        vector_to_parameters(w.clone(), model.parameters())
        accs.append(task.test(model, x_te, y_te)[1])
        elapsed.append(time.perf_counter() - start)
        if log_every and rnd % log_every == 0:
            print(f"{s.get('label', '')} round {rnd} acc {accs[-1]:.3f} r_est {state.r_est:.3g}", flush=True)
    return {
        "setting": setting,
        "accuracy": accs,
        "r_est": r_ests,
        "is_reached": phases,
        "h": hs,
        "final": accs[-1],
        "best": max(accs),
        "last5": float(np.mean(accs[-5:])),
        "wall_s": elapsed[-1],
    }


BASE = {
    "digits": {"dataset": "digits", "num-partitions": 100, "batch-size": 32, "seed": 42},
    "mnist": {"dataset": "mnist", "num-partitions": 100, "batch-size": 32, "seed": 42},
}

#: Named grids: lists of overrides (cartesian products of the value lists).
GRIDS: dict[str, list[dict[str, list[Any]]]] = {
    "fedavg": [{"strategy": ["fedavg"], "local-epochs": [1, 2, 5], "lr": [0.05, 0.1, 0.3]}],
}


def expand(grid: list[dict[str, list[Any]]], base: dict[str, Any], rounds: int) -> list[dict[str, Any]]:
    out = []
    for block in grid:
        keys = list(block)
        for values in itertools.product(*(block[k] for k in keys)):
            setting = {**base, "num-server-rounds": rounds, **dict(zip(keys, values))}
            setting["label"] = " ".join(f"{k}={v}" for k, v in zip(keys, values))
            out.append(setting)
    return out


def main(argv: Optional[list[str]] = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=("digits", "mnist"), default="digits")
    parser.add_argument("--grid", default="fedavg", help=f"one of {sorted(GRIDS)} or a JSON list of blocks")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    grid = GRIDS[args.grid] if args.grid in GRIDS else json.loads(args.grid)
    base = {**BASE[args.dataset], "data-dir": args.data_dir}
    settings = expand(grid, base, args.rounds)
    print(f"{len(settings)} settings", flush=True)
    results = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for res in pool.map(emulate, settings):
            results.append(res)
            print(
                f"{res['setting']['label']:<90} final {res['final']:.3f} best {res['best']:.3f} "
                f"last5 {res['last5']:.3f} h {np.mean(res['h']) if res['h'] else 0:.1f} "
                f"({res['wall_s']:.0f}s)",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle)
    return results


if __name__ == "__main__":
    main()
