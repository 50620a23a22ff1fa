"""PrivacyLedger: per-client and central composition, budget, persistence, metrics."""

import json
import math

import pytest
from dp_accounting import dp_event

from flwr_dp_strategies.privacy import (
    ExponentialMechanismDpEvent,
    PrivacyBudgetExceeded,
    PrivacyLedger,
    laplace_mechanism,
    privacy_metrics,
    rr_event,
)
from flwr_dp_strategies.privacy.analyses.bounds import (
    amplify_by_subsampling,
    basic_composition,
    event_epsilon_delta,
    strong_composition,
)

LAP = dp_event.LaplaceDpEvent(1.0)  # ε = 1 per release
GAUSS = dp_event.GaussianDpEvent(2.0)


def _single(event, count, **kw):
    ledger = PrivacyLedger(1e-5, **kw)
    for r in range(count):
        ledger.record(event, server_round=r)
    return ledger.report()


def test_client_epsilon_composes_central_and_own_events():
    ledger = PrivacyLedger(1e-5)
    for r in range(1, 11):
        ledger.record(GAUSS, server_round=r)  # central: every client
        ledger.record(LAP, server_round=r, client=7)  # only client 7
    ledger.record(LAP, server_round=1, client=8)
    expect_7 = PrivacyLedger(1e-5)
    for r in range(10):
        expect_7.record(GAUSS, server_round=r)
        expect_7.record(LAP, server_round=r)
    assert ledger.epsilon(7) == pytest.approx(expect_7.epsilon(), rel=1e-9)
    assert ledger.epsilon(8) < ledger.epsilon(7)
    worst = ledger.report()
    assert worst.client == "7" and worst.epsilon == ledger.epsilon(7)
    assert ledger.epsilon("unknown") == pytest.approx(_single(GAUSS, 10).epsilon)
    assert ledger.rounds(7) == list(range(1, 11)) and ledger.rounds(8) == [1]


def test_worst_case_is_max_over_clients_with_many_clients():
    ledger = PrivacyLedger(1e-5)
    for r in range(20):
        ledger.record_clients(LAP, server_round=r, clients=range(50 - r))  # client c leaves after round 49 - c
    eps = [ledger.epsilon(c) for c in range(50)]
    assert ledger.epsilon() == max(eps) == eps[0]
    assert eps == sorted(eps, reverse=True)


def test_never_reports_the_looser_accountant():
    for event, count in [(GAUSS, 50), (LAP, 30), (ExponentialMechanismDpEvent(0.5), 40)]:
        rep = _single(event, count)
        assert rep.epsilon == min(rep.epsilon_rdp, rep.epsilon_pld)
        assert _single(event, count, accounting="rdp").epsilon == pytest.approx(rep.epsilon_rdp)
        assert _single(event, count, accounting="pld").epsilon == pytest.approx(rep.epsilon_pld)


def test_accountants_are_below_textbook_bounds():
    ledger = PrivacyLedger(1e-5)
    for r in range(100):
        ledger.record(LAP, server_round=r)
    tb = ledger.textbook_bounds()
    assert tb["basic"] == pytest.approx((100.0, 0.0))
    assert ledger.epsilon() < tb["basic"][0]


def test_basic_and_strong_composition_formulas():
    assert basic_composition([(0.5, 1e-6), (0.25, 2e-6)]) == pytest.approx((0.75, 3e-6))
    eps, dlt = strong_composition(0.1, 1e-6, 100, 1e-5)
    expect = 0.1 * math.sqrt(200 * math.log(1e5)) + 100 * 0.1 * (math.e**0.1 - 1) / (math.e**0.1 + 1)
    assert eps == pytest.approx(expect) and dlt == pytest.approx(100e-6 + 1e-5)


def test_amplification_by_subsampling_formula():
    eps, dlt = amplify_by_subsampling(1.0, 1e-5, 0.01)
    assert eps == pytest.approx(math.log(1 + 0.01 * (math.e - 1)))
    assert dlt == pytest.approx(1e-7)
    # A Poisson-sampled Laplace release gets that textbook ε.
    e, _ = event_epsilon_delta(dp_event.PoissonSampledDpEvent(0.01, LAP), 1e-5)
    assert e == pytest.approx(eps)


