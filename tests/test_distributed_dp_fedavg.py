"""DistributedDpFedAvg + distributed_dp_mod: the update, the noise, the ledger, dropouts, screening."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.exception import AggregationError

from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms.distributed_dp import (
    DistributedDpParams,
    calibrate_skellam,
    scale_for_bits,
    sum_headroom,
)
from flwr_dp_strategies.privacy.mechanisms.skellam import SkellamDpEvent
from flwr_dp_strategies.secure_aggregation.protocol import MASKED_RECORD, RECORD, STAGE_KEY
from flwr_dp_strategies.strategy.distributed_dp_fedavg import EVENT_LABEL, DistributedDpFedAvg

from loopback import run_round
from secagg_harness import LoopbackGrid, shifting_app

pytestmark = pytest.mark.usefixtures("task_identity")

NODES = list(range(101, 111))


def model(d: int = 60) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((d // 3, 3), np.float32)), "b": Array(np.zeros(0, np.float32))})


def test_one_round_applies_the_mean_of_the_survivors_clipped_updates_and_books_one_skellam_event():
    d, rng = 60, np.random.default_rng(0)
    deltas = {n: rng.normal(size=d) * 0.05 for n in NODES}
    deltas[101] = deltas[101] * 100  # clipped to C
    grid = LoopbackGrid(shifting_app(deltas, rng=1), NODES, die={104: "collect"})
    strategy = DistributedDpFedAvg(
        noise_multiplier=0.01, clipping_norm=1.0, bits=24, rotation_seed=3, min_survivors=0.5
    )
    _, replies, (arrays, metrics) = run_round(strategy, grid, model(d))
    survivors = [n for n in NODES if n != 104]
    clipped = [deltas[n] * min(1.0, 1.0 / np.linalg.norm(deltas[n])) for n in survivors]
    expected = np.mean(clipped, axis=0)
    got = arrays["w"].numpy().ravel()
    sizes = strategy.protocol_sizes(len(NODES))
    params, calibration = strategy.round_parameters(1, d, sizes)
    m = sizes.honest
    noise_std = math.sqrt(len(survivors) * calibration.local_mu) / params.scale / len(survivors)
    rounding = math.sqrt(len(survivors)) / params.scale / len(survivors)
    assert np.abs(got - expected).max() < 6 * (noise_std + rounding) + 1e-6  # float32 model
    assert "secagg/survivors" not in metrics and strategy.rejections["train"]["error"] == 1  # counts: log only
    assert all(set(r.content.keys()) == {RECORD, MASKED_RECORD} for r in replies if not r.has_error())
    events = strategy.ledger.events()
    assert len(events) == 1 and events[0][0] == 1 and events[0][2] == EVENT_LABEL
    event = events[0][1]
    assert isinstance(event, SkellamDpEvent)
    assert event.mu == pytest.approx((0.01 * params.rounding_bound) ** 2)
    assert calibration.local_mu == pytest.approx(event.mu / m)
    fresh = PrivacyLedger(1e-5, neighboring_relation="add_or_remove_one")
    fresh.record(event, server_round=1)
    assert metrics["privacy/epsilon"] == pytest.approx(fresh.epsilon())


@pytest.mark.parametrize("colluders", [0, 2])
def test_the_aggregate_noise_has_the_calibrated_scale(colluders):
    """Zero updates: the decoded mean is pure noise of variance n·(μ/(m − c))/(s n)² per coordinate, with
    μ = (zΔ̃₂)² fixed by z alone. With D = 4096 values the sample variance has relative s.e. √(2/D) = 2.2 %;
    the tolerance (5 s.e.) rejects a 10 % error of the noise scale (21 % in variance)."""
    d = 4096
    deltas = {n: np.zeros(d) for n in NODES}
    grid = LoopbackGrid(shifting_app(deltas, rng=7), NODES)
    strategy = DistributedDpFedAvg(
        noise_multiplier=2.0,
        clipping_norm=1.0,
        bits=30,
        rotation_seed=1,
        min_survivors=8,
        max_colluding_clients=colluders,
    )
    arrays = ArrayRecord({"w": Array(np.zeros(d, np.float64))})
    _, _, (new, _) = run_round(strategy, grid, arrays)
    sizes = strategy.protocol_sizes(len(NODES))
    params, calibration = strategy.round_parameters(1, d, sizes)
    assert sizes.honest == 8 - colluders
    assert calibration.mu == pytest.approx((2.0 * params.rounding_bound) ** 2)
    n = len(NODES)
    expected_var = n * (calibration.mu / (8 - colluders)) / (params.scale * n) ** 2
    sample_var = float(np.var(new["w"].numpy()))
    tolerance = 5 * math.sqrt(2 / d)
    assert abs(sample_var / expected_var - 1) < tolerance
    assert abs(1.21 * expected_var / sample_var - 1) > tolerance  # a 10 % larger scale would be caught
    assert abs(0.81 * expected_var / sample_var - 1) > tolerance


def test_too_few_survivors_abort_the_round_and_book_nothing():
    deltas = {n: np.full(60, 0.01) for n in NODES}
    die = {n: "collect" for n in NODES[:4]}
    grid = LoopbackGrid(shifting_app(deltas, rng=2), NODES, die=die)
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, min_survivors=0.8)
    _, _, (arrays, metrics) = run_round(strategy, grid, model())
    assert arrays is None
    assert strategy.rejections["train"]["error"] == 4 and metrics["privacy/epsilon"] == 0.0
    assert strategy.ledger.events() == []
    # the next round starts afresh
    grid.die, grid.dead = {}, set()
    _, _, (arrays, metrics) = run_round(strategy, grid, model(), server_round=2)
    assert arrays is not None and "secagg/survivors" not in metrics
    assert len(strategy.ledger.events()) == 1


def test_a_reply_with_un_noised_records_is_rejected_booked_and_the_round_goes_on():
    deltas = {n: np.full(60, 0.01) for n in NODES}

    def tamper(msg: Message, reply: Message) -> Message:
        if (
            int(msg.metadata.dst_node_id) == 102
            and not reply.has_error()
            and reply.content[RECORD].get(STAGE_KEY) == "collect"
        ):
            reply.content["metrics"] = MetricRecord({"train_loss": 0.3})
        if (
            int(msg.metadata.dst_node_id) == 103
            and not reply.has_error()
            and reply.content[RECORD].get(STAGE_KEY) == "collect"
        ):
            reply.content[MASKED_RECORD] = ArrayRecord({"vector": Array(np.zeros(3, np.uint8))})
        return reply

    grid = LoopbackGrid(shifting_app(deltas, rng=3), NODES, tamper=tamper)
    strategy = DistributedDpFedAvg(noise_multiplier=0.01, clipping_norm=1.0, min_survivors=0.5)
    _, _, (arrays, metrics) = run_round(strategy, grid, model())
    assert strategy.rejections["train"] == {"structure": 1, "secure-aggregation": 1}
    assert np.abs(arrays["w"].numpy() - 0.01).max() < 0.01
    assert math.isinf(strategy.ledger.epsilon(102))
    assert math.isfinite(strategy.ledger.epsilon(103))


def test_clients_refuse_noise_below_their_floor():
    deltas = {n: np.full(60, 0.01) for n in NODES}
    grid = LoopbackGrid(shifting_app(deltas, rng=4, min_noise_multiplier=0.5), NODES)
    strategy = DistributedDpFedAvg(noise_multiplier=0.1, clipping_norm=1.0)
    _, _, (arrays, metrics) = run_round(strategy, grid, model())
    assert arrays is None and strategy.rejections["train"]["error"] == 10
    assert any("below this client's minimum 0.5" in e for e in grid.errors)
    assert strategy.ledger.events() == []


def test_the_budget_stops_training_before_it_is_exceeded():
    deltas = {n: np.full(60, 0.01) for n in NODES}
    grid = LoopbackGrid(shifting_app(deltas, rng=5), NODES)
    strategy = DistributedDpFedAvg(
        noise_multiplier=1.0,
        clipping_norm=1.0,
        ledger=PrivacyLedger(1e-5, max_epsilon=8.0, neighboring_relation="add_or_remove_one"),
    )
    rounds = 0
    for r in range(1, 8):
        messages, _, (arrays, _) = run_round(strategy, grid, model(), server_round=r)
        if not messages:
            break
        rounds += 1
    assert 1 <= rounds < 7 and strategy.ledger.epsilon() <= 8.0
    assert strategy.budget_exhausted


def test_aggregate_before_configure_is_flowers_aggregation_error():
    with pytest.raises(AggregationError, match="configure_train"):
        DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0).aggregate_train(1, [])


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"clipping_norm": float("nan")}, "clipping_norm"),
        ({"bits": 63}, "bits"),
        ({"bits": 1}, "bits"),
        ({"num_shares": 1}, "num_shares"),
        ({"reconstruction_threshold": 1.5}, "reconstruction_threshold"),
        ({"min_survivors": 0}, "min_survivors"),
        ({"rotation_seed": -1}, "rotation_seed"),
        ({"stage_timeout": -1.0}, "stage_timeout"),
        ({"beta": 1.0}, "beta"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, name):
    base = {"noise_multiplier": 1.0, "clipping_norm": 1.0}
    with pytest.raises(ValueError, match=name):
        DistributedDpFedAvg(**{**base, **kwargs})


def test_fedavg_arguments_keep_their_order_and_meaning():
    strategy = DistributedDpFedAvg(0.5, 0.2, 3, 4, 5, noise_multiplier=1.0, clipping_norm=1.0)
    assert (
        strategy.fraction_train,
        strategy.fraction_evaluate,
        strategy.min_train_nodes,
        strategy.min_evaluate_nodes,
        strategy.min_available_nodes,
    ) == (0.5, 0.2, 3, 4, 5)
    with pytest.raises(TypeError):
        DistributedDpFedAvg(1.0, 1.0, 2, 2, 2, "num-examples", "arrays", "config", None, None, 1.0)  # noqa


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bits=st.integers(8, 40),
    z=st.floats(0.05, 20),
    n=st.integers(2, 400),
    dim=st.integers(1, 1 << 20),
    clip=st.floats(1e-3, 1e3),
)
def test_the_chosen_scale_fits_the_planned_sum_and_the_event_carries_the_rounding(bits, z, n, dim, clip):
    m = max(1, n // 2)
    try:
        scale = scale_for_bits(bits=bits, clip_norm=clip, dim=dim, n_clients=n, noise_multiplier=z, min_survivors=m)
    except ValueError as err:
        assert "bits" in str(err)
        return
    params = DistributedDpParams(dim=dim, clip_norm=clip, scale=scale, bits=bits, rotation_seed=0)
    assert (
        sum_headroom(
            scale, clip_norm=clip, padded_dim=params.padded_dim, n_clients=n, noise_multiplier=z, min_survivors=m
        )
        <= (1 << (bits - 1)) - 1
    )
    calibration = calibrate_skellam(params, noise_multiplier=z, n_clients=m)
    assert calibration.l2_sensitivity >= scale * clip  # the rounding never lowers the sensitivity
    assert calibration.effective_noise_multiplier >= z * (1 - 1e-12)


def test_the_ledger_survives_a_restart(tmp_path):
    deltas = {n: np.full(60, 0.01) for n in NODES}
    path = tmp_path / "ledger.json"

    def make(resume=False):
        return DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, ledger_path=str(path), resume=resume)

    grid = LoopbackGrid(shifting_app(deltas, rng=6), NODES)
    first = make()
    run_round(first, grid, model(), server_round=1)
    epsilon_one = first.ledger.epsilon()
    del first
    second = make(resume=True)
    assert second.ledger.epsilon() == pytest.approx(epsilon_one)
    run_round(second, grid, model(), server_round=2)
    assert len(second.ledger.events()) == 2 and second.ledger.epsilon() > epsilon_one


def test_flowers_start_runs_the_secure_rounds_and_its_timeout_bounds_every_stage(monkeypatch):
    from flwr_dp_strategies.rounds import exchange as exchange_module, template
    from flwr_dp_strategies.secure_aggregation import server_protocol

    deltas = {n: np.full(60, 0.01) for n in NODES}
    timeouts = []
    grid = LoopbackGrid(shifting_app(deltas, rng=8), NODES)

    def recording(grid, messages, timeout):
        timeouts.append(timeout)
        return exchange_module.exchange(grid, messages, timeout)

    for module in (template, server_protocol):  # every exchange of the run: the round's and each stage's
        monkeypatch.setattr(module, "exchange", recording)
    strategy = DistributedDpFedAvg(fraction_evaluate=0.0, min_evaluate_nodes=0, noise_multiplier=1.0, clipping_norm=1.0)
    result = strategy.start(grid, model(), num_rounds=2, timeout=42.0)
    assert [m["dp/noise-multiplier"] > 0 for m in result.train_metrics_clientapp.values()] == [True, True]
    assert len(strategy.ledger.events()) == 2
    assert timeouts and set(timeouts) == {42.0}  # setup, share-keys, collect and unmask alike


def test_the_budget_check_books_as_it_will_book_in_a_replace_one_ledger():
    """The event is calibrated under add/remove; a replace-one ledger books it converted (doubled
    sensitivities). The stop must use the converted event, or the last round overshoots."""
    deltas = {n: np.full(60, 0.01) for n in NODES}
    grid = LoopbackGrid(shifting_app(deltas, rng=9), NODES)
    ledger = PrivacyLedger(1e-5, max_epsilon=20.0, neighboring_relation="replace_one")
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, ledger=ledger)
    for r in range(1, 12):
        messages, _, _ = run_round(strategy, grid, model(), server_round=r)
        if not messages:
            break
    assert strategy.budget_exhausted and 1 <= len(ledger.events()) < 11
    assert ledger.epsilon() <= 20.0
    # the unconverted (add/remove) event would have allowed one more round
    _, calibration = strategy.round_parameters(1, 60, strategy.protocol_sizes(len(NODES)))
    assert not ledger.would_exceed(central_events=[calibration.event])
    assert ledger.would_exceed(central_events=[calibration.event], neighboring_relation="add_or_remove_one")


MUTATIONS = {
    "short": lambda r: r.content.__setitem__(MASKED_RECORD, ArrayRecord({"vector": Array(np.zeros(5, np.uint8))})),
    "dtype": lambda r: r.content.__setitem__(
        MASKED_RECORD, ArrayRecord({"vector": Array(r.content[MASKED_RECORD]["vector"].numpy().astype(np.float32))})
    ),
    "missing": lambda r: r.content.__delitem__(MASKED_RECORD),
    "metrics": lambda r: r.content.__setitem__("metrics", MetricRecord({"num-examples": float("nan")})),
    "stage": lambda r: r.content[RECORD].__setitem__(STAGE_KEY, "setup"),
    "extra-key": lambda r: r.content[MASKED_RECORD].__setitem__("other", Array(np.zeros(2, np.uint8))),
}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(NODES), st.sampled_from(sorted(MUTATIONS)), max_size=4))
def test_malformed_collect_replies_never_lower_or_break_the_reported_epsilon(mutated):
    """Any mix of malformed masked replies: the round goes on (or aborts cleanly), ε is the calibrated
    event's or infinite for a node that sent un-noised records, never NaN, never lower."""
    deltas = {n: np.full(60, 0.01) for n in NODES}

    def tamper(msg: Message, reply: Message) -> Message:
        node = int(msg.metadata.dst_node_id)
        if node in mutated and not reply.has_error() and reply.content[RECORD].get(STAGE_KEY) == "collect":
            MUTATIONS[mutated[node]](reply)
        return reply

    grid = LoopbackGrid(shifting_app(deltas, rng=10), NODES, tamper=tamper)
    strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, min_survivors=0.6)
    _, _, (arrays, metrics) = run_round(strategy, grid, model())
    assert metrics is not None and not math.isnan(metrics["privacy/epsilon"])
    if arrays is None:  # too few survivors: nothing booked for the round
        needed = strategy.protocol_sizes(len(NODES)).min_survivors  # max(m, t)
        assert len(NODES) - len(mutated) < needed and not strategy.ledger.events()
    else:
        assert all(np.isfinite(a.numpy()).all() for a in arrays.values())
        fresh = PrivacyLedger(1e-5, neighboring_relation="add_or_remove_one")
        fresh.record(strategy.ledger.events()[0][1], server_round=1)
        assert metrics["privacy/epsilon"] >= fresh.epsilon() * (1 - 1e-12)
    for node, kind in mutated.items():
        assert math.isinf(strategy.ledger.epsilon(node)) == (kind == "metrics")


