"""Vertical FL with label DP (examples/label-dp): the label party, its ledger, and an end-to-end run.

The unit tests check what is certain: the label party books exactly one
randomized-response release, never reads the true train labels after
randomising them, and the gradients it sends are those of the loss on the
noisy labels. The end-to-end test runs, in a subprocess (Flower simulation,
Ray backend), the sweep script on 2 short runs (eps = 4 and no label DP), then
the ServerApp that ``flwr run`` starts, which writes its own results JSON and
plot (test accuracy and ε against the round) and prints one ``round r/N``
progress line per round.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, RecordDict

from flwr_dp_strategies.privacy import PrivacyLedger, keep_probability, rr_event
from flwr_dp_strategies.privacy.accounting.events import event_to_dict

APP_DIR = Path(__file__).resolve().parents[1] / "examples" / "label-dp"


@pytest.fixture(scope="module")
def app_modules():
    """Import label_dp_app from the example folder (and unload it afterwards)."""
    sys.path.insert(0, str(APP_DIR))
    try:
        from label_dp_app import config, label_party, task

        yield config, label_party, task
    finally:
        sys.path.remove(str(APP_DIR))
        for name in [m for m in sys.modules if m == "label_dp_app" or m.startswith("label_dp_app.")]:
            del sys.modules[name]


def _context() -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})


def _config(config_module, **overrides):
    return config_module.validate_config({**config_module.DEFAULTS, **overrides})


def test_pyproject_run_config_matches_code_defaults(app_modules):
    config, _, _ = app_modules
    with open(APP_DIR / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert pyproject["tool"]["flwr"]["app"]["config"] == config.DEFAULTS
    assert pyproject["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "label_dp_app.server_app:app",
        "clientapp": "label_dp_app.client_app:app",
    }


def test_feature_parties_hold_disjoint_column_slices(app_modules):
    _, _, task = app_modules
    left, right = task.party_columns(0, 2), task.party_columns(1, 2)
    assert set(left).isdisjoint(right) and len(left) == len(right) == 32
    assert set(left % 8) == {0, 1, 2, 3} and set(right % 8) == {4, 5, 6, 7}
    data = task.load_party_features(0, 2, 0.2, 42)
    y_train, y_test = task.load_labels(0.2, 42)
    assert data["train"].shape == (len(y_train), 32) and data["test"].shape == (len(y_test), 32)


def test_label_party_books_one_release_and_keeps_it(app_modules):
    config_module, label_party, _ = app_modules
    y_true = np.arange(1000) % 10
    config = _config(config_module, **{"label-epsilon": 1.0})
    context, ledger = _context(), PrivacyLedger(1e-5, neighboring_relation="replace_one")
    party, release = label_party.make_label_party(context, config, y_true, ledger)
    again, _ = label_party.make_label_party(context, config, y_true, ledger)  # e.g. a restarted loop
    (row,) = ledger.events(label_party.LABEL_PARTY)
    assert ledger.clients == [label_party.LABEL_PARTY]
    assert row[1] == rr_event(1.0, 10) and row[2] == "label-dp/randomized-response"
    assert event_to_dict(row[1])["num_buckets"] == 10
    assert ledger.neighboring_relation == "replace_one" and ledger.epsilon() == pytest.approx(1.0, rel=1e-3)
    assert np.array_equal(party.noisy_labels, again.noisy_labels)
    expected = 1.0 - keep_probability(1.0, 10)
    assert release.expected_changed_fraction == pytest.approx(expected)
    assert abs(release.changed_fraction - expected) < 5 * math.sqrt(expected * (1 - expected) / 1000)


def test_no_label_dp_books_nothing(app_modules):
    config_module, label_party, _ = app_modules
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    y = np.arange(100) % 10
    party, release = label_party.make_label_party(
        _context(), _config(config_module, **{"label-epsilon": math.inf}), y, ledger
    )
    assert ledger.clients == [] and release.epsilon is None and np.array_equal(party.noisy_labels, y)


def _embeddings(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, 16)).astype(np.float32) for _ in range(2)]


def test_gradients_depend_only_on_the_noisy_labels(app_modules):
    """After randomisation the true labels are never read: overwriting them changes nothing sent."""
    config_module, label_party, _ = app_modules
    config = _config(config_module, **{"label-epsilon": 1.0, "rr-seed": 5})
    y_true = np.arange(600) % 10
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    party, _ = label_party.make_label_party(_context(), config, y_true.copy(), ledger)
    poisoned = y_true.copy()
    other, _ = label_party.make_label_party(_context(), config, poisoned, ledger)
    poisoned[:] = (poisoned + 3) % 10  # the caller's true labels change after randomisation
    assert np.array_equal(party.noisy_labels, other.noisy_labels)
    for step in range(3):
        idx = party.next_batch(128)
        assert np.array_equal(idx, other.next_batch(128))
        emb = _embeddings(len(idx), step)
        grads, loss = party.step(emb, idx)
        grads_other, loss_other = other.step(emb, idx)
        assert loss == loss_other
        assert all(np.array_equal(a, b) for a, b in zip(grads, grads_other))


def test_gradient_is_the_noisy_label_cross_entropy_gradient(app_modules):
    """d(mean CE on noisy labels)/d embeddings = relu'(h) * ((softmax(z) - onehot(noisy)) W) / b."""
    config_module, label_party, _ = app_modules
    config = _config(config_module, **{"label-epsilon": 0.5, "rr-seed": 9})
    y_true = np.arange(400) % 10
    party, _ = label_party.make_label_party(
        _context(), config, y_true, PrivacyLedger(1e-5, neighboring_relation="replace_one")
    )
    idx = party.next_batch(64)
    emb = _embeddings(len(idx), 1)
    linear = party.top[1]
    weight, bias = linear.weight.detach().clone(), linear.bias.detach().clone()  # before the step
    grads, _ = party.step(emb, idx)
    h = torch.from_numpy(np.concatenate(emb, axis=1))
    probs = torch.softmax(torch.relu(h) @ weight.T + bias, dim=1)
    onehot = torch.nn.functional.one_hot(torch.as_tensor(party.noisy_labels[idx]), 10).to(probs.dtype)
    expected = ((probs - onehot) @ weight / len(idx)) * (h > 0)
    np.testing.assert_allclose(np.concatenate(grads, axis=1), expected.numpy(), rtol=1e-5, atol=1e-7)
    # ...and not the gradient of the true labels (at eps = 0.5 most labels changed)
    onehot_true = torch.nn.functional.one_hot(torch.as_tensor(y_true[idx]), 10).to(probs.dtype)
    wrong = ((probs - onehot_true) @ weight / len(idx)) * (h > 0)
    assert not np.allclose(np.concatenate(grads, axis=1), wrong.numpy(), atol=1e-6)


