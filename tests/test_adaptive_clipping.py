"""AccountedAdaptiveClipping / AccountedClientSideAdaptiveClipping (issue 18): Andrew et al. adaptive clipping.

Every test drives ``configure_train`` / ``aggregate_train`` directly with hand-made
Flower Messages (no app, no Ray) and seeded generators, so results are deterministic.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from dp_accounting import pld, rdp
from dp_accounting.dp_event import GaussianDpEvent, NonPrivateDpEvent, PoissonSampledDpEvent
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    FedAvg,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from client_mods import adaptive_clipping_mod
from loopback import LoopbackGrid, run_round
from flwr_dp_strategies import AccountedAdaptiveClipping, AccountedClientSideAdaptiveClipping
from flwr_dp_strategies.privacy import PrivacyLedger

pytestmark = pytest.mark.usefixtures("task_identity")

DELTA = 1e-5


def server(
    z: float = 0.3,
    m: int = 4,
    c0: float = 1.0,
    clipped: float = 0.5,
    lr: float = 0.2,
    sigma_b: float | None = None,
    **kwargs,
) -> AccountedAdaptiveClipping:
    """Server-side strategy; q = 1 (every one of the m nodes asked) unless ``num_clients`` says otherwise."""
    kwargs.setdefault("num_clients", m)
    return AccountedAdaptiveClipping(FedAvg(), z, m, c0, clipped, lr, sigma_b, **kwargs)


def rdp_ledger(**kwargs) -> PrivacyLedger:
    """An RDP-only ledger: long runs stay fast (PLD is checked in the accounting test)."""
    return PrivacyLedger(DELTA, accounting="rdp", **kwargs)


def reply(msg: Message, model: np.ndarray, metrics: dict | None = None) -> Message:
    content = RecordDict({"arrays": ArrayRecord([model]), "metrics": MetricRecord(metrics or {"num-examples": 1.0})})
    return Message(content, reply_to=msg)


def train_round(strategy, rnd: int, current: np.ndarray, updates, nodes: int):
    """One round: configure on a grid of ``nodes``, reply ``current + updates[i]`` to the i-th message."""
    updates = list(updates)
    # no update for the i-th message: that node stays silent (as zip(messages, updates) left it out)
    grid = LoopbackGrid.of(
        nodes, by_index=lambda i, msg: reply(msg, current + updates[i]) if i < len(updates) else None
    )
    return run_round(strategy, grid, ArrayRecord([current]), rnd).result


def along_x(norm: float, d: int = 2) -> np.ndarray:
    update = np.zeros(d)
    update[0] = norm
    return update


# ---------------------------------------------------------------------------------------------- (1) convergence
@pytest.mark.parametrize("gamma", [0.2, 0.5, 0.8])
@pytest.mark.parametrize("c0", [1e-3, 1e3])
def test_clipping_norm_converges_to_the_unclipped_gamma_quantile_from_far_below_and_above(gamma, c0):
    """Norms log-uniform on [0.1, 10]: the γ-quantile is 0.1·100^γ, with γ = 1 − target_clipped_quantile.

    Tolerance from the sample size: m = 20 replies a round, z = 1 (σ_b = m/20 = 1): the noisy fraction
    has std ≈ sqrt(1/4/20 + (1/20)²) = 0.12. With η = 0.5 and dF/dlog C = 1/ln 100 = 0.217, log C is
    an AR(1) around the quantile with std ≈ sqrt(η·0.12²/(2·0.217)) = 0.13 and correlation time
    1/(η·0.217) ≈ 9 rounds, so the mean of log C over the last 120 rounds has std ≈ 0.05; we allow 0.3
    (6 std). Flower's bugs are far outside: the wrong direction diverges, and γ taken as the clipped
    quantile lands |1 − 2γ|·ln 100 = 2.8 away for γ = 0.2, 0.8 (its median fixed point is unstable).
    """
    m, burn_in, measured = 20, 80, 120
    strategy = server(z=1.0, m=m, c0=c0, clipped=1.0 - gamma, lr=0.5, rng=7, ledger=rdp_ledger())
    norms = np.random.default_rng(8)
    current = np.zeros(2)
    logs = []
    for rnd in range(1, burn_in + measured + 1):
        updates = [along_x(r) for r in np.exp(norms.uniform(math.log(0.1), math.log(10.0), m))]
        _, metrics = train_round(strategy, rnd, current, updates, m)
        logs.append(math.log(metrics["dp/clipping-norm"]))
    target = math.log(0.1) + gamma * math.log(100.0)
    assert abs(np.mean(logs[burn_in:]) - target) < 0.3


# ---------------------------------------------------------------------------------------------- (2) model noise
def test_model_noise_std_is_z_update_times_this_rounds_c_over_m():
    """Zero updates, d = 50,000 draws in round 2 (after C moved): the noise is N(0, (z_Δ C_2/m)²) with C_2
    the norm published for round 2. A 10 % scale error, the next round's C (Flower's order: ×0.78 here),
    and the combined z instead of z_Δ are all rejected."""
    z, m, d = 0.9, 10, 50_000
    strategy = server(z=z, m=m, c0=2.0, lr=0.5, rng=3, ledger=rdp_ledger())  # σ_b = 0.5: z_Δ = 2.06
    current = np.zeros(d)
    _, first = train_round(strategy, 1, current, [np.zeros(d)] * m, m)
    arrays, second = train_round(strategy, 2, current, [np.zeros(d)] * m, m)
    c_round = second["dp/clipping-norm"]
    assert c_round == pytest.approx(first["dp/clipping-norm"] * math.exp(-0.5 * (first["dp/unclipped-fraction"] - 0.5)))
    assert c_round < 0.9 * first["dp/clipping-norm"]
    z_update = (z**-2 - (2 * 0.5) ** -2) ** -0.5
    assert strategy.update_noise_multiplier == pytest.approx(z_update)
    noise = arrays.to_numpy_ndarrays()[0]
    sigma = z_update * c_round / m
    assert stats.kstest(noise, "norm", args=(0, sigma)).pvalue > 1e-3
    for wrong in (0.9 * sigma, 1.1 * sigma, z_update * strategy.clipping_norm / m, z * c_round / m):
        assert stats.kstest(noise, "norm", args=(0, wrong)).pvalue < 1e-6


# ---------------------------------------------------------------------------------------------- (3) count noise
def test_count_noise_std_is_sigma_b_on_the_centred_count():
    """Two replies a round with equal (zero) norms, m = 20, σ_b = 1: the published fraction is
    ½ + (Σ(b_i − ½) + N(0, σ_b²))/m = 0.55 + N(0, 0.05²) (the clamp to [0, 1] is 9 std away).
    3,000 rounds: the KS statistic of a 20 % scale error (~0.048) and of the uncentred mean 0.6 (~0.38)
    are beyond the null's 1e-6 quantile (~0.045); the true law passes."""
    m, rounds = 20, 3000
    fedavg = FedAvg(fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    strategy = AccountedAdaptiveClipping(fedavg, 1.0, m, 1.0, sampling="fixed", rng=5, ledger=rdp_ledger())
    current = np.zeros(1)
    fractions = []
    for rnd in range(1, rounds + 1):
        _, metrics = train_round(strategy, rnd, current, [np.zeros(1)] * 2, 2)
        fractions.append(metrics["dp/unclipped-fraction"])
    sd = 1.0 / m
    assert stats.kstest(fractions, "norm", args=(0.55, sd)).pvalue > 1e-3
    for loc, scale in ((0.55, 0.8 * sd), (0.55, 1.25 * sd), (0.6, sd)):
        assert stats.kstest(fractions, "norm", args=(loc, scale)).pvalue < 1e-6


# ---------------------------------------------------------------------------------------------- exact round
def test_one_round_exactly_clipped_sum_over_m_unclipped_fraction_then_update():
    """Negligible noise (z = σ_b = 1e-6): norms 0.5, 0.5, 5 with C = 1 and m = 4 release (0.5+0.5+1)/4 along x,
    publish C_t = 1 and b̄ = (2 − 3/2)/4 + ½ = 0.625 (the *unclipped* count, centred), then C moves to
    exp(−η(0.625 − γ)) with γ = 1 − target_clipped_quantile = 0.7: up, since fewer are unclipped than wanted."""
    strategy = server(z=1e-6, m=4, c0=1.0, clipped=0.3, lr=0.2, sigma_b=1e-6, rng=0)
    arrays, metrics = train_round(strategy, 1, np.zeros(2), [along_x(0.5), along_x(0.5), along_x(5.0)], 4)
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], [2.0 / 4, 0.0], atol=1e-5)
    assert metrics["dp/clipping-norm"] == 1.0
    assert metrics["dp/unclipped-fraction"] == pytest.approx(0.625, abs=1e-5)
    assert strategy.clipping_norm == pytest.approx(math.exp(-0.2 * (0.625 - 0.7)), rel=1e-5)


