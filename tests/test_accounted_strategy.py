"""AccountedServerSideFixedClipping on real Flower Messages, without a running app."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg, FedMedian

import loopback
from loopback import LoopbackGrid
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.rounds.metrics import privacy_metric_record
from flwr_dp_strategies.strategy import AccountedServerSideFixedClipping

M = 4  # clients per round
Z = 0.8
C = 1.0


pytestmark = pytest.mark.usefixtures("task_identity")


def make_strategy(ledger: PrivacyLedger | None = None, **kwargs) -> AccountedServerSideFixedClipping:
    fedavg = FedAvg(min_train_nodes=M, min_available_nodes=M, min_evaluate_nodes=M)
    return AccountedServerSideFixedClipping(fedavg, Z, C, M, ledger=ledger, **kwargs)


def run_round(
    strategy, server_round: int, current: np.ndarray, updates: list[np.ndarray], weights: list[float] | None = None
):
    """configure_train -> one reply per message (model = current + update) -> aggregate_train."""
    weights = weights or [10.0] * len(updates)
    pairs = list(zip(updates, weights))

    def answer(i: int, msg: Message) -> Message | None:  # the i-th message gets the i-th update; extras stay silent
        if i >= len(pairs):
            return None
        update, w = pairs[i]
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord([current + update]),
                    "metrics": MetricRecord({"num-examples": w, "train-loss": 0.5}),
                }
            ),
            reply_to=msg,
        )

    messages, _, result = loopback.run_round(
        strategy, LoopbackGrid.of(M, by_index=answer), ArrayRecord([current]), server_round
    )
    return messages, result


def small_updates(d: int = 50) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(0.0, 1.0, d) for _ in range(M)]


def test_three_rounds_record_three_central_gaussian_events():
    strategy = make_strategy()
    current = np.zeros(50)
    epsilons = []
    for rnd in (1, 2, 3):
        messages, (arrays, metrics) = run_round(strategy, rnd, current, small_updates())
        assert len(messages) == M and arrays is not None
        assert metrics["privacy/epsilon"] == pytest.approx(strategy.ledger.epsilon())
        assert metrics["privacy/delta"] == pytest.approx(1e-5)
        assert "train-loss" not in metrics  # un-noised client metrics are not published (issue 16 C)
        epsilons.append(metrics["privacy/epsilon"])
        current = arrays.to_numpy_ndarrays()[0]
    events = strategy.ledger.events()
    assert [r for r, _, _ in events] == [1, 2, 3]
    assert all(isinstance(e, GaussianDpEvent) and e.noise_multiplier == pytest.approx(Z) for _, e, _ in events)
    assert strategy.ledger.clients == []  # central events only
    assert epsilons[0] < epsilons[1] < epsilons[2]
    assert all(math.isfinite(e) for e in epsilons)


def test_metric_values_are_floats_and_match_helper():
    ledger = PrivacyLedger(1e-5)
    ledger.record(GaussianDpEvent(1.0), server_round=1)
    record = privacy_metric_record(ledger)
    assert all(type(v) is float for v in record.values())
    assert record["privacy/epsilon"] == pytest.approx(ledger.epsilon())


def test_budget_below_one_round_sends_nothing():
    one_round = PrivacyLedger(1e-5)
    one_round.record(GaussianDpEvent(Z), server_round=1)
    strategy = make_strategy(PrivacyLedger(1e-5, max_epsilon=0.5 * one_round.epsilon()))
    messages, (arrays, metrics) = run_round(strategy, 1, np.zeros(50), small_updates())
    assert messages == [] and arrays is None and metrics is None
    assert strategy.budget_exhausted
    assert list(strategy.configure_evaluate(1, ArrayRecord([np.zeros(50)]), ConfigRecord(), LoopbackGrid.of(M))) == []
    assert strategy.ledger.events() == []


def test_budget_stops_after_the_last_affordable_round():
    two_rounds = PrivacyLedger(1e-5)
    for rnd in (1, 2):
        two_rounds.record(GaussianDpEvent(Z), server_round=rnd)
    strategy = make_strategy(PrivacyLedger(1e-5, max_epsilon=two_rounds.epsilon() * 1.01))
    released = [run_round(strategy, rnd, np.zeros(50), small_updates())[1][0] is not None for rnd in (1, 2, 3, 4)]
    assert released == [True, True, False, False]
    assert len(strategy.ledger.events()) == 2
    assert strategy.ledger.epsilon() <= strategy.ledger.max_epsilon


def test_noise_std_is_z_c_over_m():
    """Identical in-norm updates: the mean is known, the residual is the noise N(0, (zC/m)^2)."""
    d = 20_000
    update = np.full(d, 0.5 * C / math.sqrt(d))  # norm C/2: not clipped
    strategy = make_strategy(rng=12345)  # seeded: deterministic (the default draws from OS entropy)
    _, (arrays, _) = run_round(strategy, 1, np.zeros(d), [update] * M)
    residual = arrays.to_numpy_ndarrays()[0] - update
    sigma = Z * C / M
    assert abs(residual.std() - sigma) <= 3 * sigma / math.sqrt(2 * d)
    assert abs(residual.mean()) <= 4 * sigma / math.sqrt(d)


def test_updates_are_clipped_to_c():
    d = 20_000
    big = np.full(d, 10.0 * C / math.sqrt(d))  # norm 10C -> clipped to C
    strategy = make_strategy(rng=1)
    _, (arrays, _) = run_round(strategy, 1, np.zeros(d), [big] * M)
    mean = arrays.to_numpy_ndarrays()[0].mean()
    assert mean == pytest.approx(C / math.sqrt(d), abs=4 * (Z * C / M) / math.sqrt(d))


def test_missing_reply_keeps_the_fixed_denominator_and_z():
    """Fixed public denominator m: a missing client contributes nothing, the sensitivity stays C/m."""
    strategy = make_strategy()
    grid = LoopbackGrid.of(M)
    current = np.zeros(50)
    messages = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), grid))
    updates = [u * 0.01 for u in small_updates()]  # not clipped
    replies = [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord([current + u]),
                    "metrics": MetricRecord({"num-examples": 10.0, "train-loss": 0.5}),
                }
            ),
            reply_to=m,
        )
        for m, u in zip(messages[:-1], updates)
    ]  # one client never answers
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    ((_, event, _),) = strategy.ledger.events()
    assert event.noise_multiplier == pytest.approx(Z)
    residual = arrays.to_numpy_ndarrays()[0] - sum(updates[:-1]) / M
    assert np.abs(residual).max() < 6 * Z * C / M


def test_client_reported_weights_cannot_lower_the_booked_noise():
    """Audit: num-examples = 1e308 made z_eff = inf/inf = NaN and privacy/epsilon read 0.0 forever."""
    strategy = make_strategy()
    for rnd, weights in enumerate(([1e308, 1e308, 10.0, 10.0], [10.0, 10.0, 10.0, 30.0], [1e9] * M), start=1):
        _, (arrays, metrics) = run_round(strategy, rnd, np.zeros(50), small_updates(), weights=weights)
        assert all(
            math.isfinite(e.noise_multiplier) and e.noise_multiplier == pytest.approx(Z)
            for _, e, _ in strategy.ledger.events()
        )
    one_round = PrivacyLedger(1e-5)
    one_round.record(GaussianDpEvent(Z), server_round=1)
    assert strategy.ledger.epsilon() > one_round.epsilon() > 0
    assert strategy.rejections["train"]["weight"] == 0.0


def test_unequal_weights_are_averaged_uniformly_over_m():
    """D11: FedAvg's data-dependent weights would double the sensitivity; the sum over m does not use them."""
    strategy = make_strategy(rng=0)
    updates = [np.full(50, 0.01 * (i + 1)) for i in range(M)]
    _, (arrays, _) = run_round(strategy, 1, np.zeros(50), updates, weights=[10.0, 10.0, 10.0, 30.0])
    expected = sum(updates) / M
    assert np.abs(arrays.to_numpy_ndarrays()[0] - expected).max() < 6 * Z * C / M
    ((_, event, _),) = strategy.ledger.events()
    assert event.noise_multiplier == pytest.approx(Z)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(noise_multiplier=float("nan")), "noise_multiplier"),
        (dict(noise_multiplier=float("inf")), "noise_multiplier"),
        (dict(noise_multiplier=True), "noise_multiplier"),
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(clipping_norm=float("nan")), "clipping_norm"),
        (dict(clipping_norm=True), "clipping_norm"),
        (dict(num_sampled_clients=True), "num_sampled_clients"),
        (dict(num_sampled_clients=2.5), "num_sampled_clients"),
        (dict(noise_sampler="global"), "noise_sampler"),
    ],
)
def test_constructor_refuses_nan_inf_and_bool(kwargs, name):
    args = dict(noise_multiplier=Z, clipping_norm=C, num_sampled_clients=M) | kwargs
    with pytest.raises(ValueError, match=name):
        AccountedServerSideFixedClipping(
            FedAvg(),
            args["noise_multiplier"],
            args["clipping_norm"],
            args["num_sampled_clients"],
            **{k: v for k, v in args.items() if k == "noise_sampler"},
        )


