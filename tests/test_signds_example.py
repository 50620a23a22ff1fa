"""examples/signds: the SignDS-vs-FedAvg app end to end (Flower simulation) and its configuration.

* The integration test runs ``run_experiment.py`` at tiny size (10 clients, 3
  rounds, digits, SignDS only) in a subprocess, so that Ray, the environment
  variables and Flower's logging stay out of the pytest process, and checks the
  run log the ServerApp wrote: the model trains, every client uploads exactly h ≤
  max_dim_out indices (+ sign + b̂), ``privacy/epsilon`` after R rounds equals a
  ``replace_one`` ledger with R × ``round_event(sign_eps, rr_eps)`` composed, and
  r_est moves by MagRR's rule.
* The same run checks that the ServerApp itself wrote its run JSON and its plot
  (``run-<name>.json`` / ``run-<name>.png``: accuracy and ε against the round)
  and printed one ``round r/N`` progress line per round.
* The unit tests check that the pyproject run config equals the code defaults
  and that the strategy is built from the run config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "signds"


@pytest.fixture(scope="module")
def example_path():
    """Make ``signds_app`` importable for the duration of this module."""
    sys.path.insert(0, str(EXAMPLE))
    yield EXAMPLE
    sys.path.remove(str(EXAMPLE))


def test_pyproject_run_config_matches_code_defaults(example_path):
    """The code defaults (for apps started without a run config) must equal pyproject's."""
    from signds_app.config import DEFAULTS

    with open(example_path / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert pyproject["tool"]["flwr"]["app"]["config"] == DEFAULTS
    assert pyproject["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "signds_app.server_app:app",
        "clientapp": "signds_app.client_app:app",
    }


def test_strategy_from_run_config(example_path):
    from flwr.serverapp.strategy import FedAvg

    from flwr_dp_strategies import SignDS
    from signds_app.config import DEFAULTS
    from signds_app.server_app import build_strategy

    fedavg = build_strategy({**DEFAULTS, "strategy": "fedavg"})
    assert type(fedavg) is FedAvg
    config = {
        **DEFAULTS,
        "strategy": "signds",
        "sign-k": 0.2,
        "sign-eps": 4.0,
        "rr-eps": 3.0,
        "sign-dim-out": 7,
        "max-dim-out": 9,
        "initial-r-est": 0.002,
        "step-ratio": 2.0,
        "sign-global-lr": 0.5,
    }
    signds = build_strategy(config)
    assert isinstance(signds, SignDS)
    assert (signds.params.sign_k, signds.params.sign_eps, signds.params.sign_dim_out) == (0.2, 4.0, 7)
    assert signds.max_dim_out == 9 and signds.sign_global_lr == 0.5
    assert (signds.magrr.rr_epsilon, signds.magrr.initial_r_est, signds.magrr.step_ratio) == (3.0, 0.002, 2.0)
    assert signds.state.r_est == 0.002
    assert signds.ledger.neighboring_relation == "replace_one"


def _ledger_epsilon(sign_eps: float, rr_eps: float, rounds: int) -> float:
    from flwr_dp_strategies.privacy import PrivacyLedger
    from flwr_dp_strategies.signds import round_event

    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    for server_round in range(1, rounds + 1):
        ledger.record(round_event(sign_eps, rr_eps), server_round=server_round, client=1)
    return ledger.epsilon()


@pytest.mark.integration
def test_signds_app_end_to_end(tmp_path):
    from flwr_dp_strategies.signds import MagRRConfig, SignDSParams, output_dim

    clients, rounds, sign_eps, rr_eps, sign_k, max_dim_out, r0 = 10, 3, 50.0, 4.0, 0.25, 60, 1e-3
    args = [
        "--datasets",
        "digits",
        "--methods",
        "signds-default",
        "--num-clients",
        str(clients),
        "--rounds",
        str(rounds),
        "--results-dir",
        str(tmp_path),
        "--set",
        f"sign-eps={sign_eps}",
        "--set",
        f"rr-eps={rr_eps}",
        "--set",
        f"sign-k={sign_k}",
        "--set",
        f"max-dim-out={max_dim_out}",
        "--set",
        f"initial-r-est={r0}",
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
    for name in ("results.json", "results.md", "results.png", "run-signds-default-digits.json"):
        assert (tmp_path / name).stat().st_size > 0
    # the ServerApp's own outputs: the run JSON (read below) and its plot, plus a progress line per round
    assert (tmp_path / "run-signds-default-digits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for server_round in range(1, rounds + 1):
        assert f"[signds/digits] round {server_round:>3}/{rounds}  accuracy" in proc.stdout

    run = json.loads((tmp_path / "run-signds-default-digits.json").read_text())
    rows = run["rounds"]
    assert [row["round"] for row in rows] == list(range(1, rounds + 1))
    assert all(not any(row["rejected"].values()) for row in rows)
    assert all(0.0 <= row["accuracy"] <= 1.0 and row["epsilon"] > 0 for row in rows)
    assert [row["elapsed_s"] for row in rows] == sorted(row["elapsed_s"] for row in rows)

    # it trains: the model moved away from its initial accuracy, upwards
    assert max(row["accuracy"] for row in rows) > run["initial_accuracy"] + 0.05

    # upload: exactly h ≤ max_dim_out sorted indices + sign + b̂ per client (h is data independent)
    h = output_dim(run["d"], SignDSParams(sign_k=sign_k, sign_eps=sign_eps), max_dim_out)
    assert 1 <= h <= max_dim_out
    for row in rows:
        assert row["indices_per_client"] == h
        assert row["values_per_client"] == h + 2 <= max_dim_out + 2
        assert row["dense_values"] == run["d"] == 2410

    # privacy: R rounds of round_event(sign_eps, rr_eps) per client, composed (replace_one, δ = 1e-5)
    for row in rows:
        assert row["epsilon"] == pytest.approx(_ledger_epsilon(sign_eps, rr_eps, row["round"]), rel=1e-9)
        assert row["epsilon"] == pytest.approx((sign_eps + rr_eps) * row["round"], rel=1e-3)
    assert run["privacy"]["clients"] == clients
    assert run["privacy"]["neighboring_relation"] == "replace_one"

    # MagRR: the next r_est follows the majority of the (debiased) bits and the phase
    config = MagRRConfig(rr_epsilon=rr_eps)
    assert rows[0]["r_est"] == r0
    for row, following in zip(rows, rows[1:] + [None]):
        majority = int(row["debiased_ones"] > clients - row["debiased_ones"])
        assert row["majority"] == majority
        if row["is_reached"] == 0:
            expected = row["r_est"] * (config.expansion_factor if majority == 0 else 1.0)
        else:
            expected = row["r_est"] / (config.reduction_factor if majority == 1 else 1.0)
        assert row["r_est_next"] == pytest.approx(expected, rel=1e-12)
        if following is not None:
            assert following["r_est"] == pytest.approx(row["r_est_next"], rel=1e-12)
            assert following["is_reached"] == row["is_reached_next"]
    # round 1: every client's r is far above 2·r_est = 2e-3, so (bar ≥ 6 of 10 RR flips at P = 0.018) r_est grows
    assert rows[0]["majority"] == 0 and rows[0]["r_est_next"] == pytest.approx(5 * r0)
