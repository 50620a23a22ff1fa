"""Benchmarks run in process (tests, notebooks) leave logging as they found it.

Before: five benchmark functions set Flower's logger to ERROR and never set it back, so every later test in the same
process that read an INFO or WARNING line through ``caplog`` saw nothing (6 tests failed once the end-to-end modules
were scheduled first). Now the one way to quieten a logger is ``_common.quiet_loggers``, which restores it.
"""

from __future__ import annotations

import ast
import logging
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flwr_dp_benchmarks._common import quiet_loggers  # noqa: E402

BENCHMARKS = ROOT / "flwr_dp_benchmarks"


def level_setters(source: str) -> list[int]:
    """Lines of ``source`` that call ``<something>.setLevel(...)``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setLevel"
    ]


def test_quiet_loggers_sets_the_level_inside_and_restores_it_after_an_error_too():
    flwr_logger, absl = logging.getLogger("flwr"), logging.getLogger("absl")
    before = (flwr_logger.level, absl.level)
    with quiet_loggers("flwr", "absl"):
        assert flwr_logger.level == absl.level == logging.ERROR
    assert (flwr_logger.level, absl.level) == before
    with pytest.raises(RuntimeError), quiet_loggers(level=logging.WARNING):
        assert flwr_logger.level == logging.WARNING
        raise RuntimeError
    assert flwr_logger.level == before[0]


def test_quiet_loggers_as_a_decorator_restores_on_every_call():
    flwr_logger = logging.getLogger("flwr")
    before = flwr_logger.level

    @quiet_loggers()
    def level() -> int:
        return flwr_logger.level

    assert [level(), level()] == [logging.ERROR, logging.ERROR]
    assert flwr_logger.level == before


def test_no_benchmark_sets_a_logger_level_but_through_quiet_loggers():
    found = {
        path.name: lines
        for path in sorted(BENCHMARKS.glob("*.py"))
        if path.name != "_common.py" and (lines := level_setters(path.read_text(encoding="utf-8")))
    }
    assert not found, f"set a logger's level with _common.quiet_loggers (restored after): {found}"
    # positive control: the checker finds the pattern that leaked
    assert level_setters('import logging\nlogging.getLogger("flwr").setLevel(logging.ERROR)\n') == [2]


def test_a_benchmark_run_in_process_leaves_flowers_logger_as_it_was():
    from flwr_dp_benchmarks import bench_flower_adaptive_divergence

    flwr_logger = logging.getLogger("flwr")
    before = flwr_logger.level
    result = bench_flower_adaptive_divergence.run(rounds=2)
    assert len(result["ours_c"]) == len(result["flower_c"]) >= 2
    assert flwr_logger.level == before
