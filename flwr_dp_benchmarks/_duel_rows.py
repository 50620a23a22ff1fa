"""Result rows of the simulation duels (:mod:`flwr_dp_benchmarks._sim_apps`): time and memory, subject vs FedAvg.

Shared by ``bench_simulation`` and ``bench_scale``, which play their duels in the same
simulation and report them the same way.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional

from ._common import row
from ._sim_apps import VARIANTS, breakdown, failures, median, pick


def rows_from(
    result: dict,
    subjects: tuple[str, ...],
    *,
    name: str,
    params: dict[str, Any],
    first_round: int,
    strict: bool,
    target: Optional[float] = 1.10,
    suffix: str = "",
) -> list[dict]:
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
        case_params = {
            **params,
            "variant": subject,
            "kind": variant.kind,
            "duels": sum(1 for d in played if d["subject"] == subject and not d.get("error")),
        }
        case = f"{subject}: round wall time ({params.get('clients')} clients){suffix}"
        if not times or not base_times:
            why = failed.get(subject, "no completed duel")
            print(f"[{name}] {subject}: {why}", file=sys.stderr)
            nan = [math.nan]
            out.append(
                row(
                    name,
                    case,
                    case_params,
                    metric="time_s",
                    values=nan,
                    baseline="Flower FedAvg round",
                    baseline_values=nan,
                    target=goal,
                    target_met=False,
                    notes=f"FAILED: {why}",
                )
            )
            continue
        out.append(
            row(
                name,
                case,
                case_params,
                metric="time_s",
                values=times,
                baseline="Flower FedAvg round, same simulation, alternated",
                baseline_values=base_times,
                target=goal,
                target_ratio=target,
                notes=f"{variant.what}. {breakdown(played, subject, first_round)}",
            )
        )
        for key, label in (("server_hwm", "ServerApp process peak RSS"), ("tree_hwm", "process tree peak RSS")):
            values = [v for v in pick(played, subject, "subject", key, first_round) if v > 0]
            base_values = [v for v in pick(played, subject, "baseline", key, first_round) if v > 0]
            if not values or not base_values:
                continue
            reset = all(pick(played, subject, who, "hwm_reset", first_round) for who in ("subject", "baseline"))
            grew = (median(values) - median(base_values)) / 2**20
            out.append(
                row(
                    name,
                    f"{subject}: {label}{suffix}",
                    case_params,
                    metric="peak_bytes",
                    values=values,
                    baseline="Flower FedAvg rounds, same simulation",
                    baseline_values=base_values,
                    target=goal,
                    target_ratio=target,
                    notes=f"{grew:+.1f} MiB" + ("" if reset else " (VmHWM reset refused: peaks since start)"),
                )
            )
    return out


__all__ = ["rows_from"]
