"""Constructor arguments that cross the user boundary fail at construction with a TypeError naming them (issue 38
item 4): a path where a ``PrivacyLedger`` is expected used to be accepted by 11 of 13 strategies and abort round 1
with ``'str' object has no attribute 'record'``; ``ClusterEvaluation(None)`` and ``ClusterEvaluation("FedAvg")``
failed later. Every registry entry is tried."""

from __future__ import annotations

from pathlib import Path

import pytest

from flwr_dp_strategies import ClusterEvaluation, DistributedDpFedAvg, SecureObjectiveSum
from strategy_registry import REGISTRY

SECURE = {
    "DistributedDpFedAvg": lambda **kw: DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, **kw),
    "SecureObjectiveSum": lambda **kw: SecureObjectiveSum(num_classes=2, max_records=50, epsilon=5.0, **kw),
}


def build(name: str, **kw):
    entry = REGISTRY[name]
    return SECURE[name](**kw) if name in SECURE else entry.make(**kw)


@pytest.mark.parametrize("value", ["ledger.json", Path("ledger.json"), 1e-5, {"target_delta": 1e-5}])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_ledger_that_is_not_a_privacy_ledger_is_refused_at_construction(name, value):
    with pytest.raises(TypeError, match="ledger must be a PrivacyLedger"):
        build(name, ledger=value)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_ledger_path_that_is_not_a_path_is_refused_at_construction(name):
    with pytest.raises(TypeError, match="ledger_path must be a path"):
        build(name, ledger_path=3)


def test_the_message_for_a_path_points_to_ledger_path():
    with pytest.raises(TypeError, match="pass ledger_path="):
        build("AccountedFedAvg", ledger="ledger.json")


@pytest.mark.parametrize("strategy", [None, "FedAvg", 3])
def test_cluster_evaluation_refuses_what_is_not_a_strategy(strategy):
    with pytest.raises(TypeError, match="strategy must be a Flower Strategy"):
        ClusterEvaluation(strategy)