def test_randomized_response_needs_replace_one():
    with pytest.raises(ValueError, match="replace_one"):
        PrivacyLedger(1e-5).record(rr_event(1.0, 10), server_round=1, client=1)
    ledger = PrivacyLedger(1e-6, neighboring_relation="replace_one")
    ledger.record(rr_event(1.0, 10), server_round=1, client=1)
    assert ledger.epsilon(1) == pytest.approx(1.0, abs=2e-3)


def test_budget_stops_before_it_is_exceeded():
    one = _single(LAP, 1).epsilon
    ledger = PrivacyLedger(1e-5, max_epsilon=3.5)
    rounds = 0
    while not ledger.would_exceed(central_events=[LAP]):
        ledger.record(LAP, server_round=rounds)
        rounds += 1
        assert rounds < 100
    assert ledger.epsilon() <= 3.5
    with pytest.raises(PrivacyBudgetExceeded):
        ledger.check_budget(central_events=[LAP])
    assert rounds == 3 and one == pytest.approx(1.0, abs=1e-3)
    # Planned per-client events count too, and nothing was recorded by asking.
    before = ledger.to_json()
    assert ledger.would_exceed(client_events={"5": [LAP, LAP]})
    assert ledger.to_json() == before
    assert not PrivacyLedger(1e-5).would_exceed(central_events=[LAP] * 100)


def test_json_round_trip_keeps_everything(tmp_path):
    ledger = PrivacyLedger(1e-6, max_epsilon=50.0, accounting="rdp")
    rel = laplace_mechanism([0.1, 0.2], epsilon=0.5, rng=0)
    for r in range(1, 4):
        ledger.record(rel, server_round=r, client=3, label="laplace")
        ledger.record(dp_event.PoissonSampledDpEvent(0.1, GAUSS), server_round=r)
        ledger.record(dp_event.SelfComposedDpEvent(ExponentialMechanismDpEvent(0.2), 5), server_round=r, client=4)
    path = tmp_path / "ledger.json"
    ledger.save(path)
    restored = PrivacyLedger.load(path)
    assert restored.to_json() == ledger.to_json()
    assert restored.epsilon(3) == ledger.epsilon(3) and restored.epsilon() == ledger.epsilon()
    assert restored.events(3)[0][2] == "laplace"
    # Restored ledger keeps counting.
    restored.record(LAP, server_round=4, client=3)
    assert restored.epsilon(3) > ledger.epsilon(3)


def test_json_refuses_unknown_event_types():
    data = json.loads(PrivacyLedger(1e-5).to_json())
    data["events"] = {"x": {"type": "os.system", "command": "true"}}
    with pytest.raises(ValueError, match="not a known DpEvent"):
        PrivacyLedger.from_json(json.dumps(data))


def test_metrics_helper_reports_worst_client():
    ledger = PrivacyLedger(1e-5)
    assert privacy_metrics(ledger)["privacy/epsilon"] == 0.0
    ledger.record(LAP, server_round=1, client=1)
    ledger.record(LAP, server_round=2, client=1)
    ledger.record(LAP, server_round=1, client=2)
    m = privacy_metrics(ledger)
    assert m["privacy/epsilon"] == pytest.approx(ledger.epsilon(1))
    assert m["privacy/delta"] == 1e-5 and m["privacy/clients"] == 2.0
    assert all(isinstance(v, float) for v in m.values())


def test_thousand_clients_thousand_rounds_is_cached():
    # Correctness of the cache: every client shares one composition, answered once.
    ledger = PrivacyLedger(1e-5)
    for r in range(1000):
        ledger.record_clients(GAUSS, server_round=r, clients=range(1000))
    assert ledger.epsilon() == pytest.approx(ledger.epsilon(999))
    assert ledger.epsilon() == pytest.approx(
        _single(dp_event.GaussianDpEvent(2.0 / math.sqrt(1000)), 1).epsilon, rel=1e-3
    )


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"target_delta": 0.0}, "target_delta"),
        ({"target_delta": 1.0}, "target_delta"),
        ({"max_epsilon": -1.0}, "max_epsilon"),
        ({"neighboring_relation": "swap"}, "neighboring_relation"),
        ({"accounting": "magic"}, "accounting"),
    ],
)
def test_ledger_rejects_bad_configuration(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PrivacyLedger(**kwargs)


def test_ledger_rejects_bad_records():
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match="server_round"):
        ledger.record(LAP, server_round=-1)
    with pytest.raises(ValueError, match="DpEvent"):
        ledger.record("laplace", server_round=1)


