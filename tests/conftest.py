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
    """End-to-end runs (``integration``) are ``slow`` too: ``-m "not slow"`` is the fast subset CI
    runs again on the second Flower version."""
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


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
