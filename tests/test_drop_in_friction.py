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


# ---------------------------------------------------------------------------- 2. lean metrics
def test_a_clean_round_publishes_no_reject_counter_and_a_rejection_publishes_only_its_own(task_identity):
    import numpy as np
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    from conftest import FakeGrid
    from flwr_dp_strategies import AccountedFedAvg

    strategy = AccountedFedAvg(min_train_nodes=3, min_available_nodes=3)
    current = [np.zeros(3)]

    def replies(rnd, bad=None):
        msgs = list(strategy.configure_train(rnd, ArrayRecord(current), ConfigRecord(), FakeGrid(3)))
        out = []
        for i, msg in enumerate(msgs):
            values = np.full(3, np.nan) if i == bad else np.ones(3)
            out.append(Message(RecordDict({"arrays": ArrayRecord([values]),
                                           "metrics": MetricRecord({"num-examples": 5, "loss": 0.1})}), reply_to=msg))
        return out

    _, clean = strategy.aggregate_train(1, replies(1))
    assert not [key for key in clean if key.startswith("rejected/")]
    assert clean["replies/failed"] == 0  # the total stays
    _, dirty = strategy.aggregate_train(2, replies(2, bad=0))
    assert {key: value for key, value in dirty.items() if key.startswith("rejected/")} == {"rejected/non-finite": 1.0}
