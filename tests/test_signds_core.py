"""SignDS core: output dimension, the exponential mechanism over overlaps, encoding, MagRR."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.signds import (
    MagRRConfig,
    MagRRState,
    SignDSParams,
    check_global_lr,
    debiased_ones,
    encode_update,
    magnitude_bit,
    optimal_output_dim,
    optimal_threshold,
    round_event,
    update_state,
)
from flwr_dp_strategies.signds.selection import log_omega, overlap_log_probabilities, topk_size


@pytest.mark.parametrize(
    "d, k, eps, ratio, h, nu",
    [
        (266084, 0.01, 100, 0.6, 43, 26),  # MindSpore's LeNet: E[v]/h = 0.604 (spec table)
        (1_000_000, 0.01, 50, 0.6, 19, 12),
        (100_000, 0.01, 10, 0.6, 2, 2),
        (10_000, 0.05, 1, 0.5, 1, 1),  # ratio never met: minimum 1
    ],
)
def test_output_dim_and_threshold_match_the_spec_vectors(d, k, eps, ratio, h, nu):
    assert optimal_output_dim(d, k, eps, ratio) == h
    assert optimal_threshold(d, topk_size(d, k), h, eps)[0] == nu


def test_large_eps_is_exact_in_log_space_and_capped():
    """MindSpore's doubles overflow and stop at h = 58; exact arithmetic goes on (h = 239), capped at 100."""
    assert optimal_output_dim(800_000, 0.2, 100, 0.6) == 100
    h = optimal_output_dim(800_000, 0.2, 100, 0.6, max_dim_out=1000)
    assert h == 239
    nu, expected = optimal_threshold(800_000, 160_000, h, 100)
    assert expected / h >= 0.6 > optimal_threshold(800_000, 160_000, h + 1, 100)[1] / (h + 1)


def test_threshold_is_the_first_local_maximum_of_the_expected_overlap():
    d, k_top, h, eps = 5000, 500, 30, 4.0
    log_w = log_omega(d, k_top, h)
    w = np.exp(log_w - log_w.max())
    v = np.arange(h + 1)
    expected = [np.sum(v * w * np.exp(eps * (v >= t))) / np.sum(w * np.exp(eps * (v >= t))) for t in range(1, h + 1)]
    nu, e_nu = optimal_threshold(d, k_top, h, eps)
    assert nu == int(np.argmax(expected)) + 1 and e_nu == pytest.approx(max(expected), rel=1e-9)


def test_overlap_distribution_is_the_exponential_mechanism_and_10_percent_off_eps_is_rejected():
    """χ² of 40 000 sampled v against ω_v e^{ε 1[v ≥ ν]}; ε ×0.9 / ×1.1 rejected at p < 1e-6."""
    d, k_top, h, eps = 2000, 100, 12, 3.0
    nu, _ = optimal_threshold(d, k_top, h, eps)
    rng = np.random.default_rng(3)
    log_p = overlap_log_probabilities(d, k_top, h, nu, eps)
    draws = rng.choice(h + 1, size=40_000, p=np.exp(log_p) / np.exp(log_p).sum())
    counts = np.bincount(draws, minlength=h + 1)

    def pvalue(e: float) -> float:
        p = np.exp(overlap_log_probabilities(d, k_top, h, nu, e))
        keep = p * len(draws) > 5
        observed = np.append(counts[keep], counts[~keep].sum())
        expected = np.append(p[keep], p[~keep].sum()) * len(draws)
        return stats.chisquare(observed, expected).pvalue

    assert pvalue(eps) > 1e-3
    assert pvalue(0.9 * eps) < 1e-6 and pvalue(1.1 * eps) < 1e-6


def test_encoding_releases_only_sorted_unique_indices_sign_and_bit():
    update = np.random.default_rng(0).normal(size=266_084)
    up = encode_update(update, sign_k=0.01, sign_eps=100, r_est=1e-5, is_reached=0, rng=1)
    assert up.indices.dtype == np.int64 and len(up.indices) == 43
    assert np.all(np.diff(up.indices) > 0) and up.indices.min() >= 0 and up.indices.max() < update.size
    assert up.sign in (1, -1) and up.b_hat in (0, 1)


def test_encoding_selects_mostly_from_the_signed_top_k():
    """At sign_eps = 100, P(v ≥ ν) ≈ 0.998 here: at least ν of the h indices come from the top-k of s·Δ.

    (Not surely: the low-overlap sets are e^92 times as many, which the e^100 boost
    only mostly outweighs.)"""
    rng = np.random.default_rng(5)
    update = rng.normal(size=50_000)
    k_top = topk_size(50_000, 0.01)
    overlaps = []
    for seed in range(30):
        up = encode_update(update, sign_k=0.01, sign_eps=100, r_est=1e-5, is_reached=0, rng=seed)
        top = set(np.argsort(-up.sign * update)[:k_top].tolist())
        overlaps.append(sum(i in top for i in up.indices))
    h = optimal_output_dim(50_000, 0.01, 100, 0.6)
    nu, _ = optimal_threshold(50_000, k_top, h, 100)
    assert sum(o >= nu for o in overlaps) >= 28  # a uniform choice would give about h/100 (k = 1 %)
    signs = [encode_update(update, sign_k=0.01, sign_eps=100, r_est=1e-5, is_reached=0, rng=s).sign for s in range(200)]
    assert stats.binomtest(signs.count(1), 200, 0.5).pvalue > 1e-3  # a fair coin


