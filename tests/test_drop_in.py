"""Drop-in: a plain Flower app with FedAvg, one line swapped for each of our strategies (one simulation)."""

from __future__ import annotations

import json
import math
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def drop_in_lines() -> dict[str, str]:
    """``{strategy name: the line}`` of every registry entry with a ``drop_in`` line, and Flower's FedAvg."""
    from strategy_registry import REGISTRY

    lines = {"FedAvg": "FedAvg(**FEDAVG_ARGS)"}
    lines.update({entry.covers.__name__: entry.drop_in for entry in REGISTRY.values() if entry.drop_in})
    return lines


def test_every_registry_strategy_has_a_drop_in_line_or_says_why_not():
    """tests/strategy_registry.py drives the plain app: each strategy's entry gives its one line (``drop_in``),
    or why no plain app can run it (``not_drop_in``); each line builds a strategy of the class it names."""
    import sys

    from strategy_registry import REGISTRY

    sys.path.insert(0, HERE)
    from plain_app.app import make_strategy

    covered = {entry.covers for entry in REGISTRY.values() if entry.drop_in or entry.not_drop_in}
    assert {entry.covers for entry in REGISTRY.values()} == covered
    for name, line in drop_in_lines().items():
        assert type(make_strategy(line)).__name__ == name, line


@pytest.mark.integration
def test_each_strategy_runs_in_an_unchanged_flower_app(tmp_path):
    from flwr_dp_experiments.simulation import prepare_process, run_app

    prepare_process([HERE])
    lines = drop_in_lines()
    spec = tmp_path / "strategies.json"
    spec.write_text(json.dumps(lines), encoding="utf-8")
    out = tmp_path / "metrics.json"
    results = run_app(
        os.path.join(HERE, "plain_app"),
        {"strategies": str(spec), "out": str(out)},
        num_supernodes=4,
        results_path=out,
    )
    assert set(results) == set(lines)
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
