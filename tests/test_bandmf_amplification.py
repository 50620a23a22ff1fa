"""The window-allocation accountant of BandMF (privacy/accounting/bandmf_amplification.py) against independent
computations: Gauss-Hermite quadrature of the exact non-adaptive worst case (w = 2: the privacy loss lives in the
2-D span of the two candidate columns) and Monte Carlo with a confidence bound (w = 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdpa
from numpy.polynomial.hermite_e import hermegauss

from flwr_dp_strategies.privacy.accounting import bandmf_amplification as ba
from flwr_dp_strategies.privacy.accounting.events import event_from_dict, event_to_dict
from flwr_dp_strategies.privacy.mechanisms import matrix_factorization as mf


def _span(coefficients, window):
    """Coordinates a_j (w × w) of the window's candidate columns in an orthonormal basis of their span."""
    c = np.asarray(coefficients)
    length = c.size + window - 1
    columns = np.zeros((length, window))
    for j in range(window):
        columns[j : j + c.size, j] = c
    q, r = np.linalg.qr(columns)
    return r.T  # row j: coordinates of column j


def _quadrature_2d(coefficients, sigma, nodes=160, grid=None):
    """(M values, weights) under Q = N(0, σ² I) on a 2-D Gauss-Hermite grid (``grid=None``) or a uniform grid of
    ``grid`` points per axis over ±14σ (for the non-smooth hockey-stick integrands): M = P/Q of the non-adaptive
    client whose update is one unit vector (the worst case of the derivation), w = 2."""
    a = _span(coefficients, 2)
    if grid is None:
        x, wts = hermegauss(nodes)
    else:
        x = np.linspace(-14.0, 14.0, grid)
        wts = np.exp(-x * x / 2)
    wts = wts / wts.sum()
    u1, u2 = np.meshgrid(sigma * x, sigma * x, indexing="ij")
    weight = np.outer(wts, wts)
    ratios = [np.exp((a[j, 0] * u1 + a[j, 1] * u2) / sigma**2 - (a[j] @ a[j]) / (2 * sigma**2)) for j in range(2)]
    return (ratios[0] + ratios[1]) / 2, weight


@pytest.mark.parametrize("bands,sigma", [(2, 1.0), (3, 1.5), (4, 2.0)])
def test_window_two_moments_against_quadrature(bands, sigma):
    c = mf.banded_sqrt_coefficients(bands)
    m, weight = _quadrature_2d(c, sigma)
    assert abs(np.sum(weight * m) - 1.0) < 1e-9  # P is a probability
    for order in (2, 3, 5, 8):
        exact_remove = math.log(np.sum(weight * m**order))
        exact_add = math.log(np.sum(weight * m ** (1 - order)))
        remove = ba.remove_log_moment(c, 2, sigma, order)
        add = ba.add_log_moment(c, 2, sigma, order)
        assert remove == pytest.approx(exact_remove, rel=1e-7, abs=1e-9)  # exact for the non-adaptive worst case
        assert add >= exact_add - 1e-9  # a bound, never below the exact value


@pytest.mark.parametrize("bands,sigma,delta", [(2, 1.0, 1e-3), (3, 0.8, 1e-4)])
def test_booked_epsilon_is_never_below_the_exact_epsilon_of_one_cycle(bands, sigma, delta):
    """ε from the event's RDP curve at δ, against the exact hockey-stick divergence of one cycle (both directions)
    at that ε, by quadrature: the exact δ must not exceed the target δ."""
    c = mf.banded_sqrt_coefficients(bands)
    orders = np.array([1.5, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 64])
    event = ba.WindowAllocationDpEvent(sigma, 2, tuple(c))
    eps, _ = rdpa.compute_epsilon(orders, event.rdp(orders), delta)
    m, weight = _quadrature_2d(c, sigma, grid=2001)
    remove = np.sum(weight * np.maximum(m - math.exp(eps), 0.0))  # δ of P against Q at ε
    add = np.sum(weight * np.maximum(1.0 - math.exp(eps) * m, 0.0))  # δ of Q against P at ε
    assert max(remove, add) <= delta
    # and the amplified ε is below the un-amplified Gaussian's (one participation of norm 1)
    gaussian, _ = rdpa.compute_epsilon(orders, orders / (2 * sigma**2), delta)
    assert eps < gaussian


