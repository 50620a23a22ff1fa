"""A SuperNode that dies mid-round: its error reply is counted on the server (``error``), the round goes on.

Flower hands the strategy ``Message(Error(...), reply_to=instruction)`` for such a
node. Every strategy must aggregate the valid replies, count the failed ones in its
``rejections`` (the server's log), never in the round's metrics, and book what the
surviving clients declared and nothing for the failed one.
"""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent, LaplaceDpEvent, PoissonSampledDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp.strategy import FedAvg

from loopback import LoopbackGrid, run_round
from strategy_registry import REGISTRY, rejection_counts
from flwr_dp_strategies import (
    AccountedFedAvg,
    AccountedPoissonFixedClipping,
    AccountedServerSideFixedClipping,
    ClusterEvaluation,
    MinDivergenceExpSampling,
    ShuffleAmplifiedFedAvg,
    SignDS,
    declare_release,
)
from flwr_dp_strategies.layer_shuffler import LayerShuffler
from flwr_dp_strategies.privacy import PrivacyLedger

pytestmark = pytest.mark.usefixtures("task_identity")
N = 4
FAILED = 0  # index of the message whose node dies


def failed(msg: Message) -> Message:
    """The reply Flower builds for a node that became unavailable mid-round."""
    return Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="SuperNode died mid-round"), reply_to=msg)


def train_reply(
    msg: Message, arrays: list[np.ndarray], event=None, weight: float = 10.0, relation: str = "replace_one"
) -> Message:
    content = RecordDict(
        {"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"num-examples": weight, "loss": 1.0})}
    )
    if event is not None:
        declare_release(content, event, label="client", neighboring_relation=relation)
    return Message(content, reply_to=msg)


def evaluate_reply(msg: Message, event=None, point: np.ndarray | None = None) -> Message:
    records = {"metrics": MetricRecord({"num-examples": 5.0, "accuracy": 0.75})}
    if point is not None:
        records["inference"] = ArrayRecord([point])
    content = RecordDict(records)
    if event is not None:
        declare_release(content, event, label="eval", neighboring_relation="replace_one")
    return Message(content, reply_to=msg)


def node(msg: Message) -> str:
    return str(msg.metadata.dst_node_id)


def grid_failing_one(make_reply, n: int = N) -> LoopbackGrid:
    """The FAILED-th message of each send gets an error reply, the others ``make_reply(i, msg)``."""
    return LoopbackGrid.of(n, by_index=lambda i, m: failed(m) if i == FAILED else make_reply(i, m))


def train_round(strategy, current: list[np.ndarray], make_reply, n: int = N):
    msgs, _, result = run_round(strategy, grid_failing_one(make_reply, n), ArrayRecord(current), 1)
    return msgs, result


def evaluate_round(strategy, make_reply, n: int = N):
    msgs, _, result = run_round(
        strategy, grid_failing_one(make_reply, n), ArrayRecord([np.zeros(3)]), 1, phase="evaluate"
    )
    return msgs, result


def assert_failed_count(strategy, metrics: MetricRecord, count: int, phase: str) -> None:
    """``count`` failed replies, kept by the strategy for the server's log, not in the round's metrics."""
    assert rejection_counts(strategy, metrics, phase) == ({"error": count} if count else {})


# ---------------------------------------------------------------------- every strategy
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_strategy_goes_on_without_a_failed_node_and_books_nothing_for_it(name):
    """A node that dies before its train (and evaluate) reply: the others are aggregated, the failure is
    counted under ``error``, the dead node is not booked, no metric is NaN (issue 25, F)."""
    entry = REGISTRY[name]
    strategy, grid = entry.build(), entry.grid()
    msgs = list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
    replies = [failed(msgs[FAILED])] + entry.train_replies(grid, msgs[FAILED + 1 :])
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None and all(np.isfinite(a).all() for a in arrays.to_numpy_ndarrays())
    assert rejection_counts(strategy, metrics, "train") == {"error": 1}
    dead = msgs[FAILED].metadata.dst_node_id
    msgs = list(strategy.configure_evaluate(1, entry.model(), ConfigRecord(), grid))
    eval_metrics = strategy.aggregate_evaluate(
        1,
        [
            failed(m) if m.metadata.dst_node_id == dead else Message(entry.evaluate_content(i), reply_to=m)
            for i, m in enumerate(msgs)
        ],
    )
    assert eval_metrics["acc"] == pytest.approx(0.5)
    assert rejection_counts(strategy, eval_metrics, "evaluate") == {"error": 1}
    for record in (metrics, eval_metrics):
        assert not any(isinstance(v, float) and v != v for v in record.values()), record
    ledger = getattr(strategy, "ledger", None)
    assert ledger is None or str(dead) not in {str(c) for c in ledger.clients}


# ---------------------------------------------------------------------- AccountedFedAvg and its subclasses
@pytest.mark.parametrize(
    "make",
    [
        lambda: AccountedFedAvg(min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N),
        lambda: ShuffleAmplifiedFedAvg(
            min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N, shuffler=LayerShuffler(0)
        ),
        lambda: MinDivergenceExpSampling(
            min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N, num_selected=N, epsilon=None
        ),
    ],
    ids=["AccountedFedAvg", "ShuffleAmplifiedFedAvg", "MinDivergenceExpSampling"],
)
def test_fedavg_family_aggregates_the_survivors_and_books_only_them(make):
    strategy = make()
    msgs, (arrays, metrics) = train_round(
        strategy, [np.zeros(3)], lambda i, m: train_reply(m, [np.full(3, float(i))], LaplaceDpEvent(1.0 / i))
    )
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.full(3, 2.0))  # mean of replies 1, 2, 3
    assert_failed_count(strategy, metrics, 1, "train")
    assert metrics["loss"] == pytest.approx(1.0)
    assert set(strategy.ledger.clients) == {node(m) for m in msgs[1:]}  # nothing for the dead node
    assert metrics["privacy/epsilon"] == pytest.approx(3.0, rel=1e-3)  # node 3: Laplace scale 1/3 -> ε = 3


