"""examples/distributed-dp without Flower processes: its run configs, its fail-plan and its MLP (under a second)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

APP = Path(__file__).resolve().parents[1] / "examples" / "distributed-dp"
sys.path.insert(0, str(APP))

from distributed_dp_app import config, task  # noqa: E402


def test_pyproject_run_config_equals_the_defaults_and_the_cohort_config_only_overrides_known_keys():
    pyproject = tomllib.loads((APP / "pyproject.toml").read_text())
    assert pyproject["tool"]["flwr"]["app"]["config"] == config.DEFAULTS
    cohort = tomllib.loads((APP / "cohort-1000.toml").read_text())
    assert set(cohort) <= set(config.DEFAULTS)
    assert cohort["num-partitions"] == 1000 and cohort["model"] == "mlp" and cohort["num-shares"] == 0


def test_fail_plan_is_parsed_and_checked():
    assert config.fail_plan("") == {}
    assert config.fail_plan("1:share-keys:1;1:collect:2, 4;2:unmask:3") == {
        (1, "share-keys"): {1},
        (1, "collect"): {2, 4},
        (2, "unmask"): {3},
    }
    for bad in ("1:share-keys", "x:collect:1", "1:train:1", "0:collect:1"):
        with pytest.raises(ValueError, match="fail-plan"):
            config.fail_plan(bad)


def test_mlp_gradient_step_matches_finite_differences_and_learns():
    gen = np.random.default_rng(0)
    x = gen.normal(size=(40, 12)).astype(np.float32)
    y = gen.integers(0, task.NUM_CLASSES, size=40)
    arrays = task.initial_arrays(12, "mlp", hidden=5, seed=1)
    assert task.model_size(arrays) == 12 * 5 + 5 + 5 * 10 + 10

    def loss(a):
        z = task.logits({k: v.astype(np.float64) for k, v in a.items()}, x.astype(np.float64))
        z -= z.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y]))

    lr = 1e-3
    stepped = task.train_sgd(arrays, x, y, epochs=1, lr=lr, batch_size=len(y), seed=0)  # one full-batch step
    for key in ("w1", "b2"):
        index = (0, 0) if arrays[key].ndim == 2 else (0,)
        plus, minus = (
            {k: v.astype(np.float64) for k, v in arrays.items()},
            {k: v.astype(np.float64) for k, v in arrays.items()},
        )
        plus[key][index] += 1e-5
        minus[key][index] -= 1e-5
        numeric = (loss(plus) - loss(minus)) / 2e-5
        taken = (float(arrays[key][index]) - float(stepped[key][index])) / lr
        assert taken == pytest.approx(numeric, rel=1e-2, abs=1e-4)
    trained = task.train_sgd(arrays, x, y, epochs=30, lr=0.1, batch_size=10, seed=0)
    assert loss(trained) < loss(arrays)
    with pytest.raises(ValueError, match="model"):
        task.initial_arrays(12, "cnn")