# ---------------------------------------------------------------------------------------------- (4) accounting
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_ledger_epsilon_is_dp_accountings_for_the_composed_round_event(sampling):
    z, m, n, rounds = 0.8, 10, 100, 10  # σ_b = m/20 = 0.5: z < 2σ_b = 1
    fedavg = FedAvg(fraction_train=m / n, min_train_nodes=m, min_available_nodes=m)
    strategy = AccountedAdaptiveClipping(fedavg, z, m, sampling=sampling, rng=4)
    current = np.zeros(3)
    updates = [np.full(3, 0.05)] * n
    for rnd in range(1, rounds + 1):
        _, metrics = train_round(strategy, rnd, current, updates, n)
    event = GaussianDpEvent(z) if sampling == "fixed" else PoissonSampledDpEvent(m / n, GaussianDpEvent(z))
    assert [e for _, e, _ in strategy.ledger.events()] == [event] * rounds
    eps_rdp = rdp.RdpAccountant().compose(event, rounds).get_epsilon(DELTA)
    eps_pld = pld.PLDAccountant().compose(event, rounds).get_epsilon(DELTA)
    assert metrics["privacy/epsilon-rdp"] == pytest.approx(eps_rdp, rel=1e-9)
    assert metrics["privacy/epsilon-pld"] == pytest.approx(eps_pld, rel=1e-2)
    assert metrics["privacy/epsilon"] == pytest.approx(
        min(metrics["privacy/epsilon-rdp"], metrics["privacy/epsilon-pld"]), rel=1e-12
    )