def test_shuffle_amplified_release_in_the_ledger():
    from flwr_dp_strategies.privacy import shuffle_amplified_epsilon, shuffle_amplified_event

    event = shuffle_amplified_event(1.0, 1000, 1e-6)
    eps = shuffle_amplified_epsilon(1.0, 1000, 1e-6)
    assert event.epsilon == eps and event.delta == 1e-6 and eps < 1.0
    ledger = PrivacyLedger(1e-5)
    ledger.record(event, server_round=1)
    # One (ε, 1e-6) release reported at δ = 1e-5: never more than ε.
    assert ledger.epsilon() <= eps + 1e-3
    # Ten of them compose (basic in RDP, PLD pessimistic) to at most 10ε.
    for r in range(2, 11):
        ledger.record(event, server_round=r)
    assert ledger.epsilon() <= 10 * eps + 1e-3


def test_epsilon_at_a_given_delta():
    ledger = PrivacyLedger(1e-5)
    for r in range(20):
        ledger.record(GAUSS, server_round=r, client=1)
    loose, tight = ledger.epsilon(delta=1e-3), ledger.epsilon(delta=1e-8)
    assert loose < ledger.epsilon() < tight
    assert ledger.report(1, delta=1e-3).delta == 1e-3
    with pytest.raises(ValueError, match="delta"):
        ledger.epsilon(delta=2.0)


def test_one_non_private_client_does_not_switch_off_the_published_epsilon():
    """Issue 37 item 4: the published worst case is over the clients that followed the protocol; the one at inf
    keeps its own inf, and when no client followed the protocol the figure is inf."""
    ledger = PrivacyLedger(1e-5)
    for rnd in (1, 2):
        ledger.record(dp_event.GaussianDpEvent(2.0), server_round=rnd, client="a")
        ledger.record(dp_event.GaussianDpEvent(4.0), server_round=rnd, client="b")
    honest = ledger.metrics()["privacy/epsilon"]
    assert honest == pytest.approx(ledger.epsilon("a")) and math.isfinite(honest)
    ledger.record(dp_event.NonPrivateDpEvent(), server_round=2, client="c")
    assert ledger.non_private_clients() == ["c"] and ledger.epsilon("c") == math.inf and ledger.epsilon() == math.inf
    assert ledger.metrics()["privacy/epsilon"] == pytest.approx(honest)  # before: inf for the rest of the run
    ledger.record(dp_event.GaussianDpEvent(1.0), server_round=3)  # a central event counts for everyone
    assert ledger.metrics()["privacy/epsilon"] == pytest.approx(ledger.epsilon("a"))  # a is the worst honest one
    assert ledger.epsilon("a") > honest
    alone = PrivacyLedger(1e-5)
    alone.record(dp_event.NonPrivateDpEvent(), server_round=1, client="c")
    assert alone.metrics()["privacy/epsilon"] == math.inf  # nobody followed the protocol: nobody is protected


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    bookings=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", None]), st.sampled_from([1.0, 4.0, "non-private"])),
        min_size=1,
        max_size=6,
    )
)
def test_the_published_epsilon_is_the_worst_protocol_following_client_never_nan(bookings):
    """Property: privacy/epsilon equals the worst ε among clients without a non-private booking (central events
    included), is never NaN nor above the all-client worst case, and is that worst case when no client, or every
    client, sent a non-private release."""
    ledger = PrivacyLedger(1e-5)
    for rnd, (client, what) in enumerate(bookings, 1):
        event = dp_event.NonPrivateDpEvent() if what == "non-private" else dp_event.GaussianDpEvent(what)
        if client is None and what == "non-private":
            continue  # a central non-private release makes every figure inf: not what this property is about
        ledger.record(event, server_round=rnd, client=client)
    published = ledger.metrics()["privacy/epsilon"]
    assert not math.isnan(published) and published <= ledger.epsilon()
    excluded = set(ledger.non_private_clients())
    following = [c for c in ledger.clients if c not in excluded]
    if excluded and following:
        assert published == pytest.approx(max(ledger.epsilon(c) for c in following))
    else:
        assert published == ledger.epsilon()
