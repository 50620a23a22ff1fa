"""examples/adaptive-clipping: run config consistency, the strategy it builds, and the per-round lines it prints."""

from __future__ import annotations

import math
import sys
import tomllib
from pathlib import Path

import pytest
from flwr.app import MetricRecord
from flwr.serverapp.strategy import Result

from flwr_dp_strategies import AccountedAdaptiveClipping, AccountedClientSideAdaptiveClipping

APP = Path(__file__).resolve().parents[1] / "examples" / "adaptive-clipping"


@pytest.fixture(scope="module")
def app_modules():
    sys.path.insert(0, str(APP))
    try:
        from adaptive_clipping_app import config, server_app

        yield config, server_app
    finally:
        sys.path.remove(str(APP))


def test_pyproject_run_config_matches_code_defaults(app_modules):
    config, _ = app_modules
    with open(APP / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert pyproject["tool"]["flwr"]["app"]["config"] == config.DEFAULTS
    assert pyproject["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "adaptive_clipping_app.server_app:app",
        "clientapp": "adaptive_clipping_app.client_app:app",
    }
    with pytest.raises(ValueError, match="clipping"):
        config.resolve_run_config(type("Ctx", (), {"run_config": {"clipping": "both"}})())


@pytest.mark.parametrize(
    "clipping, cls", [("server", AccountedAdaptiveClipping), ("client", AccountedClientSideAdaptiveClipping)]
)
def test_the_app_builds_the_accounted_adaptive_strategy_with_flowers_arguments(app_modules, clipping, cls):
    config, server_app = app_modules
    settings = config.resolve_run_config(type("Ctx", (), {"run_config": {"clipping": clipping}})())
    strategy = server_app.build_strategy(settings)
    assert type(strategy) is cls
    assert strategy.noise_multiplier == settings["noise-multiplier"]
    assert strategy.num_sampled_clients == settings["clients-per-round"]
    assert strategy.clipping_norm == settings["initial-clipping-norm"]
    assert strategy.target_unclipped_quantile == pytest.approx(1 - settings["target-clipped-quantile"])
    assert strategy.sampling_rate == pytest.approx(settings["clients-per-round"] / settings["num-partitions"])


def test_round_lines_read_c_the_unclipped_fraction_epsilon_and_accuracy_from_the_result(app_modules):
    _, server_app = app_modules
    train = {
        r: MetricRecord({"dp/clipping-norm": 0.1 * r, "dp/unclipped-fraction": 0.25, "privacy/epsilon": float(r)})
        for r in (1, 2)
    }
    result = Result(train_metrics_clientapp=train, evaluate_metrics_serverapp={1: MetricRecord({"accuracy": 0.5})})
    lines = server_app.round_lines(result)
    assert lines[0] == "round   1  C 0.100  unclipped 0.25  epsilon 1.000  accuracy 0.500"
    assert lines[1].startswith("round   2  C 0.200") and lines[1].endswith("accuracy nan")
    assert math.isnan(float(lines[1].split()[-1]))


@pytest.mark.integration
def test_the_app_runs_with_flwr_run_and_reports_c_and_epsilon_per_round(tmp_path):
    """3 rounds, 10 SuperNodes, m = 5 (q = 0.5), through Flower's simulation path (local SuperLink + flwr run)."""
    from flwr_dp_experiments.simulation import run_app

    lr = 0.5
    settings = {
        "num-server-rounds": 3,
        "num-partitions": 10,
        "clients-per-round": 5,
        "noise-multiplier": 0.3,
        "clip-norm-lr": lr,
        "results-dir": str(tmp_path),
    }
    results = run_app(APP, settings, num_supernodes=10, results_path=tmp_path / "results.json")
    rows = results["rounds"]
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert rows[0]["clipping_norm"] == pytest.approx(0.1)  # round 1 is clipped and noised with C0
    for before, after in zip(rows, rows[1:]):  # C ← C·exp(−η(b̄ − γ)), b̄ ∈ [0, 1], γ = 0.5
        assert (
            math.exp(-lr * 0.5) - 1e-9 <= after["clipping_norm"] / before["clipping_norm"] <= math.exp(lr * 0.5) + 1e-9
        )
        assert after["epsilon"] > before["epsilon"]
    assert all(0 <= row["unclipped_fraction"] <= 1 and math.isfinite(row["epsilon"]) for row in rows)
    assert (tmp_path / "results.png").stat().st_size > 0