def test_budget_stops_training_before_it_is_exceeded():
    ledger = PrivacyLedger(DELTA, max_epsilon=2.0, accounting="rdp")
    strategy = server(z=1.5, m=20, num_clients=100, ledger=ledger, rng=5)  # σ_b = 1, q = 0.2
    current, released = np.zeros(2), 0
    for rnd in range(1, 60):
        arrays, _ = train_round(strategy, rnd, current, [np.zeros(2)] * 100, 100)
        released += arrays is not None
    assert strategy.budget_exhausted and 0 < released < 59
    assert ledger.epsilon() <= 2.0
    assert list(strategy.configure_evaluate(60, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(100))) == []


def test_ledger_path_persists_and_a_restarted_server_continues_the_rounds(tmp_path):
    path = tmp_path / "ledger.json"
    first = server(m=4, rng=2, ledger_path=path)
    for rnd in (1, 2):
        train_round(first, rnd, np.zeros(2), [np.full(2, 0.1)] * 4, 4)
    eps_two = first.ledger.epsilon()
    restored = server(m=4, rng=2, ledger_path=str(path), resume=True)
    assert restored.ledger.epsilon() == pytest.approx(eps_two) and restored.round_offset == 2
    _, metrics = train_round(restored, 1, np.zeros(2), [np.full(2, 0.1)] * 4, 4)
    assert restored.ledger.rounds() == [1, 2, 3]
    assert (
        PrivacyLedger.load(path).epsilon() == pytest.approx(metrics["privacy/epsilon"])
        and metrics["privacy/epsilon"] > eps_two
    )


def test_a_restarted_server_continues_with_the_learnt_clipping_norm(tmp_path):
    """Issue 27 item 2: C is saved with the ledger (signed with it) and restored, not reset to C₀."""
    path = tmp_path / "ledger.json"
    first = server(m=4, c0=1.0, lr=0.5, rng=2, ledger_path=path)
    for rnd in (1, 2, 3):  # every update far above C: C shrinks towards the unclipped quantile... from above
        train_round(first, rnd, np.zeros(2), [along_x(0.01)] * 4, 4)
    learnt = first.clipping_norm
    assert learnt < 0.6
    del first
    restored = server(m=4, c0=1.0, lr=0.5, rng=2, ledger_path=path, resume=True)
    assert restored.clipping_norm == learnt
    _, metrics = train_round(restored, 1, np.zeros(2), [along_x(0.01)] * 4, 4)
    assert metrics["dp/clipping-norm"] == pytest.approx(learnt)  # the round released with the learnt C
    assert server(m=4, c0=1.0, ledger_path=tmp_path / "new.json").clipping_norm == 1.0  # C₀ for a new run


