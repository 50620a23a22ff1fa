"""MinDivergenceExpSampling (seed 001 §5.3): divergence, per-layer selection, aggregation, accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.dp_event import LaplaceDpEvent, NonPrivateDpEvent, SelfComposedDpEvent
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from scipy import stats

from flwr_dp_strategies import MinDivergenceExpSampling, declare_release
from flwr_dp_strategies.privacy import ExponentialMechanismDpEvent, PrivacyLedger
from flwr_dp_strategies.strategy.min_divergence import (
    default_layer_of,
    group_layers,
    layer_divergence,
    select_low_divergence,
    selection_event,
)

from loopback import LoopbackGrid, run_round

pytestmark = pytest.mark.usefixtures("task_identity")


# ---------------------------------------------------------------------- helpers
def record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({key: Array(np.asarray(value)) for key, value in arrays.items()})


def configure(strategy: FedAvg, current: dict[str, np.ndarray], n: int, server_round: int = 1) -> list[Message]:
    return list(strategy.configure_train(server_round, record(current), ConfigRecord(), LoopbackGrid.of(n)))


def reply_to(
    msg: Message, arrays: dict[str, np.ndarray], *, weight: float = 10.0, loss: float = 0.5, event=None
) -> Message:
    content = RecordDict(
        {"arrays": record(arrays), "metrics": MetricRecord({"num-examples": float(weight), "loss": float(loss)})}
    )
    if event is not None:
        declare_release(content, event, label="test", neighboring_relation="replace_one")
    return Message(content, reply_to=msg)


def make(n: int, num_selected: int, epsilon, **kwargs) -> MinDivergenceExpSampling:
    return MinDivergenceExpSampling(
        min_train_nodes=n, min_available_nodes=n, num_selected=num_selected, epsilon=epsilon, **kwargs
    )


def brute_force_divergence(global_arrays: list[np.ndarray], reply_arrays: list[np.ndarray]) -> float:
    flips = total = 0
    for g_arr, r_arr in zip(global_arrays, reply_arrays):
        for g, r in zip(np.asarray(g_arr).ravel().tolist(), np.asarray(r_arr).ravel().tolist()):
            flips += (g < 0) != (r < 0)  # 0 (and -0.0) count as positive
            total += 1
    return flips / total


def with_flips(flips: int, size: int, value: float) -> np.ndarray:
    """``size`` entries equal to ``value`` > 0, the last ``flips`` of them negated."""
    out = np.full(size, value)
    out[size - flips :] *= -1
    return out


# ---------------------------------------------------------------------- 1. divergence (eq. 14)
def test_layer_grouping_default_and_custom():
    keys = ["fc1.weight", "fc1.bias", "conv.0.weight", "scale", "fc1.extra"]
    assert default_layer_of("fc1.weight") == "fc1" and default_layer_of("scale") == "scale"
    assert group_layers(keys) == {
        "fc1": ["fc1.weight", "fc1.bias", "fc1.extra"],
        "conv.0": ["conv.0.weight"],
        "scale": ["scale"],
    }
    assert list(group_layers(keys, lambda k: "all")) == ["all"]


def test_divergence_equals_brute_force_count_zero_is_positive():
    assert layer_divergence([np.array([0.0])], [np.array([-1e-3])]) == 1.0  # 0 -> negative: a flip
    assert layer_divergence([np.array([0.0])], [np.array([0.5])]) == 0.0  # 0 -> positive: no flip
    assert layer_divergence([np.array([-0.0])], [np.array([0.0])]) == 0.0  # -0.0 is not < 0
    assert layer_divergence([np.array([-2.0])], [np.array([0.0])]) == 1.0  # negative -> zero: a flip
    rng = np.random.default_rng(0)
    for _ in range(50):
        shapes = [(3, 4), (5,)]
        g = [rng.choice([-1.0, 0.0, 1.0], size=s) * rng.random(s) for s in shapes]
        r = [rng.choice([-1.0, 0.0, 1.0], size=s) * rng.random(s) for s in shapes]
        assert layer_divergence(g, r) == pytest.approx(brute_force_divergence(g, r), abs=1e-15)


def test_strategy_divergence_metrics_match_brute_force():
    n = 4
    rng = np.random.default_rng(1)
    current = {"l.weight": rng.normal(size=(3, 3)), "l.bias": np.array([0.0, -1.0, 2.0])}
    current["l.weight"][0, 0] = 0.0
    strategy = make(n, n, None)
    msgs = configure(strategy, current, n)
    arrays = [{k: v + rng.normal(scale=0.8, size=v.shape) for k, v in current.items()} for _ in range(n)]
    arrays[0]["l.bias"][0] = -1e-3  # global 0 -> negative: a flip
    _, metrics = strategy.aggregate_train(1, [reply_to(m, a) for m, a in zip(msgs, arrays)])
    expected = [brute_force_divergence(list(current.values()), [a[k] for k in current]) for a in arrays]
    assert strategy.server_figures["train"]["selection/mean-divergence"] == pytest.approx(np.mean(expected), abs=1e-12)
    assert metrics["selection/layers"] == 1 and strategy.server_figures["train"]["selection/candidates"] == n


# ---------------------------------------------------------------------- 2. deterministic variant
def test_epsilon_none_picks_the_k_lowest_divergences_per_layer_and_averages_them():
    n, k = 5, 2
    flips_a = [0, 3, 9, 5, 1]  # layer "a" (a.weight 8 + a.bias 2 = 10 params): lowest two are 0 and 4
    flips_b = [6, 2, 7, 0, 4]  # layer "b" (10 params): lowest two are 3 and 1
    weights = [1.0, 2.0, 3.0, 4.0, 5.0]
    current = {"a.weight": np.ones(8), "a.bias": np.ones(2), "b.weight": np.ones(10, dtype=np.float32), "c": np.ones(4)}
    arrays = []
    for i in range(n):
        a = with_flips(flips_a[i], 10, i + 1.0)
        arrays.append(
            {
                "a.weight": a[:8],
                "a.bias": a[8:],
                "b.weight": with_flips(flips_b[i], 10, i + 1.0).astype(np.float32),
                "c": np.full(4, i + 1.0),
            }
        )  # layer "c": all divergences 0 (ties)
    strategy = make(n, k, None)
    msgs = configure(strategy, current, n)
    out, metrics = strategy.aggregate_train(1, [reply_to(m, a, weight=w) for m, a, w in zip(msgs, arrays, weights)])

    def weighted_mean(key: str, picks: list[int]) -> np.ndarray:
        total = sum(weights[i] for i in picks)
        return sum(weights[i] * arrays[i][key].astype(np.float64) for i in picks) / total

    got = {key: arr.numpy() for key, arr in out.items()}
    assert list(got) == list(current)  # same keys, same order
    np.testing.assert_allclose(got["a.weight"], weighted_mean("a.weight", [0, 4]))
    np.testing.assert_allclose(got["a.bias"], weighted_mean("a.bias", [0, 4]))  # chosen with its layer, not alone
    np.testing.assert_allclose(got["b.weight"], weighted_mean("b.weight", [3, 1]), rtol=1e-6)
    np.testing.assert_allclose(got["c"], weighted_mean("c", [0, 1]))  # ties: reply order
    assert got["b.weight"].dtype == np.float32 and got["a.weight"].dtype == np.float64
    assert (
        strategy.server_figures["train"]["selection/k"] == k
        and strategy.server_figures["train"]["selection/candidates"] == n
    )
    dvg = np.array([flips_a, flips_b, [0] * n]) / 10.0
    assert strategy.server_figures["train"]["selection/mean-divergence"] == pytest.approx(dvg.mean())
    assert strategy.server_figures["train"]["selection/mean-divergence-selected"] == pytest.approx(
        (0 + 0.1 + 0 + 0.2 + 0 + 0) / 6
    )
    assert metrics["selection/epsilon"] == math.inf
    assert metrics["loss"] == pytest.approx(0.5)  # FedAvg's metrics aggregation over all accepted replies


# ---------------------------------------------------------------------- 3. exponential mechanism
def test_sampled_selection_matches_exponential_mechanism_probabilities():
    dvg = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    eps, draws = 4.0, 20_000
    rng = np.random.default_rng(12345)
    picks = np.array([select_low_divergence(dvg, 1, eps, rng)[0] for _ in range(draws)])
    counts = np.bincount(picks, minlength=dvg.size)

    def p_value(epsilon: float) -> float:
        probs = np.exp(-epsilon * dvg / 2.0)
        return stats.chisquare(counts, draws * probs / probs.sum()).pvalue

    assert p_value(eps) > 1e-3
    # Power: the same sample rejects ε off by 10 % either way (noncentrality ≈ 74 and 61 for 4 dof,
    # power > 0.9999 at level 1e-3).
    assert p_value(eps * 1.1) < 1e-3
    assert p_value(eps / 1.1) < 1e-3


def test_sampled_selection_draws_k_distinct_candidates():
    rng = np.random.default_rng(0)
    for _ in range(100):
        picks = select_low_divergence(np.linspace(0, 1, 7), 3, 2.0, rng)
        assert len(set(picks.tolist())) == 3 and picks.min() >= 0 and picks.max() < 7
    assert sorted(select_low_divergence(np.array([0.3, 0.1]), 5, 2.0, rng).tolist()) == [0, 1]


# ---------------------------------------------------------------------- 4. k = n is FedAvg
def test_selecting_every_reply_is_fedavg():
    n = 4
    rng = np.random.default_rng(2)
    current = {"fc1.weight": rng.normal(size=(3, 2)), "fc1.bias": rng.normal(size=2), "fc2.weight": rng.normal(size=5)}
    arrays = [{k: v + rng.normal(size=v.shape) for k, v in current.items()} for _ in range(n)]
    weights, losses = [3.0, 1.0, 7.0, 2.0], [0.1, 0.2, 0.3, 0.4]
    strategy = make(n, n, 2.0, rng=0)
    fedavg = FedAvg(min_train_nodes=n, min_available_nodes=n)

    def grid() -> LoopbackGrid:  # the i-th message gets the i-th prepared reply
        return LoopbackGrid.of(n, by_index=lambda i, m: reply_to(m, arrays[i], weight=weights[i], loss=losses[i]))

    ours, ours_metrics = run_round(strategy, grid(), record(current), 1).result
    theirs, theirs_metrics = run_round(fedavg, grid(), record(current), 1).result
    assert list(ours.keys()) == list(theirs.keys())
    for key in current:
        np.testing.assert_allclose(ours[key].numpy(), theirs[key].numpy(), rtol=1e-12, atol=1e-12)
    assert ours_metrics["loss"] == pytest.approx(theirs_metrics["loss"])


# ---------------------------------------------------------------------- 5. accounting
def run_rounds(
    strategy: MinDivergenceExpSampling, current: dict[str, np.ndarray], n: int, rounds: int, event=None
) -> list[MetricRecord]:
    out = []
    for rnd in range(1, rounds + 1):
        sent = dict(current)
        grid = LoopbackGrid.of(
            n, by_index=lambda i, m: reply_to(m, {k: v + 0.1 * (i + 1) for k, v in sent.items()}, event=event)
        )
        _, _, (arrays, metrics) = run_round(strategy, grid, record(current), rnd)
        current = {k: a.numpy() for k, a in arrays.items()}
        out.append(metrics)
    return out


def test_selection_ledger_composes_k_times_m_draws_per_round_and_client_ledger_is_untouched():
    n, k, eps, rounds = 4, 2, 0.5, 3
    current = {"x.w": np.ones(3), "x.b": -np.ones(2), "y.w": np.zeros(4)}
    m = 3  # layer_of below makes every key its own layer
    strategy = make(n, k, eps, rng=0, layer_of=lambda key: key)
    metrics = run_rounds(strategy, current, n, rounds, event=LaplaceDpEvent(2.0))

    expected = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    one_round = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    event = SelfComposedDpEvent(ExponentialMechanismDpEvent(eps / 2), k * m)
    one_round.record(event, server_round=1)
    for rnd in range(1, rounds + 1):
        expected.record(event, server_round=rnd)
    got = strategy.selection_ledger.epsilon()
    assert got == pytest.approx(expected.epsilon(), rel=1e-9)
    assert one_round.epsilon() < got <= rounds * k * m * eps
    assert metrics[-1]["selection/epsilon"] == pytest.approx(got, rel=1e-9)
    assert [row[2] for row in strategy.selection_ledger.events()] == ["selection"] * rounds
    assert strategy.selection_ledger.clients == []  # recorded centrally

    # The clients' ledger holds exactly what they declared (Laplace, b = 2: ε = 0.5 per round), nothing else.
    assert strategy.ledger.events(None) == []
    for client in strategy.ledger.clients:
        booked = [(ev, label) for _, ev, label in strategy.ledger.events(client)]
        assert booked == [(LaplaceDpEvent(2.0), "test")] * rounds
    declared = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    for rnd in range(1, rounds + 1):
        declared.record(LaplaceDpEvent(2.0), server_round=rnd, client="c")
    assert metrics[-1]["privacy/epsilon"] == pytest.approx(declared.epsilon(), rel=1e-9)


def test_deterministic_variant_is_booked_as_not_private():
    n = 3
    strategy = make(n, 1, None)
    metrics = run_rounds(strategy, {"w": np.ones(3)}, n, 2, event=LaplaceDpEvent(1.0))
    assert strategy.selection_ledger.epsilon() == math.inf
    assert metrics[-1]["selection/epsilon"] == math.inf
    assert [ev for _, ev, _ in strategy.selection_ledger.events()] == [NonPrivateDpEvent()] * 2
    assert math.isfinite(strategy.ledger.epsilon())


# ---------------------------------------------------------------------- 6. malformed replies
def test_malformed_replies_are_rejected_and_the_round_uses_the_valid_ones():
    n = 4
    current = {"fc.weight": np.ones(3), "fc.bias": np.ones(2)}
    strategy = make(n, 3, 1.0, rng=0)
    msgs = configure(strategy, current, n)
    good = [
        {"fc.weight": np.full(3, 2.0), "fc.bias": np.full(2, 2.0)},
        {"fc.weight": np.full(3, 4.0), "fc.bias": np.full(2, 4.0)},
    ]
    replies = [
        reply_to(msgs[0], good[0], weight=1.0),
        reply_to(msgs[1], {"fc.weight": np.array([np.nan, 1.0, 1.0]), "fc.bias": np.ones(2)}),
        reply_to(msgs[2], {"fc.weight": np.ones(4), "fc.bias": np.ones(2)}),
        reply_to(msgs[3], good[1], weight=3.0),
    ]
    out, metrics = strategy.aggregate_train(1, replies)
    assert strategy.rejections["train"]["non-finite"] == 1 and strategy.rejections["train"]["shape"] == 1
    assert strategy.server_figures["train"]["selection/candidates"] == 2
    assert (
        strategy.server_figures["train"]["selection/k"] == 2 and metrics["selection/k-requested"] == 3
    )  # fewer than k: all of them
    np.testing.assert_allclose(out["fc.weight"].numpy(), np.full(3, 3.5))  # (1·2 + 3·4) / 4
    np.testing.assert_allclose(out["fc.bias"].numpy(), np.full(2, 3.5))


def test_all_rejected_gives_no_model_and_books_no_selection():
    n = 2
    strategy = make(n, 1, 1.0, rng=0)
    msgs = configure(strategy, {"w": np.ones(2)}, n)
    out, metrics = strategy.aggregate_train(1, [reply_to(m, {"w": np.full(2, np.inf)}) for m in msgs])
    assert out is None and strategy.rejections["train"]["non-finite"] == n
    assert strategy.selection_ledger.events() == []


# ---------------------------------------------------------------------- 7. validation
@pytest.mark.parametrize("num_selected", [0, -1, 1.5, True])
def test_num_selected_is_validated(num_selected):
    with pytest.raises(ValueError, match=r"num_selected.*\[1, inf\)"):
        MinDivergenceExpSampling(num_selected=num_selected, epsilon=1.0)


@pytest.mark.parametrize("epsilon", [-1.0, 0.0, float("nan"), float("inf"), "1"])
def test_epsilon_is_validated(epsilon):
    with pytest.raises(ValueError, match=r"epsilon.*\(0, inf\)"):
        MinDivergenceExpSampling(num_selected=1, epsilon=epsilon)


# ---------------------------------------------------------------------- 8. randomness
def tie_heavy_aggregate(rng) -> np.ndarray:
    """20 replies, 12 one-key layers, every divergence 0: each layer's pick is uniform over 20 replies."""
    n, layers = 20, 12
    current = {f"l{j}": np.ones(1) for j in range(layers)}
    strategy = make(n, 1, 1.0, rng=rng)
    grid = LoopbackGrid.of(n, by_index=lambda i, m: reply_to(m, {key: np.full(1, i + 1.0) for key in current}))
    _, _, (out, _) = run_round(strategy, grid, record(current), 1)
    return np.concatenate([out[key].numpy() for key in current])