def test_mnist_columns_and_split(app_modules):
    """MNIST from a local folder: 28 columns split among the parties, MNIST's own 60 000 / 10 000 split."""
    config, _, task = app_modules
    from flwr_dp_experiments.datasets import MNIST_FILES, shared_data_dir

    assert _config(config, dataset="mnist")["dataset"] == "mnist"
    with pytest.raises(ValueError, match="dataset"):
        _config(config, dataset="cifar")
    left, right = task.party_columns(0, 2, 28), task.party_columns(1, 2, 28)
    assert len(left) == len(right) == 392 and set(left % 28) == set(range(14))
    if not os.path.exists(os.path.join(shared_data_dir("mnist"), MNIST_FILES["train"][0])):
        pytest.skip("MNIST IDX files not present")
    data = task.load_party_features(1, 2, 0.2, 42, "mnist", "")
    y_train, y_test = task.load_labels(0.2, 42, "mnist", "")
    assert data["train"].shape == (60000, 392) and data["test"].shape == (10000, 392)
    assert y_train.shape == (60000,) and y_test.shape == (10000,) and 0.0 <= data["train"].min() <= 1.0


def test_batches_are_label_independent_epochs(app_modules):
    _, label_party, _ = app_modules
    party = label_party.LabelParty(np.arange(100) % 10, num_parties=2, embedding_dim=16, lr=0.01, seed=3)
    seen = np.concatenate([party.next_batch(25) for _ in range(4)])
    assert np.array_equal(np.sort(seen), np.arange(100))  # one epoch covers every sample once
    assert np.array_equal(party.next_batch(0), np.arange(100))