def test_window_three_against_monte_carlo():
    """w = 3: Monte Carlo (2·10⁵ draws, 5 standard errors) of the exact non-adaptive moments."""
    c, sigma, window = mf.banded_sqrt_coefficients(4), 1.5, 3
    a = _span(c, window)
    rng = np.random.default_rng(7)
    u = sigma * rng.standard_normal((200_000, window))
    m = np.mean(np.exp(u @ a.T / sigma**2 - np.sum(a * a, axis=1) / (2 * sigma**2)), axis=1)
    for order in (2, 4):
        for values, bound, equal in (
            (m**order, ba.remove_log_moment(c, window, sigma, order), True),
            (m ** (1 - order), ba.add_log_moment(c, window, sigma, order), False),
        ):
            mean, se = values.mean(), values.std() / math.sqrt(values.size)
            assert math.exp(bound) >= mean - 5 * se
            if equal:
                assert math.exp(bound) <= mean + 5 * se


def test_orthogonal_and_single_slot_cases():
    """w = 1 is the Gaussian mechanism exactly (both directions α/(2σ²)); one band (orthogonal candidates) is
    random allocation of one of w Gaussian steps: its remove moment is the multinomial sum."""
    orders = np.array([2.0, 3.0, 7.0])
    rdp = ba.window_allocation_rdp([1.0], 1, 2.0, orders)
    np.testing.assert_allclose(rdp, orders / 8.0, rtol=1e-12)
    sigma = 1.3
    direct = math.log(
        sum(math.comb(3, i) * math.exp((i * i + (3 - i) ** 2 - 3) / (2 * sigma**2)) for i in range(4)) / 8
    )
    assert ba.remove_log_moment([1.0], 2, sigma, 3) == pytest.approx(direct, rel=1e-12)


def test_monotone_in_noise_and_below_unamplified():
    c = mf.banded_sqrt_coefficients(6)
    orders = np.arange(2, 33, dtype=float)
    low, high = ba.window_allocation_rdp(c, 5, 2.0, orders), ba.window_allocation_rdp(c, 5, 3.0, orders)
    assert np.all(high < low)
    assert np.all(high <= orders / (2 * 9.0) + 1e-12)  # never above the un-amplified Gaussian (m = 1)
    assert np.isinf(ba.window_allocation_rdp(c, 5, 3.0, [64.0])[0])


def test_event_validation_and_serialisation():
    event = ba.WindowAllocationDpEvent(2.0, 3, (0.8, 0.6))
    again = event_from_dict(event_to_dict(event))
    assert again == event
    np.testing.assert_array_equal(again.rdp(np.array([2.0, 4.0])), event.rdp(np.array([2.0, 4.0])))
    with pytest.raises(ValueError, match="non-negative"):
        ba.WindowAllocationDpEvent(2.0, 3, (0.8, -0.6))
    with pytest.raises(ValueError, match="window"):
        ba.WindowAllocationDpEvent(2.0, 7, (1.0,))


def test_window_slot_is_uniform_and_keyed():
    key = bytes(range(32))
    slots = [ba.window_slot(key, node, 0, 5) for node in range(5000)]
    counts = np.bincount(slots, minlength=5)
    assert counts.min() > 900 and counts.max() < 1100
    assert ba.window_slot(key, 3, 1, 5) == ba.window_slot(key, 3, 1, 5)
    other = [ba.window_slot(bytes(32), node, 0, 5) for node in range(200)]
    assert other != slots[:200]


# ---------------------------------------------------------------------- the strategy's sampling="window-allocation"
def _window_strategy(**kwargs):
    from flwr.serverapp.strategy import FedAvg

    from flwr_dp_strategies import AccountedBandedMatrixFactorization

    kwargs.setdefault("num_rounds", 8)
    kwargs.setdefault("allocation_window", 2)
    z = kwargs.pop("z", 1.0)
    return AccountedBandedMatrixFactorization(
        FedAvg(fraction_train=1.0, min_available_nodes=1),
        z,
        1.0,
        3,
        num_bands=3,
        sampling="window-allocation",
        **kwargs,
    )