def test_accounted_fedavg_evaluate_counts_failed_replies():
    strategy = AccountedFedAvg(
        min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N, evaluate_metrics="flower"
    )
    msgs, metrics = evaluate_round(strategy, lambda i, m: evaluate_reply(m, LaplaceDpEvent(1.0)))
    assert_failed_count(strategy, metrics, 1, "evaluate")
    assert metrics["accuracy"] == pytest.approx(0.75)
    assert set(strategy.ledger.clients) == {node(m) for m in msgs[1:]}


def test_every_reply_failed_gives_no_model_and_books_nothing():
    strategy = AccountedFedAvg(min_train_nodes=N, min_available_nodes=N)
    msgs = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(N)))
    arrays, metrics = strategy.aggregate_train(1, [failed(m) for m in msgs])
    assert arrays is None
    assert_failed_count(strategy, metrics, N, "train")
    assert strategy.ledger.clients == [] and strategy.ledger.events() == []


def test_no_failure_reports_zero():
    strategy = AccountedFedAvg(min_train_nodes=N, min_available_nodes=N)
    msgs = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(N)))
    _, metrics = strategy.aggregate_train(1, [train_reply(m, [np.ones(3)]) for m in msgs])
    assert_failed_count(strategy, metrics, 0, "train")


# ---------------------------------------------------------------------- central DP wrappers
def test_server_side_fixed_clipping_releases_the_survivors_over_the_fixed_denominator():
    z = 0.8
    strategy = AccountedServerSideFixedClipping(
        FedAvg(min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N), z, 1.0, N, evaluate_metrics="flower"
    )
    np.random.seed(0)
    _, (arrays, metrics) = train_round(strategy, [np.zeros(50)], lambda i, m: train_reply(m, [np.full(50, 0.01 * i)]))
    assert arrays is not None
    assert_failed_count(strategy, metrics, 1, "train")
    ((_, event, _),) = strategy.ledger.events()  # central events
    assert isinstance(event, GaussianDpEvent)
    assert event.noise_multiplier == pytest.approx(z)  # fixed denominator m = 4: three replies, same z
    assert metrics["privacy/epsilon"] == pytest.approx(strategy.ledger.epsilon())
    assert strategy.ledger.clients == []  # central events only
    _, eval_metrics = evaluate_round(strategy, lambda i, m: evaluate_reply(m))
    assert_failed_count(strategy, eval_metrics, 1, "evaluate")
    assert eval_metrics["accuracy"] == pytest.approx(0.75)


