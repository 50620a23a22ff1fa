"""examples/laplace-eval: the app end to end (Flower simulation) and the experiment's offline drift.

* The integration test runs ``run_experiment.py`` at tiny size (10 clients, 2
  rounds, LAPLACE at ε = 10 and NOT_ENCRYPT) in a subprocess, so that Ray, the
  environment variables and Flower's logging stay out of the pytest process,
  and checks the run logs the ServerApp wrote: cluster scores in the evaluate
  metrics, the ledger's ε equal to the composition of the releases the clients
  declared (one per evaluate round), ε = inf booked in NOT_ENCRYPT mode (un-noised results), and fresh
  noise for every client and round.
  The same run checks that the ServerApp itself wrote each run's JSON and PNG
  (accuracy, cluster scores and ε against the round) and printed one
  ``round r/N`` progress line per round.
* The unit tests check the offline drift computation on synthetic clustered
  points, and where the ServerApp writes its JSON and PNG.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "laplace-eval"
SCORE_KEYS = (
    "cluster/silhouette",
    "cluster/calinski-harabasz",
    "cluster/davies-bouldin",
    "cluster/labels",
    "unsupervised-eval",
)


@pytest.fixture(scope="module")
def example_path():
    """Make ``laplace_eval_app`` importable for the duration of this module."""
    sys.path.insert(0, str(EXAMPLE))
    yield EXAMPLE
    sys.path.remove(str(EXAMPLE))


def test_pyproject_run_config_matches_code_defaults(example_path):
    """The code defaults (for apps started without a run config) must equal pyproject's."""
    from laplace_eval_app.config import DEFAULTS

    with open(example_path / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert pyproject["tool"]["flwr"]["app"]["config"] == DEFAULTS
    assert pyproject["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "laplace_eval_app.server_app:app",
        "clientapp": "laplace_eval_app.client_app:app",
    }
    for key in ("privacy-eval-type", "laplace-eval-eps", "cluster-client-num", "eval-type"):
        assert key in DEFAULTS


def _synthetic_rounds(rounds: int = 6, clients: int = 30, classes: int = 4, seed: int = 0) -> np.ndarray:
    """Probability vectors that concentrate on each client's class as the 'rounds' go on."""
    rng = np.random.default_rng(seed)
    labels = np.arange(clients) % classes
    onehot = np.eye(classes)[labels]
    out = []
    for t in np.linspace(0.2, 0.9, rounds):
        jitter = rng.dirichlet(np.ones(classes), size=clients)
        points = t * onehot + (1 - t) * jitter
        out.append(points / points.sum(axis=1, keepdims=True))
    return np.stack(out)


def test_offline_drift_grows_as_epsilon_falls(example_path):
    from laplace_eval_app.drift import drift_table, protect_points, score_trajectory

    clean = _synthetic_rounds()
    base = score_trajectory(clean)
    assert np.all(np.diff(base["silhouette"]) > 0)  # the synthetic "training" separates the clusters

    weak, strong = drift_table(clean, [1e5, 1.0], repetitions=3, seed=7)
    assert weak["epsilon"] == 1e5 and weak["mindspore_laplace_eval_eps"] == 5e4 and weak["noise_scale"] == 2e-5
    assert strong["mean_abs_drift"]["silhouette"] > 100 * weak["mean_abs_drift"]["silhouette"]
    assert strong["mean_abs_drift"]["silhouette"] > 0.05
    assert weak["label_agreement"] == 1.0 and strong["label_agreement"] < 0.8
    assert weak["spearman"]["silhouette"] == pytest.approx(1.0)
    assert strong["spearman"]["silhouette"] is None or strong["spearman"]["silhouette"] < 0.99

    # same seeds, same table; the mechanism keeps the shape and draws independent noise per row
    again = drift_table(clean, [1.0], repetitions=3, seed=7)[0]
    assert again["mean_abs_drift"] == strong["mean_abs_drift"]
    noisy = protect_points(clean[0], 10.0, np.random.default_rng(1))
    assert noisy.shape == clean[0].shape
    assert len(np.unique(np.round(noisy.sum(axis=1), 12))) == len(noisy)


def test_results_paths(example_path, tmp_path):
    """``results-file`` wins (PNG next to it); otherwise ``<results-dir>/run-<mode>.json`` and ``.png``."""
    from laplace_eval_app.config import DEFAULTS
    from laplace_eval_app.results import results_paths

    assert results_paths({**DEFAULTS, "results-dir": str(tmp_path)}) == (
        str(tmp_path / "run-laplace.json"),
        str(tmp_path / "run-laplace.png"),
    )
    assert results_paths({**DEFAULTS, "results-dir": str(tmp_path), "privacy-eval-type": "NOT_ENCRYPT"}) == (
        str(tmp_path / "run-not-encrypt.json"),
        str(tmp_path / "run-not-encrypt.png"),
    )
    assert results_paths({**DEFAULTS, "results-file": str(tmp_path / "x" / "log.json")}) == (
        str(tmp_path / "x" / "log.json"),
        str(tmp_path / "x" / "log.png"),
    )
    assert DEFAULTS["results-dir"] == "results" and DEFAULTS["results-file"] == ""


def _declared_epsilon(epsilon: float, rounds: int) -> float:
    """The ledger's ε after ``rounds`` releases of the event LaplaceInferenceMod declares for one vector."""
    from flwr.app import Array, ArrayRecord

    from client_mods import LaplaceInferenceMod
    from flwr_dp_strategies.privacy import PrivacyLedger

    _, event = LaplaceInferenceMod(epsilon).protect(ArrayRecord({"v": Array(np.full(10, 0.1))}), epsilon)
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    for server_round in range(1, rounds + 1):
        ledger.record(event, server_round=server_round, client=1)
    return ledger.epsilon()


@pytest.mark.integration
def test_app_end_to_end_laplace_and_not_encrypt(tmp_path):
    clients, rounds, epsilon = 10, 2, 10.0
    args = [
        "--rounds",
        str(rounds),
        "--num-clients",
        str(clients),
        "--laplace-eps",
        str(epsilon),
        "--repetitions",
        "2",
        "--results-dir",
        str(tmp_path),
    ]
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", RAY_DISABLE_USAGE_STATS="1")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "run_experiment.py"), *args],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in ("results.json", "results.md", "results.png"):
        assert (tmp_path / name).stat().st_size > 0
    # the ServerApp's own plots, next to the run logs it wrote (read below), and its progress lines
    for name in ("run-laplace.png", "run-not-encrypt.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for server_round in range(1, rounds + 1):
        assert proc.stdout.count(f"round {server_round}/{rounds}  accuracy") == 2  # one line per run

    laplace = json.loads((tmp_path / "run-laplace.json").read_text())
    clean = json.loads((tmp_path / "run-not-encrypt.json").read_text())
    assert laplace["privacy_eval_type"] == "LAPLACE" and clean["privacy_eval_type"] == "NOT_ENCRYPT"
    assert [row["round"] for row in laplace["rounds"]] == [1, 2]
    for run in (laplace, clean):
        assert all(0.0 <= row["accuracy"] <= 1.0 and row["silhouette"] is not None for row in run["rounds"])
        assert [row["elapsed_s"] for row in run["rounds"]] == sorted(row["elapsed_s"] for row in run["rounds"])

    sums = []
    for row in laplace["rounds"]:
        metrics = row["metrics"]
        assert all(key in metrics for key in SCORE_KEYS)
        assert row["points"] == clients and "cluster/points" not in metrics  # server log only
        assert metrics["unsupervised-eval"] == metrics["cluster/silhouette"]  # eval-type SILHOUETTE_SCORE
        assert metrics["privacy/clients"] == clients
        # one Laplace release per client per evaluate round, composed in the ledger
        assert metrics["privacy/epsilon"] == pytest.approx(_declared_epsilon(epsilon, row["round"]), rel=1e-9)
        assert metrics["privacy/epsilon"] == pytest.approx(epsilon * row["round"], rel=1e-2)
        assert row["epsilon"] == metrics["privacy/epsilon"]
        sums += list(np.asarray(row["inference"]).sum(axis=1))
    assert laplace["privacy"]["releases"] == clients * rounds
    # fresh noise for every client and round (no replayed generator state)
    assert len(np.unique(np.round(sums, 12))) == clients * rounds

    for row in clean["rounds"]:
        metrics = row["metrics"]
        assert all(key in metrics for key in SCORE_KEYS)
        assert metrics["privacy/epsilon"] == float("inf")  # sent without noise: booked as non-private
        assert metrics["privacy/clients"] == clients
        assert row["epsilon"] is None  # logged as inf: sent without noise
        np.testing.assert_allclose(np.asarray(row["inference"]).sum(axis=1), 1.0, atol=1e-12)
    assert clean["privacy"]["releases"] == clients * rounds  # one NonPrivateDpEvent per client and round
    assert clean["privacy"]["epsilon"] is None  # inf in JSON-safe form

    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["offline_replay_max_error"] < 1e-9
    assert [row["epsilon"] for row in summary["drift"]] == [460520.0, 230260.0, 1e3, 1e2, 10.0, 1.0]
