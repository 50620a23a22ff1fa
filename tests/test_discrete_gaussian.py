"""Secure discrete Gaussian (CKS 2020): exact reference, fast sampler, grid outputs, sound event (issue 16 E13)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import stats

from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms.discrete_gaussian import (
    gaussian_grid,
    sample_discrete_gaussian,
    sample_discrete_gaussian_exact,
    secure_gaussian_mechanism,
)


def pmf(scale: float, support: np.ndarray) -> np.ndarray:
    weights = np.exp(-(support.astype(float) ** 2) / (2 * scale * scale))
    full = np.arange(-60 * math.ceil(scale), 60 * math.ceil(scale) + 1)
    return weights / np.exp(-(full.astype(float) ** 2) / (2 * scale * scale)).sum()


def chi2_pvalue(draws: np.ndarray, scale: float) -> float:
    """χ² of the draws against N_Z(0, scale²), tails pooled so every cell expects ≥ 5."""
    support = np.arange(-int(4 * scale) - 1, int(4 * scale) + 2)
    expected = pmf(scale, support) * draws.size
    observed = np.array([(draws == k).sum() for k in support], dtype=float)
    tail_expected = draws.size - expected.sum()
    tail_observed = draws.size - observed.sum()
    expected, observed = np.append(expected, tail_expected), np.append(observed, tail_observed)
    keep = expected >= 5
    return stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue


@pytest.mark.parametrize("scale", [0.7, 1.5, 3.0])
def test_exact_sampler_matches_the_pmf(scale):
    draws = np.array(sample_discrete_gaussian_exact(scale, 6000, random.Random(1)))
    assert chi2_pvalue(draws, scale) > 1e-3


@pytest.mark.parametrize("scale", [0.7, 2.5, 40.0])
def test_fast_sampler_matches_the_pmf_and_rejects_a_10_percent_scale_error(scale):
    draws = sample_discrete_gaussian(scale, 200_000, rng=5)
    assert draws.dtype == np.int64
    assert chi2_pvalue(draws, scale) > 1e-3
    for wrong in (0.9 * scale, 1.1 * scale):
        assert chi2_pvalue(draws, wrong) < 1e-6


def test_outputs_lie_on_a_data_independent_grid_and_the_event_is_sound():
    z, delta2, bound, d = 1.3, 2.0, 5.0, 10_000
    x = np.random.default_rng(0).uniform(-1, 1, d)
    release = secure_gaussian_mechanism(x, noise_multiplier=z, sensitivity=delta2, value_bound=bound, rng=2)
    gamma = gaussian_grid(z * delta2, bound)
    steps = release.value / gamma
    np.testing.assert_array_equal(steps, np.rint(steps))  # exact grid points
    residual = release.value - x
    assert abs(residual.std() / (z * delta2) - 1) < 4 / math.sqrt(2 * d)
    assert isinstance(release.event, dp_event.ZCDpEvent)
    assert release.event.rho >= 1 / (2 * z * z)  # never below the continuous Gaussian's zCDP
    assert release.event.rho == pytest.approx(1 / (2 * z * z), rel=1e-5)
    ledger = PrivacyLedger(1e-5)
    ledger.record(release.event, server_round=1, client=1)
    gaussian = PrivacyLedger(1e-5, accounting="rdp")
    gaussian.record(dp_event.GaussianDpEvent(z), server_round=1, client=1)
    assert ledger.epsilon() >= gaussian.epsilon() * (1 - 1e-6)


def test_values_are_clamped_to_the_public_bound():
    release = secure_gaussian_mechanism(
        np.full(50_000, 100.0), noise_multiplier=1.0, sensitivity=0.1, value_bound=1.0, rng=3
    )
    assert abs(release.value.mean() - 1.0) < 5 * 0.1 / math.sqrt(50_000)


def test_bad_parameters_name_themselves():
    with pytest.raises(ValueError, match="value_bound"):
        secure_gaussian_mechanism([1.0], noise_multiplier=1.0, value_bound=-1.0)
    with pytest.raises(ValueError, match="scale"):
        sample_discrete_gaussian(0.0, 3)


@pytest.mark.usefixtures("task_identity")
def test_local_update_noise_mod_can_draw_secure_noise():
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

    from client_mods import LocalUpdateNoiseMod
    from flwr_dp_strategies.declarations import read_declarations

    mod = LocalUpdateNoiseMod(1.0, 0.5, secure=True, rng=4)
    msg = Message(
        RecordDict({"arrays": ArrayRecord([np.zeros(20_000)]), "config": ConfigRecord({})}),
        dst_node_id=7,
        message_type=MessageType.TRAIN,
    )

    def app(m, ctx):
        return Message(
            RecordDict({"arrays": ArrayRecord([np.full(20_000, 1e-4)]), "metrics": MetricRecord({"num-examples": 5})}),
            reply_to=m,
        )

    reply = mod(msg, Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={}), app)
    noisy = reply.content["arrays"].to_numpy_ndarrays()[0]
    gamma = gaussian_grid(0.5 * 2.0, 1.0)
    np.testing.assert_array_equal(noisy / gamma, np.rint(noisy / gamma))
    assert abs(noisy.std() - 1.0) < 4 / math.sqrt(2 * noisy.size)
    [decl] = read_declarations(reply.content)
    assert isinstance(decl.event, dp_event.ZCDpEvent) and decl.event.rho >= 1 / (2 * 0.5**2)


def test_analyze_gauss_and_fm_gaussian_can_draw_secure_noise():
    from flwr_dp_strategies.privacy.mechanisms.covariance import analyze_gauss
    from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import functional_mechanism, quadratic_statistics

    rows = np.random.default_rng(0).normal(size=(40, 5))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    moment = rows.T @ rows
    release = analyze_gauss(moment, epsilon=1.0, delta=1e-5, secure=True, value_bound=40.0, rng=1)
    np.testing.assert_array_equal(release.value, release.value.T)
    assert isinstance(release.event, dp_event.ZCDpEvent)
    with pytest.raises(ValueError, match="value_bound"):
        analyze_gauss(moment, epsilon=1.0, delta=1e-5, secure=True)
    stats_ = quadratic_statistics(rows, np.arange(40) % 3, num_classes=3)
    fm = functional_mechanism(stats_, epsilon=1.0, noise="gaussian", secure=True, rng=2)
    assert isinstance(fm.event, dp_event.ZCDpEvent)
