"""One screening path (issue 17) and the accounting items C6, D7, D8, D9 of issue 16.

Every test here fails on the code before the screening rework: a malformed reply
aborted the round, was accepted silently, or changed which other replies were used.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent, LaplaceDpEvent, NoOpDpEvent
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from loopback import LoopbackGrid, run_round
from strategy_registry import REGISTRY, Entry, kwargs, rejection_counts
from flwr_dp_strategies.rounds.template import RoundRelease
from flwr_dp_strategies import AccountedFedAvg, ClusterEvaluation, ShuffleAmplifiedFedAvg, SignDS, declare_release
from flwr_dp_strategies.layer_shuffler import LayerShuffler
from flwr_dp_strategies.cluster_scores import cluster_scores
from flwr_dp_strategies.declarations import PRIVACY_RECORD
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.signds import round_event
from flwr_dp_strategies.rounds.metrics import aggregate_reply_metrics

pytestmark = pytest.mark.usefixtures("task_identity")
N = 4


def fedavg_kwargs(n: int = N) -> dict:
    return dict(min_train_nodes=n, min_available_nodes=n, min_evaluate_nodes=n)


def content(arrays=None, metrics=None, weight=10.0) -> RecordDict:
    records = {"metrics": MetricRecord(metrics if metrics is not None else {"num-examples": weight, "loss": 0.5})}
    if arrays is not None:
        records = {"arrays": ArrayRecord(arrays), **records}
    return RecordDict(records)


def reply(msg: Message, arrays=None, metrics=None, weight=10.0, event=None) -> Message:
    c = content(arrays, metrics, weight)
    if event is not None:
        declare_release(c, event, label="client", neighboring_relation="replace_one")
    return Message(c, reply_to=msg)


def node(msg: Message) -> int:
    return msg.metadata.dst_node_id


def configure_train(strategy, current, n: int = N, server_round: int = 1) -> list[Message]:
    return list(strategy.configure_train(server_round, ArrayRecord(current), ConfigRecord(), LoopbackGrid.of(n)))


def configure_evaluate(strategy, n: int = N, server_round: int = 1) -> list[Message]:
    return list(
        strategy.configure_evaluate(server_round, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(n))
    )


def other_node_reply(msgs: list[Message], make) -> Message:
    """A reply whose source is a node that was sent nothing this round."""
    bad = make(msgs[0])
    bad.metadata.__dict__["_src_node_id"] = 999
    return bad


# ---------------------------------------------------------------------- 1. identity
# the registry's strategies that release the plain mean of accepted dense updates (no noise, no clipping)
STRATEGIES = {
    name: REGISTRY[name].make for name in ("AccountedFedAvg", "ShuffleAmplifiedFedAvg", "MinDivergenceExpSampling")
}


def _shallow_copy(content: RecordDict) -> RecordDict:
    return RecordDict(dict(content.items()))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_strategy_rejects_duplicate_and_unknown_senders_in_both_phases(name):
    """A second reply of a node and a reply of a node never asked are rejected as ``identity``; the
    round goes on with the valid replies, whatever the strategy (issue 25, F)."""
    entry = REGISTRY[name]
    strategy, grid = entry.build(), entry.grid()
    for phase in ("train", "evaluate"):
        configure = strategy.configure_train if phase == "train" else strategy.configure_evaluate
        msgs = list(configure(1, entry.model(), ConfigRecord(), grid))
        valid = (
            entry.train_replies(grid, msgs)
            if phase == "train"
            else [Message(entry.evaluate_content(i), reply_to=m) for i, m in enumerate(msgs)]
        )
        duplicate = Message(_shallow_copy(valid[1].content), reply_to=msgs[1])
        unknown = Message(_shallow_copy(valid[0].content), reply_to=msgs[0])
        unknown.metadata.__dict__["_src_node_id"] = 999
        replies = valid + [duplicate, unknown]
        if phase == "train":
            arrays, metrics = strategy.aggregate_train(1, replies)
            assert arrays is not None, (phase, metrics)
        else:
            metrics = strategy.aggregate_evaluate(1, replies)
            assert metrics["acc"] == pytest.approx(0.5)
        assert rejection_counts(strategy, metrics, phase) == {"identity": 2}, phase
        assert 999 not in getattr(strategy, "ledger").clients


@pytest.mark.parametrize("make", STRATEGIES.values(), ids=STRATEGIES.keys())
def test_duplicate_and_unknown_senders_are_rejected_as_identity(make):
    strategy = make()
    msgs = configure_train(strategy, [np.zeros(3)])
    replies = [reply(m, [np.full(3, 1.0)], event=GaussianDpEvent(2.0)) for m in msgs]
    eps = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    eps.record(GaussianDpEvent(2.0), server_round=1, client="x", neighboring_relation="replace_one")
    replies.append(reply(msgs[0], [np.full(3, 100.0)], event=GaussianDpEvent(0.5)))  # second reply, same node
    replies.append(reply(msgs[1], [np.full(3, 100.0)]))  # second reply, undeclared
    replies.append(other_node_reply(msgs, lambda m: reply(m, [np.full(3, 100.0)])))
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"]["identity"] == 3
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.ones(3))
    assert 999 not in strategy.ledger.clients  # an unknown sender is not booked
    for m in msgs:  # nor is a duplicate: the first replies' epsilon is unchanged
        assert strategy.ledger.epsilon(node(m)) == pytest.approx(eps.epsilon(), rel=1e-9)


def test_a_reply_to_another_message_id_is_rejected_as_identity():
    strategy = AccountedFedAvg(**fedavg_kwargs())
    msgs = configure_train(strategy, [np.zeros(3)])
    for i, m in enumerate(msgs):  # what the Grid does when it sends them
        m.metadata.__dict__["_message_id"] = f"id-{i}"
    replies = [reply(m, [np.ones(3)]) for m in msgs]
    replies[1].metadata.__dict__["_reply_to_message_id"] = "forged"
    _, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"]["identity"] == 1


def test_identity_is_checked_in_the_evaluate_phase_too():
    strategy = AccountedFedAvg(**fedavg_kwargs(), evaluate_metrics="flower")
    msgs = configure_evaluate(strategy)
    replies = [reply(m, metrics={"num-examples": 5.0, "accuracy": 0.5}) for m in msgs]
    replies.append(other_node_reply(msgs, lambda m: reply(m, metrics={"num-examples": 5.0, "accuracy": 0.0})))
    metrics = strategy.aggregate_evaluate(1, replies)
    assert strategy.rejections["evaluate"]["identity"] == 1 and metrics["accuracy"] == pytest.approx(0.5)


# ---------------------------------------------------------------------- 2. weights, both phases
BAD_EVALUATE = {
    "missing weight": lambda m: reply(m, metrics={"accuracy": 0.5}),
    "list weight": lambda m: reply(m, metrics={"num-examples": [1.0, 2.0], "accuracy": 0.5}),
    "no MetricRecord": lambda m: Message(RecordDict({"c": ConfigRecord({"a": 1})}), reply_to=m),
    "two MetricRecords": lambda m: Message(
        RecordDict({"a": MetricRecord({"num-examples": 1.0}), "b": MetricRecord({"num-examples": 1.0})}), reply_to=m
    ),
    "weight -5": lambda m: reply(m, metrics={"num-examples": -5.0, "accuracy": 0.5}),
    "weight 0": lambda m: reply(m, metrics={"num-examples": 0, "accuracy": 0.5}),
    "weight nan": lambda m: reply(m, metrics={"num-examples": math.nan, "accuracy": 0.5}),
    "weight inf": lambda m: reply(m, metrics={"num-examples": math.inf, "accuracy": 0.5}),
    "weight 1e308": lambda m: reply(m, metrics={"num-examples": 1e308, "accuracy": 0.5}),
    "accuracy nan": lambda m: reply(m, metrics={"num-examples": 5.0, "accuracy": math.nan}),
    "huge int weight": lambda m: reply(m, metrics={"num-examples": 10**400, "accuracy": 0.5}),
    "huge int metric": lambda m: reply(m, metrics={"num-examples": 5, "accuracy": 10**400}),
}


@pytest.mark.parametrize("bad", BAD_EVALUATE.values(), ids=BAD_EVALUATE.keys())
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_malformed_evaluate_replies_are_rejected_and_the_round_goes_on(name, bad):
    entry = REGISTRY[name]
    strategy = entry.build()
    msgs = list(strategy.configure_evaluate(1, entry.model(), ConfigRecord(), entry.grid()))
    replies = [reply(m, metrics={"num-examples": 5.0, "accuracy": 0.75}) for m in msgs[1:]] + [bad(msgs[0])]
    metrics = strategy.aggregate_evaluate(1, replies)
    assert metrics["accuracy"] == pytest.approx(0.75)
    assert sum(rejection_counts(strategy, metrics, "evaluate").values()) == 1


def test_mismatched_evaluate_metric_keys_are_averaged_per_key_not_an_abort():
    strategy = ClusterEvaluation(FedAvg(**fedavg_kwargs()), evaluate_metrics="flower")
    msgs = configure_evaluate(strategy)
    replies = [reply(m, metrics={"num-examples": 5.0, "accuracy": 0.75}) for m in msgs[1:]]
    replies.append(reply(msgs[0], metrics={"num-examples": 5.0, "accuracy": 0.75, "extra": 3.0}))
    metrics = strategy.aggregate_evaluate(1, replies)
    assert metrics["accuracy"] == pytest.approx(0.75) and metrics["extra"] == pytest.approx(3.0)


@pytest.mark.parametrize("weight", [1e308, 1e39, 2e9, math.inf, -1.0])
def test_train_weights_above_max_weight_are_rejected_and_the_model_stays_finite(weight):
    strategy = AccountedFedAvg(**fedavg_kwargs())
    msgs = configure_train(strategy, [np.zeros(3, np.float32)])
    replies = [reply(m, [np.ones(3, np.float32)]) for m in msgs[1:]]
    replies.append(reply(msgs[0], [np.full(3, 3e38, np.float32)], weight=weight))
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"]["weight"] == 1
    np.testing.assert_array_equal(arrays.to_numpy_ndarrays()[0], np.ones(3, np.float32))


def test_max_weight_is_validated_and_configurable():
    with pytest.raises(ValueError, match="max_weight"):
        AccountedFedAvg(max_weight=math.nan)
    strategy = AccountedFedAvg(**fedavg_kwargs(), max_weight=50)
    msgs = configure_train(strategy, [np.zeros(3)])
    replies = [reply(m, [np.ones(3)], weight=50) for m in msgs[1:]] + [reply(msgs[0], [np.ones(3)], weight=51)]
    _, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"]["weight"] == 1


# ---------------------------------------------------------------------- 3. metrics (C6)
def test_one_added_client_does_not_change_which_others_are_aggregated():
    """Issue 16 C6: before, the majority metric-key set decided; two odd clients plus one tipped it."""

    def run(extra: int):
        n = 3 + extra
        strategy = AccountedFedAvg(**fedavg_kwargs(n))
        answers = [
            ([np.full(2, 1.0)], {"num-examples": 1.0, "loss": 0.1}),
            ([np.full(2, 2.0)], {"num-examples": 1.0, "acc": 0.9}),
            ([np.full(2, 3.0)], {"num-examples": 1.0, "acc": 0.9}),
        ]
        extra_answer = ([np.full(2, 10.0)], {"num-examples": 1.0, "loss": 0.2})

        def answer(i: int, msg: Message) -> Message:
            arrays, metrics = answers[i] if i < len(answers) else extra_answer
            return reply(msg, arrays, metrics=metrics)

        return run_round(strategy, LoopbackGrid.of(n, by_index=answer), ArrayRecord([np.zeros(2)]), 1).result

    (a0, m0), (a1, m1) = run(0), run(1)
    assert not [key for key in {**m0, **m1} if key.startswith("rejected/")]
    np.testing.assert_allclose(a0.to_numpy_ndarrays()[0], np.full(2, 2.0))  # all three used
    np.testing.assert_allclose(a1.to_numpy_ndarrays()[0], np.full(2, 4.0))  # all four used


def test_metrics_of_honest_clients_with_differing_list_lengths_and_scalars_aggregate():
    contents = [
        content(metrics={"num-examples": 1.0, "per-class": [1.0, 2.0], "loss": 1.0}),
        content(metrics={"num-examples": 3.0, "per-class": [3.0, 4.0, 5.0], "loss": [2.0, 9.0]}),
        content(metrics={"num-examples": 1.0, "acc": 0.5}),
    ]
    out = aggregate_reply_metrics(aggregate_metricrecords, contents, "num-examples")
    assert out["per-class"] == pytest.approx([(1 + 9) / 4, (2 + 12) / 4, 5.0])  # per index, over its carriers
    assert out["loss"] == pytest.approx([(1 + 6) / 4, 9.0])  # a scalar beside lists: a one-element list
    assert out["acc"] == pytest.approx(0.5)  # over the replies that carry it


def test_normal_metrics_are_bit_identical_to_flower():
    rng = np.random.default_rng(0)
    contents = [
        content(
            metrics={
                "num-examples": int(rng.integers(1, 100)),
                "loss": float(rng.random()),
                "per-class": [float(v) for v in rng.random(5)],
            }
        )
        for _ in range(7)
    ]
    assert dict(aggregate_reply_metrics(aggregate_metricrecords, contents, "num-examples")) == dict(
        aggregate_metricrecords(contents, "num-examples")
    )


def test_metric_sums_near_the_float_range_stay_finite():
    contents = [content(metrics={"num-examples": 1.0, "loss": 1.7e308}) for _ in range(3)]
    out = aggregate_reply_metrics(aggregate_metricrecords, contents, "num-examples")
    assert out["loss"] == pytest.approx(1.7e308)


@pytest.mark.parametrize("value", [math.nan, math.inf, [0.5, math.nan]])
def test_non_finite_training_metrics_reject_the_reply_and_never_reach_the_loss(value):
    strategy = AccountedFedAvg(**fedavg_kwargs())
    msgs = configure_train(strategy, [np.zeros(3)])
    replies = [reply(m, [np.ones(3)]) for m in msgs[1:]]
    replies.append(reply(msgs[0], [np.ones(3)], metrics={"num-examples": 10.0, "loss": value}))
    _, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"]["metrics"] == 1 and metrics["loss"] == pytest.approx(0.5)


# ---------------------------------------------------------------------- 4. max_reply_bytes
def test_max_reply_bytes_equal_to_the_model_size_accepts_valid_replies():
    current = [np.zeros(100, np.float32), np.zeros((4, 4), np.float64)]
    size = sum(a.nbytes for a in current)
    strategy = AccountedFedAvg(**fedavg_kwargs(), max_reply_bytes=size)
    msgs = configure_train(strategy, current)
    _, metrics = strategy.aggregate_train(1, [reply(m, [np.ones_like(a) for a in current]) for m in msgs])
    assert strategy.rejections["train"]["oversized"] == 0
    small = AccountedFedAvg(**fedavg_kwargs(), max_reply_bytes=size - 1)
    msgs = configure_train(small, current)
    _, metrics = small.aggregate_train(1, [reply(m, [np.ones_like(a) for a in current]) for m in msgs])
    assert small.rejections["train"]["oversized"] == N


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_strategy_honours_max_reply_bytes(name):
    """``max_reply_bytes`` is an accounting option of every strategy and the template checks it before the
    strategy's own screening: a limit below a valid reply's payload rejects every train reply as ``oversized``;
    the same strategy without a limit (positive control) accepts them."""
    entry = REGISTRY[name]
    # ClusterEvaluation hands the train replies to a wrapped accounting strategy, which screens them itself
    if name == "ClusterEvaluation(AccountedFedAvg)":
        with pytest.raises(ValueError, match="max_reply_bytes must be given to the wrapped"):
            entry.build(max_reply_bytes=1)
        entry = Entry(name, ClusterEvaluation, lambda **kw: ClusterEvaluation(FedAvg(**kwargs()), **kw))
    for limit, expected in ((None, 0), (1, entry.nodes)):
        strategy, grid = entry.build(**({} if limit is None else {"max_reply_bytes": limit})), entry.grid()
        msgs = list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
        replies = entry.train_replies(grid, msgs)
        _, metrics = strategy.aggregate_train(1, replies)
        counts = rejection_counts(strategy, metrics, "train")
        assert counts.get("oversized", 0) == (expected if limit is not None else 0), (limit, counts)


# ---------------------------------------------------------------------- 5. SignDS
def upload(msg: Message, indices, sign=np.array([1]), bit=np.array([0]), weight=10.0, event=None) -> Message:
    arrays = {"indices": Array(np.asarray(indices)), "sign": Array(np.asarray(sign)), "b-hat": Array(np.asarray(bit))}
    c = RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"num-examples": weight})})
    if event is not None:
        declare_release(c, event, label="client", neighboring_relation="replace_one")
    return Message(c, reply_to=msg)


BAD_UPLOADS = {
    "nan sign": (dict(indices=np.array([1, 2]), sign=np.array([np.nan])), "values"),
    "inf sign": (dict(indices=np.array([1, 2]), sign=np.array([np.inf])), "values"),
    "sign 1.99": (dict(indices=np.array([1, 2]), sign=np.array([1.99])), "values"),
    "nan b-hat": (dict(indices=np.array([1, 2]), bit=np.array([np.nan])), "values"),
    "uint64 unsorted duplicate": (dict(indices=np.array([5, 2, 5], np.uint64)), "indices"),
    "uint64 wrap": (dict(indices=np.array([1, 2**64 - 1], np.uint64)), "indices"),
    "int8 negative": (dict(indices=np.array([10, -120], np.int8)), "indices"),
    "bool indices": (dict(indices=np.array([True, False])), "shape"),
    "complex sign": (dict(indices=np.array([1, 2]), sign=np.array([1 + 0j])), "shape"),
    "huge sign array": (dict(indices=np.array([1, 2]), sign=np.ones(2_000_000, np.int8)), "oversized"),
}


@pytest.mark.parametrize("case", BAD_UPLOADS.values(), ids=BAD_UPLOADS.keys())
def test_signds_malformed_uploads_are_rejected_with_their_reason(case):
    fields, reason = case
    strategy = SignDS(sign_k=0.05, sign_eps=10.0, **fedavg_kwargs())
    msgs = configure_train(strategy, [np.zeros(20, np.float32)])
    replies = [upload(m, np.array([1, 5])) for m in msgs[1:]] + [upload(msgs[0], **fields)]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"][reason] == 1
    assert np.isfinite(arrays.to_numpy_ndarrays()[0]).all()
    assert set(np.nonzero(arrays.to_numpy_ndarrays()[0])[0]) == {1, 5}


def test_signds_accepts_narrow_integer_indices():
    strategy = SignDS(sign_k=0.05, sign_eps=10.0, **fedavg_kwargs())
    msgs = configure_train(strategy, [np.zeros(20, np.float32)])
    replies = [upload(m, np.array([1, 5], dt)) for m, dt in zip(msgs, (np.uint8, np.int16, np.uint64, np.int64))]
    _, metrics = strategy.aggregate_train(1, replies)
    assert sum(strategy.rejections["train"].values()) == 0


def test_signds_books_at_least_what_it_configured_whatever_the_client_declares():
    """Issue 16 D7: a NoOpDpEvent declaration gave eps = 0 where the server asked for 10 + rr 5."""
    strategy = SignDS(sign_k=0.05, sign_eps=10.0, **fedavg_kwargs())
    msgs = configure_train(strategy, [np.zeros(20, np.float32)])
    replies = [upload(msgs[0], [1, 5], event=NoOpDpEvent()), upload(msgs[1], [1, 5], event=round_event(10.0, 5.0))] + [
        upload(m, [1, 5]) for m in msgs[2:]
    ]
    strategy.aggregate_train(1, replies)
    expected = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    expected.record(round_event(10.0, 5.0), server_round=1, client="x")
    for m in msgs:  # the honest declaration is booked once, not twice
        assert strategy.ledger.epsilon(node(m)) == pytest.approx(expected.epsilon(), rel=1e-9)


# ---------------------------------------------------------------------- 6. Shuffle
def test_shuffle_composed_declaration_with_a_number_for_events_is_a_rejection():
    strategy = ShuffleAmplifiedFedAvg(**fedavg_kwargs(), shuffler=LayerShuffler(0))
    msgs = configure_train(strategy, [np.zeros(3)])
    replies = [reply(m, [np.ones(3)], event=LaplaceDpEvent(1.0)) for m in msgs[1:]]
    bad = reply(msgs[0], [np.ones(3)])
    bad.content[PRIVACY_RECORD] = ConfigRecord(
        {
            "events": [
                json.dumps({"event": {"type": "ComposedDpEvent", "events": 5}, "label": "x", "relation": "replace_one"})
            ]
        }
    )
    arrays, metrics = strategy.aggregate_train(1, replies + [bad])
    assert strategy.rejections["train"]["declaration"] == 1 and arrays is not None


# ---------------------------------------------------------------------- 7. ClusterEvaluation
def inference_reply(msg: Message, point, weight=5.0, event=LaplaceDpEvent(0.1)) -> Message:
    c = RecordDict(
        {
            "metrics": MetricRecord({"num-examples": weight, "accuracy": 0.5}),
            "inference": ArrayRecord({"0": Array(np.asarray(point))}),
        }
    )
    if event is not None:
        declare_release(c, event, label="eval", neighboring_relation="replace_one")
    return Message(c, reply_to=msg)


HONEST = [
    np.array([0.9, 0.05, 0.05]),
    np.array([0.05, 0.9, 0.05]),
    np.array([0.9, 0.05, 0.05]),
    np.array([0.05, 0.9, 0.05]),
]


def test_cluster_length_tie_does_not_resolve_toward_attackers():
    n = 8
    strategy = ClusterEvaluation(FedAvg(**fedavg_kwargs(n)), laplace_eval_eps=10.0)
    msgs = configure_evaluate(strategy, n)
    attack = [np.array([1.0, 0.0]), np.array([0.0, 1.0])] * 2
    metrics = strategy.aggregate_evaluate(1, [inference_reply(m, p) for m, p in zip(msgs, HONEST + attack)])
    assert (
        strategy.rejections["evaluate"]["shape"] == 0 and strategy.server_figures["evaluate"]["cluster/points"] == 0
    )  # not scored
    pinned = ClusterEvaluation(FedAvg(**fedavg_kwargs(n)), laplace_eval_eps=10.0, num_classes=3)
    msgs = configure_evaluate(pinned, n)
    metrics = pinned.aggregate_evaluate(1, [inference_reply(m, p) for m, p in zip(msgs, HONEST + attack)])
    assert pinned.rejections["evaluate"]["shape"] == 4 and pinned.server_figures["evaluate"]["cluster/points"] == 4
    assert "cluster/points" not in metrics  # a count of replies: server log only
    assert all(p.size == 3 for p in pinned.points_history[-1].values())


@pytest.mark.parametrize(
    "point,reason",
    [
        (np.array([1 + 0j, 0, 0]), "shape"),
        (np.array(["a", "b", "c"]), "shape"),
        (np.array([1e308, -1e308, 1e308]), "values"),
        (np.array([np.nan, 0.5, 0.5]), "non-finite"),
    ],
)
def test_cluster_rejects_non_real_and_absurd_inference_vectors(point, reason):
    strategy = ClusterEvaluation(FedAvg(**fedavg_kwargs(5)), num_classes=3, laplace_eval_eps=10.0)
    msgs = configure_evaluate(strategy, 5)
    replies = [inference_reply(m, p) for m, p in zip(msgs, HONEST)] + [inference_reply(msgs[4], point)]
    metrics = strategy.aggregate_evaluate(1, replies)
    assert strategy.rejections["evaluate"][reason] == 1 and strategy.server_figures["evaluate"]["cluster/points"] == 4
    assert np.isfinite([metrics["cluster/calinski-harabasz"], metrics["cluster/davies-bouldin"]]).all()


def test_cluster_scores_of_huge_points_are_finite():
    scores = cluster_scores(
        np.array([[1e308, -1e308, 1e308], [0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.9, 0.1, 0.0], [0.0, 0.9, 0.1]])
    )
    assert all(math.isfinite(v) for v in scores.values())


def test_cluster_does_not_score_replies_with_a_bad_weight_and_adds_the_wrapped_rejections():
    inner = AccountedFedAvg(**fedavg_kwargs(5), max_weight=100)
    strategy = ClusterEvaluation(inner, num_classes=3, laplace_eval_eps=10.0)
    msgs = configure_evaluate(strategy, 5)
    replies = [inference_reply(m, p) for m, p in zip(msgs, HONEST)] + [inference_reply(msgs[4], HONEST[0], 500.0)]
    metrics = strategy.aggregate_evaluate(1, replies)
    assert strategy.rejections["evaluate"]["weight"] == 1 and strategy.server_figures["evaluate"]["cluster/points"] == 4

    class Inner(AccountedFedAvg):
        def release_evaluate(self, server_round, screened):
            screened.rejected["metrics"] += 2
            return RoundRelease(metrics=MetricRecord({"acc": 1.0}))

    strategy = ClusterEvaluation(Inner(**fedavg_kwargs(5)), num_classes=3, laplace_eval_eps=10.0)
    msgs = configure_evaluate(strategy, 5)
    replies = [inference_reply(m, p) for m, p in zip(msgs, HONEST)]
    replies.append(inference_reply(msgs[4], HONEST[0], weight=math.nan))
    metrics = strategy.aggregate_evaluate(1, replies)
    assert strategy.rejections["evaluate"] == {"metrics": 2, "weight": 1}  # merged, not overwritten
    assert "cluster/points" not in metrics


def test_cluster_around_an_unaccounted_strategy_reports_infinite_train_epsilon():
    """Issue 16 D9: FedAvg aggregates raw updates; the evaluation's finite eps must not stand for them."""
    strategy = ClusterEvaluation(FedAvg(**fedavg_kwargs()), laplace_eval_eps=10.0)
    msgs = configure_train(strategy, [np.zeros(3)])
    _, metrics = strategy.aggregate_train(1, [reply(m, [np.ones(3)]) for m in msgs])
    assert metrics["privacy/epsilon"] == math.inf
    accounted = ClusterEvaluation(AccountedFedAvg(**fedavg_kwargs()), laplace_eval_eps=10.0)
    msgs = configure_train(accounted, [np.zeros(3)])
    _, metrics = accounted.aggregate_train(1, [reply(m, [np.ones(3)], event=GaussianDpEvent(2.0)) for m in msgs])
    assert math.isfinite(metrics["privacy/epsilon"])
    opted_out = ClusterEvaluation(FedAvg(**fedavg_kwargs()), laplace_eval_eps=10.0, book_unaccounted_training=False)
    msgs = configure_train(opted_out, [np.zeros(3)])
    opted_out.aggregate_train(1, [reply(m, [np.ones(3)]) for m in msgs])
    assert opted_out.ledger.clients == []


