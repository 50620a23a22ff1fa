"""Scale: rounds with 1 000 simulated clients and the Laplace cluster evaluation vs Flower's FedAvg round.

One ``flwr run`` with ``clients`` SuperNodes (Ray backend, one CPU per
ClientApp actor; see :mod:`flwr_dp_benchmarks._sim_apps`) plays a warm-up FedAvg round
(Ray starts its actors; dropped), then ``rounds`` rounds of Flower's ``FedAvg``
and of CE alternated round by round in ABBA order (FedAvg, CE, CE, FedAvg,
...), where CE is ``ClusterEvaluation(FedAvg, cluster_client_num=1000)`` (the
seed's) and every client's evaluate reply carries its mean softmax vector noised
by ``LaplaceInferenceMod`` (the server's ``laplace-eval-eps``). Every client
trains in both (identical local SGD), so the difference is the inference upload,
its noise and declaration, the ledger booking of 1 000 declarations and the
silhouette / Calinski-Harabasz / Davies-Bouldin scoring. Every round counts
(each is a whole round of a 1 000-client run).

Rows: the round's wall time (train + evaluate; target <= 1.10x), the evaluate
phase alone (reported), the peak RSS of the ServerApp process and the sum of
the per-process peak RSS of the process tree (target <= 1.10x).
"""

from __future__ import annotations

import sys

from ._common import row
from ._sim_apps import SHARED, pick, median, run_segments
from ._duel_rows import rows_from

NAME = "scale"
SUBJECT = "ClusterEvaluation + LaplaceInferenceMod"
DIAGNOSTICS = ("FedAvg + inference upload", "ClusterEvaluation (NOT_ENCRYPT)")


def run(
    *, clients: int = 1000, rounds: int = 2, local_epochs: int = 3, strict: bool = False, diagnostics: bool = False
) -> list[dict]:
    """Rows: CE + Laplace rounds vs Flower FedAvg rounds with ``clients`` clients, alternated in one simulation.

    ``diagnostics``: also duel :data:`DIAGNOSTICS` (reported, no target) to split the overhead into
    Flower's cost of the extra record, the server's scoring and the Laplace mod with its booking.
    """
    subjects = (SUBJECT, *(DIAGNOSTICS if diagnostics else ()))
    result = SHARED.pop((NAME, clients, rounds, local_epochs), None) if not diagnostics else None
    if result is None:  # else: already played by bench_simulation (--tiny)
        result = run_segments(clients, [(NAME, [(s, rounds) for s in subjects])], local_epochs=local_epochs)[NAME]
    print(
        f"[{NAME}] {len(subjects)} duel(s) of 2 x {rounds} rounds, {clients} clients: {result['wall_s']:.0f} s"
        f"{' (in the simulation benchmark run)' if result.get('shared_run') else ''}",
        file=sys.stderr,
    )
    params = {
        "clients": clients,
        "rounds": rounds,
        "local_epochs": local_epochs,
        "cluster_client_num": 1000,
        "model": "digits MLP 64-32-10",
        "simulation_wall_s": round(result["wall_s"], 1),
        "warmup_round_s": round(result.get("warmup_s") or 0.0, 1),
        "shared_run": bool(result.get("shared_run")),
    }
    rows = rows_from(result, (SUBJECT,), name=NAME, params=params, first_round=1, strict=strict)
    duels = result["duels"]
    sub, base = pick(duels, SUBJECT, "subject", "evaluate_s"), pick(duels, SUBJECT, "baseline", "evaluate_s")
    if sub and base:
        agg = [median(pick(duels, SUBJECT, who, "aggregate_evaluate_s")) * 1e3 for who in ("subject", "baseline")]
        rows.insert(
            1,
            row(
                NAME,
                f"{SUBJECT}: evaluate phase ({clients} clients)",
                {**params, "variant": SUBJECT},
                metric="time_s",
                values=sub,
                baseline="Flower FedAvg evaluate phase, same simulation",
                baseline_values=base,
                target="reported",
                notes="configure_evaluate to the end of aggregate_evaluate (the only phase CE changes); "
                f"server aggregate_evaluate {agg[0]:.0f} ms vs {agg[1]:.0f} ms",
            ),
        )
    if diagnostics:
        rows += rows_from(result, DIAGNOSTICS, name=NAME, params=params, first_round=1, strict=strict, target=None)
    return rows
