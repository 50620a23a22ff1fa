"""The ledger never books an event it cannot bound, and booking never lowers anyone's ε.

Regression tests for the audit's cases (issue 16 A1) plus a property-based test
(hypothesis) that generates arbitrary, often malformed, event trees.
"""

from __future__ import annotations

import json
import math

import pytest
from dp_accounting import dp_event as d
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_dp_strategies.privacy import ApproxDpEvent, ExponentialMechanismDpEvent, PrivacyLedger, PureDpEvent
from flwr_dp_strategies.privacy.accounting.event_validation import MAX_DEPTH, validate_event
from flwr_dp_strategies.privacy.accounting.events import event_from_dict, event_to_dict

BAD_EVENTS = [
    (d.DiscreteLaplaceDpEvent(-1, 1), "noise_parameter"),
    (d.DiscreteLaplaceDpEvent(1.0, 0), "sensitivity"),
    (d.DiscreteLaplaceDpEvent(1.0, 1.5), "sensitivity"),
    (d.GaussianDpEvent(float("nan")), "noise_multiplier"),
    (d.GaussianDpEvent(-1.0), "noise_multiplier"),
    (d.GaussianDpEvent(float("inf")), "noise_multiplier"),
    (d.GaussianDpEvent(True), "noise_multiplier"),
    (d.LaplaceDpEvent(float("nan")), "noise_multiplier"),
    (d.PoissonSampledDpEvent(0.5, event=5), "event.event"),
    (d.PoissonSampledDpEvent(1.5, d.GaussianDpEvent(1.0)), "sampling_probability"),
    (d.PoissonSampledDpEvent(float("nan"), d.GaussianDpEvent(1.0)), "sampling_probability"),
    (d.SelfComposedDpEvent(d.GaussianDpEvent(1.0), -1), "count"),
    (d.SelfComposedDpEvent(d.GaussianDpEvent(1.0), 5.0), "count"),
    (d.ComposedDpEvent([d.GaussianDpEvent(1.0), d.LaplaceDpEvent(-2.0)]), "events[1].noise_multiplier"),
    (d.ComposedDpEvent(events=5), "events"),
    (d.RandomizedResponseDpEvent(1.2, 2), "noise_parameter"),
    (d.RandomizedResponseDpEvent(0.5, 1), "num_buckets"),
    (d.SampledWithoutReplacementDpEvent(10, 11, d.GaussianDpEvent(1.0)), "sample_size"),
    (d.ZCDpEvent(-0.1), "rho"),
    (d.UnsupportedDpEvent(), "UnsupportedDpEvent"),
    (d.PoissonSampledDpEvent(0.0, d.ComposedDpEvent([])), "PoissonSampledDpEvent"),  # crashes dp-accounting
    (d.LaplaceDpEvent(0.0), "noise_multiplier"),  # crashed dp-accounting's RDP after booking
    (d.SelfComposedDpEvent(d.GaussianDpEvent(1.0), 0), "count"),  # crashed dp-accounting's PLD after booking
]


@pytest.mark.parametrize("event, field", BAD_EVENTS, ids=[f"{type(e).__name__}-{f}" for e, f in BAD_EVENTS])
def test_out_of_domain_events_are_refused_everywhere_with_the_field_named(event, field, tmp_path):
    ledger = PrivacyLedger(1e-5)
    ledger.record(d.GaussianDpEvent(2.0), server_round=1)  # a central event every client shares
    ledger.record(d.GaussianDpEvent(3.0), server_round=1, client=1)
    before = (ledger.epsilon(), ledger.epsilon(1))
    for call in (
        lambda: ledger.record(event, server_round=2, client=1),
        lambda: ledger.record(event, server_round=2),
        lambda: ledger.record_clients(event, server_round=2, clients=[1, 2]),
        lambda: ledger.check_accountable(event),
    ):
        with pytest.raises(ValueError, match=field.split(".")[-1].split("[")[0]):
            call()
    assert (ledger.epsilon(), ledger.epsilon(1)) == before
    assert ledger.clients == ["1"]


def test_a_forged_event_in_a_saved_ledger_is_refused_on_load(tmp_path):
    ledger = PrivacyLedger(1e-5)
    ledger.record(d.DiscreteLaplaceDpEvent(1.0, 1), server_round=1, client=1)
    data = json.loads(ledger.to_json())
    for key, event in data["events"].items():
        event["noise_parameter"] = -1.0
    with pytest.raises(ValueError, match="noise_parameter"):
        PrivacyLedger.from_json(json.dumps(data))


def test_negative_discrete_laplace_no_longer_zeroes_every_client():
    """Audit: DiscreteLaplace(-1, 1) booked for one client made dp-accounting report ε = 0 for all."""
    ledger = PrivacyLedger(1e-5)
    ledger.record(d.GaussianDpEvent(1.0), server_round=1)
    honest = ledger.epsilon()
    with pytest.raises(ValueError):
        ledger.record(d.DiscreteLaplaceDpEvent(-1, 1), server_round=1, client="attacker")
    assert ledger.epsilon() == honest > 1.0