def test_a_restored_clipping_norm_out_of_its_domain_is_refused(tmp_path):
    from flwr_dp_strategies.privacy.accounting import ledger_file as lf

    path = tmp_path / "ledger.json"
    first = server(m=4, rng=2, ledger_path=path)
    train_round(first, 1, np.zeros(2), [along_x(0.01)] * 4, 4)
    del first
    envelope = lf.read_envelope(path)  # an unkeyed file: whoever can write it can re-checksum it (documented)
    data = lf.encode_file(
        envelope.bodies,
        None,
        run=envelope.run,
        path=envelope.path,
        generation=envelope.generation,
        state={"adaptive-clipping": {"clipping_norm": -1.0}},
    )
    path.write_bytes(data)
    mark = lf.HighWaterMark(envelope.run, envelope.path, envelope.generation, lf.decode_file(data, "", None)[1])
    (tmp_path / "ledger.json.hwm").write_bytes(lf.encode_high_water(mark, None))
    with pytest.raises(ValueError, match="clipping_norm"):
        server(m=4, rng=2, ledger_path=path, resume=True)


def test_only_noised_figures_are_published_unless_client_metrics_are_booked_non_private():
    for publish in (False, True):
        strategy = server(m=4, rng=1, publish_client_metrics=publish)
        current = np.zeros(2)
        msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(4)))
        _, metrics = strategy.aggregate_train(
            1, [reply(m, current + 0.1, {"num-examples": 3.0, "loss": 0.7}) for m in msgs]
        )
        extra = {k for k in metrics if not k.startswith("privacy/")}
        if publish:
            assert extra == {"dp/clipping-norm", "dp/unclipped-fraction", "loss"}
            assert NonPrivateDpEvent() in [e for _, e, _ in strategy.ledger.events()]
            assert metrics["privacy/epsilon"] == math.inf
        else:
            assert extra == {"dp/clipping-norm", "dp/unclipped-fraction"}
            assert 0 < metrics["privacy/epsilon"] < math.inf


# ---------------------------------------------------------------------------------------------- (5) construction
def test_z_at_or_above_twice_the_count_std_is_refused_naming_both_parameters():
    for args in ((FedAvg(), 1.0, 10), (FedAvg(), 2.0, 100, 0.1, 0.5, 0.2, 1.0)):
        with pytest.raises(ValueError, match="noise_multiplier") as err:
            AccountedAdaptiveClipping(*args)
        assert "clipped_count_stddev" in str(err.value)
        with pytest.raises(ValueError):  # Flower refuses these too
            DifferentialPrivacyServerSideAdaptiveClipping(*args)


def test_the_split_is_andrews_formula_and_survives_extreme_multipliers():
    from flwr_dp_strategies.strategy.adaptive_clipping import update_noise_multiplier

    for z, sigma_b in ((0.5, 1.0), (1.0, 5.0), (0.99, 0.5)):
        assert update_noise_multiplier(z, sigma_b) == pytest.approx((z**-2 - (2 * sigma_b) ** -2) ** -0.5, rel=1e-12)
    assert update_noise_multiplier(1e-300, 1.0) == pytest.approx(1e-300, rel=1e-12)
    assert math.isfinite(update_noise_multiplier(1.0 - 1e-12, 0.5))


