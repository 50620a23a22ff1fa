"""The clients' evaluate metrics are released accounted by default (issue 37 item 2).

Before: every strategy except ClusterEvaluation published Flower's weighted mean of the clients' evaluate metrics
(``accuracy``, ``loss``, ``num-examples``), un-noised, and booked nothing. Now each strategy takes
``evaluate_metrics``: declared metrics are noised bounded means booked in the ledger (``dp-eval/<key>``),
undeclared ones are withheld, and Flower's mean is published only when asked for by name (booked non-private).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent, NonPrivateDpEvent
from dp_accounting.rdp import RdpAccountant
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from scipy import stats

from flwr_dp_strategies import (
    AccountedFedAvg,
    AccountedServerSideFixedClipping,
    ClusterEvaluation,
    PrivacyLedger,
    declare_release,
)
from flwr_dp_strategies.privacy.mechanisms.gaussian import bounded_mean
from flwr_dp_strategies.rounds.client_metrics import AccountedMetrics
from loopback import LoopbackGrid
from strategy_registry import REGISTRY

pytestmark = pytest.mark.usefixtures("task_identity")

N = 4
NODES = dict(min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N)


def evaluate(strategy, accuracies, server_round=1, declare=None):
    msgs = list(
        strategy.configure_evaluate(server_round, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(N))
    )
    replies = []
    for m, accuracy in zip(msgs, accuracies):
        content = RecordDict({"metrics": MetricRecord({"num-examples": 10.0, "accuracy": accuracy, "loss": 0.3})})
        if declare is not None:
            declare_release(content, declare, label="eval", neighboring_relation="replace_one")
        replies.append(Message(content, reply_to=m))
    return strategy.aggregate_evaluate(server_round, replies)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_by_default_no_strategy_publishes_the_clients_evaluate_metrics(name):
    """Every registered strategy, built with its defaults: none of the keys the clients sent is published (before:
    ``acc`` and ``num-examples``, Flower's mean, for all but ClusterEvaluation(FedAvg))."""
    entry = REGISTRY[name]
    strategy, grid = entry.make(), entry.grid()
    list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
    msgs = list(strategy.configure_evaluate(1, entry.model(), ConfigRecord(), grid))
    contents = [entry.evaluate_content(i) for i in range(len(msgs))]
    sent = {key for c in contents for record in c.metric_records.values() for key in record}
    assert sent  # the positive control: the clients did send metrics
    metrics = strategy.aggregate_evaluate(1, [Message(c, reply_to=m) for c, m in zip(contents, msgs)])
    assert not sent & set(metrics), sorted(sent & set(metrics))
    assert "privacy/epsilon" in metrics


@pytest.mark.parametrize("relation", ["add_or_remove_one", "replace_one"])
def test_a_declared_metric_is_a_noised_bounded_mean_booked_as_its_own_gaussian(relation):
    z = 2.0
    ledger = PrivacyLedger(1e-5, neighboring_relation=relation)
    strategy = AccountedFedAvg(
        **NODES, ledger=ledger, evaluate_metrics=AccountedMetrics({"accuracy": (0.0, 1.0)}, noise_multiplier=z)
    )
    strategy._metrics_rng = lambda: np.random.default_rng(0)  # a fixed draw for the check below
    metrics = evaluate(strategy, [0.5, 0.7, 0.9, 1e6])  # the last is clipped to 1
    noise = np.random.default_rng(0).normal(0.0, z * 1.0)
    assert metrics["dp-eval/accuracy"] == pytest.approx((0.5 + 0.7 + 0.9 + 1.0 + noise) / N)
    assert "accuracy" not in metrics and "loss" not in metrics and "num-examples" not in metrics
    (_, event, label), *rest = ledger.events()
    assert rest == [] and event == GaussianDpEvent(z) and "accuracy" in label  # not converted: Δ = u − ℓ under both
    reference = RdpAccountant()
    reference.compose(GaussianDpEvent(z))
    assert metrics["privacy/epsilon-rdp"] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)


def test_evaluate_epsilon_covers_training_and_every_declared_metric():
    z_train, z_eval = 1.0, 3.0
    strategy = AccountedServerSideFixedClipping(
        FedAvg(**NODES),
        z_train,
        1.0,
        N,
        rng=0,
        evaluate_metrics=AccountedMetrics({"accuracy": (0.0, 1.0), "loss": (0.0, 5.0)}, noise_multiplier=z_eval),
    )
    msgs = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(N)))
    replies = [
        Message(
            RecordDict({"arrays": ArrayRecord([np.ones(3)]), "metrics": MetricRecord({"num-examples": 1.0})}),
            reply_to=m,
        )
        for m in msgs
    ]
    _, train = strategy.aggregate_train(1, replies)
    metrics = evaluate(strategy, [0.5] * N)
    assert {"dp-eval/accuracy", "dp-eval/loss"} <= set(metrics)
    reference = RdpAccountant()
    for event in (GaussianDpEvent(z_train), GaussianDpEvent(z_eval), GaussianDpEvent(z_eval)):
        reference.compose(event)
    assert metrics["privacy/epsilon-rdp"] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)
    assert metrics["privacy/epsilon"] > train["privacy/epsilon"]


