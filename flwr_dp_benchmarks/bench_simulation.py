"""Every strategy and client mechanism against Flower's FedAvg in the same Flower simulation (digits MLP).

One ``flwr run`` (Ray backend, ``clients`` SuperNodes, one CPU per
ClientApp actor) runs, after a warm-up round, one *duel* per subject: a fresh
Flower ``FedAvg`` and a fresh subject, ``rounds`` rounds each, alternating round
by round on the same Grid in ABBA order (FedAvg r1, X r1, X r2, FedAvg r2, ...;
see :mod:`flwr_dp_benchmarks._sim_apps`), so both see the same machine load within a
second or two. ``passes`` > 1 repeats all duels (every other pass in reverse
order). Figures are medians of rounds 2..R (round 1 pays one-off costs: Opacus'
import, the functional mechanism's release, the label randomisation);
"FedAvg (control)" is Flower's FedAvg as a subject, so its ratio is the noise floor.

Rows per subject: the round's wall time (train + evaluate; target <= 1.10x),
the peak RSS of the ServerApp process (which also runs Flower's simulation
engine) and the sum of the per-process peak RSS of the whole process tree (Ray
workers included), both reset before each round (``VmHWM``; target <= 1.10x).
The notes split the round into train / evaluate phase and list the server's own
time in the strategy methods where it exceeds FedAvg's, to say where an
overhead comes from.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional

from ._common import row
from ._sim_apps import SHARED, VARIANTS, breakdown, cpus, failures, median, pick, run_segments

NAME = "simulation"
SUBJECTS = tuple(name for name, v in VARIANTS.items() if v.kind in ("control", "strategy", "mod"))


def duels(subjects: tuple[str, ...], rounds: int, passes: int) -> list[tuple[str, int]]:
    """One duel per subject and pass; odd passes in reverse order."""
    out: list[tuple[str, int]] = []
    for p in range(passes):
        out += [(name, rounds) for name in (subjects if p % 2 == 0 else tuple(reversed(subjects)))]
    return out


def rows_from(result: dict, subjects: tuple[str, ...], *, name: str, params: dict[str, Any], first_round: int,
              strict: bool, target: Optional[float] = 1.10, suffix: str = "") -> list[dict]:
    """Time and memory rows per subject from the duels of one run (``target`` None: reported, no target)."""
    goal = "reported" if target is None else f"<= {target:.2f}x"
    played = result["duels"]
    failed = failures(played)
    if failed and strict:
        details = "\n".join(d.get("traceback", d["error"]) for d in played if d.get("error"))
        raise RuntimeError(f"{name}: duels failed: {failed}\n{details}")
    out = []
    for subject in subjects:
        variant = VARIANTS[subject]
        times = pick(played, subject, "subject", "round_s", first_round)
        base_times = pick(played, subject, "baseline", "round_s", first_round)
        case_params = {**params, "variant": subject, "kind": variant.kind,
                       "duels": sum(1 for d in played if d["subject"] == subject and not d.get("error"))}
        case = f"{subject}: round wall time ({params.get('clients')} clients){suffix}"
        if not times or not base_times:
            why = failed.get(subject, "no completed duel")
            print(f"[{name}] {subject}: {why}", file=sys.stderr)
            nan = [math.nan]
            out.append(row(name, case, case_params, metric="time_s", values=nan, baseline="Flower FedAvg round",
                           baseline_values=nan, target=goal, target_met=False,
                           notes=f"FAILED: {why}"))
            continue
        out.append(row(name, case, case_params, metric="time_s", values=times,
                       baseline="Flower FedAvg round, same simulation, alternated", baseline_values=base_times,
                       target=goal, target_ratio=target,
                       notes=f"{variant.what}. {breakdown(played, subject, first_round)}"))
        for key, label in (("server_hwm", "ServerApp process peak RSS"), ("tree_hwm", "process tree peak RSS")):
            values = [v for v in pick(played, subject, "subject", key, first_round) if v > 0]
            base_values = [v for v in pick(played, subject, "baseline", key, first_round) if v > 0]
            if not values or not base_values:
                continue
            reset = all(pick(played, subject, who, "hwm_reset", first_round) for who in ("subject", "baseline"))
            grew = (median(values) - median(base_values)) / 2**20
            out.append(row(name, f"{subject}: {label}{suffix}", case_params, metric="peak_bytes", values=values,
                           baseline="Flower FedAvg rounds, same simulation", baseline_values=base_values,
                           target=goal, target_ratio=target,
                           notes=f"{grew:+.1f} MiB" + ("" if reset else " (VmHWM reset refused: peaks since start)")))
    return out


def run(*, clients: int = 100, rounds: int = 5, passes: int = 1, subjects: Optional[tuple[str, ...]] = None,
        local_epochs: int = 3, pull_interval: Optional[float] = 0.01, strict: bool = False,
        with_scale_rounds: int = 0, busy: int = 0) -> list[dict]:
    """Rows for every subject (default: every variant) against Flower's FedAvg in the same simulation.

    ``pull_interval``: the Grid's reply polling, 0.01 s instead of Flower's 0.1 s, which would round
    every phase of a ~1 s round up to a 0.1 s step (too coarse for a 10 % target); the same for
    subject and baseline. None keeps Flower's.

    ``with_scale_rounds`` > 0 (the ``--tiny`` smoke run): also play ``bench_scale``'s duel at the same
    client count in this simulation and keep it in ``SHARED`` for ``bench_scale.run`` (one Ray start
    instead of two: Ray's start is most of a tiny run).

    ``busy`` > 0: the whole simulation runs while ``busy`` processes spin on the cores
    (``bench_aggregation.busy_processes``); the rows end in ``loaded (k busy processes)``.
    """
    subjects = tuple(subjects or SUBJECTS)
    segments = [(NAME, duels(subjects, rounds, passes))]
    if with_scale_rounds > 0:
        from . import bench_scale

        segments.append((bench_scale.NAME, [(bench_scale.SUBJECT, with_scale_rounds)]))
    from .bench_aggregation import busy_processes

    with busy_processes(busy, seconds=4 * 3600.0):
        results = run_segments(clients, segments, local_epochs=local_epochs, pull_interval=pull_interval)
    if with_scale_rounds > 0:
        SHARED[(bench_scale.NAME, clients, with_scale_rounds, local_epochs)] = results[bench_scale.NAME]
    result = results[NAME]
    print(f"[{NAME}] {len(segments[0][1])} duels of 2 x {rounds} rounds, {clients} clients: {result['wall_s']:.0f} s "
          f"(warm-up round {result['warmup_s'] or 0:.0f} s)", file=sys.stderr)
    params = {"clients": clients, "rounds": rounds, "passes": passes, "local_epochs": local_epochs,
              "busy_processes": busy,
              "grid_pull_interval_s": pull_interval or 0.1,
              "ray_cpus": cpus(), "model": "digits MLP 64-32-10", "simulation_wall_s": round(result["wall_s"], 1)}
    return rows_from(result, subjects, name=NAME, params=params, first_round=2 if rounds > 1 else 1, strict=strict,
                     suffix=f" loaded ({busy} busy processes)" if busy else "")
