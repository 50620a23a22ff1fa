"""Server aggregation of n Flower reply Messages (d float32 parameters) vs a stacked ``np.mean``.

Replies are real ``flwr.app.Message`` objects (``reply_to`` a message from the
strategy's own ``configure_train``), so every strategy pays for reading the
serialised arrays, as it would in a ServerApp. The baseline is ``np.mean`` over
the already stacked, already decoded (n, d) float32 matrix: the memory-bandwidth
floor of averaging these numbers.

Cases (one timed row and one peak-memory row each): Flower's ``FedAvg`` (the
peer), ``AccountedFedAvg`` (equal weights, and unequal weights ``num-examples``
= 10 + i), ``AccountedServerSideFixedClipping`` and
``AccountedPoissonFixedClipping`` (z = C = 1, every update clipped; each also
with an RDP-only ledger, whose ε is cheap, to show the aggregation without the
round's PLD accounting), ``ShuffleAmplifiedFedAvg``,
``MinDivergenceExpSampling`` (k = n/2, ε = 1) and ``SignDS``, whose replies are
real SignDS uploads (``indices``, ``sign``, ``b-hat`` from ``encode_update`` of
the same client models) rebuilt sparsely into the dense model. Timings include
each strategy's per-round privacy accounting (the ledger's ε in the round
metrics).

Loaded machine. With ``busy`` > 0 the dense strategies are timed again while
``busy`` processes spin on the cores (pure-Python loops, as Ray's client actors
keep a simulation's cores busy), against ``np.mean`` timed under the same load;
rows end in ``loaded (k busy processes)``. The target is a loaded ratio within
1.2x of the idle one: the aggregation runs BLAS on one thread
(:func:`~flwr_dp_strategies.rounds.streaming_aggregation.blas_single_thread`).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, Strategy

from flwr_dp_strategies import (
    AccountedFedAvg,
    AccountedPoissonFixedClipping,
    AccountedServerSideFixedClipping,
    MinDivergenceExpSampling,
    ShuffleAmplifiedFedAvg,
    SignDS,
)
from flwr_dp_strategies.layer_shuffler import LayerShuffler
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.signds import encode_update
from flwr_dp_strategies.rounds.streaming_aggregation import npy_view

from ._common import available_memory_bytes, peak_bytes, quiet_loggers, row, time_pair

NAME = "aggregation"


class _FakeGrid:
    """The part of a Flower Grid that configure_train uses: node ids 101, 102, ..."""

    def __init__(self, num_nodes: int) -> None:
        self.node_ids = list(range(101, 101 + num_nodes))

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)


class _TaskIdentity:
    """Set a run/node/task id as a ServerApp would (Messages need one), restore it afterwards."""

    def __enter__(self):
        from flwr.supercore.task_identity import TaskIdentity

        self._cls = TaskIdentity
        self._saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        return self

    def __exit__(self, *exc):
        self._cls._run_id, self._cls._node_id, self._cls._task_id = self._saved


@dataclass(frozen=True)
class Case:
    """A strategy to time: how to build it, its reply payloads, the client weights and a note."""

    make: Callable[[], Strategy]
    payloads: str = "dense"  # "dense": the client models; "signds": SignDS uploads of the same models
    unequal_weights: bool = False
    note: str = ""


def _cases(n: int) -> dict[str, Case]:
    def fedavg() -> FedAvg:
        return FedAvg(min_train_nodes=n, min_available_nodes=n)

    return {
        "flwr FedAvg": Case(fedavg),
        "AccountedFedAvg": Case(lambda: AccountedFedAvg(min_train_nodes=n, min_available_nodes=n)),
        "AccountedFedAvg unequal weights": Case(
            lambda: AccountedFedAvg(min_train_nodes=n, min_available_nodes=n),
            unequal_weights=True,
            note="num-examples = 10 + i (weighted path: one BLAS axpy per reply)",
        ),
        "AccountedServerSideFixedClipping": Case(
            lambda: AccountedServerSideFixedClipping(fedavg(), 1.0, 1.0, n),
            note="z = C = 1, every update clipped; noise from Flower's np.random.normal",
        ),
        "AccountedPoissonFixedClipping": Case(
            lambda: AccountedPoissonFixedClipping(fedavg(), 1.0, 1.0, n, rng=0),
            note="q = 1, every update clipped; the round's PLD accounting (ledger epsilon) is included",
        ),
        "AccountedServerSideFixedClipping, RDP-only ledger": Case(
            lambda: AccountedServerSideFixedClipping(
                fedavg(), 1.0, 1.0, n, ledger=PrivacyLedger(1e-5, accounting="rdp")
            ),
            note="as above with PrivacyLedger(accounting='rdp'): the aggregation without the PLD epsilon",
        ),
        "AccountedPoissonFixedClipping, RDP-only ledger": Case(
            lambda: AccountedPoissonFixedClipping(
                fedavg(), 1.0, 1.0, n, rng=0, ledger=PrivacyLedger(1e-5, accounting="rdp")
            ),
            note="as above with PrivacyLedger(accounting='rdp'): the aggregation without the PLD epsilon",
        ),
        "ShuffleAmplifiedFedAvg": Case(
            lambda: ShuffleAmplifiedFedAvg(min_train_nodes=n, min_available_nodes=n, shuffler=LayerShuffler(0)),
            note="one layer; NaN/inf found from the streamed mean, as AccountedFedAvg",
        ),
        "MinDivergenceExpSampling": Case(
            lambda: MinDivergenceExpSampling(
                min_train_nodes=n, min_available_nodes=n, num_selected=max(1, n // 2), epsilon=1.0, rng=0
            ),
            note="k = n/2, epsilon = 1: a sign-divergence pass over every reply, then the mean of k",
        ),
        "SignDS": Case(
            lambda: SignDS(min_train_nodes=n, min_available_nodes=n),
            payloads="signds",
            note="replies are SignDS uploads (sorted int64 indices, sign, MagRR bit) of the same models, "
            "rebuilt sparsely; the baseline is still the dense stacked mean",
        ),
    }


def _updates(n: int, d: int, seed: int) -> np.ndarray:
    """(n, d) float32 client models: a pool of random rows, shifted per client (cheap for large n·d)."""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal((min(n, 16), d), dtype=np.float32)
    out = np.empty((n, d), dtype=np.float32)
    for i in range(n):
        np.add(pool[i % pool.shape[0]], np.float32(1e-3 * i), out=out[i])
    return out


def choose_d(n: int, d: int) -> tuple[int, str]:
    """``d``, or d/10 when the replies plus the stacked matrix would not fit comfortably in memory."""
    need = 2 * n * d * 4 * 1.5  # serialised replies + stacked matrix, plus headroom
    avail = available_memory_bytes()
    if avail is not None and need > avail:
        return max(d // 10, 1), f"d reduced from {d:.0e}: {need / 2**30:.1f} GiB needed, {avail / 2**30:.1f} available"
    return d, ""


def _signds_records(strategy: SignDS, stacked: np.ndarray, current: np.ndarray, seed: int) -> list[ArrayRecord]:
    """One SignDS upload per client, encoded as ``client_mods.signds_mod`` does (distinct rows encoded once)."""
    cache: dict[int, ArrayRecord] = {}
    records = []
    for i in range(stacked.shape[0]):
        row_id = i % 16  # _updates repeats 16 random rows (plus a tiny shift)
        if row_id not in cache:
            upload = encode_update(
                stacked[i] - current,
                sign_k=strategy.params.sign_k,
                sign_eps=strategy.params.sign_eps,
                sign_thr_ratio=strategy.params.sign_thr_ratio,
                sign_dim_out=strategy.params.sign_dim_out,
                r_est=strategy.state.r_est,
                is_reached=strategy.state.is_reached,
                max_dim_out=strategy.max_dim_out,
                magrr=strategy.magrr,
                rng=seed + i,
            )
            cache[row_id] = ArrayRecord(
                {
                    "indices": Array(upload.indices.astype(np.int64)),
                    "sign": Array(np.array([upload.sign], dtype=np.int64)),
                    "b-hat": Array(np.array([upload.b_hat], dtype=np.int64)),
                }
            )
        records.append(cache[row_id])
    return records


def _replies(
    case: Case, strategy: Strategy, msgs: list[Message], dense: list[ArrayRecord], stacked: np.ndarray, seed: int
) -> list[Message]:
    records = (
        dense
        if case.payloads == "dense"
        else _signds_records(strategy, stacked, np.zeros(stacked.shape[1], np.float32), seed)
    )
    out = []
    for i, (msg, rec) in enumerate(zip(msgs, records)):
        weight = 10.0 + i if case.unequal_weights else 10.0
        out.append(
            Message(
                RecordDict({"arrays": rec, "metrics": MetricRecord({"num-examples": weight, "loss": 0.5})}),
                reply_to=msg,
            )
        )
    return out


LOADED_CASES = (
    "flwr FedAvg",
    "AccountedFedAvg",
    "AccountedFedAvg unequal weights",
    "ShuffleAmplifiedFedAvg",
    "AccountedServerSideFixedClipping",
    "AccountedPoissonFixedClipping",
)


def _spin(stop_at: float) -> None:
    """Busy work until ``stop_at`` (a client actor's Python loop)."""
    x = 0
    while time.time() < stop_at:
        for i in range(10_000):
            x += i * i


@contextlib.contextmanager
def busy_processes(count: int, seconds: float = 600.0):
    """``count`` processes spinning on the cores while the block runs (terminated on exit)."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spin, args=(time.time() + seconds,), daemon=True) for _ in range(count)]
    for proc in procs:
        proc.start()
    time.sleep(0.5 if count else 0.0)  # let them reach the loop
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join()


def _bench_one(n: int, d: int, repeats: int, seed: int, note: str, busy: int = 0) -> list[dict]:
    stacked = _updates(n, d, seed)
    records = [ArrayRecord([stacked[i]]) for i in range(n)]  # serialised once, shared by every strategy
    current = ArrayRecord([np.zeros(d, dtype=np.float32)])
    stacked_bytes = stacked.nbytes
    baseline_peak = stacked_bytes + peak_bytes(lambda: np.mean(stacked, axis=0))
    rows = []
    params = {"n": n, "d": d, "dtype": "float32", "arrays_per_reply": 1}
    rows += _time_cases(n, d, repeats, seed, note, stacked, records, current, baseline_peak, params)
    if busy:
        with busy_processes(busy):
            rows += _time_cases(
                n,
                d,
                repeats,
                seed,
                note,
                stacked,
                records,
                current,
                baseline_peak,
                params | {"busy_processes": busy},
                loaded=busy,
            )
    rows.append(_payload_floor_row(records, stacked, repeats, params, note))
    return rows


def _time_cases(
    n: int,
    d: int,
    repeats: int,
    seed: int,
    note: str,
    stacked: np.ndarray,
    records: list,
    current: ArrayRecord,
    baseline_peak: int,
    params: dict,
    loaded: int = 0,
) -> list[dict]:
    """One time row (and, idle only, one peak-memory row) per case."""
    rows = []
    suffix = f" loaded ({loaded} busy processes)" if loaded else ""
    stacked_bytes = stacked.nbytes
    for name, case in _cases(n).items():
        if loaded and name not in LOADED_CASES:
            continue
        strategy = case.make()
        msgs = list(strategy.configure_train(1, current, ConfigRecord(), _FakeGrid(n)))
        assert len(msgs) == n, (name, len(msgs))
        replies = _replies(case, strategy, msgs, records, stacked, seed)
        results: list[Optional[ArrayRecord]] = []

        def aggregate(_state, strategy=strategy, replies=replies):
            arrays, _ = strategy.aggregate_train(1, replies)
            results.append(arrays)
            results[:] = results[-1:]

        sub, base = time_pair(aggregate, lambda _s: np.mean(stacked, axis=0), repeats=repeats)
        assert results[-1] is not None and results[-1]["0"].shape == (d,), name
        notes = "; ".join(x for x in (case.note, note) if x)
        rows.append(
            row(
                NAME,
                f"{name} n={n} d={d:.0e}{suffix}",
                params,
                metric="time_s",
                values=sub,
                baseline="np.mean(stacked (n, d) float32, axis=0)",
                baseline_values=base,
                target="<= 1.2x",
                target_ratio=1.2,
                notes=notes,
            )
        )
        results.clear()
        if loaded:
            del replies, msgs, strategy
            continue
        peak = peak_bytes(lambda: aggregate(None))
        rows.append(
            row(
                NAME,
                f"{name} n={n} d={d:.0e} peak memory",
                params,
                metric="peak_bytes",
                values=[peak],
                baseline="stacked matrix + np.mean's peak (tracemalloc)",
                baseline_values=[baseline_peak],
                target="report (no target)",
                notes=f"peak = {peak / (4 * d):.2f} model copies (4·d bytes); replies' serialised "
                f"bytes ({stacked_bytes / 2**20:.0f} MiB) not counted" + (f"; {note}" if note else ""),
            )
        )
        del replies, msgs, strategy
    return rows


def _payload_floor_row(records: list[ArrayRecord], stacked: np.ndarray, repeats: int, params: dict, note: str) -> dict:
    """The bare in-place sum over the replies' payloads (zero-copy views): the floor of any streaming aggregation."""

    def floor(_state):
        total = np.array(npy_view(records[0]["0"]))
        for record in records[1:]:
            np.add(total, npy_view(record["0"]), out=total)

    sub, base = time_pair(floor, lambda _s: np.mean(stacked, axis=0), repeats=repeats)
    n, d = stacked.shape
    return row(
        NAME,
        f"floor: np.add over the payload views n={n} d={d:.0e}",
        params,
        metric="time_s",
        values=sub,
        baseline="np.mean(stacked (n, d) float32, axis=0)",
        baseline_values=base,
        target="report (no target)",
        notes="one np.add per reply into one accumulator, payloads read zero-copy: what reading Flower's "
        "serialised replies costs (separate bytes buffers in 4 KiB pages, where the stacked matrix "
        "gets numpy's huge pages)" + (f"; {note}" if note else ""),
    )


def run(
    *,
    ns: tuple[int, ...] = (100, 1000),
    d: int = 10**6,
    d_large_n: Optional[int] = None,
    repeats: int = 5,
    seed: int = 0,
    busy: int = 0,
) -> list[dict]:
    """Rows per strategy and n: aggregate_train time vs stacked mean (target ≤ 1.2×), and peak memory."""
    rows = []
    with quiet_loggers(level=logging.WARNING), _TaskIdentity():
        for n in ns:
            dim = d if n < 1000 or d_large_n is None else d_large_n
            note = "" if dim == d else f"d={dim:.0e} for n={n} (set by the run configuration)"
            dim, mem_note = choose_d(n, dim)
            note = "; ".join(x for x in (note, mem_note) if x)
            reps = repeats if n * dim <= 2 * 10**8 else max(3, repeats // 2)
            rows += _bench_one(n, dim, reps, seed, note, busy=busy if n < 1000 else 0)
    return rows
