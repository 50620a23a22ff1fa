"""Drop-in: a plain Flower app with FedAvg, one line swapped for each of our strategies (one simulation)."""

from __future__ import annotations

import math
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


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
        assert 0.0 <= result["evaluate"]["accuracy"] <= 1.0, name  # the app's own evaluation still runs
        assert not any(key.startswith(("rejected/", "replies/")) for key in result["train"]), name
    for name in (
        "AccountedServerSideFixedClipping",
        "AccountedPoissonFixedClipping",
        "AccountedAdaptiveClipping",
        "AccountedClientSideAdaptiveClipping",
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
    ):  # no noise: same training as FedAvg
        assert results[name]["evaluate"]["accuracy"] == pytest.approx(
            results["FedAvg"]["evaluate"]["accuracy"], abs=1e-6
        )
        assert results[name]["evaluate"]["accuracy"] > 0.5
    # plain clients declare nothing: their dense updates are booked as non-private, never as epsilon = 0
    assert results["AccountedFedAvg"]["train"]["privacy/epsilon"] == math.inf
    assert results["SignDS"]["train"]["signds/values-per-client"] <= 100
    assert results["ClusterEvaluation"]["evaluate"]["cluster/missing"] == 4  # no inference results: not scored