def test_drop_in_binds_flowers_arguments_positionally_with_flowers_meaning():
    args = (1.0, 100, 0.3, 0.4, 0.1, 6.0)
    for ours_cls, flowers_cls in (
        (AccountedAdaptiveClipping, DifferentialPrivacyServerSideAdaptiveClipping),
        (AccountedClientSideAdaptiveClipping, DifferentialPrivacyClientSideAdaptiveClipping),
    ):
        ours, flowers = ours_cls(FedAvg(), *args), flowers_cls(FedAvg(), *args)
        assert isinstance(ours, flowers_cls)
        for name in (
            "num_sampled_clients",
            "clipping_norm",
            "target_clipped_quantile",
            "clip_norm_lr",
            "clipped_count_stddev",
        ):
            assert getattr(ours, name) == getattr(flowers, name), name
        assert ours.update_noise_multiplier == pytest.approx(flowers.noise_multiplier)  # Flower's z_Δ
        assert ours.noise_multiplier == 1.0 and ours.target_unclipped_quantile == pytest.approx(0.6)
        ours_params = list(inspect.signature(ours_cls).parameters.values())
        positional = [p.name for p in ours_params if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert positional == list(inspect.signature(flowers_cls).parameters)
    assert AccountedAdaptiveClipping(FedAvg(), 1.0, 100).clipped_count_stddev == 5.0  # m/20


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"noise_multiplier": True}, "noise_multiplier"),
        ({"num_sampled_clients": 0}, "num_sampled_clients"),
        ({"num_sampled_clients": 2.0}, "num_sampled_clients"),
        ({"initial_clipping_norm": -1.0}, "initial_clipping_norm"),
        ({"initial_clipping_norm": math.inf}, "initial_clipping_norm"),
        ({"target_clipped_quantile": 1.5}, "target_clipped_quantile"),
        ({"target_clipped_quantile": math.nan}, "target_clipped_quantile"),
        ({"clip_norm_lr": 0.0}, "clip_norm_lr"),
        ({"clip_norm_lr": math.inf}, "clip_norm_lr"),
        ({"clipped_count_stddev": -1.0}, "clipped_count_stddev"),
        ({"clipped_count_stddev": False}, "clipped_count_stddev"),
        ({"num_clients": 5}, "num_clients"),
        ({"sampling": "uniform"}, "sampling"),
        ({"per_client_metrics": 1}, "per_client_metrics"),
        ({"publish_client_metrics": "yes"}, "publish_client_metrics"),
        ({"max_weight": math.nan}, "max_weight"),
        ({"rng": -1}, "rng"),
        ({"strategy": None}, "strategy"),
        ({"ledger": "ledger.json"}, "ledger"),
        ({"ledger_path": 3}, "ledger_path"),
        ({"ledger": PrivacyLedger(DELTA, neighboring_relation="replace_one")}, "ledger"),
    ],
)
def test_every_argument_is_validated_and_named(kwargs, name):
    args = {"strategy": FedAvg(), "noise_multiplier": 0.5, "num_sampled_clients": 10, **kwargs}
    with pytest.raises((ValueError, TypeError), match=name):  # a wrong type is a TypeError
        AccountedAdaptiveClipping(**args)


def test_a_replace_one_ledger_books_the_fixed_sample_round_at_half_the_multiplier():
    ledger = PrivacyLedger(DELTA, neighboring_relation="replace_one")
    strategy = AccountedAdaptiveClipping(FedAvg(), 0.3, 4, sampling="fixed", ledger=ledger, rng=0)
    train_round(strategy, 1, np.zeros(2), [np.zeros(2)] * 4, 4)
    assert [e for _, e, _ in ledger.events()] == [GaussianDpEvent(0.15)]


def test_zero_norm_updates_do_not_crash_and_count_as_unclipped():
    strategy = server(z=1e-6, m=4, sigma_b=1e-6, rng=0)
    arrays, metrics = train_round(strategy, 1, np.ones(3), [np.zeros(3)] * 4, 4)
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.ones(3), atol=1e-5)
    assert metrics["dp/unclipped-fraction"] == pytest.approx(1.0, abs=1e-5)
    assert strategy.clipping_norm < 1.0


# ---------------------------------------------------------------------------------------------- (6) screening
def _duplicate(msg: Message, current: np.ndarray) -> Message:
    return reply(msg, current + 0.1)


BAD = {
    "non-finite": lambda msg, cur: reply(msg, np.full(2, np.nan)),
    "shape": lambda msg, cur: reply(msg, np.zeros(3)),
    "weight": lambda msg, cur: reply(msg, cur + 0.1, {"num-examples": -5.0}),
    "keys": lambda msg, cur: Message(
        RecordDict(
            {"arrays": ArrayRecord({"0": Array(cur), "x": Array(cur)}), "metrics": MetricRecord({"num-examples": 1.0})}
        ),
        reply_to=msg,
    ),
    "structure": lambda msg, cur: Message(RecordDict({"arrays": ArrayRecord([cur])}), reply_to=msg),
    "identity": _duplicate,
}