def test_event_descriptions_are_strict():
    good = event_to_dict(d.PoissonSampledDpEvent(0.1, d.GaussianDpEvent(1.0)))
    assert event_from_dict(good) == d.PoissonSampledDpEvent(0.1, d.GaussianDpEvent(1.0))
    with pytest.raises(ValueError, match="unknown"):
        event_from_dict({**good, "extra": 1})
    with pytest.raises(ValueError, match="missing"):
        event_from_dict({"type": "GaussianDpEvent"})
    nested: dict = {"type": "GaussianDpEvent", "noise_multiplier": 1.0}
    for _ in range(MAX_DEPTH + 2):
        nested = {"type": "SelfComposedDpEvent", "event": nested, "count": 1}
    with pytest.raises(ValueError, match="deeper"):
        event_from_dict(nested)


def test_trees_too_deep_or_too_large_are_refused():
    event: d.DpEvent = d.GaussianDpEvent(1.0)
    for _ in range(MAX_DEPTH + 1):
        event = d.SelfComposedDpEvent(event, 1)
    with pytest.raises(ValueError, match="deeper"):
        validate_event(event)
    with pytest.raises(ValueError, match="more than"):
        validate_event(d.ComposedDpEvent([d.GaussianDpEvent(1.0)] * 5000))


# ---------------------------------------------------------------- property-based
_reals = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.floats(min_value=0.05, max_value=20.0),
    st.integers(min_value=-3, max_value=5),
    st.booleans(),
)
_probabilities = st.one_of(st.floats(min_value=0.0, max_value=1.0), _reals)
_counts = st.one_of(st.integers(min_value=-2, max_value=6), st.floats(min_value=0, max_value=4), st.booleans())

_leaves = st.one_of(
    st.builds(d.GaussianDpEvent, _reals),
    st.builds(d.LaplaceDpEvent, _reals),
    st.builds(d.DiscreteLaplaceDpEvent, _reals, _counts),
    st.builds(d.RandomizedResponseDpEvent, _probabilities, st.integers(min_value=0, max_value=6)),
    st.builds(d.ZCDpEvent, _reals),
    st.just(d.NoOpDpEvent()),
    st.just(d.NonPrivateDpEvent()),
    st.builds(PureDpEvent, st.floats(min_value=0.05, max_value=5.0)),
    st.builds(ExponentialMechanismDpEvent, st.floats(min_value=0.05, max_value=5.0)),
    st.builds(ApproxDpEvent, st.floats(min_value=0.05, max_value=5.0), st.floats(min_value=1e-9, max_value=1e-6)),
    st.integers().map(lambda i: d.PoissonSampledDpEvent(0.5, i)),  # a non-event inside a tree
)


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.builds(d.SelfComposedDpEvent, children, _counts),
        st.builds(d.ComposedDpEvent, st.lists(children, max_size=3)),
        st.builds(d.PoissonSampledDpEvent, _probabilities, children),
    )


_events = st.recursive(_leaves, _extend, max_leaves=4)


def _snapshot(ledger: PrivacyLedger) -> dict:
    return {c: ledger.epsilon(c) for c in ("a", "b", "c")} | {None: ledger.epsilon()}


@pytest.mark.slow  # over 10 s (1 000 / 150 hypothesis examples): the full lane runs it
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    events=st.lists(
        st.tuples(
            _events, st.sampled_from(["a", "b", None]), st.sampled_from(["add_or_remove_one", "replace_one", None])
        ),
        min_size=1,
        max_size=3,
    ),
    relation=st.sampled_from(["add_or_remove_one", "replace_one"]),
)
def test_recording_never_lowers_any_epsilon_and_never_reports_nan_or_negative(events, relation):
    ledger = PrivacyLedger(1e-5, neighboring_relation=relation)
    ledger.record(d.GaussianDpEvent(4.0), server_round=0, client="a")
    ledger.record(d.LaplaceDpEvent(3.0), server_round=0, client="c")
    before = _snapshot(ledger)
    for rnd, (event, client, declared) in enumerate(events, start=1):
        try:
            ledger.record(event, server_round=rnd, client=client, neighboring_relation=declared)
        except ValueError:
            after = _snapshot(ledger)  # a refused event leaves the ledger as it was
            assert after == before
            continue
        after = _snapshot(ledger)
        for key, eps in after.items():
            assert not math.isnan(eps) and eps >= 0.0, (key, eps)
            # Adding a release can only add privacy loss (PLD discretisation: relative slack 1e-6).
            assert eps >= before[key] * (1 - 1e-6) - 1e-9, (key, before[key], eps, event)
        before = after