def test_a_sum_pushed_past_the_range_by_aligned_clients_is_reported():
    """Ten clients aligned with the public rotation (each update rotates onto one coordinate, ‖Δ‖ = C) put
    10·s·C into it where the plan allows 6 standard deviations of a spread sum: the coordinate wraps.
    The round reports the share of the range the revealed sum uses and warns; a spread round does not."""
    from flwr_dp_strategies.privacy.mechanisms.distributed_dp import inverse_randomized_hadamard
    from flwr_dp_strategies.strategy.distributed_dp_fedavg import WRAP_WARNING

    d = 64
    strategy = DistributedDpFedAvg(noise_multiplier=0.01, clipping_norm=1.0, bits=20, rotation_seed=7)
    seed = strategy.rotation_seed + 1  # round 1
    aligned = inverse_randomized_hadamard(np.eye(d)[0], d, seed)
    grid = LoopbackGrid(shifting_app({n: aligned for n in NODES}, rng=12), NODES)
    arrays = ArrayRecord({"w": Array(np.zeros(d, np.float64))})
    _, _, (new, metrics) = run_round(strategy, grid, arrays)
    assert float(new["w"].numpy() @ aligned) < 0  # the truth is +1 along it: the sum wrapped
    assert metrics["secagg/peak-fraction"] > WRAP_WARNING, metrics["secagg/peak-fraction"]
    rng = np.random.default_rng(3)
    spread = {n: rng.normal(size=d) * 0.01 for n in NODES}
    calm = DistributedDpFedAvg(noise_multiplier=0.01, clipping_norm=1.0, bits=20, rotation_seed=7)
    _, _, (_, metrics) = run_round(calm, LoopbackGrid(shifting_app(spread, rng=13), NODES), arrays)
    assert metrics["secagg/peak-fraction"] < WRAP_WARNING