def test_flower_by_name_publishes_the_plain_mean_and_books_the_round_non_private():
    strategy = AccountedFedAvg(**NODES, evaluate_metrics="flower")
    metrics = evaluate(strategy, [0.5, 0.7, 0.9, 0.1])
    assert metrics["accuracy"] == pytest.approx(0.55) and "dp-eval/accuracy" not in metrics
    assert metrics["privacy/epsilon"] == math.inf
    assert any(isinstance(event, NonPrivateDpEvent) for _, event, _ in strategy.ledger.events())


def test_flower_by_name_books_nothing_more_when_every_client_declared_its_release():
    from dp_accounting.dp_event import LaplaceDpEvent

    strategy = AccountedFedAvg(**NODES, evaluate_metrics="flower")
    metrics = evaluate(strategy, [0.5, 0.7, 0.9, 0.1], declare=LaplaceDpEvent(1.0))
    assert metrics["accuracy"] == pytest.approx(0.55)
    assert math.isfinite(metrics["privacy/epsilon"])  # post-processing of the declared (booked) releases
    assert strategy.ledger.events() == []  # central events: none


def test_undeclared_keys_are_logged_once_by_name(caplog):
    import logging

    strategy = AccountedFedAvg(**NODES)
    logging.getLogger("flwr").propagate = True  # restored by conftest's autouse fixture
    with caplog.at_level(logging.INFO):
        evaluate(strategy, [0.5] * N, server_round=1)
        evaluate(strategy, [0.5] * N, server_round=2)
    withheld = [r.getMessage() for r in caplog.records if "withheld" in r.getMessage()]
    assert len(withheld) == 1 and "accuracy" in withheld[0] and "loss" in withheld[0]


def test_bounded_mean_noise_is_z_times_the_range_over_m_and_10_percent_off_is_rejected():
    """KS test of (release − true mean) against N(0, (z(u − ℓ)/m)²): 20 000 releases (fixed seed); a 10 % error in
    the scale moves the KS statistic to about 0.035, far above the null's 1e-6 quantile (about 0.019)."""
    z, lower, upper, m = 1.5, -1.0, 3.0, 5
    values = np.array([0.0, 2.0, 3.0, -1.0])  # inside the range: the clipped mean is (4 + 3·... ) / m exactly
    true = float(np.sum(values - lower)) / m + lower
    generator = np.random.default_rng(11)
    noise = np.array(
        [
            bounded_mean(values, lower=lower, upper=upper, denominator=m, noise_multiplier=z, rng=generator).value
            - true
            for _ in range(20_000)
        ]
    )
    sigma = z * (upper - lower) / m
    critical = math.sqrt(-0.5 * math.log(1e-6 / 2) / noise.size)
    assert stats.kstest(noise, "norm", args=(0.0, sigma)).statistic < critical
    for wrong in (0.9 * sigma, 1.1 * sigma):
        assert stats.kstest(noise, "norm", args=(0.0, wrong)).statistic > critical


def test_one_client_moves_a_metric_by_at_most_the_range_over_m():
    """Sensitivity: with the noise drawn the same way, removing a client whose value is huge moves the release by
    at most (u − ℓ)/m."""
    kwargs = dict(lower=0.0, upper=1.0, denominator=4, noise_multiplier=1.0)
    with_it = bounded_mean([0.5, 0.2, 1e12], rng=np.random.default_rng(3), **kwargs).value
    without = bounded_mean([0.5, 0.2], rng=np.random.default_rng(3), **kwargs).value
    assert 0.0 < with_it - without <= 1.0 / 4 + 1e-12


@pytest.mark.parametrize(
    "value, error, match",
    [
        ("plain", ValueError, "evaluate_metrics"),
        (3, TypeError, "evaluate_metrics"),
        ({"accuracy": (0, 1)}, TypeError, "evaluate_metrics"),
    ],
)
def test_a_bad_evaluate_metrics_names_the_parameter(value, error, match):
    with pytest.raises(error, match=match):
        AccountedFedAvg(**NODES, evaluate_metrics=value)
    with pytest.raises(error, match=match):
        AccountedServerSideFixedClipping(FedAvg(**NODES), 1.0, 1.0, N, evaluate_metrics=value)


@pytest.mark.parametrize(
    "ranges, z, match",
    [
        ({"accuracy": (1.0, 0.0)}, 1.0, "lower < upper"),
        ({"accuracy": (0.0, math.inf)}, 1.0, "finite"),
        ({"accuracy": (0.0, 1.0)}, None, "noise_multiplier"),
        ({"accuracy": (0.0, 1.0)}, 0.0, "noise_multiplier"),
        ({"accuracy": "01"}, 1.0, "pair"),
        ({3: (0.0, 1.0)}, 1.0, "metric names"),
    ],
)
def test_accounted_metrics_refuses_what_it_cannot_bound(ranges, z, match):
    with pytest.raises((TypeError, ValueError), match=match):
        AccountedMetrics(ranges, noise_multiplier=z)


def test_cluster_evaluation_leaves_a_wrapped_strategys_evaluate_metrics_to_it():
    with pytest.raises(ValueError, match="wrapped AccountedFedAvg"):
        ClusterEvaluation(AccountedFedAvg(**NODES), evaluate_metrics="flower")
    strategy = ClusterEvaluation(FedAvg(**NODES), evaluate_metrics=AccountedMetrics({"accuracy": (0, 1)}, 4.0))
    metrics = evaluate(strategy, [0.5] * N)
    assert "dp-eval/accuracy" in metrics and "accuracy" not in metrics