# ---------------------------------------------------------------------- 8. D8
@pytest.mark.parametrize(
    "make_bad",
    [
        lambda m: reply(m, [np.array([np.nan, 0, 0])]),
        lambda m: reply(m, [np.ones(4)]),
        lambda m: Message(
            RecordDict(
                {"arrays": ArrayRecord({"x": Array(np.ones(3))}), "metrics": MetricRecord({"num-examples": 1.0})}
            ),
            reply_to=m,
        ),
    ],
    ids=["nan", "shape", "keys"],
)
def test_a_rejected_undeclared_train_reply_is_booked_non_private(make_bad):
    strategy = AccountedFedAvg(**fedavg_kwargs())
    msgs = configure_train(strategy, [np.zeros(3)])
    replies = [reply(m, [np.ones(3)], event=GaussianDpEvent(2.0)) for m in msgs[1:]] + [make_bad(msgs[0])]
    _, metrics = strategy.aggregate_train(1, replies)
    assert strategy.ledger.epsilon(node(msgs[0])) == math.inf
    assert all(math.isfinite(strategy.ledger.epsilon(node(m))) for m in msgs[1:])


def test_cluster_around_plain_fedavg_screens_train_replies_instead_of_aborting():
    strategy = ClusterEvaluation(FedAvg(**fedavg_kwargs()), laplace_eval_eps=10.0)
    msgs = configure_train(strategy, [np.zeros(3)])
    replies = [reply(m, [np.ones(3)]) for m in msgs[2:]]
    replies.append(reply(msgs[0], [np.ones(3)], metrics={"num-examples": 10.0, "loss": 0.5, "extra": 1.0}))
    replies.append(
        Message(
            RecordDict(
                {
                    "a": ArrayRecord([np.ones(3)]),
                    "b": ArrayRecord([np.ones(3)]),
                    "metrics": MetricRecord({"num-examples": 1.0}),
                }
            ),
            reply_to=msgs[1],
        )
    )
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"]["structure"] == 1 and metrics["extra"] == pytest.approx(1.0)
    np.testing.assert_array_equal(arrays.to_numpy_ndarrays()[0], np.ones(3))


def test_a_non_config_record_under_the_declaration_name_is_screened_not_dropped():
    strategy = AccountedFedAvg(**fedavg_kwargs())
    msgs = configure_train(strategy, [np.zeros(3)])
    replies = [reply(m, [np.ones(3)]) for m in msgs[1:]]
    bad = reply(msgs[0], [np.ones(3)])
    bad.content[PRIVACY_RECORD] = ArrayRecord([np.full(3, 100.0)])
    _, metrics = strategy.aggregate_train(1, replies + [bad])
    assert strategy.rejections["train"]["structure"] == 1
