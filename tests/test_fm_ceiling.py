"""examples/delm/fm_ceiling.py: the ceilings it reports are what the library's mechanism gives."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from flwr_dp_experiments.datasets import load_dataset
from flwr_dp_experiments.feature_maps import hog_features
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import quadratic_statistics, solve_objective

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "examples", "delm", "fm_ceiling.py")


@pytest.fixture(scope="module")
def ceiling():
    spec = importlib.util.spec_from_file_location("delm_fm_ceiling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits():
    x_train, y_train, x_test, y_test = load_dataset("digits")
    return hog_features(x_train, cell=2, bins=6), y_train, hog_features(x_test, cell=2, bins=6), y_test


@pytest.mark.parametrize("one_noise", [False, True])
def test_private_head_tends_to_the_noise_free_solve_as_epsilon_grows(ceiling, digits, one_noise):
    """At a huge ε the noise and the noise-adapted ridge vanish: the head predicts as the exact solve
    (compared on predictions: S has near-null directions where tiny noise moves the weights freely)."""
    train, y_train, test, _ = digits
    exact = solve_objective(quadratic_statistics(train, y_train, num_classes=10), ridge=0.0)
    head = ceiling.private_head(train, y_train, 10, 1e7, 0, one_noise)
    agree = np.mean(np.argmax(test @ head, axis=1) == np.argmax(test @ exact, axis=1))
    assert agree >= 0.99


def test_one_noise_is_less_noisy_than_local_noise(ceiling, digits):
    """The summed noise of 100 local releases is √100 = 10 times one release's: its head is further
    from the noise-free one in every seed (the gap is a factor ~10, far beyond seed-to-seed spread)."""
    train, y_train, _, _ = digits
    exact = solve_objective(quadratic_statistics(train, y_train, num_classes=10), ridge=0.0)
    for seed in range(3):
        local = ceiling.private_head(train, y_train, 10, 50.0, seed, False)
        central = ceiling.private_head(train, y_train, 10, 50.0, seed, True)
        assert np.linalg.norm(central - exact) < np.linalg.norm(local - exact)


def test_main_writes_one_row_per_feature_map(ceiling, tmp_path):
    out = tmp_path / "ceiling.md"
    ceiling.main(["--datasets", "digits", "--seeds", "1", "--out", str(out)])
    rows = [line for line in out.read_text(encoding="utf-8").splitlines() if line.startswith("| digits |")]
    assert len(rows) == len(ceiling.FEATURE_MAPS)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        accuracies = [float(c) for c in cells[2:6]]
        assert all(0.0 <= a <= 1.0 for a in accuracies)
        assert accuracies[0] > 0.5  # the noise-free least-squares head on digits is far above chance


def test_main_rejects_zero_seeds(ceiling, tmp_path, capsys):
    with pytest.raises(SystemExit):
        ceiling.main(["--datasets", "digits", "--seeds", "0", "--out", str(tmp_path / "x.md")])
    assert "--seeds must be an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "x.md").exists()
