"""The strategy registry the cross-cutting suites draw from covers every exported strategy (issue 25, F)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message

from strategy_registry import REGISTRY, exported_strategies

pytestmark = pytest.mark.usefixtures("task_identity")


def test_every_exported_strategy_is_in_the_registry():
    exported = exported_strategies()
    assert len(exported) >= 12  # the package's Strategy subclasses, wrappers included
    missing = {cls.__name__ for cls in exported} - {entry.covers.__name__ for entry in REGISTRY.values()}
    assert not missing, f"exported strategies outside tests/strategy_registry.py: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_entry_builds_its_strategy_and_runs_a_clean_round(name):
    """Valid replies (as the registry describes them) are all aggregated: a finite model, no rejection."""
    entry = REGISTRY[name]
    strategy, grid = entry.build(), entry.grid()
    assert isinstance(strategy, entry.covers)
    messages = list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
    assert len(messages) == entry.nodes
    arrays, metrics = strategy.aggregate_train(1, entry.train_replies(grid, messages))
    assert arrays is not None and all(np.isfinite(a).all() for a in arrays.to_numpy_ndarrays())
    assert not any(k.startswith("rejected/") for k in metrics) and metrics.get("replies/failed", 0) == 0, metrics
    messages = list(strategy.configure_evaluate(1, entry.model(), ConfigRecord(), grid))
    metrics = strategy.aggregate_evaluate(
        1, [Message(entry.evaluate_content(i), reply_to=m) for i, m in enumerate(messages)]
    )
    assert metrics["acc"] == pytest.approx(0.5)
    assert not any(k.startswith("rejected/") for k in metrics) and metrics.get("replies/failed", 0) == 0, metrics
    assert not any(isinstance(v, float) and math.isnan(v) for v in metrics.values())
