"""SecureObjectiveSum + SecureObjectiveTrainer: exact sums, the noise scale, the bound, the event, dropouts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from client_mods.secure_objective import SecureObjectiveTrainer
from flwr_dp_strategies import SecureObjectiveSum
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import (
    quadratic_statistics,
    solve_objective,
    sum_statistics,
)
from flwr_dp_strategies.privacy.mechanisms.secure_objective import (
    SecureObjectiveParams,
    calibrate_secure_objective,
    client_integer_objective,
    coefficient_l2_sensitivity,
    decode_objective,
    encode_objective,
    integer_l2_sensitivity,
    objective_vector,
    planned_magnitude,
    randomized_round,
    record_l2_bound,
    record_vectors,
    sum_integer_objectives,
    vector_length,
)
from flwr_dp_strategies.privacy.mechanisms.skellam import SkellamDpEvent
from flwr_dp_strategies.secure_aggregation.protocol import MASKED_RECORD, RECORD
from flwr_dp_strategies.strategy.secure_objective_sum import EVENT_LABEL

from loopback import run_round
from secagg_harness import TEST_FLOOR, LazyRoster, LoopbackGrid

pytestmark = pytest.mark.usefixtures("task_identity")

NODES = list(range(201, 211))


def client_data(dim: int, num_classes: int, seed: int = 0, rows: int = 30):
    rng = np.random.default_rng(seed)
    return {n: (rng.normal(size=(rows, dim)), rng.integers(0, num_classes, size=rows)) for n in NODES}


def objective_app(data, num_classes: int, loss: str = "softmax") -> ClientApp:
    """A ClientApp whose node n answers with SecureObjectiveTrainer(rng=n) on data[n]."""
    app = ClientApp()
    roster = LazyRoster(len(data) + 8)
    trainers = {
        n: SecureObjectiveTrainer(
            num_classes=num_classes, loss=loss, rng=n, min_noise_multiplier=TEST_FLOOR, identity=roster
        )
        for n in data
    }

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = int(context.node_id)
        return trainers[node].train(msg, context, *data[node])

    return app


def head(dim: int, width: int) -> ArrayRecord:
    return ArrayRecord({"head.weight": Array(np.zeros((dim, width)))})


def expected_integer_sum(data, nodes, params, share, num_classes, loss="softmax"):
    """Each node's encoding replayed from its seed (the trainer draws rounding, then noise, from rng=n)."""
    return sum_integer_objectives(
        [
            encode_objective(
                quadratic_statistics(*data[n], num_classes=num_classes, loss=loss),
                params,
                local_noise_variance=share,
                rng=np.random.default_rng(n),
            )
            for n in nodes
        ],
        params,
    )


# ---------------------------------------------------------------------------- the privacy core


@settings(max_examples=60, deadline=None)
@given(
    x=arrays(np.float64, (5, 6), elements=st.floats(-1e3, 1e3)),
    y=st.lists(st.integers(0, 3), min_size=5, max_size=5),
    loss=st.sampled_from(["softmax", "logistic"]),
)
def test_no_record_vector_exceeds_the_bound_and_they_sum_to_the_objective(x, y, loss):
    c = 2 if loss == "logistic" else 4
    labels = np.array(y) % c
    phi = record_vectors(x, labels, num_classes=c, loss=loss)
    bound = record_l2_bound(c, loss)
    assert phi.shape == (5, vector_length(6, c, loss))
    assert np.all(np.linalg.norm(phi, axis=1) <= bound * (1 + 1e-12))
    assert np.all(np.abs(phi) <= 1 + 1e-12)  # the modular range rests on |φ_j| ≤ 1
    # replace-one: any two records differ by at most the replace-one sensitivity
    diffs = phi[:, None, :] - phi[None, :, :]
    assert np.all(
        np.linalg.norm(diffs, axis=2)
        <= coefficient_l2_sensitivity(c, loss=loss, neighboring_relation="replace_one") * (1 + 1e-12)
    )
    exact = objective_vector(quadratic_statistics(x, labels, num_classes=c, loss=loss))
    np.testing.assert_allclose(phi.sum(axis=0), exact, rtol=1e-10, atol=1e-9)


def test_the_bound_is_attained_by_a_basis_vector():
    phi = record_vectors(np.eye(4)[:1], np.array([0]), num_classes=3)
    assert np.linalg.norm(phi) == pytest.approx(record_l2_bound(3))