def _round(strategy, server_round, grid, d=4):
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    arrays = ArrayRecord({"w": Array(np.zeros(d, np.float32))})
    msgs = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
    replies = [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({"w": Array(np.full(d, 0.01, np.float32))}),
                    "metrics": MetricRecord({"num-examples": 5}),
                }
            ),
            reply_to=m,
        )
        for m in msgs
    ]
    strategy.aggregate_train(server_round, replies)
    return sorted(int(m.metadata.dst_node_id) for m in msgs)


@pytest.mark.usefixtures("task_identity")
def test_window_allocation_asks_each_member_once_per_cycle_in_its_window_and_books_one_event_per_cycle():
    """b = 3, w = 2: G = 2 groups, cycles of 4 releases; releases 1-2 are group 0's window, 3-4 group 1's."""
    from loopback import LoopbackGrid

    strategy = _window_strategy(rng=4, z=2.0)
    grid = LoopbackGrid.of(12)
    asked = {}
    for r in range(1, 9):
        for node in _round(strategy, r, grid):
            asked.setdefault(node, []).append(r)
    groups = strategy.participation.groups
    assert strategy.num_groups == 2 and sorted(np.bincount(list(groups.values()))) == [6, 6]
    for node, releases in asked.items():
        assert len(releases) == 2  # once per cycle
        window = [1, 2] if groups[node] == 0 else [3, 4]
        assert releases[0] in window and releases[1] - 4 in window
        assert releases[1] - releases[0] >= 3  # b-min-separation
    assert len(asked) == 12
    assert strategy.analysis() == "amplified"
    events = [event for _, event, _ in strategy.ledger.events()]
    cycle = [e for e in events if isinstance(e, ba.WindowAllocationDpEvent)]
    assert len(cycle) == 2 and cycle[0].window == 2
    orders = np.arange(2, 33, dtype=float)
    expected, _ = rdpa.compute_epsilon(orders, 2 * cycle[0].rdp(orders), strategy.ledger.target_delta)
    assert strategy.ledger.report().epsilon_rdp <= expected + 1e-9  # the ledger's orders include these


@pytest.mark.usefixtures("task_identity")
def test_window_allocation_admits_exactly_the_nodes_it_asked():
    """The rule that screens replies (admit) accepts exactly the nodes asked in the release: any other node's reply,
    of the group or not, is refused with its reason."""
    from flwr.app import Array, ArrayRecord, ConfigRecord

    from loopback import LoopbackGrid

    strategy = _window_strategy(rng=4)
    grid = LoopbackGrid.of(12)
    for r in (1, 2, 3):
        _round(strategy, r, grid)
    arrays = ArrayRecord({"w": Array(np.zeros(4, np.float32))})
    msgs = list(strategy.configure_train(4, arrays, ConfigRecord(), grid))
    asked = {int(m.metadata.dst_node_id) for m in msgs}
    release = strategy.releases + 1
    for node in strategy.participation.groups:
        reason = strategy._window_refusal(node, release)
        assert (reason is None) == (node in asked), (node, reason)
    assert asked and len(asked) < len(strategy.participation.groups)


@pytest.mark.usefixtures("task_identity")
def test_window_allocation_restart_continues_the_secret_slots(tmp_path):
    import json

    from loopback import LoopbackGrid

    def run(path, start, count, resume=False):
        strategy = _window_strategy(rng=6, ledger_path=path, resume=resume)
        grid = LoopbackGrid.of(12)
        out = [_round(strategy, r, grid) for r in range(start, start + count)]
        strategy.ledger_store.close()
        return strategy, out

    whole, straight = run(tmp_path / "a.json", 1, 8)
    _, before = run(tmp_path / "b.json", 1, 4)
    resumed, after = run(tmp_path / "b.json", 5, 4, resume=True)
    assert before + after == straight
    assert resumed.participation.to_state() == whole.participation.to_state()
    ledger = json.loads((tmp_path / "b.json").read_text())
    assert '"nodes"' not in json.dumps(ledger)  # the sample is in the secret file only


