"""examples/audit: run config consistency, the broken switch's noise, and both runs end to end with ``flwr run``."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from flwr_dp_strategies import AccountedServerSideFixedClipping
from flwr_dp_strategies.audit import CanaryAudit

APP = Path(__file__).resolve().parents[1] / "examples" / "audit"


@pytest.fixture(scope="module")
def app_modules():
    sys.path.insert(0, str(APP))
    try:
        from audit_app import config, server_app

        yield config, server_app
    finally:
        sys.path.remove(str(APP))


def test_pyproject_run_config_matches_code_defaults(app_modules):
    config, _ = app_modules
    with open(APP / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert pyproject["tool"]["flwr"]["app"]["config"] == config.DEFAULTS
    assert pyproject["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "audit_app.server_app:app",
        "clientapp": "audit_app.client_app:app",
    }
    for bad in ({"num-canaries": 0}, {"broken-noise-fraction": 0.0}, {"broken-noise-fraction": 1.5}):
        with pytest.raises(ValueError):
            config.resolve_run_config(type("Ctx", (), {"run_config": bad})())


@pytest.mark.parametrize("broken", [False, True])
def test_the_strategy_books_z_and_the_broken_one_releases_a_fraction_of_it(app_modules, broken, task_identity):
    """All N + k nodes per round (m = N + k); ``broken`` books z but adds ``fraction · z · C / m`` of noise."""
    config, server_app = app_modules
    settings = config.resolve_run_config(type("Ctx", (), {"run_config": {"broken": broken, "num-canaries": 40}})())
    strategy = server_app.build_strategy(settings)
    assert isinstance(strategy, AccountedServerSideFixedClipping)
    assert isinstance(strategy, server_app.UnderNoisedFixedClipping) is broken
    z, c, m = settings["noise-multiplier"], settings["clipping-norm"], settings["num-partitions"] + 40
    assert (strategy.noise_multiplier, strategy.clipping_norm, strategy.num_sampled_clients) == (z, c, m)
    audit = server_app.build_audit(strategy, settings)
    assert isinstance(audit, CanaryAudit) and audit.num_canaries == 40 and audit.canary_norm == 10 * c
    # the release's noise, measured: sum 0 (no update), so the released model is the noise alone
    from flwr_dp_strategies.rounds.streaming_aggregation import ClippedSum

    zeros = {"w": np.zeros(200_000, np.float64)}
    summed = ClippedSum(zeros, c)
    released = strategy._fixed_release(summed, np.random.default_rng(0))["w"].numpy()
    fraction = settings["broken-noise-fraction"] if broken else 1.0
    assert np.std(released) == pytest.approx(fraction * z * c / m, rel=0.02)
    assert strategy.noise_multiplier == z  # restored after the release: the ledger books z


@pytest.mark.integration
@pytest.mark.slow
def test_the_app_audits_a_run_and_raises_the_alarm_when_broken(tmp_path):
    """The default sizes (10 clients + 500 canaries, d = 24 010, one round), correct then broken, one SuperLink."""
    from flwr_dp_experiments.simulation import LocalSimulation, run_app

    log = tmp_path / "flower.log"
    reports = {}
    with LocalSimulation(log) as sim:
        for broken in (False, True):
            out = tmp_path / ("broken" if broken else "correct")
            results = run_app(
                APP,
                {"broken": broken, "results-dir": str(out)},
                num_supernodes=10,
                results_path=out / "audit.json",
                simulation=sim,
            )
            assert (out / "audit.png").stat().st_size > 0
            reports[broken] = results["report"]
            assert len(results["cosines"]["null_final"]) == 500
    text = log.read_text(encoding="utf-8")
    for line in (
        "Canary audit (Andrew et al. 2024), 500 canaries, seed 7, delta=1e-05:",
        "ledger epsilon: 1.9931",
        "epsilon estimate: final model",
        "epsilon lower bounds (all four together at 95% confidence): counts (Clopper-Pearson) final model",
        "never a replacement for the ledger's epsilon",
        "audit figure written to",
    ):
        assert text.count(line) == 2, line
    assert text.count("exceeds the ledger's epsilon") == 1
    correct, broken = reports[False], reports[True]
    assert correct["audit/alarm"] == 0.0 and broken["audit/alarm"] == 1.0
    for key in ("audit/epsilon-lower-bound/final", "audit/epsilon-lower-bound-shift/final"):
        assert correct[key] <= correct["audit/ledger-epsilon"], key
    # half the noise: beyond what 500 canaries' counts can prove, proved by the shift model
    assert broken["audit/epsilon-lower-bound-shift/final"] > broken["audit/ledger-epsilon"]
    assert broken["audit/epsilon-estimate/final"] > correct["audit/epsilon-estimate/final"]
