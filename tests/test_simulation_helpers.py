"""flwr_dp_experiments.simulation (run config files, key checks) and flwr_dp_experiments.results, without Ray."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flwr_dp_experiments.results import write_run_results
from flwr_dp_experiments.simulation import LocalSimulation, app_config, write_run_config

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"


def test_run_config_file_reads_back_through_flowers_parser(tmp_path):
    """What `flwr run --run-config <file>` will see: the same keys and values (paths with spaces and quotes too)."""
    from flwr.common.config import parse_config_args

    config = {
        "num-server-rounds": 3,
        "noise-multiplier": 0.5,
        "results-dir": str(tmp_path / 'a "b" c'),
        "mechanism": "central-dp",
        "flag": True,
        "tiny": 1e-5,
    }
    path = write_run_config(tmp_path / "run.toml", config)
    assert parse_config_args([path]) == config


def test_run_config_refuses_what_toml_cannot_carry(tmp_path):
    with pytest.raises(ValueError, match="finite"):
        write_run_config(tmp_path / "run.toml", {"label-epsilon": math.inf})
    with pytest.raises(TypeError):
        write_run_config(tmp_path / "run.toml", {"x": [1, 2]})


def test_unknown_run_config_keys_are_refused_before_anything_starts(tmp_path):
    assert app_config(QUICKSTART)["num-server-rounds"] == 5
    sim = LocalSimulation(tmp_path / "flower.log")
    sim._process, sim.home = object(), str(tmp_path)  # as if started; the check comes before any process
    with pytest.raises(ValueError, match="not-a-key"):
        sim.run(QUICKSTART, {"not-a-key": 1}, num_supernodes=2)


def test_run_before_start_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="before start"):
        LocalSimulation(tmp_path / "flower.log").run(QUICKSTART, {}, num_supernodes=2)


def test_write_run_results_json_and_png(tmp_path):
    rows = [
        {"round": 1, "accuracy": 0.5, "epsilon": 1.0, "epsilon_b": 2.0},
        {"round": 2, "accuracy": 0.7, "epsilon": 1.5, "epsilon_b": None},
    ]
    path = write_run_results(
        tmp_path / "out",
        "central-dp",
        rows,
        initial_accuracy=0.1,
        delta=1e-5,
        extra={"config": {"seed": 1}},
        epsilon_series={"a": "epsilon", "b": "epsilon_b"},
        panels=[{"title": "loss", "series": {"loss": "accuracy"}}],
    )
    data = json.loads(Path(path).read_text())
    assert data == {"method": "central-dp", "initial_accuracy": 0.1, "config": {"seed": 1}, "rounds": rows}
    assert (tmp_path / "out" / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_run_results_without_dp_and_without_png(tmp_path):
    rows = [{"round": 1, "accuracy": 0.5, "epsilon": None}]
    write_run_results(tmp_path, "none", rows, json_name="run.json", png_name="run.png")
    assert (tmp_path / "run.png").stat().st_size > 0  # the eps panel says "no DP" instead of a line
    write_run_results(tmp_path / "j", "none", rows, png_name=None)
    assert [p.name for p in (tmp_path / "j").iterdir()] == ["results.json"]