#: In the same subprocess as the sweep (saves a Python start): the app run once with ``flwr run``,
#: with the run config (JSON) in argv[1] and the JSON it must write in argv[2]; argv[3:] is the sweep's.
SWEEP_THEN_APP = """
import json, sys
import run_experiment
run_experiment.main(sys.argv[3:])
from flwr_dp_experiments.simulation import run_app
run_app(run_experiment.HERE, json.loads(sys.argv[1]), num_supernodes=2, results_path=sys.argv[2],
        echo=run_experiment.APP_LINES)
"""


@pytest.mark.integration
def test_vertical_run_end_to_end(tmp_path):
    args = [
        "--eps",
        "4",
        "inf",
        "--repeats",
        "1",
        "--rounds",
        "10",
        "--eval-every",
        "5",
        "--results-dir",
        str(tmp_path),
    ]
    app_rounds = 4
    app_settings = {
        "label-epsilon": 4.0,
        "num-server-rounds": app_rounds,
        "eval-every": 2,
        "results-dir": str(tmp_path / "app"),
    }
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", RAY_DISABLE_USAGE_STATS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            SWEEP_THEN_APP,
            json.dumps(app_settings),
            str(tmp_path / "app" / "run-eps-4.0.json"),
            *args,
        ],
        cwd=APP_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    # the ServerApp of `flwr run` (not the sweep): its results JSON and plot, and a progress line per round
    app_run = json.loads((tmp_path / "app" / "run-eps-4.0.json").read_text())
    assert (tmp_path / "app" / "run-eps-4.0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [row["round"] for row in app_run["rounds"]] == [2, 4]
    for row in app_run["rounds"]:
        assert 0.0 <= row["accuracy"] <= 1.0 and row["elapsed_s"] > 0
        assert row["epsilon"] == app_run["privacy"]["ledger_epsilon"] == pytest.approx(4.0, rel=1e-3)
    for server_round in range(1, app_rounds + 1):
        assert f"round {server_round}/{app_rounds}  loss (noisy labels)" in proc.stdout
    assert "test accuracy" in proc.stdout and "epsilon 4.000 (label-DP" in proc.stdout

    # the sweep (run_experiment.py)
    results = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "accuracy_vs_eps.png").stat().st_size > 0
    dp_run, plain_run = results["runs"]
    assert [row["round"] for row in plain_run["rounds"]] == [5, 10]
    assert plain_run["final_accuracy"] > 0.6  # chance is 0.1

    assert plain_run["privacy"]["events"] == [] and plain_run["privacy"]["ledger_epsilon"] is None
    privacy = dp_run["privacy"]
    assert privacy["neighboring_relation"] == "replace_one"
    (event,) = privacy["events"]  # exactly one release for the label party, not one per round
    assert event["client"] == "label-party" and event["round"] == 0
    assert event["event"] == event_to_dict(rr_event(4.0, 10))
    assert privacy["ledger_epsilon"] == pytest.approx(4.0, rel=1e-3)
    n, p = privacy["num_labels"], privacy["expected_changed_fraction"]
    assert p == pytest.approx(9 / (math.exp(4) + 9))
    assert abs(privacy["changed_fraction"] - p) < 5 * math.sqrt(p * (1 - p) / n)
    assert dp_run["final_accuracy"] > 0.3


def test_a_message_flower_could_not_push_aborts_the_step_at_once(task_identity):
    """Issue 38: Flower 1.43's HttpGrid returns "" for a failed push; the server app used to wait on it until its
    reply timeout and then fail with a misleading count."""
    sys.path.insert(0, str(APP_DIR))
    try:
        from label_dp_app import server_app

        class FailingPush:
            def push_messages(self, messages):
                return ["id-1", ""]

            def pull_messages(self, ids):  # never reached
                raise AssertionError("pulled although a push failed")

        messages = [Message(RecordDict(), dst_node_id=n, message_type="query") for n in (11, 12)]
        with pytest.raises(RuntimeError, match=r"could not send to feature parties \[12\]"):
            server_app.exchange(FailingPush(), messages)
    finally:
        sys.path.remove(str(APP_DIR))
        for name in [m for m in sys.modules if m == "label_dp_app" or m.startswith("label_dp_app.")]:
            del sys.modules[name]