def test_noise_comes_from_os_entropy_not_numpys_global_generator():
    """Audit: after np.random.seed(0) two runs released identical models (Flower's np.random helper)."""
    released = []
    for _ in range(2):
        np.random.seed(0)
        _, (arrays, _) = run_round(make_strategy(), 1, np.zeros(50), small_updates())
        released.append(arrays.to_numpy_ndarrays()[0])
    assert not np.allclose(released[0], released[1])
    np.random.seed(0)
    _, (flower, _) = run_round(make_strategy(noise_sampler="flower"), 1, np.zeros(50), small_updates())
    np.random.seed(0)
    _, (again, _) = run_round(make_strategy(noise_sampler="flower"), 1, np.zeros(50), small_updates())
    np.testing.assert_array_equal(flower.to_numpy_ndarrays()[0], again.to_numpy_ndarrays()[0])  # explicit opt-in


def test_publishing_client_metrics_is_booked_as_non_private():
    strategy = make_strategy(publish_client_metrics=True)
    _, (_, metrics) = run_round(strategy, 1, np.zeros(50), small_updates())
    assert metrics["train-loss"] == pytest.approx(0.5)
    assert strategy.ledger.epsilon() == math.inf


def test_replace_one_halves_the_recorded_noise_multiplier():
    strategy = make_strategy(PrivacyLedger(1e-5, neighboring_relation="replace_one"))
    run_round(strategy, 1, np.zeros(50), small_updates())
    ((_, event, _),) = strategy.ledger.events()
    assert event.noise_multiplier == pytest.approx(Z / 2)


