"""The neighbouring relation travels with every event (issue 16 B).

A declaration states the relation its sensitivity was computed for; a ledger
converts add/remove events soundly into replace-one and refuses the converse.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event as d
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flwr_dp_strategies import AccountedFedAvg, declare_release, read_declarations
from flwr_dp_strategies.declarations import PRIVACY_RECORD, MalformedDeclaration
from flwr_dp_strategies.privacy import ApproxDpEvent, ExponentialMechanismDpEvent, PrivacyLedger, PureDpEvent
from flwr_dp_strategies.privacy.mechanisms.gaussian import gaussian_sigma
from flwr_dp_strategies.privacy.accounting.relations import convert_event

from loopback import LoopbackGrid

DELTA = 1e-5


def analyze_gauss_z(epsilon: float) -> float:
    """Analyze Gauss on unit-norm rows: add/remove sensitivity ‖xxᵀ‖_F = 1, so z = σ(ε, δ, Δ = 1)."""
    return gaussian_sigma(epsilon, DELTA, 1.0)


def test_add_remove_analyze_gauss_is_not_booked_at_face_value_in_a_replace_one_ledger():
    """Audit: booked 1.000 in a replace-one ledger where the truth (Δ = √2) is 1.465."""
    z = analyze_gauss_z(1.0)
    face_value = PrivacyLedger(DELTA, neighboring_relation="add_or_remove_one")
    face_value.record(d.GaussianDpEvent(z), server_round=1, client=1)
    truth = PrivacyLedger(DELTA, neighboring_relation="replace_one")
    truth.record(d.GaussianDpEvent(z / math.sqrt(2)), server_round=1, client=1)
    assert face_value.epsilon() == pytest.approx(1.0, abs=2e-3)
    assert truth.epsilon() == pytest.approx(1.465, abs=5e-3)

    content = RecordDict()
    declare_release(content, d.GaussianDpEvent(z), label="analyze-gauss", neighboring_relation="add_or_remove_one")
    generic = PrivacyLedger(DELTA, neighboring_relation="replace_one")
    for decl in read_declarations(content):
        generic.record(decl.event, server_round=1, client=1, neighboring_relation=decl.neighboring_relation)
    assert generic.epsilon() >= truth.epsilon()  # sensitivity 2Δ: sound, looser than √2

    content = RecordDict()
    declare_release(
        content,
        d.GaussianDpEvent(z),
        label="analyze-gauss",
        neighboring_relation="add_or_remove_one",
        replace_one_event=d.GaussianDpEvent(z / math.sqrt(2)),
    )
    tight = PrivacyLedger(DELTA, neighboring_relation="replace_one")
    [decl] = read_declarations(content)
    tight.record(
        decl.event,
        server_round=1,
        client=1,
        neighboring_relation=decl.neighboring_relation,
        replace_one_event=decl.replace_one_event,
    )
    assert tight.epsilon() == pytest.approx(truth.epsilon(), rel=1e-9)
    # An add/remove ledger books the add/remove form, not the tighter replace-one one.
    plain = PrivacyLedger(DELTA, neighboring_relation="add_or_remove_one")
    plain.record(
        decl.event,
        server_round=1,
        client=1,
        neighboring_relation=decl.neighboring_relation,
        replace_one_event=decl.replace_one_event,
    )
    assert plain.epsilon() == pytest.approx(face_value.epsilon(), rel=1e-9)


def test_add_remove_laplace_fm_release_is_doubled_under_replacement():
    """Audit: an add/remove FM Laplace release (ε = 1) was booked 1.000 in a replace-one ledger (truth 1.29-1.60)."""
    ledger = PrivacyLedger(DELTA, neighboring_relation="replace_one")
    ledger.record(d.LaplaceDpEvent(1.0), server_round=1, client=1, neighboring_relation="add_or_remove_one")
    assert ledger.epsilon() == pytest.approx(2.0, rel=1e-6)
    assert ledger.epsilon() >= 1.60


def test_replace_one_events_are_refused_by_an_add_remove_ledger():
    ledger = PrivacyLedger(DELTA, neighboring_relation="add_or_remove_one")
    with pytest.raises(ValueError, match="replace_one"):
        ledger.record(d.GaussianDpEvent(1.0), server_round=1, client=1, neighboring_relation="replace_one")
    with pytest.raises(ValueError, match="neighboring_relation"):
        ledger.record(d.GaussianDpEvent(1.0), server_round=1, client=1, neighboring_relation="zero_out")
    assert ledger.clients == []


@pytest.mark.parametrize(
    "event, expected",
    [
        (d.GaussianDpEvent(3.0), d.GaussianDpEvent(1.5)),
        (d.LaplaceDpEvent(3.0), d.LaplaceDpEvent(1.5)),
        (d.DiscreteLaplaceDpEvent(0.5, 2), d.DiscreteLaplaceDpEvent(0.5, 4)),
        (PureDpEvent(0.5), PureDpEvent(1.0)),
        (ExponentialMechanismDpEvent(0.5), ExponentialMechanismDpEvent(1.0)),
        (ApproxDpEvent(0.5, 1e-6), ApproxDpEvent(1.0, (1 + math.exp(0.5)) * 1e-6)),
        (d.ZCDpEvent(0.1), d.ZCDpEvent(0.4)),
        (d.PoissonSampledDpEvent(0.1, d.GaussianDpEvent(1.0)), d.PoissonSampledDpEvent(0.1, d.GaussianDpEvent(1.0))),
        (
            d.SelfComposedDpEvent(d.ComposedDpEvent([d.GaussianDpEvent(2.0), d.NoOpDpEvent()]), 3),
            d.SelfComposedDpEvent(d.ComposedDpEvent([d.GaussianDpEvent(1.0), d.NoOpDpEvent()]), 3),
        ),
    ],
)
def test_conversion_table(event, expected):
    assert convert_event(event, "add_or_remove_one", "replace_one") == expected


def test_sampled_gaussian_conversion_matches_a_replace_one_sensitivity_of_twice_the_record_bound():
    """dp-accounting's replace-one PLD of PoissonSampled(q=1, Gaussian(z)) is the unsampled Gaussian at z/2."""
    sampled = PrivacyLedger(DELTA, neighboring_relation="replace_one", accounting="pld")
    sampled.record(
        d.PoissonSampledDpEvent(1.0, d.GaussianDpEvent(2.0)),
        server_round=1,
        client=1,
        neighboring_relation="add_or_remove_one",
    )
    plain = PrivacyLedger(DELTA, neighboring_relation="replace_one", accounting="pld")
    plain.record(d.GaussianDpEvent(2.0), server_round=1, client=1, neighboring_relation="add_or_remove_one")
    assert sampled.epsilon() == pytest.approx(plain.epsilon(), rel=1e-3)


