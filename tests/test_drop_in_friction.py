"""Drop-in friction (issue 20): what an unchanged Flower app notices when it swaps in our strategies."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


# ---------------------------------------------------------------------------- 1. root log handler
def test_dp_accounting_warning_adds_no_root_handler_and_flower_logs_once():
    """dp-accounting warns through absl, whose log() calls basicConfig(): every Flower line then printed twice."""
    result = _run("""
        import logging
        import flwr_dp_strategies
        from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent
        from flwr_dp_strategies.privacy import PrivacyLedger
        ledger = PrivacyLedger(1e-5, neighboring_relation="add_or_remove_one")
        ledger.record(PoissonSampledDpEvent(0.5, GaussianDpEvent(0.5)), server_round=1, client=1)
        ledger.epsilon()
        assert logging.getLogger().handlers == [], logging.getLogger().handlers
        from flwr.common.logger import log
        log(logging.INFO, "flower-line-marker")
    """)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "failed to converge" in output  # the warning itself still reaches the user
    assert output.count("flower-line-marker") == 1, output[-2000:]


# ---------------------------------------------------------------------------- 6. helpers where they belong
def test_shared_helpers_live_in_the_module_of_what_they_do():
    import numpy as np
    from flwr.app import Array, ArrayRecord

    from flwr_dp_strategies.strategy import accounted_fedavg, accounted_fixed_clipping, reply_screening
    from flwr_dp_strategies.strategy.streaming_aggregation import ClippedSum

    assert reply_screening.reply_arrays.__module__ == reply_screening.__name__
    assert reply_screening.reply_weight.__module__ == reply_screening.__name__
    assert accounted_fedavg.reply_arrays is reply_screening.reply_arrays  # public name kept as a re-export
    assert not hasattr(accounted_fixed_clipping, "_add_clipped")
    summed = ClippedSum({"w": np.zeros(3)}, clipping_norm=1.0)
    records = [ArrayRecord({"w": Array(np.array([3.0, 4.0, 0.0]))}), ArrayRecord({"w": Array(np.array([np.nan, 0, 0]))})]
    assert summed.add_records(records) == [1]
    assert np.allclose(summed.result()["w"], [0.6, 0.8, 0.0])

