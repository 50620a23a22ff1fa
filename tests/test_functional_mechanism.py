"""Functional mechanism: Taylor coefficients, sensitivity bounds, noise scale, PSD repair, the trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dp_accounting.dp_event import GaussianDpEvent, LaplaceDpEvent, NoOpDpEvent
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from scipy import stats as st

from client_mods import FunctionalMechanismTrainer
from flwr_dp_strategies import read_declarations
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import (
    descend,
    fm_l2_sensitivity,
    fm_sensitivity,
    functional_mechanism,
    quadratic_statistics,
    released_vector,
    repair_psd,
    smooth_step_size,
    taylor_gradient,
    taylor_objective,
)

RNG = np.random.default_rng(7)


def unit_rows(n: int, q: int, rng=RNG) -> np.ndarray:
    x = rng.normal(size=(n, q))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.2, 1.0, size=(n, 1))


def exact_taylor(x: np.ndarray, y: np.ndarray, c: int, w: np.ndarray, loss: str) -> float:
    """Σ_i [L(0) + ∇L(0)·w + ½ wᵀ ∇²L(0) w] of the exact loss, by torch autograd."""
    total = 0.0
    flat = torch.zeros(w.size, dtype=torch.float64)
    for xi, yi in zip(torch.from_numpy(x), torch.from_numpy(y)):

        def f(v, xi=xi, yi=yi):
            s = xi @ v.reshape(w.shape)
            if loss == "logistic":
                return torch.nn.functional.binary_cross_entropy_with_logits(s[0], yi.double())
            return torch.nn.functional.cross_entropy(s[None, :], yi[None])

        g = torch.autograd.functional.jacobian(f, flat).numpy()
        h = torch.autograd.functional.hessian(f, flat).numpy()
        total += float(f(flat)) + g @ w.ravel() + 0.5 * w.ravel() @ h @ w.ravel()
    return total


@pytest.mark.parametrize("loss,c", [("softmax", 4), ("logistic", 2)])
def test_coefficients_equal_the_taylor_expansion(loss, c):
    x, y = unit_rows(12, 3), RNG.integers(0, c, 12)
    stats = quadratic_statistics(x, y, num_classes=c, loss=loss)
    w = RNG.normal(size=stats.linear.shape)
    assert taylor_objective(stats, w) == pytest.approx(exact_taylor(x, y, c, w, loss), rel=1e-10)
    # the gradient is the objective's: central differences
    eps, grad = 1e-6, np.zeros_like(w)
    for idx in np.ndindex(w.shape):
        step = np.zeros_like(w)
        step[idx] = eps
        grad[idx] = (taylor_objective(stats, w + step) - taylor_objective(stats, w - step)) / (2 * eps)
    np.testing.assert_allclose(taylor_gradient(stats, w), grad, rtol=1e-5, atol=1e-7)


def released(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    q = x.size
    rows, cols = np.triu_indices(q)
    return np.concatenate([np.outer(x, r).ravel(), np.outer(x, x)[rows, cols]])


def response(c: int, label: int) -> np.ndarray:
    r = np.full(c, 1.0 / c)
    r[label] -= 1.0
    return r


def adversarial_pairs(q: int, c: int, rng) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    flat = np.ones(q) / math.sqrt(q)
    e1, e2 = np.eye(q)[0], np.eye(q)[1]
    signs = np.where(np.arange(q) % 2, -1.0, 1.0) / math.sqrt(q)
    pairs = [
        (flat, response(c, 0), -flat, response(c, 0)),
        (flat, response(c, 0), signs, response(c, 1)),
        (e1, response(c, 0), e2, response(c, 1)),
        (flat, response(c, 0), np.zeros(q), response(c, 1)),
    ]
    for _ in range(400):
        a, b = unit_rows(2, q, rng)
        a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
        pairs.append((a, response(c, rng.integers(c)), b, response(c, rng.integers(c))))
    return pairs


def hill_climb(q: int, c: int, rng, steps: int = 300) -> float:
    """A local search for the replace-one L1 maximum, from flat opposite-sign rows."""
    x, xp = np.ones(q) / math.sqrt(q), np.where(np.arange(q) % 2, -1.0, 1.0) / math.sqrt(q)
    r, rp = response(c, 0), response(c, 1)
    best = np.abs(released(x, r) - released(xp, rp)).sum()
    for _ in range(steps):
        cand = [v + rng.normal(scale=0.05, size=q) for v in (x, xp)]
        cand = [v / np.linalg.norm(v) for v in cand]
        value = np.abs(released(cand[0], r) - released(cand[1], rp)).sum()
        if value > best:
            best, (x, xp) = value, cand
    return best


@pytest.mark.parametrize("q,c", [(2, 2), (5, 3), (12, 10)])
def test_sensitivity_bounds_hold_on_adversarial_rows(q, c):
    rng = np.random.default_rng(q * 100 + c)
    l1_rep = fm_sensitivity(q, c, neighboring_relation="replace_one")
    l1_add = fm_sensitivity(q, c, neighboring_relation="add_or_remove_one")
    l2_rep = fm_l2_sensitivity(c, neighboring_relation="replace_one")
    l2_add = fm_l2_sensitivity(c, neighboring_relation="add_or_remove_one")
    worst_l1 = worst_l2 = 0.0
    for a, ra, b, rb in adversarial_pairs(q, c, rng):
        diff = released(a, ra) - released(b, rb)
        worst_l1, worst_l2 = max(worst_l1, np.abs(diff).sum()), max(worst_l2, np.linalg.norm(diff))
        assert np.abs(released(a, ra)).sum() <= l1_add + 1e-9
        assert np.linalg.norm(released(a, ra)) <= l2_add + 1e-9
    worst_l1 = max(worst_l1, hill_climb(q, c, rng))
    assert worst_l1 <= l1_rep + 1e-9 and worst_l2 <= l2_rep + 1e-9
    # tightness: the flat row attains the add/remove bound exactly; replace-one is within 25 %
    flat = np.ones(q) / math.sqrt(q)
    assert np.abs(released(flat, response(c, 0))).sum() == pytest.approx(l1_add)
    assert worst_l1 >= 0.75 * l1_rep
    assert np.linalg.norm(released(np.eye(q)[0], response(c, 0))) == pytest.approx(l2_add)
    # the paper's bound (|x_j| <= 1 only) is larger here (softmax) ...
    assert fm_sensitivity(q, c, calibration="paper") >= l1_rep


def residuals(noise: str, epsilon: float, draws: int = 600) -> tuple[np.ndarray, float]:
    x, y = unit_rows(50, 8), RNG.integers(0, 5, 50)
    exact = quadratic_statistics(x, y, num_classes=5)
    rng = np.random.default_rng(11)
    res = [
        released_vector(functional_mechanism(exact, epsilon=epsilon, noise=noise, rng=rng).value)
        - released_vector(exact)
        for _ in range(draws)
    ]
    return np.concatenate(res), exact.dim


def test_laplace_noise_scale_is_delta_over_epsilon_and_10_percent_off_is_detected():
    res, q = residuals("laplace", 2.0)
    b = fm_sensitivity(q, 5) / 2.0
    assert st.kstest(res, "laplace", args=(0, b)).pvalue > 1e-3
    for wrong in (0.9 * b, 1.1 * b):
        assert st.kstest(res, "laplace", args=(0, wrong)).pvalue < 1e-6


def test_gaussian_noise_scale_matches_the_analytic_sigma():
    from flwr_dp_strategies.privacy import gaussian_sigma

    res, _ = residuals("gaussian", 1.0)
    sigma = gaussian_sigma(1.0, 1e-5, fm_l2_sensitivity(5))
    assert st.kstest(res, "norm", args=(0, sigma)).pvalue > 1e-3
    for wrong in (0.9 * sigma, 1.1 * sigma):
        assert st.kstest(res, "norm", args=(0, wrong)).pvalue < 1e-6


def test_events_record_the_true_epsilon():
    exact = quadratic_statistics(unit_rows(30, 6), RNG.integers(0, 3, 30), num_classes=3)
    sound = functional_mechanism(exact, epsilon=0.5, rng=1).event
    assert sound == LaplaceDpEvent(noise_multiplier=2.0)
    paper = functional_mechanism(exact, epsilon=0.5, calibration="paper", rng=1).event
    ratio = fm_sensitivity(6, 3, calibration="paper") / fm_sensitivity(6, 3)
    assert paper.noise_multiplier == pytest.approx(2.0 * ratio)
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(paper, server_round=1, client=1)
    assert ledger.epsilon(1) == pytest.approx(0.5 / ratio, rel=1e-3)
    gauss = functional_mechanism(exact, epsilon=0.5, noise="gaussian", rng=1).event
    assert isinstance(gauss, GaussianDpEvent)


def test_psd_repair_clips_negative_eigenvalues_only():
    m = RNG.normal(size=(6, 6))
    m = m + m.T
    fixed = repair_psd(m, floor=0.1)
    assert np.linalg.eigvalsh(fixed).min() >= 0.1 - 1e-9
    values = np.linalg.eigvalsh(m)
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(fixed)), np.sort(np.maximum(values, 0.1)), atol=1e-9)
    psd = m @ m.T + np.eye(6)
    np.testing.assert_allclose(repair_psd(psd), psd, atol=1e-9)


def test_validation_errors_name_the_parameter():
    with pytest.raises(ValueError, match="epsilon"):
        functional_mechanism(quadratic_statistics(unit_rows(3, 2), np.array([0, 1, 0]), num_classes=2), epsilon=0)
    with pytest.raises(ValueError, match="num_classes"):
        quadratic_statistics(unit_rows(3, 2), np.array([0, 1, 0]), num_classes=3, loss="logistic")
    with pytest.raises(ValueError, match="labels"):
        quadratic_statistics(unit_rows(3, 2), np.array([0, 5, 0]), num_classes=3)
    with pytest.raises(ValueError, match="calibration"):
        fm_sensitivity(3, 2, calibration="loose")


def test_descent_on_the_exact_objective_fits_a_separable_problem():
    x = np.vstack([unit_rows(100, 4) * 0.3 + np.eye(4)[k] * 0.7 for k in range(3)])
    y = np.repeat(np.arange(3), 100)
    stats = quadratic_statistics(x, y, num_classes=3)
    w = descend(stats, np.zeros((4, 3)), steps=500, learning_rate=2.0)
    assert ((x @ w).argmax(axis=1) == y).mean() > 0.9
    assert taylor_objective(stats, w) < taylor_objective(stats, np.zeros((4, 3)))


@pytest.mark.parametrize("loss, c", [("softmax", 5), ("logistic", 2)])
def test_smooth_step_is_one_over_the_lipschitz_constant(loss, c):
    """1/L descends monotonically; 2.2/L (past the 2/L stability limit) blows up: L is not overstated 10 %."""
    x, y = unit_rows(300, 6), RNG.integers(0, c, 300)
    stats = quadratic_statistics(x, y, num_classes=c, loss=loss)
    shape = stats.linear.shape
    step = smooth_step_size(stats, ridge=0.0)
    w, values = np.zeros(shape), []
    for _ in range(30):
        w = descend(stats, w, steps=1, learning_rate=step)
        values.append(taylor_objective(stats, w))
    assert all(b <= a + 1e-9 for a, b in zip(values, values[1:]))
    far = descend(stats, RNG.normal(size=shape), steps=200, learning_rate=2.2 * step)
    assert taylor_objective(stats, far) > 1e6 * abs(values[-1])
    assert smooth_step_size(stats, ridge=0.5) < step


@pytest.mark.usefixtures("task_identity")
def test_trainer_releases_once_and_reuses_the_noisy_objective():
    x, y = unit_rows(80, 5), RNG.integers(0, 3, 80)
    trainer = FunctionalMechanismTrainer(1.0, num_classes=3, local_steps=3, rng=5)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    start = np.zeros((5, 3), dtype=np.float32)
    outs = []
    for rnd in (1, 2, 3):
        msg = Message(
            RecordDict({"arrays": ArrayRecord({"head.weight": Array(start)}), "config": ConfigRecord()}),
            dst_node_id=7,
            message_type="train",
        )
        reply = trainer.train(msg, context, x, y)
        for decl in read_declarations(reply.content):
            ledger.record(decl.event, server_round=rnd, client=7)
        outs.append(reply.content["arrays"]["head.weight"].numpy())
        if rnd == 1:
            first_epsilon = ledger.epsilon(7)
            assert first_epsilon == pytest.approx(1.0, rel=1e-3)
        else:
            assert [d.event for d in read_declarations(reply.content)] == [NoOpDpEvent()]
    assert ledger.epsilon(7) == pytest.approx(first_epsilon)
    np.testing.assert_array_equal(outs[0], outs[2])  # same start, same stored noisy objective
    assert not np.allclose(outs[0], 0)
    assert outs[0].dtype == np.float32


def test_trainer_refuses_add_remove_which_would_release_the_record_count():
    """Audit: under add/remove the server recovered n exactly (50.000000 / 51.000000) from the upload."""
    with pytest.raises(ValueError, match="neighboring_relation"):
        FunctionalMechanismTrainer(1.0, num_classes=3, neighboring_relation="add_or_remove_one")