@pytest.mark.parametrize("reason", sorted(BAD))
def test_a_malformed_reply_is_rejected_counted_and_the_round_released_as_without_it(reason):
    current = np.zeros(2)
    results = []
    for with_bad in (False, True):
        strategy = server(m=4, rng=11)
        msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(4)))
        replies = [reply(msg, current + along_x(r)) for msg, r in zip(msgs[:3], (0.5, 2.0, 0.0))]
        if with_bad:
            replies.append(BAD[reason](msgs[0] if reason == "identity" else msgs[3], current))
        arrays, metrics = strategy.aggregate_train(1, replies)
        assert strategy.rejections["train"][reason] == float(with_bad)
        assert sum(strategy.rejections["train"].values()) == float(with_bad)
        assert len(strategy.ledger.events()) == 1
        results.append((arrays.to_numpy_ndarrays()[0], metrics["dp/unclipped-fraction"], strategy.clipping_norm))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert results[0][1:] == results[1][1:]


def test_evaluate_replies_are_screened():
    strategy = server(m=4, rng=0, evaluate_metrics="flower")
    msgs = list(strategy.configure_evaluate(1, ArrayRecord([np.zeros(2)]), ConfigRecord(), LoopbackGrid.of(4)))
    good = [
        Message(RecordDict({"metrics": MetricRecord({"num-examples": 1.0, "eval-acc": a})}), reply_to=m)
        for m, a in zip(msgs, (0.2, 0.4, 0.6))
    ]
    bad = Message(RecordDict({"metrics": MetricRecord({"num-examples": 1.0, "eval-acc": math.nan})}), reply_to=msgs[3])
    metrics = strategy.aggregate_evaluate(1, good + [bad])
    assert metrics["eval-acc"] == pytest.approx(0.4)
    assert strategy.rejections["evaluate"]["metrics"] == 1.0


# ---------------------------------------------------------------------------------------------- (7) client side
def _client(msg: Message, update: np.ndarray) -> Message:
    """What a ClientApp with ``adaptive_clipping_mod`` sends back for a trained update."""
    sent = msg.content["arrays"].to_numpy_ndarrays()[0]

    def app(message: Message, _context: Context) -> Message:
        return reply(message, sent + update)

    return adaptive_clipping_mod(
        msg, Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={}), app
    )


def _with_metrics(msg: Message, current: np.ndarray, update: np.ndarray, metrics: dict) -> Message:
    return reply(msg, (current + update).astype(current.dtype), {"num-examples": 1.0, **metrics})


def client_side(**kwargs) -> AccountedClientSideAdaptiveClipping:
    kwargs.setdefault("num_clients", 4)
    kwargs.setdefault("rng", 0)
    return AccountedClientSideAdaptiveClipping(FedAvg(), 1e-6, 4, 1.0, 0.3, 0.2, 1e-6, **kwargs)


def test_the_mod_clips_to_the_servers_c_and_reports_the_unclipped_bit():
    strategy = client_side()
    current = np.zeros(2, dtype=np.float32)
    msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(4)))
    assert all(m.content["config"]["clipping_norm"] == 1.0 for m in msgs)
    clipped, unclipped = _client(msgs[0], along_x(5.0)), _client(msgs[1], np.zeros(2))
    assert np.linalg.norm(clipped.content["arrays"].to_numpy_ndarrays()[0]) <= 1.0
    assert clipped.content["metrics"]["unclipped_bit"] == 0 and clipped.content["metrics"]["norm_bit"] == 1
    assert unclipped.content["metrics"]["unclipped_bit"] == 1 and unclipped.content["metrics"]["norm_bit"] == 0
    flowers = _with_metrics(msgs[2], current, along_x(0.5), {"norm_bit": 0})  # Flower's mod: not clipped
    arrays, metrics = strategy.aggregate_train(1, [clipped, unclipped, flowers])
    assert sum(strategy.rejections["train"].values()) == 0
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], [1.5 / 4, 0.0], atol=1e-5)
    assert metrics["dp/unclipped-fraction"] == pytest.approx((2 - 1.5) / 4 + 0.5, abs=1e-5)


BAD_CLIENT = {
    "bit 2": (along_x(0.5), {"unclipped_bit": 2}),
    "bit 0.5": (along_x(0.5), {"unclipped_bit": 0.5}),
    "no bit": (along_x(0.5), {}),
    "bits disagree": (along_x(0.5), {"unclipped_bit": 1, "norm_bit": 1}),
    "norm above C": (along_x(1.01), {"unclipped_bit": 1}),
}


