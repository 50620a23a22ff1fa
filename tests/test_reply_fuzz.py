"""Malicious replies never abort a round, never poison the model, never move an honest client's ε (issue 17).

Each case: three valid replies plus one bad one, every Message passed through
Flower's own serialisation (``message_to_proto`` / ``message_from_proto``), run
against every strategy and both phases. Hypothesis draws the strategy, the phase,
the mutation, the value it writes and the bad reply's identity (its own node, a
duplicate of another node, a node never asked). Asserted:

* the round returns (no exception);
* a train round releases a finite model;
* if the bad reply was rejected, the model and the metrics of the round equal
  those of a round on the three valid replies alone (same seeds), and the
  valid clients' ε is unchanged;
* every reply is either counted under ``rejected/<reason>`` or aggregated.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from uuid import uuid4

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp.strategy import FedAvg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_dp_strategies import (AccountedFedAvg, AccountedPoissonFixedClipping, AccountedServerSideFixedClipping,
                                ClusterEvaluation, LayerShuffler, MinDivergenceExpSampling, ShuffleAmplifiedFedAvg,
                                SignDS)
from flwr_dp_strategies.declarations import PRIVACY_RECORD

from conftest import FakeGrid

N = 4
pytestmark = pytest.mark.usefixtures("task_identity")


def _kw() -> dict:
    return dict(min_train_nodes=N, min_available_nodes=N, min_evaluate_nodes=N, fraction_evaluate=1.0)


STRATEGIES: dict[str, Callable[[], object]] = {
    "AccountedFedAvg": lambda: AccountedFedAvg(**_kw()),
    "ShuffleAmplifiedFedAvg": lambda: ShuffleAmplifiedFedAvg(**_kw(), shuffler=LayerShuffler(0)),
    "MinDivergenceExpSampling": lambda: MinDivergenceExpSampling(num_selected=2, epsilon=None, **_kw()),
    "SignDS": lambda: SignDS(sign_k=0.05, sign_eps=10.0, **_kw()),
    "ClusterEvaluation(FedAvg)": lambda: ClusterEvaluation(FedAvg(**_kw()), book_unaccounted_training=False),
    "ClusterEvaluation(AccountedFedAvg)": lambda: ClusterEvaluation(AccountedFedAvg(**_kw())),
    "AccountedServerSideFixedClipping": lambda: AccountedServerSideFixedClipping(FedAvg(**_kw()), 1.0, 1.0, N,
                                                                                 rng=7),
    "AccountedPoissonFixedClipping": lambda: AccountedPoissonFixedClipping(FedAvg(**_kw()), 1.0, 1.0, N,
                                                                           num_clients=N, rng=7),
}
RANDOMISED = {"ShuffleAmplifiedFedAvg"}  # its permutation depends on the number of replies


def _arr(values) -> Array:
    return Array(np.asarray(values))


def _model() -> ArrayRecord:
    return ArrayRecord({"w.a": _arr(np.zeros(6, np.float32)), "v.b": _arr(np.zeros(2, np.float32))})


def _good_train(name: str, i: int) -> RecordDict:
    if name == "SignDS":
        arrays = ArrayRecord({"indices": _arr(np.array([1, 5 + i])), "sign": _arr(np.array([1])),
                              "b-hat": _arr(np.array([i % 2]))})
    else:
        arrays = ArrayRecord({"w.a": _arr(np.full(6, 0.1 * (i + 1), np.float32)),
                              "v.b": _arr(np.full(2, -0.05 * (i + 1), np.float32))})
    return RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 10, "loss": 0.5})})


def _good_evaluate(name: str, i: int) -> RecordDict:
    probs = np.roll(np.array([0.8, 0.15, 0.05]), i)
    return RecordDict({"metrics": MetricRecord({"num-examples": 10, "acc": 0.5}),
                       "inference": ArrayRecord({"0": _arr(probs)})})


# --------------------------------------------------------------------------------------- mutations
def _first_array_key(c: RecordDict) -> str | None:
    return next(iter(c["arrays"].keys()), None) if "arrays" in c else None


def _fill(c: RecordDict, value: float) -> None:
    key = _first_array_key(c)
    if key is not None:
        old = c["arrays"][key].numpy()
        dtype = old.dtype if old.dtype.kind == "f" else np.float64
        with np.errstate(over="ignore"):
            c["arrays"][key] = _arr(np.full(old.shape, value).astype(dtype))


def _weight(c: RecordDict, value) -> None:
    c["metrics"]["num-examples"] = value


def _metric(c: RecordDict, value) -> None:
    c["metrics"]["loss"] = value


def _declare(c: RecordDict, entries) -> None:
    c[PRIVACY_RECORD] = ConfigRecord({"events": entries})


def _set_array(key: str, values) -> Callable[[RecordDict], None]:
    def mutate(c: RecordDict) -> None:
        if "arrays" in c and key in c["arrays"]:
            c["arrays"][key] = _arr(values)
    return mutate


def _inference(values) -> Callable[[RecordDict], None]:
    def mutate(c: RecordDict) -> None:
        if "inference" in c:
            c["inference"]["0"] = _arr(values)
    return mutate


REALS = st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 3.4e38, 1e39, -5.0, 0.0, 1e-300, 7.0])
MUTATIONS: dict[str, Callable[[RecordDict, object], None]] = {
    "fill-array": lambda c, v: _fill(c, v),
    "weight": lambda c, v: _weight(c, v),
    "weight-list": lambda c, v: _weight(c, [1.0, 2.0]),
    "weight-missing": lambda c, v: c["metrics"].pop("num-examples"),
    "metric-value": lambda c, v: _metric(c, v),
    "metric-list-length": lambda c, v: _metric(c, [0.5, 0.5, 0.1]),
    "two-metric-records": lambda c, v: c.__setitem__("m2", MetricRecord({"num-examples": 1})),
    "no-metric-record": lambda c, v: c.pop("metrics"),
    "extra-array-record": lambda c, v: c.__setitem__("a2", ArrayRecord({"x": _arr(np.ones(2))})),
    "array-keys": lambda c, v: "arrays" in c and c.__setitem__("arrays", ArrayRecord({"zz": _arr(np.ones(3))})),
    "array-empty": lambda c, v: "arrays" in c and c.__setitem__("arrays", ArrayRecord()),
    "array-dtype-int8": lambda c, v: (k := _first_array_key(c)) and c["arrays"].__setitem__(
        k, _arr(np.ones(c["arrays"][k].numpy().shape, np.int8))),
    "array-complex": lambda c, v: (k := _first_array_key(c)) and c["arrays"].__setitem__(
        k, _arr(np.ones(c["arrays"][k].numpy().shape, np.complex64))),
    "array-shape": lambda c, v: (k := _first_array_key(c)) and c["arrays"].__setitem__(k, _arr(np.ones((2, 2)))),
    "declaration-deep": lambda c, v: _declare(c, ["[" * 2000 + "]" * 2000]),
    "declaration-composed-5": lambda c, v: _declare(c, [json.dumps(
        {"event": {"type": "ComposedDpEvent", "events": 5}, "label": "", "relation": "replace_one"})]),
    "declaration-not-list": lambda c, v: _declare(c, 5),
    "declaration-bad-param": lambda c, v: _declare(c, [json.dumps(
        {"event": {"type": "GaussianDpEvent", "noise_multiplier": v}, "label": "", "relation": "replace_one"})]),
    "declaration-no-relation": lambda c, v: _declare(c, [json.dumps(
        {"event": {"type": "LaplaceDpEvent", "noise_multiplier": 1.0}, "label": ""})]),
    "declaration-noop": lambda c, v: _declare(c, [json.dumps(
        {"event": {"type": "NoOpDpEvent"}, "label": "", "relation": "replace_one"})]),
    "signds-indices-uint64": lambda c, v: _set_array("indices", np.array([5, 2, 5], np.uint64))(c),
    "signds-indices-int8": lambda c, v: _set_array("indices", np.array([10, -120], np.int8))(c),
    "signds-indices-float": lambda c, v: _set_array("indices", np.array([1.0, 2.0]))(c),
    "signds-sign": lambda c, v: _set_array("sign", np.array([v]))(c),
    "signds-sign-1.99": lambda c, v: _set_array("sign", np.array([1.99]))(c),
    "signds-bhat": lambda c, v: _set_array("b-hat", np.array([v]))(c),
    "signds-huge": lambda c, v: _set_array("indices", np.arange(200_000, dtype=np.int64))(c),
    "inference-complex": lambda c, v: _inference(np.array([1 + 1j, 0, 0]))(c),
    "inference-strings": lambda c, v: _inference(np.array(["a", "b", "c"]))(c),
    "inference-huge": lambda c, v: _inference(np.array([1e308, -1e308, 1e308]))(c),
    "inference-value": lambda c, v: _inference(np.array([v, 0.1, 0.1]))(c),
    "inference-length": lambda c, v: _inference(np.array([0.5, 0.5]))(c),
    "inference-missing": lambda c, v: "inference" in c and c.pop("inference"),
}
IDENTITIES = ("own", "duplicate", "unknown-node")


# --------------------------------------------------------------------------------------- one round
def _serialised(msg: Message) -> Message:
    return message_from_proto(message_to_proto(msg))


def _instructions(strategy, phase: str) -> list[Message]:
    configure = strategy.configure_train if phase == "train" else strategy.configure_evaluate
    msgs = list(configure(1, _model(), ConfigRecord(), FakeGrid(N)))
    for msg in msgs:  # what the Grid does when it sends them
        msg.metadata.__dict__["_message_id"] = str(uuid4())
    return [_serialised(m) for m in msgs]


def _run(name: str, phase: str, bad: tuple[str, object, str] | None):
    """(result, strategy, the valid nodes) of one round; ``bad`` = (mutation, value, identity) or None."""
    strategy = STRATEGIES[name]()
    msgs = _instructions(strategy, phase)
    assert len(msgs) == N
    good = _good_train if phase == "train" else _good_evaluate
    replies = [Message(good(name, i), reply_to=msgs[i]) for i in range(N - 1)]
    if bad is not None:
        mutation, value, identity = bad
        content = good(name, N - 1)
        MUTATIONS[mutation](content, value)
        target = msgs[N - 1] if identity == "own" else msgs[0]
        reply = Message(content, reply_to=target)
        if identity == "unknown-node":
            reply.metadata.__dict__["_src_node_id"] = 999
        replies.append(reply)
    replies = [_serialised(r) for r in replies]
    if phase == "train":
        result = strategy.aggregate_train(1, replies)
    else:
        result = strategy.aggregate_evaluate(1, replies)
    return result, strategy, [int(m.metadata.dst_node_id) for m in msgs[:N - 1]]


def _rejected(metrics) -> float:
    return sum(v for k, v in (metrics or {}).items() if k.startswith("rejected/")) + \
        float((metrics or {}).get("replies/failed", 0))


def _ledger_epsilons(strategy, nodes: list[int]) -> list[float]:
    ledger = getattr(strategy, "ledger", None)
    return [] if ledger is None else [ledger.epsilon(node) for node in nodes]


def _arrays_equal(a: ArrayRecord, b: ArrayRecord) -> bool:
    return list(a.keys()) == list(b.keys()) and all(
        np.array_equal(a[k].numpy(), b[k].numpy(), equal_nan=True) for k in a.keys())


CASES = st.tuples(st.sampled_from(sorted(STRATEGIES)), st.sampled_from(["train", "evaluate"]),
                  st.sampled_from(sorted(MUTATIONS)), REALS, st.sampled_from(IDENTITIES))


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=CASES)
def test_a_malicious_reply_never_aborts_poisons_or_moves_honest_epsilon(case):
    name, phase, mutation, value, identity = case
    logging.disable(logging.WARNING)
    try:
        baseline, base_strategy, base_nodes = _run(name, phase, None)
        result, strategy, nodes = _run(name, phase, (mutation, value, identity))  # must not raise
    finally:
        logging.disable(logging.NOTSET)
    metrics = result[1] if phase == "train" else result
    base_metrics = baseline[1] if phase == "train" else baseline
    if phase == "train":
        arrays = result[0]
        assert arrays is not None, (case, metrics)
        assert all(np.isfinite(a).all() for a in arrays.to_numpy_ndarrays()), case
    for key, val in (metrics or {}).items():
        assert not (isinstance(val, float) and math.isnan(val)), (case, key)
    rejected = _rejected(metrics) - _rejected(base_metrics)
    assert rejected in (0.0, 1.0), (case, metrics)
    if rejected == 1.0:
        if phase == "train" and name not in RANDOMISED:
            assert _arrays_equal(result[0], baseline[0]), case
        honest = {k: v for k, v in (metrics or {}).items() if not k.startswith(("rejected/", "privacy/"))}
        honest_base = {k: v for k, v in (base_metrics or {}).items() if not k.startswith(("rejected/", "privacy/"))}
        assert honest.keys() == honest_base.keys() and all(
            honest[k] == pytest.approx(honest_base[k]) for k in honest), case
        # the i-th valid reply (same content in both runs) leaves its node with the same ε
        assert _ledger_epsilons(strategy, nodes) == pytest.approx(_ledger_epsilons(base_strategy, base_nodes)), case
