"""The participation rule of BandMF (issue 30): flwr_dp_strategies.privacy.accounting.participation, no Flower."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from flwr_dp_strategies.privacy.accounting.participation import CyclicParticipation

ROOT = Path(__file__).resolve().parent.parent


def test_groups_are_balanced_and_a_late_node_joins_the_smallest():
    rule = CyclicParticipation(3, 2, rng=0)
    rule.assign(range(10))
    sizes = sorted([list(rule.groups.values()).count(g) for g in range(3)])
    assert sizes == [3, 3, 4]
    smallest = min(range(3), key=lambda g: list(rule.groups.values()).count(g))
    rule.assign([99])
    assert rule.groups[99] == smallest
    before = dict(rule.groups)
    rule.assign(range(10))
    assert {n: rule.groups[n] for n in before} == before  # a node never changes group


def test_selection_respects_the_group_separation_and_cap():
    rule = CyclicParticipation(2, 1, rng=1)
    first = rule.select(range(6), 1)
    rule.record(first, 1)
    second = rule.select(range(6), 2)
    assert len(first) == len(second) == 3 and not set(first) & set(second)
    rule.record(second, 2)
    assert rule.select(range(6), 3) == []  # k = 1 reached
    with pytest.raises(ValueError, match="cap k"):
        rule.record(first[:1], 3)
    other = CyclicParticipation(3, 5)
    other.record([7], 4)
    assert "less than b=3" in other.violation(7, 6) and other.violation(7, 7) is None


def test_state_round_trips_and_a_foreign_state_is_refused():
    rule = CyclicParticipation(3, 2, rng=2)
    rule.record(rule.select(range(9), 1), 1)
    again = CyclicParticipation(3, 2)
    again.load_state(rule.to_state())
    assert again.to_state() == rule.to_state()
    with pytest.raises(ValueError, match="num_groups=3"):
        CyclicParticipation(4, 2).load_state(rule.to_state())
    bad = rule.to_state()
    bad["nodes"][0][1] = 7  # group out of range
    with pytest.raises(ValueError, match="malformed node row"):
        CyclicParticipation(3, 2).load_state(bad)


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="num_groups"):
        CyclicParticipation(0, 1)
    with pytest.raises(ValueError, match="max_participations"):
        CyclicParticipation(1, 0)


def test_the_example_defaults_match_its_pyproject_and_build_the_strategy():
    sys.path.insert(0, str(ROOT / "examples" / "bandmf"))
    try:
        from bandmf_app import server_app, task
    finally:
        sys.path.pop(0)
    config = tomllib.loads((ROOT / "examples" / "bandmf" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert config["config"] == task.DEFAULTS
    strategy = server_app.build_strategy(task.DEFAULTS)
    assert strategy.num_bands == 4 and strategy.max_participations == 5 and strategy.num_sampled_clients == 10