def test_ledger_path_persists_and_restores(tmp_path):
    path = tmp_path / "ledger.json"
    first = make_strategy(ledger_path=str(path))
    for rnd in (1, 2):
        run_round(first, rnd, np.zeros(50), small_updates())
    assert path.exists()
    eps_two = first.ledger.epsilon()

    restored = make_strategy(ledger_path=str(path), resume=True)  # e.g. the server restarted
    assert restored.ledger.epsilon() == pytest.approx(eps_two)
    assert restored.round_offset == 2
    _, (_, metrics) = run_round(restored, 1, np.zeros(50), small_updates())
    assert restored.ledger.rounds() == [1, 2, 3]
    assert metrics["privacy/epsilon"] > eps_two
    assert PrivacyLedger.load(path).epsilon() == pytest.approx(metrics["privacy/epsilon"])


def test_client_errors_are_counted_and_the_valid_replies_released():
    """A SuperNode that dies mid-round is a missing reply: the others are released, z_eff is recorded."""
    from flwr.app import Error

    strategy = make_strategy()
    current = np.zeros(50)
    messages = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(M)))
    replies = [Message(Error(code=1, reason="boom"), reply_to=messages[0])] + [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord([current + u]),
                    "metrics": MetricRecord({"num-examples": 10.0, "train-loss": 0.5}),
                }
            ),
            reply_to=m,
        )
        for m, u in zip(messages[1:], small_updates())
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None
    assert strategy.rejections["train"]["error"] == 1
    ((_, event, _),) = strategy.ledger.events()
    assert event.noise_multiplier == pytest.approx(Z)  # fixed denominator: a missing reply changes nothing
    assert metrics["privacy/epsilon"] == pytest.approx(strategy.ledger.epsilon())


def test_all_replies_failed_release_nothing_and_record_nothing():
    from flwr.app import Error

    strategy = make_strategy()
    messages = list(strategy.configure_train(1, ArrayRecord([np.zeros(5)]), ConfigRecord(), LoopbackGrid.of(M)))
    arrays, metrics = strategy.aggregate_train(1, [Message(Error(code=1, reason="boom"), reply_to=m) for m in messages])
    assert arrays is None and strategy.rejections["train"]["error"] == M
    assert strategy.ledger.events() == []


def test_rejects_unaccountable_setups():
    with pytest.raises(ValueError, match="noise_multiplier"):
        AccountedServerSideFixedClipping(FedAvg(), 0.0, C, M)
    with pytest.raises(ValueError, match="not a function of the mean"):
        AccountedServerSideFixedClipping(FedMedian(), Z, C, M)
    AccountedServerSideFixedClipping(FedAdam(), Z, C, M)  # a server optimizer on the mean: its step after the release


def test_default_ledger():
    strategy = AccountedServerSideFixedClipping(FedAvg(), Z, C, M)
    assert strategy.ledger.target_delta == 1e-5 and strategy.ledger.max_epsilon is None


def test_secure_noise_sampler_releases_grid_points_and_books_the_discrete_gaussian():
    from dp_accounting.dp_event import ZCDpEvent

    from flwr_dp_strategies.privacy.mechanisms.discrete_gaussian import gaussian_grid

    d = 20_000
    strategy = make_strategy(noise_sampler="secure", rng=3)
    update = np.full(d, 0.5 * C / math.sqrt(d))
    _, (arrays, _) = run_round(strategy, 1, np.zeros(d), [update] * M)
    released = arrays.to_numpy_ndarrays()[0]
    residual = released - update
    sigma = Z * C / M
    assert abs(residual.std() - sigma) <= 4 * sigma / math.sqrt(2 * d)
    gamma = gaussian_grid(sigma, C * M / M)
    np.testing.assert_allclose(released / gamma, np.rint(released / gamma), atol=1e-6)
    ((_, event, _),) = strategy.ledger.events()
    assert isinstance(event, ZCDpEvent) and event.rho == pytest.approx(1 / (2 * Z * Z), rel=1e-4)
    assert event.rho >= 1 / (2 * Z * Z)
