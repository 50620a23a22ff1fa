"""ShuffleAmplifiedFedAvg: FedAvg's aggregate after layer shuffling, and a sound shuffle-amplified ε."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent, LaplaceDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flwr_dp_strategies import AccountedFedAvg, ShuffleAmplifiedFedAvg, declare_release
from flwr_dp_strategies.layer_shuffler import LayerShuffler
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.accounting.events import PureDpEvent
from flwr_dp_strategies.privacy.analyses.shuffle import shuffle_amplified_epsilon

import loopback
from loopback import LoopbackGrid

pytestmark = pytest.mark.usefixtures("task_identity")

KEYS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
SHAPES = ((3, 2), (3,), (1, 3), (1,))


def model(value: float = 0.0) -> ArrayRecord:
    return ArrayRecord({k: ArrayRecord([np.full(s, value, np.float32)])["0"] for k, s in zip(KEYS, SHAPES)})


def configure(strategy: AccountedFedAvg, server_round: int, n: int) -> list[Message]:
    return list(strategy.configure_train(server_round, model(), ConfigRecord(), LoopbackGrid.of(n)))


def reply_to(msg: Message, arrays: ArrayRecord, weight: float = 10.0, events=()) -> Message:
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": weight, "loss": weight / 10})})
    for event in events:
        declare_release(content, event, label="test", neighboring_relation="replace_one")
    return Message(content, reply_to=msg)


def random_arrays(gen: np.random.Generator) -> ArrayRecord:
    return ArrayRecord({k: ArrayRecord([gen.normal(size=s).astype(np.float32)])["0"] for k, s in zip(KEYS, SHAPES)})


def make(n: int, **kwargs) -> ShuffleAmplifiedFedAvg:
    return ShuffleAmplifiedFedAvg(min_train_nodes=n, min_available_nodes=n, **kwargs)


def run_round(strategy: AccountedFedAvg, rnd: int, n: int, events=(), weights=None, seed: int = 0):
    gen = np.random.default_rng(seed)
    weights = weights or [10.0] * n
    grid = LoopbackGrid.of(
        n, by_index=lambda i, m: reply_to(m, random_arrays(gen), weights[i], events) if i < len(weights) else None
    )
    return loopback.run_round(strategy, grid, model(), rnd).result


def test_aggregate_equals_fedavg_and_keeps_keys_order_and_dtype():
    n, weights = 6, [1.0, 5.0, 2.5, 10.0, 7.0, 3.0]
    shuffling = make(n, shuffler=LayerShuffler(1))
    shuffled, shuffled_metrics = run_round(shuffling, 1, n, weights=weights, seed=4)
    plain, plain_metrics = run_round(
        AccountedFedAvg(min_train_nodes=n, min_available_nodes=n), 1, n, weights=weights, seed=4
    )
    assert list(shuffled.keys()) == list(KEYS)
    for key in KEYS:
        assert shuffled[key].numpy().dtype == np.float32
        np.testing.assert_allclose(shuffled[key].numpy(), plain[key].numpy(), rtol=1e-6, atol=1e-7)
    assert shuffled_metrics["loss"] == pytest.approx(plain_metrics["loss"])
    assert shuffled_metrics["shuffle/layers"] == 2 and "shuffle/reports" not in shuffled_metrics
    assert shuffling.server_figures["train"]["shuffle/reports"] == n  # the count of reports: server log only


def test_the_shuffler_gets_layers_without_node_ids():
    seen = {}

    class Recording(LayerShuffler):
        def shuffle(self, reports, weights):
            seen["reports"], seen["weights"] = reports, weights
            return super().shuffle(reports, weights)

    n = 5
    run_round(make(n, shuffler=Recording(0)), 1, n, weights=[1.0, 2.0, 3.0, 4.0, 5.0])
    assert len(seen["reports"]) == n and seen["weights"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    layers = seen["reports"][0]
    assert [[key for key, _ in segment] for segment in layers] == [
        ["fc1.weight", "fc1.bias"],
        ["fc2.weight", "fc2.bias"],
    ]


def test_malformed_replies_are_rejected_counted_and_the_round_goes_on():
    n = 4
    strategy = make(n)
    msgs = configure(strategy, 1, n)
    bad = model(1.0)
    bad["fc1.bias"] = ArrayRecord([np.array([np.nan, 1, 1], np.float32)])["0"]
    replies = [
        reply_to(msgs[0], model(1.0)),
        reply_to(msgs[1], model(3.0)),
        reply_to(msgs[2], bad),
        reply_to(msgs[3], model(1.0), weight=-1.0),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["fc2.weight"].numpy(), np.full((1, 3), 2.0))
    assert (strategy.rejections["train"]["non-finite"], strategy.rejections["train"]["weight"]) == (1, 1)
    assert strategy.server_figures["train"]["shuffle/reports"] == 2 and "shuffle/reports" not in metrics


@pytest.mark.parametrize("event", [LaplaceDpEvent(1.0), PureDpEvent(epsilon=1.0)])
def test_ldp_reports_are_booked_as_fmt_amplified(event):
    n = 100
    strategy = make(n, reports_are_ldp=True)
    _, metrics = run_round(strategy, 1, n, events=[event])
    expected = shuffle_amplified_epsilon(1.0, n, 1e-5)
    assert metrics["shuffle/epsilon"] == pytest.approx(expected, rel=1e-9)
    assert metrics["shuffle/epsilon"] < 1.0
    assert metrics["shuffle/epsilon0"] == pytest.approx(1.0)
    assert metrics["privacy/epsilon"] == pytest.approx(1.0, rel=1e-3)  # the per-client ledger is unchanged
    assert strategy.shuffle_ledger.rounds() == [1] and strategy.shuffle_ledger.clients == []
    _, metrics2 = run_round(strategy, 2, n, events=[event])
    assert metrics2["shuffle/epsilon"] > metrics["shuffle/epsilon"]  # infinite: both rounds spend delta = target


def test_composition_over_rounds_with_a_smaller_round_delta():
    n = 100
    strategy = make(n, reports_are_ldp=True, shuffle_round_delta=1e-7)
    eps, own = [], []
    for rnd in (1, 2, 3):
        _, metrics = run_round(strategy, rnd, n, events=[PureDpEvent(epsilon=1.0)], seed=rnd)
        eps.append(metrics["shuffle/epsilon"])
        own.append(metrics["privacy/epsilon"])
    assert eps[0] < eps[1] < eps[2] < own[2]
    assert all(math.isfinite(e) for e in eps)
    assert strategy.shuffle_ledger.rounds() == [1, 2, 3]


def test_planned_rounds_split_the_target_delta_so_the_composition_stays_finite():
    n, rounds = 100, 3
    strategy = make(n, reports_are_ldp=True, planned_rounds=rounds)
    assert strategy.shuffle_round_delta == pytest.approx(1e-5 / (2 * rounds))
    eps = [
        run_round(strategy, r, n, events=[PureDpEvent(epsilon=1.0)], seed=r)[1]["shuffle/epsilon"]
        for r in range(1, rounds + 1)
    ]
    assert all(math.isfinite(e) for e in eps) and eps[0] < eps[1] < eps[2]
    booked = [event for _, event, _ in strategy.shuffle_ledger.events()]
    assert [event.delta for event in booked] == [pytest.approx(1e-5 / 6)] * rounds
    # one round's event is FMT at delta/6: a larger epsilon than at the full delta (what the default used to spend)
    assert booked[0].epsilon == pytest.approx(shuffle_amplified_epsilon(1.0, n, 1e-5 / 6), rel=1e-9)
    assert booked[0].epsilon > shuffle_amplified_epsilon(1.0, n, 1e-5)


def test_start_takes_num_rounds_as_the_planned_rounds(monkeypatch):
    from flwr_dp_strategies.rounds.template import AccountedRound  # the template owns the run

    seen = {}
    monkeypatch.setattr(
        AccountedRound, "start", lambda self, grid, arrays, num_rounds=3, *a, **k: seen.update(n=num_rounds)
    )
    strategy = make(4, reports_are_ldp=True)
    assert strategy.shuffle_round_delta == pytest.approx(1e-5)  # no plan known yet: one round at the full delta
    strategy.start(LoopbackGrid.of(4), model(), num_rounds=5)
    assert seen == {"n": 5} and strategy.planned_rounds == 5
    assert strategy.shuffle_round_delta == pytest.approx(1e-5 / 10)
    explicit = make(4, reports_are_ldp=True, shuffle_round_delta=1e-7, planned_rounds=2)
    assert explicit.shuffle_round_delta == 1e-7  # an explicit delta wins
    with pytest.raises(ValueError, match="planned_rounds"):
        make(4, planned_rounds=0)


def test_not_ldp_books_nothing_and_reports_the_clients_own_epsilon(caplog):
    n = 20
    strategy = make(n)
    with caplog.at_level(logging.INFO, logger="flwr"):
        _, metrics = run_round(strategy, 1, n, events=[LaplaceDpEvent(1.0)])
    assert strategy.shuffle_ledger.rounds() == [] and strategy.shuffle_ledger.events() == []
    assert metrics["shuffle/epsilon"] == pytest.approx(metrics["privacy/epsilon"])
    assert metrics["shuffle/epsilon0"] == pytest.approx(1.0)
    assert "reports_are_ldp=False" in caplog.text


@pytest.mark.parametrize("case", ["gaussian", "undeclared", "weights", "mixed"])
def test_what_fmt_does_not_cover_is_not_booked(case):
    n = 20
    strategy = make(n, reports_are_ldp=True)
    gen = np.random.default_rng(0)
    msgs = configure(strategy, 1, n)
    events = {"gaussian": [GaussianDpEvent(1.0)], "undeclared": []}.get(case, [PureDpEvent(epsilon=1.0)])
    replies = [
        reply_to(
            m,
            random_arrays(gen),
            10.0 + (case == "weights") * i,
            [PureDpEvent(epsilon=0.5)] if case == "mixed" and i == 0 else events,
        )
        for i, m in enumerate(msgs)
    ]
    _, metrics = strategy.aggregate_train(1, replies)
    assert strategy.shuffle_ledger.events() == []
    assert metrics["shuffle/epsilon"] == pytest.approx(metrics["privacy/epsilon"])
    if case in ("gaussian", "undeclared"):
        assert metrics["shuffle/epsilon0"] == math.inf


def test_an_unamplified_round_stops_later_booking():
    n = 20
    strategy = make(n, reports_are_ldp=True, shuffle_round_delta=1e-7)
    run_round(strategy, 1, n, events=[GaussianDpEvent(2.0)])
    _, metrics = run_round(strategy, 2, n, events=[PureDpEvent(epsilon=1.0)])
    assert strategy.shuffle_ledger.rounds() == []
    assert metrics["shuffle/epsilon"] == pytest.approx(metrics["privacy/epsilon"])


def test_paper_mode_reports_epsilon_over_m_loudly_and_never_books(caplog):
    n = 20
    strategy = make(n, amplification="paper", reports_are_ldp=True)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, metrics = run_round(strategy, 1, n, events=[PureDpEvent(epsilon=2.0)])
    assert metrics["shuffle/epsilon-paper"] == pytest.approx(2.0 / 2)
    assert metrics["shuffle/epsilon"] == pytest.approx(metrics["privacy/epsilon"])  # the sound figure
    assert strategy.shuffle_ledger.events() == []
    assert "NOT a differential-privacy bound" in caplog.text


def test_none_mode_books_nothing():
    n = 10
    strategy = make(n, amplification="none", reports_are_ldp=True)
    _, metrics = run_round(strategy, 1, n, events=[PureDpEvent(epsilon=1.0)])
    assert strategy.shuffle_ledger.events() == [] and "shuffle/epsilon-paper" not in metrics


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="amplification"):
        make(4, amplification="taylor")
    with pytest.raises(ValueError, match="replace_one"):
        make(4, shuffle_ledger=PrivacyLedger(1e-5))
    with pytest.raises(ValueError, match="shuffle_round_delta"):
        make(4, shuffle_round_delta=1e-3)