@settings(max_examples=60, deadline=None)
@given(
    y=arrays(np.float64, 50, elements=st.floats(-1e4, 1e4)),
    shift=arrays(np.float64, 50, elements=st.floats(-3, 3)),
    seed=st.integers(0, 2**32 - 1),
)
def test_coupled_roundings_of_neighbours_are_within_the_integer_sensitivity(y, shift, seed):
    """The coupling of the module docstring: same uniforms, ‖k − k′‖ < ‖y − y′‖ + √D."""
    k = randomized_round(y, np.random.default_rng(seed))
    k2 = randomized_round(y + shift, np.random.default_rng(seed))
    assert np.linalg.norm(k - k2) < np.linalg.norm(shift) + math.sqrt(y.size) + 1e-9
    assert np.all(np.abs(k - y) < 1)


def test_the_integer_sum_without_noise_is_the_sum_of_the_rounded_coefficients():
    data = client_data(6, 3)
    params = SecureObjectiveParams(dim=6, num_classes=3, loss="softmax", scale=1000.0, bits=32)
    stats = {n: quadratic_statistics(*data[n], num_classes=3) for n in NODES}
    ks = {n: client_integer_objective(stats[n], params, rng=n) for n in NODES}
    total = sum_integer_objectives([encode_objective(stats[n], params, rng=n) for n in NODES], params)
    decoded = decode_objective(total, params)
    rounded_sum = np.sum(list(ks.values()), axis=0) / params.scale
    np.testing.assert_array_equal(objective_vector(decoded)[:-1], rounded_sum[:-1])
    assert decoded.count == 30 * len(NODES)
    exact = objective_vector(sum_statistics(stats.values()))
    assert np.abs(rounded_sum - exact).max() < len(NODES) / params.scale  # each rounding within 1/s


