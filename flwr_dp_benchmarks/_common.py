"""Shared helpers: interleaved timing, result rows, peak memory, machine description."""

from __future__ import annotations

import gc
import logging
import math
import os
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

ROW_KEYS = (
    "benchmark",
    "case",
    "params",
    "metric",
    "value",
    "values",
    "baseline",
    "baseline_value",
    "baseline_values",
    "ratio",
    "target",
    "target_met",
    "notes",
)


_HEAP_FROZEN = False


@contextmanager
def quiet_loggers(*names: str, level: int = logging.ERROR) -> Iterator[None]:
    """Set the loggers ``names`` (default ``flwr``) to ``level`` inside the block, or the decorated call, and
    restore their levels after it: a benchmark run in process (a test, a notebook) leaves logging as it found it."""
    loggers = [logging.getLogger(name) for name in names or ("flwr",)]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, old in zip(loggers, saved):
            logger.setLevel(old)


def _freeze_heap() -> None:
    """Collect once, then move every object alive (the imported libraries: torch, Flower, scipy) to the
    collector's permanent generation (``gc.freeze``), so the full collection before each timed call scans only
    what the benchmark allocated since: 77 ms a call with torch loaded, about 0.1 ms after. Objects are still
    freed by reference counting; only cycles among the frozen ones are never collected."""
    global _HEAP_FROZEN
    if not _HEAP_FROZEN:
        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True


def time_pair(
    subject: Callable[[Any], Any],
    baseline: Callable[[Any], Any],
    *,
    repeats: int,
    warmup: int = 1,
    setup: Optional[Callable[[], Any]] = None,
    baseline_setup: Optional[Callable[[], Any]] = None,
) -> tuple[list[float], list[float]]:
    """Wall times (s) of ``subject(state)`` and ``baseline(state)``, interleaved, alternating which goes first.

    ``setup()`` (untimed) builds a fresh state for each call; without it the state is None.
    """

    _freeze_heap()

    def once(fn: Callable[[Any], Any], make: Optional[Callable[[], Any]]) -> float:
        state = make() if make is not None else None
        gc.collect()
        t0 = time.perf_counter()
        fn(state)
        return time.perf_counter() - t0

    for _ in range(warmup):
        once(subject, setup)
        once(baseline, baseline_setup)
    sub, base = [], []
    for i in range(repeats):
        if i % 2 == 0:
            sub.append(once(subject, setup))
            base.append(once(baseline, baseline_setup))
        else:
            base.append(once(baseline, baseline_setup))
            sub.append(once(subject, setup))
    return sub, base


def row(
    benchmark: str,
    case: str,
    params: dict,
    *,
    metric: str,
    values: list[float],
    baseline: str,
    baseline_values: list[float],
    target: str,
    target_ratio: Optional[float] = None,
    target_met: Optional[bool] = None,
    notes: str = "",
) -> dict:
    """One result row: medians, their ratio and whether the ratio target is met."""
    value = float(statistics.median(values))
    base = float(statistics.median(baseline_values))
    ratio = value / base if base > 0 else math.inf
    if target_met is None and target_ratio is not None:
        target_met = bool(ratio <= target_ratio)
    return {
        "benchmark": benchmark,
        "case": case,
        "params": params,
        "metric": metric,
        "value": value,
        "values": [float(v) for v in values],
        "baseline": baseline,
        "baseline_value": base,
        "baseline_values": [float(v) for v in baseline_values],
        "ratio": ratio,
        "target": target,
        "target_met": target_met,
        "notes": notes,
    }


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated (tracemalloc, numpy buffers included) while ``fn()`` runs, above what was live before."""
    gc.collect()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if started:
            tracemalloc.stop()
    return max(int(peak - before), 1)


def available_memory_bytes() -> Optional[int]:
    """MemAvailable from /proc/meminfo (None where unknown)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine() -> dict:
    """Platform, CPUs, memory and library versions."""
    import numpy as np

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
    }
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as handle:
            mem = int(handle.readline().split()[1]) * 1024
    except OSError:
        pass
    info["memory_total_bytes"] = mem
    from importlib import metadata

    for name in ("torch", "flwr", "dp-accounting", "opacus"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
    except Exception:  # noqa: BLE001
        pass
    return info


def write_outputs(
    result: dict, out: Path, png_name: str, markdown: Callable[[dict], str], plot: Callable[[dict, Path], None]
) -> list[Path]:
    """``results.json``, ``results.md`` and the plot ``png_name`` of ``result`` in ``out``."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md", out / png_name]
    paths[0].write_text(json.dumps(result, indent=1, allow_nan=True, default=float))
    paths[1].write_text(markdown(result))
    plot(result, paths[2])
    return paths