@pytest.mark.parametrize("case", sorted(BAD_CLIENT))
def test_the_client_side_server_rejects_a_bad_bit_or_an_unclipped_update(case):
    update, bits = BAD_CLIENT[case]
    results = []
    for with_bad in (False, True):
        strategy = client_side(rng=3)
        current = np.zeros(2)
        msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(4)))
        replies = [_client(msgs[0], along_x(5.0)), _client(msgs[1], along_x(0.2))]
        if with_bad:
            replies.append(_with_metrics(msgs[2], current, update, bits))
        arrays, metrics = strategy.aggregate_train(1, replies)
        assert strategy.rejections["train"]["values"] == float(with_bad)
        results.append((arrays.to_numpy_ndarrays()[0], metrics["dp/unclipped-fraction"]))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1]


def test_a_float32_model_clipped_by_the_mod_passes_the_servers_norm_check():
    """float32 rounding of w + clipped update can exceed C(1 + 1e-6) for a small C: the mod shrinks it."""
    strategy = AccountedClientSideAdaptiveClipping(FedAvg(), 0.1, 4, 1e-4, num_clients=4, rng=0)
    current = np.random.default_rng(0).normal(size=100_000).astype(np.float32)
    msgs = list(strategy.configure_train(1, ArrayRecord([current]), ConfigRecord(), LoopbackGrid.of(4)))
    update = np.random.default_rng(1).normal(size=current.size)
    _, metrics = strategy.aggregate_train(1, [_client(m, update) for m in msgs])
    assert strategy.rejections["train"]["values"] == 0.0


# ---------------------------------------------------------------------------------------------- (8) property
@settings(database=None, deadline=None, max_examples=50)
@given(
    rounds=st.lists(st.lists(st.one_of(st.just(0.0), st.floats(1e-12, 1e12)), max_size=4), min_size=1, max_size=4),
    c0=st.floats(1e-6, 1e6),
    clipped=st.floats(0.0, 1.0),
    lr=st.floats(0.01, 5.0),
)
def test_published_c_stays_finite_and_positive_and_epsilon_never_decreases(rounds, c0, clipped, lr):
    strategy = server(z=0.3, m=4, c0=c0, clipped=clipped, lr=lr, rng=0)  # σ_b = 0.2: z < 0.4
    current, previous = np.zeros(2), 0.0
    for rnd, norms in enumerate(rounds, start=1):
        _, metrics = train_round(strategy, rnd, current, [along_x(r) for r in norms], 4)
        assert 0 < metrics["dp/clipping-norm"] < math.inf and 0 < strategy.clipping_norm < math.inf
        assert 0.0 <= metrics["dp/unclipped-fraction"] <= 1.0
        assert metrics["privacy/epsilon"] >= previous
        previous = metrics["privacy/epsilon"]


@pytest.mark.parametrize("scale", [10.0, 1e-3])  # every update exceeds C / none does
def test_flowers_own_mod_on_a_float32_model_is_reclipped_never_rejected(scale):
    """Flower's ``adaptiveclipping_mod`` clips in float32: w + clipped update rounds past C(1 + 1e-6) when
    ‖w‖ ≫ C. Such replies were rejected (11 of 40 when every update exceeds C, 0 when none does: a count
    of data-dependent events, published). Now all 40 are aggregated (re-clipped to C), and no count of
    rejected or failed replies is in the round's metrics."""
    from flwr.clientapp.mod import adaptiveclipping_mod

    n, c = 40, 0.05
    strategy = AccountedClientSideAdaptiveClipping(
        FedAvg(min_available_nodes=n), 1.0, n, c, clipped_count_stddev=2.0, num_clients=n, rng=0
    )
    current = (np.random.default_rng(0).normal(size=5_000) * 3).astype(np.float32)
    msgs = list(strategy.configure_train(1, ArrayRecord({"w": Array(current)}), ConfigRecord(), LoopbackGrid.of(n)))
    assert len(msgs) == n

    def trained(i: int):
        def call_next(msg: Message, ctxt: Context) -> Message:
            update = np.random.default_rng(100 + i).normal(size=current.size) * scale / math.sqrt(current.size)
            arrays = ArrayRecord({"w": Array((current + update).astype(np.float32))})
            return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 10})}), reply_to=msg)

        return call_next

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    replies = [adaptiveclipping_mod(m, context, trained(i)) for i, m in enumerate(msgs)]
    _, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"] == {}
    assert not any(key.startswith(("rejected/", "replies/")) for key in metrics), sorted(metrics)