def test_calibration_hits_the_target_epsilon_and_fits_the_range():
    for relation in ("add_or_remove_one", "replace_one"):
        cal = calibrate_secure_objective(
            dim=20,
            num_classes=10,
            max_records=60000,
            n_clients=100,
            min_survivors=80,
            epsilon=1.0,
            neighboring_relation=relation,
            bits=32,
        )
        fresh = PrivacyLedger(1e-5, neighboring_relation=relation)
        fresh.record(cal.event, server_round=1)
        assert cal.epsilon == pytest.approx(fresh.epsilon(), rel=1e-9)
        assert 1.0 - 1e-4 < cal.epsilon <= 1.0
        l2 = integer_l2_sensitivity(
            cal.params.scale, cal.params.length, coefficient_l2_sensitivity(10, neighboring_relation=relation)
        )
        assert cal.event.l2_sensitivity == pytest.approx(l2)
        assert (
            planned_magnitude(cal.params.scale, cal.mu, max_records=60000, n_clients=100, min_survivors=80) <= 2**31 - 1
        )
        assert cal.rounding_inflation < 1.01
    z = calibrate_secure_objective(
        dim=20, num_classes=10, max_records=1000, n_clients=10, min_survivors=8, noise_multiplier=2.0
    )
    assert z.mu == pytest.approx((2.0 * z.event.l2_sensitivity) ** 2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(bits=12), "bits"),
        (dict(bits=63), "bits"),
        (dict(max_records=0), "max_records"),
        (dict(epsilon=-1.0), "epsilon"),
        (dict(epsilon=None), "epsilon"),
        (dict(noise_multiplier=1.0), "epsilon"),
        (dict(min_survivors=11), "min_survivors"),
        (dict(neighboring_relation="x"), "neighboring_relation"),
        (dict(loss="hinge"), "loss"),
        (dict(num_classes=1), "num_classes"),
        (dict(dim=0), "dim"),
        (dict(overflow_sigmas=0.0), "overflow_sigmas"),
    ],
)
def test_bad_calibration_parameters_name_themselves(kwargs, name):
    args = dict(dim=20, num_classes=10, max_records=60000, n_clients=10, min_survivors=8, epsilon=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        calibrate_secure_objective(**args)


@pytest.mark.parametrize(
    "kwargs, name",
    [(dict(scale=0.0), "scale"), (dict(bits=1), "bits"), (dict(loss="logistic"), "num_classes"), (dict(dim=0), "dim")],
)
def test_bad_encoding_parameters_name_themselves(kwargs, name):
    args = dict(dim=4, num_classes=3, loss="softmax", scale=10.0, bits=20)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        SecureObjectiveParams(**args)


# ---------------------------------------------------------------------------- the strategy, with real SecAgg+


def test_one_round_reveals_exactly_the_sum_of_the_encodings_solves_it_and_books_one_central_event():
    q, c = 6, 3
    data = client_data(q, c, seed=1)
    grid = LoopbackGrid(objective_app(data, c), NODES)
    strategy = SecureObjectiveSum(num_classes=c, max_records=1000, epsilon=1.0, bits=32, min_survivors=8)
    _, replies, (arrays, metrics) = run_round(strategy, grid, head(q, c))
    assert all(set(r.content.keys()) == {RECORD, MASKED_RECORD} for r in replies)  # nothing else leaves a node
    cal = strategy.round_parameters(q, strategy.protocol_sizes(len(NODES)))
    expected = decode_objective(expected_integer_sum(data, NODES, cal.params, cal.local_mu, c), cal.params)
    np.testing.assert_array_equal(objective_vector(strategy.objective), objective_vector(expected))
    np.testing.assert_allclose(
        arrays["head.weight"].numpy(), solve_objective(expected, ridge=strategy.last_ridge), rtol=1e-12, atol=1e-12
    )
    events = strategy.ledger.events()
    assert len(events) == 1 and events[0][2] == EVENT_LABEL
    event = events[0][1]
    assert isinstance(event, SkellamDpEvent) and event == cal.add_remove_event and event.mu == pytest.approx(cal.mu)
    assert strategy.ledger.report().client is None  # central: no per-client entry
    fresh = PrivacyLedger(1e-5, neighboring_relation="add_or_remove_one")
    fresh.record(event, server_round=1)
    assert metrics["privacy/epsilon"] == pytest.approx(fresh.epsilon()) and fresh.epsilon() <= 1.0 + 1e-9
    assert "secagg/survivors" not in metrics  # survivors: server log only
    # one release only: the next round sends nothing and keeps the head
    assert list(strategy.configure_train(2, arrays, ConfigRecord(), grid)) == []
    assert len(strategy.ledger.events()) == 1


def test_the_aggregate_noise_has_the_calibrated_scale():
    """Decoded minus exact coefficients is the noise (plus rounding, variance ≤ n/(4s²), < 0.1 % of it).
    With D − 1 = 3910 coefficients the sample variance has relative s.e. √(2/3910) = 2.3 %; the
    tolerance (5 s.e. = 11 %) rejects a 10 % error of the noise scale (21 % in variance)."""
    q, c = 85, 3
    data = client_data(q, c, seed=2, rows=20)
    grid = LoopbackGrid(objective_app(data, c), NODES)
    strategy = SecureObjectiveSum(num_classes=c, max_records=500, epsilon=1.0, bits=32, min_survivors=8)
    run_round(strategy, grid, head(q, c))
    cal = strategy.round_parameters(q, strategy.protocol_sizes(len(NODES)))
    exact = sum_statistics(quadratic_statistics(*data[n], num_classes=c) for n in NODES)
    noise = (objective_vector(strategy.objective) - objective_vector(exact))[:-1]
    expected_var = len(NODES) * cal.local_mu / cal.params.scale**2
    assert noise.size == vector_length(q, c) - 1 == 3910
    tolerance = 5 * math.sqrt(2 / noise.size)
    ratio = float(np.mean(noise**2)) / expected_var
    assert abs(ratio - 1) < tolerance
    assert abs(1.21 * ratio - 1) > tolerance and abs(0.81 * ratio - 1) > tolerance  # 10 % off would be caught


def test_a_dropout_above_the_threshold_still_solves_the_survivors_objective():
    q, c = 6, 3
    data = client_data(q, c, seed=3)
    grid = LoopbackGrid(objective_app(data, c), NODES, die={205: "collect"})
    strategy = SecureObjectiveSum(num_classes=c, max_records=1000, epsilon=50.0, bits=40, min_survivors=8)
    _, _, (arrays, metrics) = run_round(strategy, grid, head(q, c))
    survivors = [n for n in NODES if n != 205]
    cal = strategy.round_parameters(q, strategy.protocol_sizes(len(NODES)))
    expected = decode_objective(expected_integer_sum(data, survivors, cal.params, cal.local_mu, c), cal.params)
    np.testing.assert_array_equal(objective_vector(strategy.objective), objective_vector(expected))
    assert strategy.rejections["train"]["error"] == 1
    assert abs(strategy.objective.count - 30 * 9) <= 1
    exact = sum_statistics(quadratic_statistics(*data[n], num_classes=c) for n in survivors)
    free = solve_objective(exact, ridge=strategy.last_ridge)
    assert np.abs(arrays["head.weight"].numpy() - free).max() < 0.05 * np.abs(free).max()
    assert len(strategy.ledger.events()) == 1


def test_too_many_dropouts_abort_and_book_nothing_then_the_next_round_solves():
    q, c = 4, 2
    data = client_data(q, c, seed=4)
    grid = LoopbackGrid(objective_app(data, c), NODES, die={n: "collect" for n in NODES[:3]})
    strategy = SecureObjectiveSum(num_classes=c, max_records=1000, epsilon=1.0, min_survivors=8)
    _, _, (arrays, _) = run_round(strategy, grid, head(q, c))
    assert arrays is None and strategy.ledger.events() == [] and strategy.head is None
    grid.die, grid.dead = {}, set()
    _, _, (arrays, _) = run_round(strategy, grid, head(q, c), server_round=2)
    assert arrays is not None and len(strategy.ledger.events()) == 1


def test_a_client_refuses_noise_below_its_floor():
    q, c = 4, 2
    data = client_data(q, c, seed=5)
    app = ClientApp()
    trainer = SecureObjectiveTrainer(num_classes=c, min_noise_multiplier=100.0)

    @app.train()
    def train(msg, context):
        return trainer.train(msg, context, *data[int(context.node_id)])

    grid = LoopbackGrid(app, NODES)
    strategy = SecureObjectiveSum(num_classes=c, max_records=1000, epsilon=1.0, min_survivors=8)
    _, _, (arrays, _) = run_round(strategy, grid, head(q, c))
    assert arrays is None and strategy.ledger.events() == []
    assert any("below this client's minimum" in e for e in grid.errors)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_classes=1), "num_classes"),
        (dict(max_records=0), "max_records"),
        (dict(epsilon=0.0), "epsilon"),
        (dict(epsilon=None), "epsilon"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(loss="hinge"), "loss"),
        (dict(loss="logistic"), "num_classes"),
        (dict(ridge=-1.0), "ridge"),
        (dict(bits=1), "bits"),
        (dict(min_survivors=0), "min_survivors"),
        (dict(psd_floor=-1.0), "psd_floor"),
        (dict(overflow_sigmas=0.0), "overflow_sigmas"),
    ],
)
def test_bad_strategy_arguments_name_the_parameter(kwargs, name):
    args = dict(num_classes=3, max_records=100, epsilon=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        SecureObjectiveSum(**args)


def test_too_few_bits_for_the_federation_name_bits():
    strategy = SecureObjectiveSum(num_classes=10, max_records=10**9, epsilon=1.0, bits=20)
    with pytest.raises(ValueError, match="bits"):
        strategy.round_parameters(50, strategy.protocol_sizes(10))


def test_fedavg_arguments_keep_their_order_and_the_extras_are_keyword_only():
    strategy = SecureObjectiveSum(0.5, 0.25, 3, 4, 5, num_classes=3, max_records=10, epsilon=1.0)
    assert (strategy.fraction_train, strategy.fraction_evaluate, strategy.min_train_nodes) == (0.5, 0.25, 3)
    with pytest.raises(TypeError):
        SecureObjectiveSum(1.0, 1.0, 2, 2, 2, "n", "arrays", "config", None, None, 3)  # type: ignore[misc]


def test_the_ledger_survives_a_restart(tmp_path):
    """The one release is booked in the file; a resumed strategy reports it and a fresh start onto the
    file is refused (it would restart from epsilon = 0)."""
    q, c = 6, 3
    grid = LoopbackGrid(objective_app(client_data(q, c, seed=4), c), NODES)
    path = str(tmp_path / "ledger.json")

    def make(**kw):
        return SecureObjectiveSum(
            num_classes=c, max_records=1000, epsilon=1.0, bits=32, min_survivors=8, ledger_path=path, **kw
        )

    first = make()
    run_round(first, grid, head(q, c))
    booked = first.ledger.epsilon()
    assert 0 < booked <= 1.0 + 1e-9
    del first
    assert make(resume=True).ledger.epsilon() == pytest.approx(booked)
    from flwr_dp_strategies.privacy.accounting.ledger_file import LedgerFileError

    with pytest.raises(LedgerFileError, match="already holds a ledger"):
        make()