def test_window_allocation_arguments():
    with pytest.raises(ValueError, match="allocation_window"):
        _window_strategy(allocation_window=None)
    with pytest.raises(ValueError, match="allocation_window"):
        _window_strategy(allocation_window=7)
    from flwr.serverapp.strategy import FedAvg

    from flwr_dp_strategies import AccountedBandedMatrixFactorization

    with pytest.raises(ValueError, match="allocation_window"):
        AccountedBandedMatrixFactorization(FedAvg(), 1.0, 1.0, 3, num_bands=3, num_rounds=6, allocation_window=2)


@pytest.mark.usefixtures("task_identity")
def test_window_allocation_counts_a_node_when_asked_so_the_cap_bounds_its_cycles():
    """k = 1 over 3 cycles: a node is asked once in the run even when it does not reply (it cannot keep its cap for a
    later cycle), so one cycle event is booked, not three."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    from loopback import LoopbackGrid

    strategy = _window_strategy(rng=5, num_rounds=12, max_participations=1)
    grid = LoopbackGrid.of(12)
    arrays = ArrayRecord({"w": Array(np.zeros(4, np.float32))})
    asked = []
    for r in range(1, 13):
        msgs = list(strategy.configure_train(r, arrays, ConfigRecord(), grid))
        asked += [int(m.metadata.dst_node_id) for m in msgs]
        update = ArrayRecord({"w": Array(np.full(4, 0.01, np.float32))})
        replies = [
            Message(RecordDict({"arrays": update, "metrics": MetricRecord({"num-examples": 5})}), reply_to=m)
            for m in msgs[::2]  # every other asked node does not reply
        ]
        strategy.aggregate_train(r, replies)
    assert sorted(asked) == sorted(strategy.participation.groups)  # each node asked exactly once
    assert all(count == 1 for count in strategy.participation.counts.values())
    assert strategy.analysis() == "amplified"
    cycle = [e for _, e, _ in strategy.ledger.events() if isinstance(e, ba.WindowAllocationDpEvent)]
    assert len(cycle) == 1


def _exact_cycle_pld(coefficients, sigma, discretization=1e-2, grid=601):
    """The privacy loss distribution of one cycle (w = 2) of the non-adaptive worst-case client, from a 2-D grid:
    losses rounded up to the discretisation and the mass outside the grid put at +∞ (pessimistic up to the grid's
    quadrature). An attack, so every sound accountant's ε must be at least its ε."""
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution

    m, weight = _quadrature_2d(coefficients, sigma, grid=grid)
    loss = np.log(m).ravel()
    q = weight.ravel()
    p = q * m.ravel()

    def pmf(losses, probs):
        keys = np.ceil(losses / discretization).astype(np.int64)
        sums = np.bincount(keys - keys.min(), weights=probs)
        table = {int(k) + int(keys.min()): float(v) for k, v in enumerate(sums) if v > 0}
        return pld_pmf.create_pmf(table, discretization, max(0.0, 1.0 - float(probs.sum())), True)

    return privacy_loss_distribution.PrivacyLossDistribution(pmf(loss, p), pmf(-loss, q))


@pytest.mark.parametrize("bands,sigma,cycles", [(2, 1.5, 4), (3, 2.0, 8)])
def test_booked_epsilon_of_several_cycles_is_never_below_the_exact_composition(bands, sigma, cycles):
    """n cycles: the booked RDP ε against the exact PLD of the worst non-adaptive client composed n times."""
    c = mf.banded_sqrt_coefficients(bands)
    orders = np.array([1.5, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 64])
    booked, _ = rdpa.compute_epsilon(orders, cycles * ba.WindowAllocationDpEvent(sigma, 2, tuple(c)).rdp(orders), 1e-5)
    exact = _exact_cycle_pld(c, sigma).self_compose(cycles).get_epsilon_for_delta(1e-5)
    assert booked >= exact
    assert booked <= 1.5 * exact  # and not vacuous
