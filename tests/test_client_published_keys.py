"""Every key a client mod, trainer or data path of ``client_mods`` sends to the server is on one allow-list, with what
protects it (issue 37): a mod that starts forwarding a data-dependent metric (``train-loss``, ``eval-acc``, the exact
``num-examples``) fails here.

Each case runs the real client code for one round on a user function that returns secret metrics; the secure
aggregation mods run the whole protocol through the registry's SecAgg entries, and every message each client sends
(every stage) is read. ``test_every_client_export_is_classified`` keeps the case list complete: a new export of
``client_mods`` must be run here or named as a helper that sends nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, KEY_NORM_BIT

import client_mods
from client_mods import (
    EPSILON_METRIC,
    ROUND_EPSILON_METRIC,
    DpSgdTrainer,
    FunctionalMechanismTrainer,
    LaplaceInferenceMod,
    LocalUpdateNoiseMod,
    adaptive_clipping_mod,
    covariance_reply,
    dp_sgd_train_reply,
    signds_mod,
)
from client_mods.dp_sgd_trainer import NOISE_METRIC
from flwr_dp_strategies import SignDS
from flwr_dp_strategies.wire import KEY_UNCLIPPED_BIT
from strategy_registry import REGISTRY

pytestmark = pytest.mark.usefixtures("task_identity")

#: every metric key a client may send, and what protects it
ALLOWED = {
    "num-examples": "the public weight: 1.0, or the record count where the declared relation (replace-one) makes it "
    "public",
    KEY_UNCLIPPED_BIT: "adaptive clipping's bit: enters only the server's noised, booked count",
    KEY_NORM_BIT: "Flower's adaptive clipping bit: enters only the server's noised, booked count",
    EPSILON_METRIC: "DP-SGD's ε: a function of the public (q, z, steps, δ) only",
    ROUND_EPSILON_METRIC: "DP-SGD's one-round ε: a function of the public (q, z, steps, δ) only",
    NOISE_METRIC: "DP-SGD's noise multiplier z: configured, or calibrated from the public (target ε, q, steps, δ)",
    "train-loss": "the functional mechanism's objective at the released head: post-processing of the noisy "
    "coefficients (the only case that sends it)",
}
SECRET = {"num-examples": 517.0, "train-loss": 0.123, "eval-acc": 0.87}


def context(node: int = 7) -> Context:
    return Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})


def user_train(msg: Message, ctx: Context) -> Message:
    received = msg.content["arrays"].to_numpy_ndarrays()
    content = RecordDict({"arrays": ArrayRecord([r + 0.01 for r in received]), "metrics": MetricRecord(SECRET)})
    return Message(content, reply_to=msg)


def user_evaluate(msg: Message, ctx: Context) -> Message:
    content = RecordDict(
        {"inference": ArrayRecord({"probs": Array(np.full((4, 3), 1 / 3))}), "metrics": MetricRecord(SECRET)}
    )
    return Message(content, reply_to=msg)


def train_message(config: dict | None = None, arrays: ArrayRecord | None = None) -> Message:
    content = RecordDict({"arrays": arrays or ArrayRecord([np.zeros(200)]), "config": ConfigRecord(config or {})})
    return Message(content, dst_node_id=7, message_type=MessageType.TRAIN)


def _local_noise() -> list[Message]:
    return [LocalUpdateNoiseMod(1.0, 0.5)(train_message(), context(), user_train)]


def _laplace() -> list[Message]:
    msg = Message(
        RecordDict({"arrays": ArrayRecord([np.zeros(2)]), "config": ConfigRecord({})}),
        dst_node_id=7,
        message_type=MessageType.EVALUATE,
    )
    return [LaplaceInferenceMod(1.0)(msg, context(), user_evaluate)]


def _signds() -> list[Message]:
    config = SignDS(sign_k=0.05, sign_eps=10.0).client_config()
    return [signds_mod(train_message(config), context(), user_train)]


def _adaptive_clipping() -> list[Message]:
    return [adaptive_clipping_mod(train_message({KEY_CLIPPING_NORM: 1.0}), context(), user_train)]


def _dp_sgd() -> list[Message]:
    torch.manual_seed(0)
    model = lambda: torch.nn.Sequential(torch.nn.Linear(4, 3))  # noqa: E731
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    arrays = ArrayRecord(model().state_dict())
    trainer = DpSgdTrainer(model, noise_multiplier=1.0, batch_size=8, sample_rate=0.2, seed=0)
    return [dp_sgd_train_reply(train_message(arrays=arrays), context(), trainer, (x, y), num_threads=None)]


def _functional_mechanism() -> list[Message]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    arrays = ArrayRecord({"head.weight": Array(np.zeros((4, 3), dtype=np.float32))})
    trainer = FunctionalMechanismTrainer(1.0, num_classes=3, local_steps=2, rng=0)
    return [trainer.train(train_message(arrays=arrays), context(), x, rng.integers(0, 3, 50))]


def _covariance() -> list[Message]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    msg = Message(RecordDict(), dst_node_id=7, message_type="train.pca")
    return [covariance_reply(msg, context(), x, epsilon=1.0, delta=1e-5, rng=0)]


def _secure(entry_name: str):
    def run() -> list[Message]:
        entry = REGISTRY[entry_name]
        sent: list[Message] = []
        grid = entry.grid()
        grid.tamper = lambda msg, reply: sent.append(reply) or reply
        strategy = entry.make()
        msgs = list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
        replies = entry.train_replies(grid, msgs)
        strategy.aggregate_train(1, replies)
        assert not grid.errors, grid.errors
        return sent + replies

    return run


#: export -> the client code it runs for one round
CASES = {
    "LocalUpdateNoiseMod": _local_noise,
    "LaplaceInferenceMod": _laplace,
    "signds_mod": _signds,
    "make_signds_mod": _signds,
    "adaptive_clipping_mod": _adaptive_clipping,
    "DpSgdTrainer": _dp_sgd,
    "dp_sgd_train_reply": _dp_sgd,
    "FunctionalMechanismTrainer": _functional_mechanism,
    "covariance_reply": _covariance,
    "distributed_dp_mod": _secure("DistributedDpFedAvg"),
    "make_distributed_dp_mod": _secure("DistributedDpFedAvg"),
    "SecureObjectiveTrainer": _secure("SecureObjectiveSum"),
}

#: exports that send nothing themselves (constants, accounting helpers, data wrappers whose reply is the user's own
#: function's, declared through ``declare_label_release``), and why
HELPERS = {
    "DpSgdBudgetExhausted": "an exception",
    "DpSgdRound": "the result of a round, sent through dp_sgd_train_reply",
    "EPSILON_METRIC": "a key name",
    "ROUND_EPSILON_METRIC": "a key name",
    "STATE_KEY": "a key name",
    "LABEL_DP_DECLARATION": "a key name",
    "choose_grad_sample_mode": "a configuration helper",
    "combined_noise_multiplier": "arithmetic on public parameters",
    "declare_opacus_round": "adds a declaration to the user's reply",
    "dp_sgd_event": "builds an event from public parameters",
    "declare_label_release": "adds a declaration to the user's reply",
    "is_label_release_declared": "reads a declaration",
    "label_release_event": "builds an event from public parameters",
    "laplace_eval_epsilon": "arithmetic on public parameters",
    "private_labels": "returns noisy labels to the caller, on the client",
    "LabelDp": "a data wrapper: the noisy labels stay on the client",
    "LabelDpDataset": "a data wrapper: the noisy labels stay on the client",
    "project": "local arithmetic",
    "projection_from_state": "reads the client's state",
    "store_projection": "stores the server's public projection; its reply is the public weight 1.0",
}


def sent_keys(messages: list[Message]) -> set[str]:
    return {key for m in messages if m.has_content() for rec in m.content.metric_records.values() for key in rec}


def test_every_client_export_is_classified():
    assert set(CASES) | set(HELPERS) == set(client_mods.__all__)
    assert not set(CASES) & set(HELPERS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_key_a_client_sends_is_on_the_allow_list(name):
    messages = CASES[name]()
    assert messages
    keys = sent_keys(messages)
    assert keys <= set(ALLOWED), sorted(keys - set(ALLOWED))
    for m in messages:
        for rec in m.content.metric_records.values() if m.has_content() else ():
            # the user's secret values never pass through (the FM loss is its own, not the user's)
            assert rec.get("num-examples") != SECRET["num-examples"] and rec.get("eval-acc") is None
            if "train-loss" in rec:
                assert name == "FunctionalMechanismTrainer" and rec["train-loss"] != SECRET["train-loss"]


def test_a_forwarded_secret_is_caught():
    """Positive control: a mod that passes the user's metrics through fails the allow-list."""

    def leaky(msg, ctx, call_next):
        return call_next(msg, ctx)

    keys = sent_keys([leaky(train_message(), context(), user_train)])
    assert keys - set(ALLOWED) == {"eval-acc"}