def test_magrr_bit_rule_and_rr_flip_rate():
    cfg = MagRRConfig()
    assert magnitude_bit(1.9e-5, 1e-5, 0, cfg) == 1 and magnitude_bit(2.1e-5, 1e-5, 0, cfg) == 0
    assert magnitude_bit(0.49e-5, 1e-5, 1, cfg) == 1 and magnitude_bit(0.51e-5, 1e-5, 1, cfg) == 0
    # the RR bit: r far below r_est gives b = 1, flipped with 1/(1 + e^ε_rr); ε_rr ×0.9 / ×1.1 rejected
    update = np.full(400, 1e-9)
    config = MagRRConfig(rr_epsilon=1.0)
    draws = 20_000
    bits = [
        encode_update(update, sign_k=0.05, sign_eps=1, r_est=1.0, is_reached=0, rng=s, magrr=config).b_hat
        for s in range(draws)
    ]
    flips = draws - sum(bits)

    def flip(eps: float) -> float:
        return 1 / (1 + math.exp(eps))

    assert stats.binomtest(flips, draws, flip(1.0)).pvalue > 1e-3
    assert stats.binomtest(flips, draws, flip(0.9)).pvalue < 1e-6
    assert stats.binomtest(flips, draws, flip(1.1)).pvalue < 1e-6


def test_magrr_server_debiasing_phases_and_fallback():
    cfg = MagRRConfig()
    p = cfg.keep_probability
    assert debiased_ones(int(round(p * 100)), 100, p) == pytest.approx(100, abs=1)  # all true ones
    state = MagRRState()
    state, info = update_state(state, ones=10, total=100, expected_participants=100, global_lr=0.1, config=cfg)
    assert info["majority"] == 0 and state.r_est == pytest.approx(5e-5)  # growth ×5
    for i in range(10):
        state, _ = update_state(state, 90, 100, 100, 0.1, cfg)
        assert state.is_reached == 0 and state.reach_count == i + 1
    state, _ = update_state(state, 90, 100, 100, 0.1, cfg)  # the 11th growth round with majority 1
    assert state.is_reached == 1 and state.r_est == pytest.approx(5e-5)
    state, _ = update_state(state, 90, 100, 100, 0.1, cfg)
    assert state.r_est == pytest.approx(5e-5 / 1.5)  # shrink ÷1.5
    state, _ = update_state(state, 10, 100, 100, 0.1, cfg)
    assert state.r_est == pytest.approx(5e-5 / 1.5) and state.is_reached == 1  # no way back
    state, info = update_state(state, 1, 4, 100, 0.1, cfg)  # 4 bits < 5 % of 100
    assert info["fallback"] == 1 and 3.0 * 100 * state.r_est == pytest.approx(0.1)
    assert "debiased-ones" not in info and all(math.isfinite(v) for v in info.values())  # was NaN
    _, info = update_state(state, 0, 0, 4, 0.1, cfg)  # no bit at all: a fallback round too
    assert info["fallback"] == 1 and all(math.isfinite(v) for v in info.values())


def test_round_event_composes_to_sign_eps_plus_rr_eps():
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(round_event(100.0, 5.0), server_round=1, client="a")
    assert ledger.epsilon() == pytest.approx(105.0, rel=1e-4)
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    for rnd in range(1, 11):
        ledger.record(round_event(1.0, 5.0), server_round=rnd, client="a")
    assert ledger.epsilon() < 60.0  # RDP/PLD composition beats 10 × 6


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"sign_k": 0.0}, "sign_k"),
        ({"sign_k": 0.26}, "sign_k"),
        ({"sign_eps": 0.0}, "sign_eps"),
        ({"sign_eps": 101}, "sign_eps"),
        ({"sign_thr_ratio": 0.49}, "sign_thr_ratio"),
        ({"sign_thr_ratio": 1.01}, "sign_thr_ratio"),
        ({"sign_dim_out": -1}, "sign_dim_out"),
        ({"sign_dim_out": 51}, "sign_dim_out"),
        ({"sign_dim_out": 2.0}, "sign_dim_out"),
    ],
)
def test_parameter_domains_as_mindspore(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SignDSParams(**kwargs)
    with pytest.raises(ValueError, match="sign_global_lr"):
        check_global_lr(0.0)
