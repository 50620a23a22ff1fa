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
        "serverapp": "adaptive_clipping_app.server_app:app", "clientapp": "adaptive_clipping_app.client_app:app"}
    with pytest.raises(ValueError, match="clipping"):
        config.resolve_run_config(type("Ctx", (), {"run_config": {"clipping": "both"}})())


@pytest.mark.parametrize("clipping, cls", [("server", AccountedAdaptiveClipping),
                                           ("client", AccountedClientSideAdaptiveClipping)])
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
    train = {r: MetricRecord({"dp/clipping-norm": 0.1 * r, "dp/unclipped-fraction": 0.25,
                              "privacy/epsilon": float(r)}) for r in (1, 2)}
    result = Result(train_metrics_clientapp=train,
                    evaluate_metrics_serverapp={1: MetricRecord({"accuracy": 0.5})})
    lines = server_app.round_lines(result)
    assert lines[0] == "round   1  C 0.100  unclipped 0.25  epsilon 1.000  accuracy 0.500"
    assert lines[1].startswith("round   2  C 0.200") and lines[1].endswith("accuracy nan")
    assert math.isnan(float(lines[1].split()[-1]))
