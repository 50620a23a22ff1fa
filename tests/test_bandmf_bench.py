"""bench_bandmf --train (issue 30 item 4): the calibration uses each strategy's own booking, every clipped method
gets the same C grid, and the committed accuracy table says what it was run with. No training here."""

from __future__ import annotations

import json
import math

import pytest
from dp_accounting.dp_event import ComposedDpEvent

from flwr_dp_benchmarks import bench_bandmf as bench
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms import matrix_factorization as mf


def _epsilon(events) -> float:
    ledger = PrivacyLedger(1e-5)
    ledger.record(ComposedDpEvent(list(events)), server_round=1)
    return ledger.epsilon(method="pld")


def test_the_bandmf_calibration_events_compose_to_the_strategys_one_gaussian():
    events = bench.train_events("bandmf", 7.0, 40, 1000, 100, 10)
    assert len(events) == 40  # every release books its increment: the run's ε is reached at T
    whole = mf.run_event(mf.banded_sqrt_coefficients(10), 40, 7.0, 10, 4)
    assert whole.noise_multiplier == pytest.approx(7.0 / 2.0)  # sens = √k = 2
    assert _epsilon(events) == pytest.approx(_epsilon([whole]), rel=1e-3)


def test_the_amplified_calibration_books_one_poisson_gaussian_per_epoch():
    events = bench.train_events("bandmf-amplified", 3.0, 40, 1000, 100, 5)
    assert len(events) == 8 and {(e.sampling_probability, e.event.noise_multiplier) for e in events} == {(0.5, 3.0)}


def test_every_clipped_method_gets_the_same_c_grid_and_the_reused_rows_fill_the_gaps():
    jobs = bench.train_jobs(40)
    for method in ("dp-fedavg", "bandmf", "bandmf-amplified"):
        for eps in bench.TRAIN_EPSILONS:
            assert {c for m, e, _, c, n in jobs if (m, e, n) == (method, eps, 1000)} == set(bench.TRAIN_C_GRID)
    reused = bench.reused_user_level_rows(40)
    for eps in bench.TRAIN_EPSILONS:
        fixed = {c for m, e, _, c, _ in jobs if (m, e) == ("poisson-fixed", eps)}
        fixed |= {r["clip"] for r in reused if (r["method"], r["target_epsilon"]) == ("poisson-fixed", eps)}
        assert fixed == set(bench.TRAIN_C_GRID)
        assert [r["clip"] for r in reused if (r["method"], r["target_epsilon"]) == ("poisson-adaptive", eps)] == [None]
    silo = {(m, c) for m, e, _, c, n in jobs if n == bench.CROSS_SILO["num_clients"]}
    assert silo == {(m, c) for m in ("dp-fedavg", "bandmf") for c in bench.TRAIN_C_GRID}
    assert bench.method_bands("bandmf", bench.CROSS_SILO["num_clients"]) == 1  # all in every round: b = 1


def test_the_committed_accuracy_table_reached_its_targets():
    path = bench.RESULTS / "train.json"
    if not path.exists():
        pytest.skip("no committed --train results")
    result = json.loads(path.read_text(encoding="utf-8"))
    assert result["c_grid"] == list(bench.TRAIN_C_GRID)
    for row in result["runs"]:
        assert row["target_epsilon"] * 0.99 <= row["ledger_epsilon"] <= row["target_epsilon"] * (1 + 1e-6), row
        assert math.isfinite(row["noise_multiplier"]) and 0.0 <= row["accuracy"] <= 1.0
    best = {(r["setting"], r["method"], r["target_epsilon"], r["rounds"]): r["accuracy"] for r in result["best"]}
    for row in result["runs"]:
        assert row["accuracy"] <= best[(row["setting"], row["method"], row["target_epsilon"], row["rounds"])]


def test_the_model_scale_section_writes_no_noise_state_per_round():
    """bench_bandmf --model-scale (issue 39 item 3) at a tiny d: the same replies for both, O(1) state on disk."""
    row = bench.scale_case(2000, repeats=1, clients=3, bands=2)
    assert row["fedavg_s"] > 0 and row["bandmf_s"] > 0 and row["ratio"] > 0
    assert row["first_release_written_bytes"]["bandmf"] == 71  # the key file, once
    assert row["bandmf_state_written_bytes_per_round"] == 0
    assert sum(row["state_on_disk_bytes"].values()) < 1 << 20
    assert row["noise_ring_bytes"] == 1 * 2000 * 8


def test_the_committed_model_scale_results_keep_the_state_o1():
    path = bench.RESULTS / "model_scale.json"
    if not path.exists():
        pytest.skip("no committed --model-scale results")
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    assert {r["d"] for r in rows} >= {10**6, 10**7}
    for r in rows:
        assert r["bandmf_state_written_bytes_per_round"] == 0 and sum(r["state_on_disk_bytes"].values()) < 1 << 20
