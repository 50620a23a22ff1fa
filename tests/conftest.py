"""Shared test settings: offline Flower, quiet Ray."""

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# Vendored Flower apps and Flower's own strategy tests (``*_test.py``, package-relative imports) are
# run by tests/test_flower_examples.py and tests/test_flower_strategy_parity.py, never collected.
# (Not a conftest.py of their own: a second top-level ``conftest`` module shadows this one.)
collect_ignore = ["flower_examples"]


import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """End-to-end runs (``integration``) are ``slow`` too; a test whose module can run no Flower code is
    ``flower_independent`` (tests/flower_use.py). CI runs ``-m "not slow and not flower_independent"`` again on the
    other Flower versions: the other tests give the same result on every version."""
    from flower_use import flower_independent

    tier: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if flower_independent(Path(str(item.fspath))):
            item.add_marker(pytest.mark.flower_independent)
        module = str(item.fspath)
        rank = 0 if item.get_closest_marker("integration") else 1 if item.get_closest_marker("slow") else 2
        tier[module] = min(tier.get(module, 2), rank)
    # Longest work first: with ``-n`` each module is one unit of work, handed out in this order
    # (``--no-loadscope-reorder``), so the end-to-end runs start at once and the short modules fill in around
    # them; handed out last (xdist's default puts one-test modules last) they left a core idle for minutes.
    items.sort(key=lambda item: tier[str(item.fspath)])  # stable: each module keeps its own order


@pytest.fixture(scope="session")
def _flower_logging_baseline():
    """The ``flwr`` logger as Flower's import configures it (level, propagation, enabled)."""
    import logging

    import flwr.common.logger  # noqa: F401 - configures the logger

    flwr_logger = logging.getLogger("flwr")
    return flwr_logger.level, flwr_logger.propagate, flwr_logger.disabled


@pytest.fixture(autouse=True)
def _restore_logging(_flower_logging_baseline):
    """Every test starts and ends with the ``flwr`` logger as Flower's import left it, so ``caplog`` captures the same
    in any order and process: whatever came before (a script a test runs sets the logger to ERROR, Flower's simulation
    turns its propagation off, a module fixture runs a benchmark before the module's first test) is undone. Restoring
    only the state found at the test's start kept what a module fixture had changed before it."""
    import logging

    flwr_logger = logging.getLogger("flwr")

    def reset() -> None:
        level, propagate, disabled = _flower_logging_baseline
        flwr_logger.setLevel(level)
        flwr_logger.propagate, flwr_logger.disabled = propagate, disabled
        logging.disable(logging.NOTSET)

    reset()
    yield
    reset()


@pytest.fixture
def task_identity():
    """Messages need a run/node/task id; set one as a ServerApp would, then restore."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture(scope="session")
def tiny_benchmarks(tmp_path_factory) -> Path:
    """The output folder of ``flwr_dp_benchmarks.run --tiny`` (every benchmark at toy size), run once per
    session (per pytest-xdist worker that needs it): the benchmark smoke tests and the DP-SGD
    step-time tests read the same rows."""
    pytest.importorskip("matplotlib")
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from flwr_dp_benchmarks import run as bench_run

    out = tmp_path_factory.mktemp("bench")
    assert bench_run.main(["--tiny", "--out", str(out)]) == 0
    return out


FAST_LANE_LIMIT_S = 10.0
"""A test not marked ``slow`` must finish within this (setup, call and teardown each): the fast lane is the one
CI reruns on the oldest Flower, and the one developers run."""

_over_limit: list[tuple[str, str, float]] = []


def pytest_runtest_logreport(report):
    """Note every fast-lane test phase over :data:`FAST_LANE_LIMIT_S` (reports reach the controller under xdist)."""
    if report.duration > FAST_LANE_LIMIT_S and "slow" not in report.keywords:
        _over_limit.append((report.nodeid, report.when, report.duration))


def pytest_terminal_summary(terminalreporter):
    """Name the fast-lane tests that ran over the limit: they belong in the slow lane (or must get faster)."""
    if _over_limit:
        terminalreporter.section("fast lane over its limit")
        for nodeid, when, duration in sorted(_over_limit, key=lambda row: -row[2]):
            terminalreporter.write_line(
                f"{duration:6.1f} s {when:8s} {nodeid}: not marked slow, over {FAST_LANE_LIMIT_S:g} s"
            )
