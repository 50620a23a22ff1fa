"""Nothing data-dependent leaves a local-DP mod un-noised and undeclared (issue 16 C4).

Audit: LocalUpdateNoiseMod, signds_mod and LaplaceInferenceMod privatised only their
ArrayRecord; ``train-loss``, ``eval-acc`` and the exact ``num-examples`` passed through.
"""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

from client_mods import LaplaceInferenceMod, LocalUpdateNoiseMod
from client_mods.reply_metrics import NON_PRIVATE_METRICS_LABEL
from client_mods.signds_mod import make_signds_mod, signds_mod
from flwr_dp_strategies import SignDS
from flwr_dp_strategies.declarations import read_declarations
from flwr_dp_strategies.privacy import PrivacyLedger

pytestmark = pytest.mark.usefixtures("task_identity")
SECRET = {"num-examples": 517, "train-loss": 0.123, "eval-acc": 0.87}


def context() -> Context:
    return Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})


def trainer(msg: Message, ctx: Context) -> Message:
    received = msg.content["arrays"].to_numpy_ndarrays()
    content = RecordDict({"arrays": ArrayRecord([r + 0.01 for r in received]), "metrics": MetricRecord(SECRET)})
    return Message(content, reply_to=msg)


def evaluator(msg: Message, ctx: Context) -> Message:
    content = RecordDict(
        {"inference": ArrayRecord({"probs": Array(np.full((4, 3), 1 / 3))}), "metrics": MetricRecord(SECRET)}
    )
    return Message(content, reply_to=msg)


def train_message(config: dict | None = None) -> Message:
    content = RecordDict({"arrays": ArrayRecord([np.zeros(200)]), "config": ConfigRecord(config or {})})
    return Message(content, dst_node_id=7, message_type=MessageType.TRAIN)


def evaluate_message() -> Message:
    content = RecordDict({"arrays": ArrayRecord([np.zeros(2)]), "config": ConfigRecord({})})
    return Message(content, dst_node_id=7, message_type=MessageType.EVALUATE)


SIGNDS_CONFIG = SignDS(sign_k=0.05, sign_eps=10.0).client_config()

CASES = {
    "local-noise": (lambda release: LocalUpdateNoiseMod(1.0, 0.5, release_metrics=release), train_message, trainer),
    "laplace-inference": (
        lambda release: LaplaceInferenceMod(1.0, release_metrics=release),
        evaluate_message,
        evaluator,
    ),
    "signds": (lambda release: make_signds_mod(release_metrics=release), lambda: train_message(SIGNDS_CONFIG), trainer),
}


def _metrics(reply: Message) -> dict:
    records = [r for r in reply.content.values() if isinstance(r, MetricRecord)]
    assert len(records) == 1
    return dict(records[0])


@pytest.mark.parametrize("name", sorted(CASES))
def test_metrics_are_replaced_by_a_public_weight_by_default(name):
    make_mod, make_message, app = CASES[name]
    reply = make_mod(False)(make_message(), context(), app)
    assert _metrics(reply) == {"num-examples": 1.0}
    assert all(not isinstance(d.event, NonPrivateDpEvent) for d in read_declarations(reply.content))


@pytest.mark.parametrize("name", sorted(CASES))
def test_released_metrics_are_declared_non_private(name):
    make_mod, make_message, app = CASES[name]
    reply = make_mod(True)(make_message(), context(), app)
    assert _metrics(reply) == pytest.approx(SECRET)
    declarations = read_declarations(reply.content)
    assert [d.label for d in declarations if isinstance(d.event, NonPrivateDpEvent)] == [NON_PRIVATE_METRICS_LABEL]
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    for d in declarations:
        ledger.record(d.event, server_round=1, client=7, neighboring_relation=d.neighboring_relation)
    assert ledger.epsilon(7) == float("inf")


def test_plain_signds_mod_withholds_metrics():
    reply = signds_mod(train_message(SIGNDS_CONFIG), context(), trainer)
    assert _metrics(reply) == {"num-examples": 1.0}


def test_adaptive_clipping_mod_sends_only_the_public_weight_and_its_bits():
    """Issue 37 item 3: the central-DP clipping mod passed the raw train-loss and num-examples to the server."""
    from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, KEY_NORM_BIT

    from client_mods import adaptive_clipping_mod
    from client_mods.adaptive_clipping_mod import make_adaptive_clipping_mod
    from flwr_dp_strategies.wire import KEY_UNCLIPPED_BIT

    message = lambda: train_message({KEY_CLIPPING_NORM: 1.0})  # noqa: E731
    bits = {KEY_UNCLIPPED_BIT: 1, KEY_NORM_BIT: 0}  # the update's norm is 0.14 < 1
    reply = adaptive_clipping_mod(message(), context(), trainer)
    assert _metrics(reply) == {"num-examples": 1.0, **bits} and not read_declarations(reply.content)
    released = make_adaptive_clipping_mod(release_metrics=True)(message(), context(), trainer)
    assert _metrics(released) == pytest.approx({**SECRET, **bits})
    assert [d.label for d in read_declarations(released.content)] == [NON_PRIVATE_METRICS_LABEL]
    weighted = make_adaptive_clipping_mod(weighted_by_key="n")(message(), context(), trainer)
    assert _metrics(weighted) == {"n": 1.0, **bits}
    with pytest.raises(ValueError, match="release_metrics"):
        make_adaptive_clipping_mod(release_metrics="yes")
