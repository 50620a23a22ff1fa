"""Stopping early without a hidden release (issue 38 item 2): the budget stop (ledger only), the accounted early
stop (AboveThreshold, booked once per chain), and a user's ``should_stop`` shown only public and accounted keys."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from dp_accounting.dp_event import LaplaceDpEvent
from dp_accounting.pld import PLDAccountant
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from scipy import stats

from flwr_dp_strategies import AccountedFedAvg, AccountedServerSideFixedClipping, PrivacyLedger
from flwr_dp_strategies.privacy.accounting.events import PureDpEvent
from flwr_dp_strategies.privacy.mechanisms.sparse_vector import AboveThreshold
from flwr_dp_strategies.rounds.client_metrics import AccountedMetrics
from flwr_dp_strategies.rounds.early_stop import AccountedEarlyStop
from loopback import LoopbackGrid

pytestmark = pytest.mark.usefixtures("task_identity")

N = 4
NODES = dict(min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N)


def app(accuracy_of_round=lambda rnd: 0.5) -> ClientApp:
    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        shifted = ArrayRecord({k: Array(v.numpy() + 0.01) for k, v in arrays.items()})
        return Message(RecordDict({"arrays": shifted, "metrics": MetricRecord({"num-examples": 10})}), reply_to=msg)

    @client.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        rnd = int(msg.content["config"]["round"]) if "round" in msg.content["config"] else 0
        metrics = MetricRecord({"num-examples": 10, "accuracy": float(accuracy_of_round(rnd)), "loss": 0.1})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return client


def grid(client=None) -> LoopbackGrid:
    return LoopbackGrid(client or app(), list(range(101, 101 + N)))


def initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(5))})


def test_the_budget_stop_ends_the_run_before_the_round_that_would_exceed_and_books_nothing(caplog):
    """Before: the run went on to num_rounds, each further round training nothing (and evaluating)."""
    ledger = PrivacyLedger(1e-5, neighboring_relation="add_or_remove_one", max_epsilon=3.0)
    strategy = AccountedServerSideFixedClipping(FedAvg(**NODES), 2.0, 1.0, N, ledger=ledger, rng=0)
    fits = 0
    while not ledger.would_exceed(central_events=[strategy.add_remove_event()] * (fits + 1)):
        fits += 1
    assert 1 <= fits < 10
    logging.getLogger("flwr").propagate = True
    with caplog.at_level(logging.INFO):
        result = strategy.start(grid(), initial(), num_rounds=10)
    assert sorted(result.train_metrics_clientapp) == list(range(1, fits + 1))
    assert sorted(result.evaluate_metrics_clientapp) == list(range(1, fits + 1))  # no idle round after the last
    assert len(ledger.events()) == fits  # the stop itself booked nothing
    assert ledger.epsilon() <= 3.0
    assert any(f"stopping after round {fits}" in r.getMessage() for r in caplog.records)


def test_without_a_budget_every_round_runs_and_result_starts_with_the_initial_arrays():
    strategy = AccountedServerSideFixedClipping(FedAvg(**NODES), 2.0, 1.0, N, rng=0)
    result = strategy.start(grid(), initial(), num_rounds=3)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert not np.array_equal(result.arrays["w"].numpy(), np.zeros(5))


def evaluate_config_app():
    """Clients whose accuracy rises by 0.1 a round (the round arrives in the evaluate config)."""
    return app(lambda rnd: min(1.0, 0.1 * rnd))


class RoundInConfig(AccountedFedAvg):
    """Tells the evaluating clients the round (their accuracy is a function of it)."""

    def instruct_evaluate(self, server_round, arrays, config, grid):
        config["round"] = server_round
        return super().instruct_evaluate(server_round, arrays, config, grid)


def test_the_accounted_early_stop_halts_once_the_noised_mean_crosses_and_books_one_chain():
    epsilon = 2.0
    ledger = PrivacyLedger(1e-5)
    strategy = RoundInConfig(**NODES, ledger=ledger)
    stop = AccountedEarlyStop("accuracy", lower=0.0, upper=1.0, threshold=0.5, epsilon=epsilon, rng=4)
    result = strategy.start(grid(evaluate_config_app()), initial(), num_rounds=20, should_stop=stop)
    last = max(result.train_metrics_clientapp)
    assert stop.halted and last == stop.chain.answered < 20  # the run ended at the halting round
    chain = [(e, label) for _, e, label in ledger.events() if "early stop" in label]
    assert chain == [(PureDpEvent(epsilon), chain[0][1])]  # one booking for the whole chain
    alone = PrivacyLedger(1e-5)
    alone.record(PureDpEvent(epsilon), server_round=1)
    laplace = PLDAccountant()
    laplace.compose(LaplaceDpEvent(1.0 / epsilon))  # an ε-DP Laplace: its ε at δ is a lower bound
    assert laplace.get_epsilon(1e-5) <= alone.epsilon() + 1e-9 <= epsilon + 1e-9
    assert "accuracy" not in str(result)  # the clients' accuracy was never published (not declared)


def test_the_early_stop_answers_below_for_a_loss_and_never_halts_on_a_flat_metric():
    # loss 0.1 at every client: a margin of 4 × 0.05 = 0.2 clients' worth against Lap(0.08) and Lap(0.04) noise
    stop = AccountedEarlyStop("loss", lower=0.0, upper=1.0, threshold=0.05, epsilon=50.0, direction="below", rng=1)
    result = AccountedFedAvg(**NODES).start(grid(), initial(), num_rounds=4, should_stop=stop)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4] and stop.chain.answered == 4 and not stop.halted
    stop = AccountedEarlyStop("loss", lower=0.0, upper=1.0, threshold=0.5, epsilon=50.0, direction="below", rng=1)
    result = AccountedFedAvg(**NODES).start(grid(), initial(), num_rounds=4, should_stop=stop)
    assert sorted(result.train_metrics_clientapp) == [1] and stop.halted  # 0.1 is below 0.5: the positive control


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lower=1.0, upper=0.0, threshold=0.5, epsilon=1.0), "lower"),
        (dict(lower=0.0, upper=1.0, threshold=2.0, epsilon=1.0), "threshold"),
        (dict(lower=0.0, upper=1.0, threshold=0.5, epsilon=0.0), "epsilon"),
        (dict(lower=0.0, upper=math.nan, threshold=0.5, epsilon=1.0), "upper"),
        (dict(lower=0.0, upper=1.0, threshold=0.5, epsilon=1.0, direction="up"), "direction"),
    ],
)
def test_a_bad_early_stop_names_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AccountedEarlyStop("accuracy", **kwargs)


def test_a_users_should_stop_sees_only_public_and_accounted_keys(caplog):
    seen = []

    def should_stop(rnd, result):
        seen.append({k for record in result.evaluate_metrics_clientapp.values() for k in record})
        return rnd == 2

    strategy = AccountedFedAvg(**NODES, evaluate_metrics="flower")
    logging.getLogger("flwr").propagate = True
    with caplog.at_level(logging.WARNING):
        result = strategy.start(grid(), initial(), num_rounds=5, should_stop=should_stop)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert "accuracy" in result.evaluate_metrics_clientapp[1]  # published by name (booked non-private) ...
    assert all("accuracy" not in keys and "privacy/epsilon" in keys for keys in seen)  # ... but hidden from the stop
    warnings = [r.getMessage() for r in caplog.records if "should_stop is not shown" in r.getMessage()]
    assert len(warnings) == 1 and "accuracy" in warnings[0]
    with pytest.raises(TypeError, match="should_stop"):
        strategy.start(grid(), initial(), num_rounds=1, should_stop="yes")


def test_declared_metrics_reach_the_users_should_stop():
    seen = []
    strategy = AccountedFedAvg(**NODES, evaluate_metrics=AccountedMetrics({"accuracy": (0.0, 1.0)}, 3.0))
    strategy.start(grid(), initial(), num_rounds=1, should_stop=lambda rnd, result: seen.append(result) or False)
    assert "dp-eval/accuracy" in seen[0].evaluate_metrics_clientapp[1]


def laplace_ks(samples, scale):
    return stats.kstest(samples, "laplace", args=(0.0, scale)).statistic


def test_above_threshold_noise_is_2_and_4_delta_over_epsilon_and_10_percent_off_is_rejected():
    """KS tests of the threshold noise and the query noise against Lap(2Δ/ε) and Lap(4Δ/ε): 20 000 chains (fixed
    seed); a 10 % scale error moves the statistic to about 0.03, far above the null's 1e-6 quantile (0.019)."""
    epsilon, delta, count = 0.7, 2.5, 20_000
    generator = np.random.default_rng(21)
    threshold_noise, query_noise = [], []
    for _ in range(count):
        chain = AboveThreshold(1.0, epsilon=epsilon, sensitivity=delta, rng=generator)
        threshold_noise.append(chain._noisy_threshold - 1.0)
        chain.query(-1e9)  # never halts: only its noise is read
        query_noise.append(chain._last_noise)
    critical = math.sqrt(-0.5 * math.log(1e-6 / 2) / count)
    for samples, scale in ((threshold_noise, 2 * delta / epsilon), (query_noise, 4 * delta / epsilon)):
        assert laplace_ks(samples, scale) < critical
        assert laplace_ks(samples, 0.9 * scale) > critical and laplace_ks(samples, 1.1 * scale) > critical


def test_a_halted_chain_answers_nothing_more():
    chain = AboveThreshold(0.0, epsilon=1.0, sensitivity=1.0, rng=0)
    assert chain.query(1e9) and chain.halted and chain.halted_at == 1
    with pytest.raises(RuntimeError, match="new epsilon"):
        chain.query(0.0)
