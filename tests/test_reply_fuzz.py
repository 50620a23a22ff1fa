"""Malicious replies never abort a round, never poison the model, never move an honest client's ε (issue 17).

Each case: the valid replies of all nodes but one plus one bad one, every Message
passed through Flower's own serialisation (``message_to_proto`` /
``message_from_proto``), run against every strategy of ``strategy_registry.REGISTRY``
(every exported one; the secure-aggregation ones through their real client app and
protocol stages) and both phases. Hypothesis draws the strategy, the phase, the
mutation, the value it writes and the bad reply's identity (its own node, a
duplicate of another node, a node never asked). Asserted:

* the round returns (no exception);
* a train round releases a finite model;
* if the bad reply was rejected, the model and the metrics of the round equal
  those of a round on the valid replies alone (same seeds), and the
  valid clients' ε is unchanged;
* every reply is either counted in the strategy's ``rejections`` (never in the round's
  metrics) or aggregated.
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_dp_strategies.declarations import PRIVACY_RECORD

from strategy_registry import REGISTRY, rejection_counts

pytestmark = pytest.mark.usefixtures("task_identity")
STRATEGIES = REGISTRY  # every exported strategy (test_strategy_registry.py checks it is complete)


def _arr(values) -> Array:
    return Array(np.asarray(values))


# --------------------------------------------------------------------------------------- mutations
def _array_record_name(c: RecordDict) -> str | None:
    """The record a train reply's update is in: ``arrays``, else the first ArrayRecord that is not the
    inference result (a secure-aggregation reply's masked vector)."""
    if isinstance(c.get("arrays"), ArrayRecord):
        return "arrays"
    return next((k for k, v in c.items() if isinstance(v, ArrayRecord) and k != "inference"), None)


def _first_array_key(c: RecordDict) -> str | None:
    name = _array_record_name(c)
    return None if name is None else next(iter(c[name].keys()), None)


def _metrics(c: RecordDict) -> MetricRecord:
    """The reply's MetricRecord ``metrics``, added if it has none (a secure-aggregation reply)."""
    if "metrics" not in c:
        c["metrics"] = MetricRecord({"num-examples": 10})
    return c["metrics"]


def _set_first(c: RecordDict, make: Callable[[np.ndarray], np.ndarray]) -> None:
    key = _first_array_key(c)
    if key is not None:
        record = c[_array_record_name(c)]
        record[key] = _arr(make(record[key].numpy()))


def _fill(c: RecordDict, value: float) -> None:
    def filled(old: np.ndarray) -> np.ndarray:
        dtype = old.dtype if old.dtype.kind == "f" else np.float64
        with np.errstate(over="ignore"):
            return np.full(old.shape, value).astype(dtype)

    _set_first(c, filled)


def _weight(c: RecordDict, value) -> None:
    _metrics(c)["num-examples"] = value


def _metric(c: RecordDict, value) -> None:
    _metrics(c)["loss"] = value


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
    "weight-missing": lambda c, v: _metrics(c).pop("num-examples"),
    "metric-value": lambda c, v: _metric(c, v),
    "metric-list-length": lambda c, v: _metric(c, [0.5, 0.5, 0.1]),
    "two-metric-records": lambda c, v: c.__setitem__("m2", MetricRecord({"num-examples": 1})),
    "no-metric-record": lambda c, v: "metrics" in c and c.pop("metrics"),
    "extra-array-record": lambda c, v: c.__setitem__("a2", ArrayRecord({"x": _arr(np.ones(2))})),
    "array-keys": lambda c, v: (n := _array_record_name(c)) and c.__setitem__(n, ArrayRecord({"zz": _arr(np.ones(3))})),
    "array-empty": lambda c, v: (n := _array_record_name(c)) and c.__setitem__(n, ArrayRecord()),
    "array-dtype-int8": lambda c, v: _set_first(c, lambda old: np.ones(old.shape, np.int8)),
    "array-complex": lambda c, v: _set_first(c, lambda old: np.ones(old.shape, np.complex64)),
    "array-shape": lambda c, v: _set_first(c, lambda old: np.ones((2, 2))),
    "declaration-deep": lambda c, v: _declare(c, ["[" * 2000 + "]" * 2000]),
    "declaration-composed-5": lambda c, v: _declare(
        c, [json.dumps({"event": {"type": "ComposedDpEvent", "events": 5}, "label": "", "relation": "replace_one"})]
    ),
    "declaration-not-list": lambda c, v: _declare(c, 5),
    "declaration-bad-param": lambda c, v: _declare(
        c,
        [
            json.dumps(
                {"event": {"type": "GaussianDpEvent", "noise_multiplier": v}, "label": "", "relation": "replace_one"}
            )
        ],
    ),
    "declaration-no-relation": lambda c, v: _declare(
        c, [json.dumps({"event": {"type": "LaplaceDpEvent", "noise_multiplier": 1.0}, "label": ""})]
    ),
    "declaration-noop": lambda c, v: _declare(
        c, [json.dumps({"event": {"type": "NoOpDpEvent"}, "label": "", "relation": "replace_one"})]
    ),
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


def _instructions(strategy, phase: str, entry, grid) -> list[Message]:
    configure = strategy.configure_train if phase == "train" else strategy.configure_evaluate
    msgs = list(configure(1, entry.model(), ConfigRecord(), grid))
    for msg in msgs:  # what the Grid does when it sends them
        msg.metadata.__dict__["_message_id"] = str(uuid4())
    return [_serialised(m) for m in msgs]


def _run(name: str, phase: str, bad: tuple[str, object, str] | None):
    """(result, strategy, the valid nodes) of one round; ``bad`` = (mutation, value, identity) or None.

    The last node's reply is the bad one (``own``), or it is silent and the bad reply claims another
    node's identity; without ``bad`` the last node is silent. Every node's valid reply is computed
    first (a secure-aggregation client app draws its randomness in the same order in every run).
    """
    entry = STRATEGIES[name]
    strategy, grid = entry.make(), entry.grid()
    msgs = _instructions(strategy, phase, entry, grid)
    n = entry.nodes
    assert len(msgs) == n
    if phase == "train":
        valid = entry.train_replies(grid, msgs)
    else:
        valid = [Message(entry.evaluate_content(i), reply_to=m) for i, m in enumerate(msgs)]
    replies = valid[: n - 1]
    if bad is not None:
        mutation, value, identity = bad
        content = valid[n - 1].content
        MUTATIONS[mutation](content, value)
        target = msgs[n - 1] if identity == "own" else msgs[0]
        reply = Message(content, reply_to=target)
        reply.metadata.__dict__["_src_node_id"] = 999 if identity == "unknown-node" else target.metadata.dst_node_id
        replies.append(reply)
    replies = [_serialised(r) for r in replies]
    if phase == "train":
        result = strategy.aggregate_train(1, replies)
    else:
        result = strategy.aggregate_evaluate(1, replies)
    return result, strategy, [int(m.metadata.dst_node_id) for m in msgs[: n - 1]]


def _rejected(strategy, metrics, phase: str) -> int:
    """How many replies the round rejected or saw fail (kept by the strategy, never in ``metrics``)."""
    return sum(rejection_counts(strategy, metrics, phase).values())


def _ledger_epsilons(strategy, nodes: list[int]) -> list[float]:
    ledger = getattr(strategy, "ledger", None)
    return [] if ledger is None else [ledger.epsilon(node) for node in nodes]


def _arrays_equal(a: ArrayRecord, b: ArrayRecord) -> bool:
    return list(a.keys()) == list(b.keys()) and all(
        np.array_equal(a[k].numpy(), b[k].numpy(), equal_nan=True) for k in a.keys()
    )


ADDS_RECORDS = {
    "weight",
    "weight-list",
    "weight-missing",
    "metric-value",
    "metric-list-length",
    "two-metric-records",
    "extra-array-record",
}
"""Mutations that add a record beside a secure-aggregation reply's protocol records (a MetricRecord at least)."""
CASES = st.tuples(
    st.sampled_from(sorted(STRATEGIES)),
    st.sampled_from(["train", "evaluate"]),
    st.sampled_from(sorted(MUTATIONS)),
    REALS,
    st.sampled_from(IDENTITIES),
)


@pytest.mark.slow  # over 10 s (1 000 / 150 hypothesis examples): the full lane runs it
@settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
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
    rejected = _rejected(strategy, metrics, phase) - _rejected(base_strategy, base_metrics, phase)
    assert rejected in (0, 1), (case, metrics)
    if rejected == 1:
        if phase == "train" and not STRATEGIES[name].randomised:
            assert _arrays_equal(result[0], baseline[0]), case
        honest = {k: v for k, v in (metrics or {}).items() if not k.startswith("privacy/")}
        honest_base = {k: v for k, v in (base_metrics or {}).items() if not k.startswith("privacy/")}
        assert honest.keys() == honest_base.keys() and all(
            honest[k] == pytest.approx(honest_base[k]) for k in honest
        ), case
        # the i-th valid reply (same content in both runs) leaves its node with the same ε
        assert _ledger_epsilons(strategy, nodes) == pytest.approx(_ledger_epsilons(base_strategy, base_nodes)), case


@pytest.mark.parametrize("identity", ["duplicate", "unknown-node"])
@pytest.mark.parametrize("name", sorted(n for n, e in STRATEGIES.items() if e.secure))
def test_a_secure_reply_rejected_for_its_identity_books_nothing(name, identity):
    """A second collect reply of an honest node, or one from a node never asked, carrying records beside
    the protocol's: neither the honest node's epsilon nor an unknown node's entry moves."""
    logging.disable(logging.WARNING)
    try:
        _, base_strategy, base_nodes = _run(name, "train", None)
        _, strategy, nodes = _run(name, "train", ("two-metric-records", None, identity))
    finally:
        logging.disable(logging.NOTSET)
    assert 999 not in strategy.ledger.clients and "999" not in strategy.ledger.clients
    assert _ledger_epsilons(strategy, nodes) == pytest.approx(_ledger_epsilons(base_strategy, base_nodes))
