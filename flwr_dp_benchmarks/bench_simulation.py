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

import sys
from typing import Optional

from . import bench_scale
from ._duel_rows import rows_from
from ._sim_apps import SHARED, VARIANTS, cpus, run_segments

NAME = "simulation"
SUBJECTS = tuple(name for name, v in VARIANTS.items() if v.kind in ("control", "strategy", "mod"))


def duels(subjects: tuple[str, ...], rounds: int, passes: int) -> list[tuple[str, int]]:
    """One duel per subject and pass; odd passes in reverse order."""
    out: list[tuple[str, int]] = []
    for p in range(passes):
        out += [(name, rounds) for name in (subjects if p % 2 == 0 else tuple(reversed(subjects)))]
    return out


def run(
    *,
    clients: int = 100,
    rounds: int = 5,
    passes: int = 1,
    subjects: Optional[tuple[str, ...]] = None,
    local_epochs: int = 3,
    pull_interval: Optional[float] = 0.01,
    strict: bool = False,
    with_scale_rounds: int = 0,
    busy: int = 0,
) -> list[dict]:
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
        segments.append((bench_scale.NAME, [(bench_scale.SUBJECT, with_scale_rounds)]))
    from .bench_aggregation import busy_processes

    with busy_processes(busy, seconds=4 * 3600.0):
        results = run_segments(clients, segments, local_epochs=local_epochs, pull_interval=pull_interval)
    if with_scale_rounds > 0:
        SHARED[(bench_scale.NAME, clients, with_scale_rounds, local_epochs)] = results[bench_scale.NAME]
    result = results[NAME]
    print(
        f"[{NAME}] {len(segments[0][1])} duels of 2 x {rounds} rounds, {clients} clients: {result['wall_s']:.0f} s "
        f"(warm-up round {result['warmup_s'] or 0:.0f} s)",
        file=sys.stderr,
    )
    params = {
        "clients": clients,
        "rounds": rounds,
        "passes": passes,
        "local_epochs": local_epochs,
        "busy_processes": busy,
        "grid_pull_interval_s": pull_interval or 0.1,
        "ray_cpus": cpus(),
        "model": "digits MLP 64-32-10",
        "simulation_wall_s": round(result["wall_s"], 1),
    }
    return rows_from(
        result,
        subjects,
        name=NAME,
        params=params,
        first_round=2 if rounds > 1 else 1,
        strict=strict,
        suffix=f" loaded ({busy} busy processes)" if busy else "",
    )
