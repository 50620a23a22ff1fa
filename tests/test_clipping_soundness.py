"""Soundness of the two central-DP strategies (issue 16 A2, C5, C6, D11, E12; issue 17 screening).

Every test builds real Flower Messages and drives ``configure_*`` / ``aggregate_*``
directly (no app, no Ray), with seeded generators, so each runs in well under a second.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from scipy import stats

from loopback import LoopbackGrid
from flwr_dp_strategies import AccountedPoissonFixedClipping, AccountedServerSideFixedClipping

M = 4
pytestmark = pytest.mark.usefixtures("task_identity")


def fixed(z: float = 1.0, c: float = 1.0, **kwargs) -> AccountedServerSideFixedClipping:
    fedavg = FedAvg(min_train_nodes=M, min_available_nodes=M, min_evaluate_nodes=M)
    return AccountedServerSideFixedClipping(fedavg, z, c, M, **kwargs)


def poisson(z: float = 1.0, c: float = 1.0, **kwargs) -> AccountedPoissonFixedClipping:
    fedavg = FedAvg(min_train_nodes=M, min_available_nodes=M, min_evaluate_nodes=M)
    return AccountedPoissonFixedClipping(fedavg, z, c, M, num_clients=M, **kwargs)  # q = 1: every node asked


STRATEGIES = {"fixed": fixed, "poisson": poisson}


def train_reply(msg: Message, model: np.ndarray, metrics: dict) -> Message:
    return Message(RecordDict({"arrays": ArrayRecord([model]), "metrics": MetricRecord(metrics)}), reply_to=msg)


def train_messages(strategy, current: np.ndarray, server_round: int = 1) -> list[Message]:
    return list(strategy.configure_train(server_round, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(M)))


# ---------------------------------------------------------------------------- noise scale
def test_fixed_clipping_noise_is_n0_zc_over_m_and_10_percent_off_is_rejected():
    """Default path: zero updates, so the released model minus the current one is the noise alone.

    d = 50,000 draws: the KS statistic of a 10% scale error is ~0.035, about 8x its
    null 1e-6 quantile, so the wrong scales are rejected with room to spare while the
    true one passes (fixed seed: deterministic).
    """
    z, c, d = 1.2, 0.7, 50_000
    strategy = fixed(z, c, rng=3)
    current = np.full(d, 0.25)
    msgs = train_messages(strategy, current)
    arrays, _ = strategy.aggregate_train(1, [train_reply(m, current, {"num-examples": 3.0}) for m in msgs])
    noise = arrays.to_numpy_ndarrays()[0] - current
    sigma = z * c / M
    assert stats.kstest(noise, "norm", args=(0, sigma)).pvalue > 1e-3
    for factor in (0.9, 1.1):
        assert stats.kstest(noise, "norm", args=(0, factor * sigma)).pvalue < 1e-6


# ---------------------------------------------------------------------------- C6 / D11 sensitivity
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_one_added_client_moves_the_clipped_sum_by_exactly_c_whatever_its_keys_and_weight(name):
    """Acceptance per reply alone and a fixed denominator: adding one client (with extra metric keys
    that would flip a majority-key filter, and a huge reported weight) moves S/m by C/m, not more."""
    c = 1.0
    current, update = np.zeros(3), np.array([3.0, 4.0, 0.0])  # norm 5: clipped to C
    metrics = [
        {"num-examples": 3.0, "loss": 0.5},
        {"num-examples": 3.0, "loss": 0.5},
        {"num-examples": 3.0, "loss": 0.5, "acc": 0.5},
        {"num-examples": 1e9, "loss": 0.5, "acc": 0.5},
    ]
    models = []
    for n_replies in (3, 4):
        strategy = STRATEGIES[name](1e-12, c, rng=0)
        msgs = train_messages(strategy, current)
        replies = [train_reply(msg, current + update, mt) for msg, mt in zip(msgs, metrics)][:n_replies]
        arrays, out = strategy.aggregate_train(1, replies)
        assert sum(strategy.rejections["train"].values()) == 0
        models.append(arrays.to_numpy_ndarrays()[0])
    np.testing.assert_allclose(models[0], 3 * update / 5 / M, atol=1e-9)  # sum of clipped over m
    assert np.linalg.norm(models[1] - models[0]) * M == pytest.approx(c, rel=1e-6)


# ---------------------------------------------------------------------------- A2 weights
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_booked_event_never_depends_on_reported_weights(name):
    """Two replies at num-examples = 1e308 once made z_eff = NaN and epsilon read 0.0: now they are
    rejected as ``weight`` (above max_weight) and the booked event is the configured one."""
    ref = STRATEGIES[name](1.0, 1.0, rng=0)
    strategy = STRATEGIES[name](1.0, 1.0, rng=0)
    current = np.zeros(5)
    msgs = train_messages(strategy, current)
    train_messages(ref, current)
    weights = [1e308, 1e308, 10.0, 10.0]
    _, metrics = strategy.aggregate_train(
        1, [train_reply(m, current + 0.01, {"num-examples": w}) for m, w in zip(msgs, weights)]
    )
    assert strategy.rejections["train"]["weight"] == 2.0
    assert [e for _, e, _ in strategy.ledger.events()] == [ref.round_event()]
    assert 0 < strategy.ledger.epsilon() < math.inf


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("max_weight", [0.0, -1.0, math.nan, math.inf, True])
def test_max_weight_is_validated(name, max_weight):
    with pytest.raises(ValueError, match="max_weight"):
        STRATEGIES[name](max_weight=max_weight)


def test_max_weight_bounds_the_reported_weight():
    strategy = fixed(rng=0, max_weight=100.0)
    current = np.zeros(5)
    msgs = train_messages(strategy, current)
    weights = [100.0, 100.5, 1.0, 1.0]
    _, metrics = strategy.aggregate_train(
        1, [train_reply(m, current, {"num-examples": w}) for m, w in zip(msgs, weights)]
    )
    assert strategy.rejections["train"]["weight"] == 1.0


# ---------------------------------------------------------------------------- issue 17: train screening
def _undecodable() -> ArrayRecord:
    return ArrayRecord({"0": Array(dtype="float64", shape=(5,), stype="numpy.ndarray", data=b"\x00garbage")})


BAD_TRAIN = {
    "extra key": lambda cur: RecordDict(
        {"arrays": ArrayRecord({"0": Array(cur), "x": Array(cur)}), "metrics": MetricRecord({"num-examples": 1.0})}
    ),
    "wrong shape": lambda cur: RecordDict(
        {"arrays": ArrayRecord([np.zeros(6)]), "metrics": MetricRecord({"num-examples": 1.0})}
    ),
    "wrong dtype": lambda cur: RecordDict(
        {"arrays": ArrayRecord([cur.astype(np.complex128)]), "metrics": MetricRecord({"num-examples": 1.0})}
    ),
    "undecodable": lambda cur: RecordDict({"arrays": _undecodable(), "metrics": MetricRecord({"num-examples": 1.0})}),
    "no metrics": lambda cur: RecordDict({"arrays": ArrayRecord([cur])}),
    "two metric records": lambda cur: RecordDict(
        {
            "arrays": ArrayRecord([cur]),
            "metrics": MetricRecord({"num-examples": 1.0}),
            "more": MetricRecord({"num-examples": 1.0}),
        }
    ),
    "negative weight": lambda cur: RecordDict(
        {"arrays": ArrayRecord([cur]), "metrics": MetricRecord({"num-examples": -5.0})}
    ),
    "NaN update": lambda cur: RecordDict(
        {"arrays": ArrayRecord([np.full(5, np.nan)]), "metrics": MetricRecord({"num-examples": 1.0})}
    ),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("bad", sorted(BAD_TRAIN))
def test_a_malformed_train_reply_is_rejected_and_the_round_released_as_without_it(name, bad):
    current, update = np.zeros(5), np.full(5, 0.1)
    released = []
    for with_bad in (False, True):
        strategy = STRATEGIES[name](0.5, 1.0, rng=11)
        msgs = train_messages(strategy, current)
        replies = [train_reply(m, current + update, {"num-examples": 2.0}) for m in msgs[:3]]
        if with_bad:
            replies.append(Message(BAD_TRAIN[bad](current), reply_to=msgs[3]))
        arrays, metrics = strategy.aggregate_train(1, replies)
        assert sum(strategy.rejections["train"].values()) == float(with_bad)
        released.append(arrays.to_numpy_ndarrays()[0])
        assert len(strategy.ledger.events()) == 1
    np.testing.assert_array_equal(released[0], released[1])


# ---------------------------------------------------------------------------- issue 17: evaluate screening
BAD_EVAL = {
    "weight -5": {"metrics": MetricRecord({"num-examples": -5.0, "eval-acc": 0.0})},
    "weight 0": {"metrics": MetricRecord({"num-examples": 0.0, "eval-acc": 0.0})},
    "weight NaN": {"metrics": MetricRecord({"num-examples": math.nan, "eval-acc": 0.0})},
    "weight inf": {"metrics": MetricRecord({"num-examples": math.inf, "eval-acc": 0.0})},
    "weight missing": {"metrics": MetricRecord({"eval-acc": 0.0})},
    "weight list": {"metrics": MetricRecord({"num-examples": [1.0, 2.0], "eval-acc": 0.0})},
    "no metric record": {"config": ConfigRecord({"num-examples": 1.0})},
    "two metric records": {
        "metrics": MetricRecord({"num-examples": 1.0, "eval-acc": 0.0}),
        "more": MetricRecord({"num-examples": 1.0, "eval-acc": 0.0}),
    },
    "metric NaN": {"metrics": MetricRecord({"num-examples": 1.0, "eval-acc": math.nan})},
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("bad", sorted(BAD_EVAL))
def test_a_malformed_evaluate_reply_is_rejected_and_the_accuracy_is_the_honest_mean(name, bad):
    """Audit: Flower's FedAvg evaluated these unscreened (InconsistentMessageReplies, or a NaN accuracy)."""
    strategy = STRATEGIES[name](rng=0, evaluate_metrics="flower")  # screening, seen through Flower's mean
    msgs = list(strategy.configure_evaluate(1, ArrayRecord([np.zeros(5)]), ConfigRecord(), LoopbackGrid.of(M)))
    assert len(msgs) == M
    honest = [
        Message(RecordDict({"metrics": MetricRecord({"num-examples": w, "eval-acc": a})}), reply_to=m)
        for m, w, a in zip(msgs, (1.0, 1.0, 2.0), (0.2, 0.4, 0.7))
    ]
    metrics = strategy.aggregate_evaluate(1, honest + [Message(RecordDict(BAD_EVAL[bad]), reply_to=msgs[3])])
    assert metrics["eval-acc"] == pytest.approx((0.2 + 0.4 + 2 * 0.7) / 4)
    assert sum(strategy.rejections["evaluate"].values()) == 1.0


# ---------------------------------------------------------------------------- C5 / E12 defaults
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_nothing_un_noised_is_published_and_noise_ignores_numpys_global_seed(name):
    released, published = [], []
    for _ in range(2):
        np.random.seed(0)
        strategy = STRATEGIES[name](1.0, 1.0)  # default: OS entropy
        current = np.zeros(50)
        msgs = train_messages(strategy, current)
        arrays, metrics = strategy.aggregate_train(
            1, [train_reply(m, current, {"num-examples": 7.0, "train-loss": 0.25}) for m in msgs]
        )
        released.append(arrays.to_numpy_ndarrays()[0])
        published.append(set(metrics))
    assert not np.allclose(released[0], released[1])
    for keys in published:
        assert not keys & {"train-loss", "num-examples", "dp/participants"}
        assert all(k.startswith("privacy/") for k in keys), keys