def test_poisson_fixed_clipping_releases_books_the_round_and_only_the_survivors_declarations():
    z, m = 1.0, N
    ledger = PrivacyLedger(1e-5)
    strategy = AccountedPoissonFixedClipping(
        FedAvg(min_evaluate_nodes=N, min_available_nodes=N), z, 1.0, m, num_clients=N, ledger=ledger, rng=0
    )  # q = 1: all N asked
    msgs, (arrays, metrics) = train_round(
        strategy,
        [np.zeros(5)],
        lambda i, msg: train_reply(msg, [np.full(5, 0.01)], GaussianDpEvent(4.0), relation="add_or_remove_one"),
    )
    assert arrays is not None and len(msgs) == N
    assert_failed_count(strategy, metrics, 1, "train")
    assert "dp/participants" not in metrics and "loss" not in metrics
    assert set(ledger.clients) == {node(msg) for msg in msgs[1:]}
    assert [event for _, event, _ in ledger.events()] == [PoissonSampledDpEvent(1.0, GaussianDpEvent(z))]
    for msg in msgs[1:]:  # each survivor's own declaration, once
        assert [event for _, event, _ in ledger.events(node(msg))] == [GaussianDpEvent(4.0)]
    assert ledger.events(node(msgs[FAILED])) == []
    _, eval_metrics = evaluate_round(strategy, lambda i, msg: evaluate_reply(msg))
    assert_failed_count(strategy, eval_metrics, 1, "evaluate")


# ---------------------------------------------------------------------- SignDS and ClusterEvaluation
def test_signds_counts_failed_replies_in_train_and_evaluate():
    """Uploads in the format of ``client_mods.signds_mod``: sorted indices, a sign, the MagRR bit."""
    strategy = SignDS(min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N)

    def upload(i: int, msg: Message) -> Message:
        arrays = ArrayRecord(
            {
                "indices": ArrayRecord([np.array([0, 2 + i], dtype=np.int64)])["0"],
                "sign": ArrayRecord([np.array([1], dtype=np.int64)])["0"],
                "b-hat": ArrayRecord([np.array([1], dtype=np.int64)])["0"],
            }
        )
        return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1.0})}), reply_to=msg)

    msgs, (arrays, metrics) = train_round(strategy, [np.zeros(10, np.float32)], upload)
    assert arrays is not None
    assert_failed_count(strategy, metrics, 1, "train")
    assert set(strategy.ledger.clients) == {node(m) for m in msgs[1:]}
    _, eval_metrics = evaluate_round(strategy, lambda i, m: evaluate_reply(m))
    assert_failed_count(strategy, eval_metrics, 1, "evaluate")


def test_cluster_evaluation_scores_and_books_the_survivors():
    n = 7
    strategy = ClusterEvaluation(
        FedAvg(min_evaluate_nodes=n, min_available_nodes=n, min_train_nodes=n), laplace_eval_eps=10.0
    )
    points = [np.array([0.9, 0.05, 0.05]) if i % 2 else np.array([0.05, 0.9, 0.05]) for i in range(n)]
    msgs, metrics = evaluate_round(strategy, lambda i, m: evaluate_reply(m, LaplaceDpEvent(0.1), points[i]), n)
    assert_failed_count(strategy, metrics, 1, "evaluate")
    assert strategy.server_figures["evaluate"]["cluster/points"] == n - 1
    assert set(strategy.points_history[-1]) == {m.metadata.dst_node_id for m in msgs[1:]}
    assert set(strategy.ledger.clients) == {node(m) for m in msgs[1:]}
    assert metrics["privacy/epsilon"] == pytest.approx(10.0, rel=1e-3)
    # training is the wrapped FedAvg's, screened here: the failed reply is counted here
    _, (arrays, train_metrics) = train_round(
        strategy, [np.zeros(3)], lambda i, m: train_reply(m, [np.full(3, float(i))]), n
    )
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.full(3, 3.5))  # mean of 1..6
    assert_failed_count(strategy, train_metrics, 1, "train")


def test_cluster_evaluation_keeps_the_wrapped_accounting_strategys_count():
    n = 5
    inner = AccountedFedAvg(min_evaluate_nodes=n, min_available_nodes=n, min_train_nodes=n)
    strategy = ClusterEvaluation(inner)
    _, (_, metrics) = train_round(strategy, [np.zeros(3)], lambda i, m: train_reply(m, [np.ones(3)]), n)
    assert_failed_count(strategy, metrics, 1, "train")
    assert strategy.ledger is inner.ledger
