"""Server aggregation at model scale: every central strategy against Flower's ``FedAvg`` at d = 1e6, 1e7, 1e8.

    python flwr_dp_benchmarks/bench_model_scale.py [--quick | --tiny] [--out flwr_dp_benchmarks/results/model_scale]

(also ``python flwr_dp_benchmarks/run.py --only model_scale``, which writes the suite's files instead).

Issue 40 item 1. Every other aggregation benchmark uses models of 1e3-1e5 parameters; this one times
``aggregate_train`` of one round at d float32 parameters (one array per reply) with n clients per round:
n = 10 at d = 1e6, 1e7, 1e8 and n = 100 at d = 1e6, 1e7 (100 x 1e8 float32 is 40 GB of replies: it does not
fit this machine's memory and is listed as not run, never estimated).

Replies are real ``flwr.app.Message`` objects (``reply_to`` a message of the strategy's own
``configure_train``; helpers of :mod:`.bench_aggregation`), serialised once and shared by every strategy,
generated one client at a time (no (n, d) matrix: at d = 1e8 the replies alone are 4 GB).

Subjects: ``AccountedFedAvg``, ``AccountedServerSideFixedClipping`` (z = C = 1), ``AccountedPoissonFixedClipping``
(z = C = 1, q = 1: every node), ``AccountedAdaptiveClipping`` (z = 1, C0 = 1, sigma_b = max(1, n/20), q = 1),
``AccountedClientSideAdaptiveClipping`` (the replies carry the clients' unclipped bit, and their updates are
within C0, set to 2x the largest update norm, so none is rejected) and, as a column only,
``AccountedBandedMatrixFactorization`` (b = 1, 3 rounds, the registry's configuration; not at d = 1e8). Every
central strategy wraps Flower's ``FedAvg`` and draws its default OS-entropy noise.

Baseline: Flower's ``FedAvg.aggregate_train`` on the same replies, interleaved with the subject
(:func:`._common.time_pair`); target <= 1.2x. Timings include each strategy's accounting.

``DistributedDpFedAvg`` is not here: its ``aggregate_train`` is the SecAgg+ unmask stage, which needs every
client's protocol state (key agreement, Shamir shares, per-pair masks over d) from a loopback grid running the
client app (``tests/secagg_harness.py``); playing 10 clients' masking at d = 1e7 in-process is the clients'
cost, not the server's. ``bench_distributed_dp.py --secagg-scale`` times the unmask at 100-1000 clients.

Memory: the peak of traced allocations (``tracemalloc``: numpy's buffers and Python's bytes, e.g. the
result's serialised payload) during one ``aggregate_train``, above what was live before it (the replies
and the current model are not counted), in model copies (4 d bytes); target <= 3 copies. FedAvg's own peak
is in the baseline column.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, Strategy

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "flwr_dp_benchmarks"

from flwr_dp_strategies import (  # noqa: E402
    AccountedAdaptiveClipping,
    AccountedBandedMatrixFactorization,
    AccountedClientSideAdaptiveClipping,
    AccountedFedAvg,
    AccountedPoissonFixedClipping,
    AccountedServerSideFixedClipping,
)
from flwr_dp_strategies.privacy import PrivacyLedger  # noqa: E402
from flwr_dp_strategies.wire import KEY_UNCLIPPED_BIT  # noqa: E402

from ._common import available_memory_bytes, machine, peak_bytes, quiet_loggers, row, time_pair  # noqa: E402
from .bench_aggregation import _FakeGrid, _TaskIdentity  # noqa: E402

NAME = "model_scale"
TARGET_RATIO = 1.2
TARGET_COPIES = 3.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "model_scale"

#: (n, d) of a full run; 100 x 1e8 is listed as not run (40 GB of replies)
FULL_SIZES = ((10, 10**6), (100, 10**6), (10, 10**7), (100, 10**7), (10, 10**8))
NOT_RUN = ((100, 10**8),)
MODES = {
    "full": {"sizes": FULL_SIZES, "not_run": NOT_RUN},
    "quick": {"sizes": ((10, 10**6), (100, 10**6), (10, 10**7)), "not_run": ()},
    "tiny": {"sizes": ((3, 2000),), "not_run": (), "repeats": 1, "rdp_ledger": True},
}


@dataclass(frozen=True)
class Case:
    """A strategy: how to build it for n clients and a clipping norm, whether replies carry the unclipped bit."""

    make: Callable[[int, float, Any], Strategy]  # (n, clipping norm, ledger or None)
    bit: bool = False
    column_only: bool = False
    max_d: Optional[int] = None
    note: str = ""


def _fedavg(n: int) -> FedAvg:
    return FedAvg(min_train_nodes=n, min_available_nodes=n)


CASES: dict[str, Case] = {
    "AccountedFedAvg": Case(lambda n, c, ledger: AccountedFedAvg(min_train_nodes=n, min_available_nodes=n)),
    "AccountedServerSideFixedClipping": Case(
        lambda n, c, ledger: AccountedServerSideFixedClipping(_fedavg(n), 1.0, 1.0, n, ledger=ledger),
        note="z = C = 1, every update clipped",
    ),
    "AccountedPoissonFixedClipping": Case(
        lambda n, c, ledger: AccountedPoissonFixedClipping(_fedavg(n), 1.0, 1.0, n, num_clients=n, ledger=ledger),
        note="z = C = 1, q = 1",
    ),
    "AccountedAdaptiveClipping": Case(
        lambda n, c, ledger: AccountedAdaptiveClipping(
            _fedavg(n),
            1.0,
            n,
            initial_clipping_norm=1.0,
            clipped_count_stddev=max(1.0, n / 20),
            num_clients=n,
            ledger=ledger,
        ),
        note="z = 1, C0 = 1, q = 1",
    ),
    "AccountedClientSideAdaptiveClipping": Case(
        lambda n, c, ledger: AccountedClientSideAdaptiveClipping(
            _fedavg(n),
            1.0,
            n,
            initial_clipping_norm=c,
            clipped_count_stddev=max(1.0, n / 20),
            num_clients=n,
            ledger=ledger,
        ),
        bit=True,
        note="replies carry the unclipped bit; C0 = 2x the largest update norm (none rejected, none clipped)",
    ),
    "AccountedBandedMatrixFactorization": Case(
        lambda n, c, ledger: AccountedBandedMatrixFactorization(
            _fedavg(n), 1.0, 1.0, n, num_bands=1, num_rounds=3, ledger=ledger
        ),
        column_only=True,
        max_d=10**7,
        note="column only (its noise state is being rewritten); b = 1, 3 rounds",
    ),
}


def client_records(n: int, d: int, seed: int) -> tuple[list[ArrayRecord], float]:
    """n serialised float32 client models (a pool of at most 4 random rows, shifted per client, as
    :func:`.bench_aggregation._updates` does, one client at a time), and the largest model norm."""
    rng = np.random.default_rng(seed)
    pool = [rng.standard_normal(d, dtype=np.float32) for _ in range(min(n, 4))]
    records, largest = [], 0.0
    scratch = np.empty(d, dtype=np.float32)
    for i in range(n):
        np.add(pool[i % len(pool)], np.float32(1e-3 * i), out=scratch)
        largest = max(largest, float(np.linalg.norm(scratch.astype(np.float64, copy=False))))
        records.append(ArrayRecord([scratch]))
    del pool, scratch
    return records, largest


def _replies(msgs: list[Message], records: list[ArrayRecord], bit: bool) -> list[Message]:
    out = []
    for msg, record in zip(msgs, records, strict=True):
        metrics = {"num-examples": 10.0, "loss": 0.5}
        if bit:
            metrics[KEY_UNCLIPPED_BIT] = 1
        out.append(Message(RecordDict({"arrays": record, "metrics": MetricRecord(metrics)}), reply_to=msg))
    return out


def _prepared(make: Callable[[], Strategy], n: int, current: ArrayRecord, records: list, bit: bool):
    strategy = make()
    msgs = list(strategy.configure_train(1, current, ConfigRecord(), _FakeGrid(n)))
    if len(msgs) != n:
        raise RuntimeError(f"configure_train sent {len(msgs)} instructions, expected {n}")
    return strategy, _replies(msgs, records, bit)


def _aggregate(state: tuple[Strategy, list[Message]], d: int) -> None:
    """Round 1 of a freshly configured strategy (``state``: from :func:`_prepared`)."""
    strategy, replies = state
    arrays, _ = strategy.aggregate_train(1, replies)
    if arrays is None or arrays["0"].shape != (d,):
        raise RuntimeError(f"{type(strategy).__name__} released {arrays!r}")


def _repeats(n: int, d: int, repeats: Optional[int]) -> tuple[int, int]:
    """(repeats, warm-ups): fewer where one FedAvg call takes seconds."""
    if repeats is not None:
        return repeats, 1 if n * d <= 10**8 else 0
    size = n * d
    if size <= 10**7:
        return 5, 1
    if size <= 10**8:
        return 3, 1
    return 1, 0


def bench_size(
    n: int,
    d: int,
    seed: int = 0,
    repeats: Optional[int] = None,
    cases: Optional[list[str]] = None,
    rdp_ledger: bool = False,
):
    """Rows of one (n, d): per case a time row (ratio to FedAvg) and a peak-memory row (model copies).

    ``rdp_ledger``: the central strategies get ``PrivacyLedger(1e-5, accounting="rdp")``, whose ε is cheap: the
    aggregation without the round's PLD accounting (a cost independent of d)."""
    need = n * d * 4 * 2.5
    avail = available_memory_bytes()
    params = {"n": n, "d": d, "dtype": "float32", "arrays_per_reply": 1, "ledger": "rdp" if rdp_ledger else "best"}
    if avail is not None and need > avail:
        return [_not_run_row(n, d, f"needs ~{need / 2**30:.0f} GiB, {avail / 2**30:.0f} GiB available")]
    records, largest = client_records(n, d, seed)
    current = ArrayRecord([np.zeros(d, dtype=np.float32)])
    reps, warm = _repeats(n, d, repeats)
    model_bytes = 4 * d

    def fedavg_setup():
        return _prepared(lambda: _fedavg(n), n, current, records, False)

    def aggregate(state):
        _aggregate(state, d)

    fedavg_peak = _peak(fedavg_setup, aggregate)
    rows = []
    for name, case in CASES.items():
        if cases is not None and name not in cases:
            continue
        label = f"{name}{', RDP-only ledger' if rdp_ledger else ''} n={n} d={d:.0e}"
        if case.max_d is not None and d > case.max_d:
            rows.append(_not_run_row(n, d, f"{name}: not run above d = {case.max_d:.0e} (column only)", name))
            continue
        try:

            def setup(case=case):
                ledger = PrivacyLedger(1e-5, accounting="rdp") if rdp_ledger else None
                return _prepared(lambda: case.make(n, 2.0 * largest, ledger), n, current, records, case.bit)

            sub, base = time_pair(
                aggregate, aggregate, repeats=reps, warmup=warm, setup=setup, baseline_setup=fedavg_setup
            )
            peak = _peak(setup, aggregate)
        except Exception as err:  # noqa: BLE001  (a column-only strategy under rewrite must not stop the run)
            if not case.column_only:
                raise
            rows.append(_not_run_row(n, d, f"{name}: {type(err).__name__}: {err}", name))
            continue
        note = "; ".join(x for x in (case.note, "column only: no target" if case.column_only else "") if x)
        rows.append(
            row(
                NAME,
                label,
                params | {"strategy": name},
                metric="time_s",
                values=sub,
                baseline="flwr FedAvg.aggregate_train, same replies",
                baseline_values=base,
                target="report" if case.column_only else f"<= {TARGET_RATIO}x",
                target_ratio=None if case.column_only else TARGET_RATIO,
                notes=note,
            )
        )
        copies = peak / model_bytes
        rows.append(
            row(
                NAME,
                f"{label} peak memory",
                params | {"strategy": name, "model_copies": copies, "fedavg_model_copies": fedavg_peak / model_bytes},
                metric="peak_bytes",
                values=[peak],
                baseline="flwr FedAvg's peak (tracemalloc)",
                baseline_values=[fedavg_peak],
                target="report" if case.column_only else f"<= {TARGET_COPIES:g} model copies",
                target_met=None if case.column_only else bool(copies <= TARGET_COPIES),
                notes=f"{copies:.2f} model copies above the replies (FedAvg {fedavg_peak / model_bytes:.2f})",
            )
        )
    return rows


