"""Server aggregation of n Flower reply Messages (d float32 parameters) vs a stacked ``np.mean``.

Replies are real ``flwr.app.Message`` objects (``reply_to`` a message from the
strategy's own ``configure_train``), so every strategy pays for decoding the
serialised arrays, as it would in a ServerApp. The baseline is ``np.mean`` over
the already stacked, already decoded (n, d) float32 matrix: the memory-bandwidth
floor of averaging these numbers.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from flwr_dp_strategies import AccountedFedAvg, AccountedPoissonFixedClipping

from ._common import available_memory_bytes, peak_bytes, row, time_pair

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


def _strategies(n: int) -> dict:
    return {
        "flwr FedAvg": lambda: FedAvg(min_train_nodes=n, min_available_nodes=n),
        "AccountedFedAvg": lambda: AccountedFedAvg(min_train_nodes=n, min_available_nodes=n),
        "AccountedPoissonFixedClipping": lambda: AccountedPoissonFixedClipping(
            FedAvg(min_train_nodes=n, min_available_nodes=n), 1.0, 1.0, n, rng=0),
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


def _bench_one(n: int, d: int, repeats: int, seed: int, note: str) -> list[dict]:
    stacked = _updates(n, d, seed)
    records = [ArrayRecord([stacked[i]]) for i in range(n)]  # serialised once, shared by every strategy
    current = ArrayRecord([np.zeros(d, dtype=np.float32)])
    stacked_bytes = stacked.nbytes
    baseline_peak = stacked_bytes + peak_bytes(lambda: np.mean(stacked, axis=0))
    rows = []
    params = {"n": n, "d": d, "dtype": "float32", "arrays_per_reply": 1}
    for name, make in _strategies(n).items():
        strategy = make()
        msgs = list(strategy.configure_train(1, current, ConfigRecord(), _FakeGrid(n)))
        assert len(msgs) == n, (name, len(msgs))
        replies = [Message(RecordDict({"arrays": rec, "metrics": MetricRecord({"num-examples": 10.0, "loss": 0.5})}),
                           reply_to=msg) for msg, rec in zip(msgs, records)]
        results: list[Optional[ArrayRecord]] = []

        def aggregate(_state, strategy=strategy, replies=replies):
            arrays, _ = strategy.aggregate_train(1, replies)
            results.append(arrays)
            results[:] = results[-1:]

        sub, base = time_pair(aggregate, lambda _s: np.mean(stacked, axis=0), repeats=repeats)
        assert results[-1] is not None and results[-1]["0"].shape == (d,), name
        rows.append(row(NAME, f"{name} n={n} d={d:.0e}", params, metric="time_s", values=sub,
                        baseline="np.mean(stacked (n, d) float32, axis=0)", baseline_values=base,
                        target="<= 1.2x", target_ratio=1.2, notes=note))
        results.clear()
        peak = peak_bytes(lambda: aggregate(None))
        rows.append(row(NAME, f"{name} n={n} d={d:.0e} peak memory", params, metric="peak_bytes",
                        values=[peak], baseline="stacked matrix + np.mean's peak (tracemalloc)",
                        baseline_values=[baseline_peak], target="report (no target)",
                        notes=f"peak = {peak / (4 * d):.2f} model copies (4·d bytes); replies' serialised "
                              f"bytes ({stacked_bytes / 2**20:.0f} MiB) not counted" + (f"; {note}" if note else "")))
        del replies, msgs, strategy
    return rows


def run(*, ns: tuple[int, ...] = (100, 1000), d: int = 10**6, d_large_n: Optional[int] = None,
        repeats: int = 5, seed: int = 0) -> list[dict]:
    """Rows per strategy and n: aggregate_train time vs stacked mean (target ≤ 1.2×), and peak memory."""
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)
    rows = []
    try:
        with _TaskIdentity():
            for n in ns:
                dim = d if n < 1000 or d_large_n is None else d_large_n
                note = "" if dim == d else f"d={dim:.0e} for n={n} (set by the run configuration)"
                dim, mem_note = choose_d(n, dim)
                note = "; ".join(x for x in (note, mem_note) if x)
                reps = repeats if n * dim <= 2 * 10**8 else max(3, repeats // 2)
                rows += _bench_one(n, dim, reps, seed, note)
    finally:
        flwr_logger.setLevel(level)
    return rows

