"""Every key a registered strategy publishes in a round's metrics is public, a ledger figure, post-processing of an
accounted release (``flwr_dp_strategies.rounds.published_keys``) or one of the clients' own metric keys.

The counts issue 37 found published (``shuffle/reports``, ``selection/candidates``, ``selection/k``,
``objective/clients``, ``objective/new-clients``, ``objective/noise-std``, ``cluster/points``, ``cluster/missing``,
``cluster/length-mismatch``) move with who replied; they are kept in the server's log and ``server_figures``.
"""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, MetricRecord

from flwr_dp_strategies import AccountedFedAvg
from flwr_dp_strategies.rounds.published_keys import PUBLISHED, protection
from loopback import LoopbackGrid
from strategy_registry import REGISTRY, Entry

pytestmark = pytest.mark.usefixtures("task_identity")

FORMERLY_PUBLISHED_COUNTS = {
    "shuffle/reports",
    "selection/candidates",
    "selection/k",
    "selection/mean-divergence",
    "selection/mean-divergence-selected",
    "objective/clients",
    "objective/new-clients",
    "objective/noise-std",
    "objective/ridge",
    "cluster/points",
    "cluster/missing",
    "cluster/length-mismatch",
    "signds/debiased-ones",
    "signds/fallback",
}


def unlisted(metrics: MetricRecord, client_keys: set[str]) -> list[str]:
    """The published keys that are neither in the allow-list nor the clients' own metric keys."""
    return sorted(key for key in metrics if protection(key) is None and key not in client_keys)


def one_round(entry: Entry, strategy) -> dict[str, tuple[MetricRecord, set[str]]]:
    grid = entry.grid()
    msgs = list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
    replies = entry.train_replies(grid, msgs)
    _, train = strategy.aggregate_train(1, replies)
    train_keys = {key for r in replies for rec in r.content.metric_records.values() for key in rec}
    msgs = list(strategy.configure_evaluate(1, entry.model(), ConfigRecord(), grid))
    contents = [entry.evaluate_content(i) for i in range(len(msgs))]
    evaluate = strategy.aggregate_evaluate(1, [Message(c, reply_to=m) for c, m in zip(contents, msgs)])
    evaluate_keys = {key for c in contents for rec in c.metric_records.values() for key in rec}
    return {"train": (train or MetricRecord(), train_keys), "evaluate": (evaluate or MetricRecord(), evaluate_keys)}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_published_key_is_listed_with_what_protects_it(name):
    entry = REGISTRY[name]
    try:
        strategy = entry.make(per_client_metrics=True)  # the per-node keys too
    except TypeError:  # the secure-aggregation entries and the docs' example take no such argument
        strategy = entry.make()
    for phase, (metrics, client_keys) in one_round(entry, strategy).items():
        assert "privacy/epsilon" in metrics, (phase, sorted(metrics))
        assert unlisted(metrics, client_keys) == [], phase
        assert not FORMERLY_PUBLISHED_COUNTS & set(metrics), phase
        if getattr(strategy, "per_client_metrics", False) and metrics["privacy/clients"] > 0:
            assert any(key.startswith("privacy/epsilon/node-") for key in metrics)  # matched by the <id> pattern


def test_the_counts_stay_with_the_operator():
    """Positive control for the moved counts: they are still computed, in the server's figures."""
    figures = {}
    for name in ("ShuffleAmplifiedFedAvg", "MinDivergenceExpSampling", "NoisyObjectiveSum", "SignDS"):
        entry = REGISTRY[name]
        strategy = entry.make()
        one_round(entry, strategy)
        figures.update(strategy.server_figures["train"])
    assert figures["shuffle/reports"] == 4 and figures["selection/candidates"] == 4
    assert figures["objective/clients"] == 4 and "signds/fallback" in figures


class _Leaky(AccountedFedAvg):
    """A release that publishes the number of replies it aggregated."""

    def release_train(self, server_round, screened):
        release = super().release_train(server_round, screened)
        release.metrics["replies/aggregated"] = float(len(screened.accepted))
        return release


def test_a_new_count_in_the_metrics_is_caught():
    strategy = _Leaky(min_train_nodes=2, min_available_nodes=2)
    grid = LoopbackGrid.of(2)
    entry = REGISTRY["AccountedFedAvg"]
    msgs = list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
    _, metrics = strategy.aggregate_train(1, entry.train_replies(grid, msgs))
    assert unlisted(metrics, {"num-examples", "loss"}) == ["replies/aggregated"]


def test_every_listed_key_says_what_protects_it():
    for key, (protected_by, what) in PUBLISHED.items():
        assert protected_by.split(":")[0] in (
            "public",
            "the privacy ledger's figure",
            "post-processing of an accounted release",
            "noised and booked in the ledger",
        ), key
        assert what, key
    assert protection("privacy/epsilon/node-17") is not None and protection("privacy/epsilon/node-x") is None
    assert protection("dp-eval/accuracy") == "noised and booked in the ledger" and protection("dp-eval/") is None


def test_the_docs_list_every_published_key():
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    for key, (protected_by, _) in PUBLISHED.items():
        assert f"| `{key}` | {protected_by} |" in page, key
    for key in FORMERLY_PUBLISHED_COUNTS:
        assert f"`{key}`" in page.split("## What stays with the operator")[1], key