def _peak(setup: Callable[[], Any], aggregate: Callable[[Any], None]) -> int:
    """:func:`._common.peak_bytes` of one ``aggregate`` of a fresh ``setup()`` (built before tracing starts)."""
    state = setup()
    return peak_bytes(lambda: aggregate(state))


def _not_run_row(n: int, d: int, why: str, strategy: str = "all") -> dict:
    return {
        "benchmark": NAME,
        "case": f"{strategy} n={n} d={d:.0e} not run",
        "params": {"n": n, "d": d, "dtype": "float32", "strategy": strategy},
        "metric": "not_run",
        "value": math.nan,
        "values": [],
        "baseline": "",
        "baseline_value": math.nan,
        "baseline_values": [],
        "ratio": math.nan,
        "target": "",
        "target_met": None,
        "notes": why,
    }


def run(
    *,
    sizes: tuple[tuple[int, int], ...] = FULL_SIZES,
    not_run: tuple[tuple[int, int], ...] = NOT_RUN,
    repeats: Optional[int] = None,
    seed: int = 0,
    cases: Optional[list[str]] = None,
    rdp_ledger: bool = False,
) -> list[dict]:
    """Rows for every (n, d) of ``sizes`` (see the module docstring), and a not-run row per ``not_run``."""
    rows = []
    with quiet_loggers(), _TaskIdentity():  # not each reply BandMF's schedule leaves out of a repeated round
        for n, d in sizes:
            t0 = time.perf_counter()
            rows += bench_size(n, d, seed=seed, repeats=repeats, cases=cases, rdp_ledger=rdp_ledger)
            print(f"[model_scale] n={n} d={d:.0e} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    for n, d in not_run:
        size = n * d * 4 / 1e9
        rows.append(_not_run_row(n, d, f"{size:.0f} GB of float32 replies do not fit this machine's memory"))
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: strategy x (n, d): seconds, ratio to FedAvg, peak model copies (FedAvg's in the first rows)."""
    lines = [
        "| strategy | n | d | seconds | FedAvg seconds | ratio (≤ 1.2×) | peak, model copies (≤ 3) | FedAvg copies |",
        "|---|---|---|---|---|---|---|---|",
    ]
    peaks = {r["case"].removesuffix(" peak memory"): r for r in rows if r["metric"] == "peak_bytes"}
    for r in rows:
        p = r["params"]
        if r["metric"] == "not_run":
            lines.append(f"| {p['strategy']} | {p['n']} | {p['d']:.0e} | not run: {r['notes']} | | | | |")
            continue
        if r["metric"] != "time_s":
            continue
        peak = peaks.get(r["case"])
        met = "" if r["target_met"] is None else (" ✓" if r["target_met"] else " ✗")
        copies, base_copies, pmet = "", "", ""
        if peak is not None:
            copies = f"{peak['params']['model_copies']:.2f}"
            base_copies = f"{peak['params']['fedavg_model_copies']:.2f}"
            pmet = "" if peak["target_met"] is None else (" ✓" if peak["target_met"] else " ✗")
        label = p["strategy"] + (", RDP-only ledger" if p.get("ledger") == "rdp" else "")
        lines.append(
            f"| {label} | {p['n']} | {p['d']:.0e} | {r['value']:.3g} | {r['baseline_value']:.3g} | "
            f"{r['ratio']:.2f}×{met} | {copies}{pmet} | {base_copies} |"
        )
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    m = result["machine"]
    return (
        f"# Server aggregation at model scale ({result['mode']} run, {result['created']})\n\n"
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs, {(m.get('memory_total_bytes') or 0) / 2**30:.1f} GiB; "
        f"numpy {m['numpy']}, flwr {m.get('flwr')}. `flwr_dp_benchmarks/bench_model_scale.py` (issue 40 item 1).\n\n"
        "Seconds: median `aggregate_train` time of one round (float32, one array per reply), interleaved with "
        "Flower's `FedAvg.aggregate_train` on the same replies. Peak: traced allocations (tracemalloc: numpy "
        "buffers and Python bytes) during one call above the replies and the model, in model copies (4·d bytes).\n\n"
        + "".join(f"{note}\n\n" for note in result.get("notes", []))
        + table(result["rows"])
    )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--cases", nargs="*", default=None, choices=sorted(CASES))
    parser.add_argument("--rdp-ledger", action="store_true", help="RDP-only ledgers: no PLD accounting in the round")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--note", action="append", default=[], help="a line for the markdown (repeatable)")
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    kwargs = dict(MODES[mode])
    if args.repeats is not None:
        kwargs["repeats"] = args.repeats
    if args.rdp_ledger:
        kwargs["rdp_ledger"] = True
    rows = run(**kwargs, cases=args.cases)
    result = {
        "mode": mode,
        "machine": machine(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "notes": args.note,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1, allow_nan=True, default=float))
    (args.out / "results.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
