"""examples/delm: a tiny end-to-end run of the DELM reproduction on the embedded digits data (< 20 s)."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
from dp_accounting.dp_event import GaussianDpEvent, LaplaceDpEvent, NoOpDpEvent, NonPrivateDpEvent

from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import fm_l2_sensitivity, fm_sensitivity
from flwr_dp_strategies.privacy.mechanisms.gaussian import gaussian_sigma

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(os.path.dirname(HERE), "examples", "delm", "run_experiments.py")
SCEN = "iid-digits"  # 20 clients, 64 features, 10 classes


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("delm_run_experiments", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(runner, method: str, rounds: int, epsilon: float = 1.0):
    saved = runner.SCENARIOS[SCEN]["epsilon"]
    runner.SCENARIOS[SCEN]["epsilon"] = epsilon
    try:
        return runner.run_one(method, SCEN, rounds, 0, "", log=lambda s: None)
    finally:
        runner.SCENARIOS[SCEN]["epsilon"] = saved


def one_fpca_one_fm(eps_total: float, fm_event) -> float:
    """ε of exactly one Analyze-Gauss FPCA release (ε/3) and one FM release per client, nothing else."""
    sens = math.sqrt(2.0)  # replace-one Δ₂ of triu(Σ x xᵀ) for unit rows
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(GaussianDpEvent(gaussian_sigma(eps_total / 3, 1e-5, sens) / sens), server_round=0, client="c")
    ledger.record(fm_event, server_round=1, client="c")
    return ledger.epsilon()


def test_delm_basic_with_huge_epsilon_beats_chance(runner):
    res = run(runner, "delm-basic", 10, epsilon=1e6)
    assert res["final_accuracy"] > 0.6  # chance is 0.1; noise-free head reaches ~0.85 on digits
    assert len(res["accuracy"]) == 10


@pytest.mark.parametrize("rounds", [2, 7])
def test_client_ledger_is_one_fpca_plus_one_fm_event_whatever_the_rounds(runner, rounds):
    res = run(runner, "delm-basic", rounds)
    fm_sens = fm_l2_sensitivity(10, neighboring_relation="replace_one")
    expected = one_fpca_one_fm(1.0, GaussianDpEvent(gaussian_sigma(2 / 3, 1e-5, fm_sens) / fm_sens))
    assert res["ledger_epsilon"] == pytest.approx(expected, rel=1e-9)
    assert res["ledger_epsilon_per_client"] == [pytest.approx(expected, abs=1e-8)]  # all clients equal
    assert 0 < res["ledger_epsilon"] < 1.05
    # FPCA (round 0) + FM (round 1) + a NoOp for every later round: nothing else is booked.
    assert res["ledger_event_counts_client0"] == 1 + rounds
    kinds = [kind for _, kind, _ in res["ledger_events_client0"]]
    assert kinds[:2] == ["GaussianDpEvent", "GaussianDpEvent"] and set(kinds[2:]) <= {NoOpDpEvent.__name__}


def test_paper_protocol_books_a_laplace_fm_event(runner):
    res = run(runner, "delm-basic-paper-p0.5", 3)
    q = res["config"]["q"]
    assert q == 32  # p = 0.5 of 64 features
    fm_event = LaplaceDpEvent(1.0 / (2 / 3))  # b = Δ₁/ε₂ with the sound Δ₁: noise_multiplier b/Δ₁ = 1/ε₂
    assert fm_sensitivity(q, 10, neighboring_relation="replace_one") > 0
    assert res["ledger_epsilon"] == pytest.approx(one_fpca_one_fm(1.0, fm_event), rel=1e-9)


def test_enhanced_selection_ledger_is_finite_with_epsilon_and_infinite_without(runner):
    sampled = run(runner, "delm-enhanced", 3)
    assert 0 < sampled["selection_epsilon"] < math.inf
    per_round = sampled["selection_epsilon_per_round"]
    assert per_round[0] < per_round[-1]  # the selection ledger composes over rounds
    plain = run(runner, "delm-enhanced-nosampling", 3)
    assert plain["selection_epsilon"] == math.inf
    # The selection never touches the clients' ledger.
    assert sampled["ledger_epsilon"] == pytest.approx(plain["ledger_epsilon"], rel=1e-12)
    assert math.isfinite(sampled["ledger_epsilon"])


def test_local_pca_is_booked_non_private(runner):
    res = run(runner, "delm-local-pca", 2)
    assert res["ledger_epsilon"] == math.inf
    assert res["ledger_events_client0"][0][1] == NonPrivateDpEvent.__name__


def test_mlp_baselines_ledger(runner):
    fedavg = run(runner, "fedavg", 1)
    assert fedavg["ledger_epsilon"] == math.inf  # undeclared updates: non-private, never 0
    one, two = run(runner, "ldp-fl-round", 1), run(runner, "ldp-fl-round", 2)
    # One analytic-Gaussian release calibrated to ε = 1: the ledger's RDP/PLD bound is a little above 1.
    assert 1.0 <= one["ledger_epsilon"] < 1.15
    assert two["ledger_epsilon"] > one["ledger_epsilon"]  # composes over rounds
    total = run(runner, "ldp-fl-total", 2)
    assert total["ledger_epsilon"] == pytest.approx(1.0, rel=1e-3)
    assert total["config"]["epsilon_per_round"] < 1.0
