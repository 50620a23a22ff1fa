"""Drop-in: a plain Flower app with FedAvg, one line swapped for each of our strategies (one simulation)."""

from __future__ import annotations

import math
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


#: Registry strategies the plain app cannot run unchanged, and why (their own suites run them in an app).
NOT_DROP_IN = {
    "NoisyObjectiveSum": "its clients upload objective coefficients, not a model (examples/private-objective)",
    "DistributedDpFedAvg": "its clients run the secure-aggregation protocol (distributed_dp_mod)",
    "SecureObjectiveSum": "its clients run the secure-aggregation protocol (SecureObjectiveTrainer)",
    "NoisyClippedMean": "the worked example of docs/architecture.md, outside the package",
}


def test_the_drop_in_app_covers_every_registry_strategy():
    """tests/strategy_registry.py drives the coverage: a new strategy is in the plain app or says why not."""
    import sys

    from strategy_registry import REGISTRY

    sys.path.insert(0, HERE)
    from plain_app.app import DROP_IN

    registry = {entry.covers.__name__ for entry in REGISTRY.values()}
    assert registry - set(NOT_DROP_IN) <= set(DROP_IN), sorted(registry - set(NOT_DROP_IN) - set(DROP_IN))
    assert set(NOT_DROP_IN) <= registry  # no stale exemption


@pytest.mark.integration
def test_each_strategy_runs_in_an_unchanged_flower_app(tmp_path):
    from flwr_dp_experiments.simulation import prepare_process, run_app

    prepare_process([HERE])
    from plain_app.app import DROP_IN

    out = tmp_path / "metrics.json"
    results = run_app(
        os.path.join(HERE, "plain_app"),
        {"strategies": ",".join(DROP_IN), "out": str(out)},
        num_supernodes=4,
        results_path=out,
    )
    assert set(results) == set(DROP_IN)
    for name, result in results.items():
        assert result["changed"], name  # the model was trained and released
        if name == "FedAvg":
            assert 0.0 <= result["evaluate"]["accuracy"] <= 1.0  # the app's own evaluation runs
        else:  # the clients' accuracy is a statistic of their data: withheld unless declared (issue 37)
            assert "accuracy" not in result["evaluate"] and "privacy/epsilon" in result["evaluate"], name
        assert not any(key.startswith(("rejected/", "replies/")) for key in result["train"]), name
    for name in (
        "AccountedServerSideFixedClipping",
        "AccountedPoissonFixedClipping",
        "AccountedAdaptiveClipping",
        "AccountedClientSideAdaptiveClipping",
        "AccountedBandedMatrixFactorization",
        "SignDS",
    ):
        assert 0 < results[name]["train"]["privacy/epsilon"] < math.inf, name
    for name in ("AccountedAdaptiveClipping", "AccountedClientSideAdaptiveClipping"):  # float32 model, clients clip
        assert 0 < results[name]["train"]["dp/clipping-norm"] < math.inf, name
    # selecting all NODES replies per layer / shuffling layers: the same aggregate as FedAvg
    for name in (
        "FedAvg",
        "AccountedFedAvg",
        "ClusterEvaluation",
        "MinDivergenceExpSampling",
        "ShuffleAmplifiedFedAvg",
    ):  # no noise: same training as FedAvg, the same final model
        assert results[name]["model"] == pytest.approx(results["FedAvg"]["model"], rel=1e-5), name
    assert results["FedAvg"]["evaluate"]["accuracy"] > 0.5
    # plain clients declare nothing: their dense updates are booked as non-private, never as epsilon = 0
    assert results["AccountedFedAvg"]["train"]["privacy/epsilon"] == math.inf
    assert results["SignDS"]["train"]["signds/values-per-client"] <= 100
    # no inference results: not scored; the count of replies without one stays in the server's log
    assert "cluster/missing" not in results["ClusterEvaluation"]["evaluate"]