def test_randomized_response_has_no_add_remove_form():
    with pytest.raises(ValueError, match="replacement"):
        convert_event(d.RandomizedResponseDpEvent(0.5, 2), "add_or_remove_one", "replace_one")


def test_a_declaration_without_a_relation_is_malformed():
    content = RecordDict(
        {
            PRIVACY_RECORD: ConfigRecord(
                {"events": [json.dumps({"event": {"type": "GaussianDpEvent", "noise_multiplier": 1.0}, "label": "x"})]}
            )
        }
    )
    with pytest.raises(MalformedDeclaration, match="relation"):
        read_declarations(content)
    with pytest.raises(TypeError):
        declare_release(RecordDict(), d.GaussianDpEvent(1.0), label="x")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="noise_multiplier"):
        declare_release(RecordDict(), d.GaussianDpEvent(-1.0), label="x", neighboring_relation="replace_one")


def test_deeply_nested_declaration_is_malformed_not_a_recursion_error():
    content = RecordDict({PRIVACY_RECORD: ConfigRecord({"events": ["[" * 2000 + "]" * 2000]})})
    with pytest.raises(MalformedDeclaration, match="nest"):
        read_declarations(content)


@pytest.mark.usefixtures("task_identity")
def test_strategy_books_declarations_under_their_relation():
    """Default AccountedFedAvg ledger is replace-one; an add/remove declaration is converted, not taken at face value."""
    strategy = AccountedFedAvg(min_train_nodes=2, min_available_nodes=2)
    assert strategy.ledger.neighboring_relation == "replace_one"
    msgs = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(2)))
    replies = []
    for msg, relation in zip(msgs, ("add_or_remove_one", "replace_one")):
        content = RecordDict({"arrays": ArrayRecord([np.ones(3)]), "metrics": MetricRecord({"num-examples": 1.0})})
        declare_release(content, d.LaplaceDpEvent(1.0), label="x", neighboring_relation=relation)
        replies.append(Message(content, reply_to=msg))
    strategy.aggregate_train(1, replies)
    add_remove_node, replace_node = (int(m.metadata.dst_node_id) for m in msgs)
    assert strategy.ledger.epsilon(add_remove_node) == pytest.approx(2.0, rel=1e-6)
    assert strategy.ledger.epsilon(replace_node) == pytest.approx(1.0, rel=1e-6)
