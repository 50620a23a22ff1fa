"""AccountedPoissonFixedClipping: Poisson client sampling, fixed denominator, amplified accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from scipy import stats

from loopback import LoopbackGrid
from flwr_dp_strategies import AccountedPoissonFixedClipping
from flwr_dp_strategies.privacy import PrivacyLedger

pytestmark = pytest.mark.usefixtures("task_identity")


def make(z: float = 1.0, c: float = 1.0, m: int = 10, **kwargs) -> AccountedPoissonFixedClipping:
    return AccountedPoissonFixedClipping(FedAvg(), z, c, m, **kwargs)


def replies_for(msgs: list[Message], current: np.ndarray, update: np.ndarray) -> list[Message]:
    return [
        Message(
            RecordDict({"arrays": ArrayRecord([current + update]), "metrics": MetricRecord({"num-examples": 3.0})}),
            reply_to=m,
        )
        for m in msgs
    ]


def test_each_node_is_sampled_independently_with_rate_q():
    n, m, rounds = 200, 20, 300
    strategy = make(m=m, rng=1)
    counts = np.zeros(n)
    sizes = []
    for rnd in range(1, rounds + 1):
        msgs = list(strategy.configure_train(rnd, ArrayRecord([np.zeros(2)]), ConfigRecord(), LoopbackGrid.of(n)))
        sizes.append(len(msgs))
        for msg in msgs:
            counts[msg.metadata.dst_node_id - 101] += 1
    q = m / n
    total = int(counts.sum())
    assert stats.binomtest(total, n * rounds, q).pvalue > 1e-3
    for wrong in (0.9 * q, 1.1 * q):
        assert stats.binomtest(total, n * rounds, wrong).pvalue < 1e-6
    # sample sizes vary (Poisson, not fixed-size) with the binomial variance n q (1 - q)
    assert np.var(sizes) == pytest.approx(n * q * (1 - q), rel=0.3)
    # no node is favoured: chi-square on per-node counts
    assert stats.chisquare(counts).pvalue > 1e-3


def test_fixed_denominator_and_clipping():
    m = 10
    strategy = make(z=1e-9, c=1.0, m=m, num_clients=30, rng=2)
    current = np.zeros(4)
    msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(30)))
    big = np.array([3.0, 4.0, 0.0, 0.0])  # norm 5 -> clipped to norm 1
    arrays, metrics = strategy.aggregate_train(1, replies_for(msgs, current, big))
    expected = len(msgs) * big / 5.0 / m  # sum of clipped updates / expected count m, not / |S|
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], expected, atol=1e-6)
    assert "dp/participants" not in metrics  # the sample is secret (issue 16 C5)


def test_noise_std_is_zc_over_m_and_10_percent_off_is_rejected():
    z, c, m, d = 1.2, 0.7, 10, 50_000
    strategy = make(z=z, c=c, m=m, num_clients=40, rng=3)
    current = np.zeros(d)
    msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(40)))
    arrays, _ = strategy.aggregate_train(1, replies_for(msgs, current, np.zeros(d)))
    noise = arrays.to_numpy_ndarrays()[0]
    sigma = z * c / m
    assert stats.kstest(noise, "norm", args=(0, sigma)).pvalue > 1e-3
    for factor in (0.9, 1.1):
        assert stats.kstest(noise, "norm", args=(0, factor * sigma)).pvalue < 1e-6


def test_ledger_records_the_amplified_event_every_round_including_empty_samples():
    z, m, n = 1.0, 2, 100
    strategy = make(z=z, m=m, rng=4)
    current = np.zeros(3)
    empty_rounds = 0
    for rnd in range(1, 21):
        msgs = list(strategy.configure_train(rnd, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(n)))
        empty_rounds += not msgs
        arrays, metrics = strategy.aggregate_train(rnd, replies_for(msgs, current, np.ones(3) * 0.01))
        assert arrays is not None  # an empty sample still releases w + noise
        current = arrays.to_numpy_ndarrays()[0]
    assert empty_rounds > 0  # q = 0.02, 100 nodes: P(empty) = 0.13 per round
    expected = PrivacyLedger(1e-5)
    for rnd in range(1, 21):
        expected.record(PoissonSampledDpEvent(m / n, GaussianDpEvent(z)), server_round=rnd)
    assert metrics["privacy/epsilon"] == pytest.approx(expected.epsilon(), rel=1e-9)
    unamplified = PrivacyLedger(1e-5)
    for rnd in range(1, 21):
        unamplified.record(GaussianDpEvent(z), server_round=rnd)
    assert metrics["privacy/epsilon"] < unamplified.epsilon() / 4


@pytest.mark.parametrize("relation", ["add_or_remove_one", "replace_one"])
def test_budget_stops_training_before_it_is_exceeded(relation):
    """Also in a replace-one ledger, which books the add/remove event in its own relation."""
    ledger = PrivacyLedger(1e-5, max_epsilon=2.0, neighboring_relation=relation)
    strategy = make(z=2.0, m=2, num_clients=10, ledger=ledger, rng=5)
    current = np.zeros(2)
    released = 0
    for rnd in range(1, 30):
        msgs = list(strategy.configure_train(rnd, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(10)))
        arrays, _ = strategy.aggregate_train(rnd, replies_for(msgs, current, np.zeros(2)))
        released += arrays is not None
    assert strategy.budget_exhausted and 0 < released < 29
    assert ledger.epsilon() <= 2.0


@pytest.mark.parametrize(
    "args, name",
    [
        ((FedAvg(), 0.0, 1.0, 5), "noise_multiplier"),
        ((FedAvg(), 1.0, -1.0, 5), "clipping_norm"),
        ((FedAvg(), 1.0, 1.0, 0), "num_sampled_clients"),
    ],
)
def test_bad_parameters_name_themselves(args, name):
    with pytest.raises(ValueError, match=name):
        AccountedPoissonFixedClipping(*args)
    with pytest.raises(ValueError, match="num_clients"):
        AccountedPoissonFixedClipping(FedAvg(), 1.0, 1.0, 5, num_clients=4)


def _keyed_reply(msg: Message, current: np.ndarray, update: np.ndarray, keys: tuple[str, ...]) -> Message:
    metrics = {"num-examples": 3.0, **{k: 0.5 for k in keys}}
    return Message(
        RecordDict({"arrays": ArrayRecord([current + update]), "metrics": MetricRecord(metrics)}), reply_to=msg
    )


def test_one_added_client_moves_the_clipped_sum_by_at_most_c():
    """Audit (C6): the majority-metric-key filter let one added client change which others were aggregated
    (the clipped sum moved by 3C, not C). Acceptance now depends on each reply alone."""
    m, c = 4, 1.0
    current, update = np.zeros(3), np.array([3.0, 4.0, 0.0])  # norm 5: clipped to C
    keys = [("loss",), ("loss",), ("loss", "acc"), ("loss", "acc")]
    models = []
    for with_attacker in (False, True):
        strategy = make(z=1e-12, c=c, m=m, num_clients=m, rng=0)  # q = 1: all four nodes asked
        msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(m)))
        replies = [_keyed_reply(msg, current, update, k) for msg, k in zip(msgs, keys)]
        arrays, _ = strategy.aggregate_train(1, replies if with_attacker else replies[:3])
        models.append(arrays.to_numpy_ndarrays()[0])
    moved = np.linalg.norm(models[1] - models[0]) * m  # in units of the clipped sum
    assert moved == pytest.approx(c, rel=1e-6)


def test_sample_size_and_client_metrics_are_not_published_unless_booked_non_private():
    """Audit (C5): dp/participants (|S|) and the clients' train metrics were published next to each release."""
    for publish in (False, True):
        strategy = make(z=1.0, m=5, num_clients=10, rng=4, publish_client_metrics=publish)
        current = np.zeros(3)
        msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(10)))
        _, metrics = strategy.aggregate_train(1, [_keyed_reply(msg, current, np.ones(3), ("loss",)) for msg in msgs])
        assert "dp/participants" not in metrics
        assert ("loss" in metrics) is publish
        assert math.isinf(strategy.ledger.epsilon()) is publish