def test_default_rng_is_fresh_entropy_and_seeds_reproduce():
    # Two independent uniform picks over 20 replies in 12 layers coincide with probability 20**-12.
    assert not np.array_equal(tie_heavy_aggregate(None), tie_heavy_aggregate(None))
    np.testing.assert_array_equal(tie_heavy_aggregate(7), tie_heavy_aggregate(7))
    np.testing.assert_array_equal(
        tie_heavy_aggregate(np.random.default_rng(3)), tie_heavy_aggregate(np.random.default_rng(3))
    )


def test_selection_is_booked_at_half_epsilon_per_draw():
    """Audit: k = 5, m = 4, T = 50, ε = 1 was booked 198.5 (each draw at ε); one client moves only its own
    utility, so each draw is ε/2-DP and ε/2-bounded-range: 67.4."""
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    for rnd in range(1, 51):
        ledger.record(selection_event(1.0, 5, 4), server_round=rnd)
    assert ledger.epsilon() == pytest.approx(67.4, abs=0.1)


def test_one_changed_utility_moves_an_em_draw_by_at_most_half_epsilon():
    """Empirical check of the derivation: P ∝ exp(ε·u/2) with only u_j changed by Δ = 1 moves ln P(j)
    by ε/2 + ln(Z'/Z) ≤ ε/2 (and every other outcome by |ln Z'/Z| ≤ ε/2), not by ε."""
    eps, n, draws = 2.0, 10, 200_000
    rng = np.random.default_rng(7)
    utilities = np.zeros(n)
    neighbour = utilities.copy()
    neighbour[0] = -1.0
    gumbel = rng.gumbel(size=(2, draws, n))  # Gumbel-max: argmax(εu/2 + G) is one EM draw
    picks = [np.argmax(eps * u / 2.0 + gumbel[i], axis=1) for i, u in enumerate((utilities, neighbour))]
    p, p_neighbour = (np.mean(pk == 0) for pk in picks)
    ratio = math.log(p / p_neighbour)
    exact = eps / 2 + math.log((n - 1 + math.exp(-eps / 2)) / n)
    # Delta method: sd of ln p̂ is sqrt((1 - p)/(p·draws)); 4 sd over both terms.
    tolerance = 4 * math.sqrt((1 - p) / (p * draws) + (1 - p_neighbour) / (p_neighbour * draws))
    assert abs(ratio - exact) < tolerance
    assert exact <= eps / 2
