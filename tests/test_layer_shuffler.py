"""LayerShuffler: per-layer permutations that keep every layer's multiset and weighted mean."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from flwr_dp_strategies.layer_shuffler import LayerShuffler
from flwr_dp_strategies.layer_shuffler import layer_groups

N, M = 20, 4


def make_reports(n: int = N, m: int = M, seed: int = 0) -> tuple[list[list[np.ndarray]], list[float]]:
    """Client i's layer j is filled with the tag 100*i + j (so its origin is readable), plus noise."""
    gen = np.random.default_rng(seed)
    reports = [[np.full(j + 2, 100.0 * i + j) + gen.normal(size=j + 2) * 1e-3 for j in range(m)] for i in range(n)]
    weights = list(gen.uniform(1.0, 50.0, size=n))
    return reports, weights


def origin(segment: np.ndarray) -> int:
    return int(round(segment[0])) // 100


def test_every_layer_keeps_its_multiset_of_segments_and_weights():
    reports, weights = make_reports()
    shuffled, shuffled_weights = LayerShuffler(3).shuffle(reports, weights)
    assert len(shuffled) == N and all(len(r) == M for r in shuffled)
    for j in range(M):
        sources = [origin(shuffled[r][j]) for r in range(N)]
        assert sorted(sources) == list(range(N))  # each client's segment exactly once
        for r in range(N):
            i = sources[r]
            assert shuffled[r][j] is reports[i][j]
            assert shuffled_weights[r][j] == weights[i]  # the weight travels with the segment


def test_weighted_layer_means_are_unchanged():
    reports, weights = make_reports()
    shuffled, shuffled_weights = LayerShuffler(5).shuffle(reports, weights)
    for j in range(M):
        before = sum(w * rep[j] for w, rep in zip(weights, reports)) / sum(weights)
        total = sum(ws[j] for ws in shuffled_weights)
        after = sum(ws[j] * rep[j] for ws, rep in zip(shuffled_weights, shuffled)) / total
        np.testing.assert_allclose(after, before, rtol=1e-12)


def test_layers_are_mixed_across_clients():
    reports, weights = make_reports()
    shuffled, _ = LayerShuffler(11).shuffle(reports, weights)
    single_client = sum(len({origin(seg) for seg in report}) == 1 for report in shuffled)
    assert single_client < 3


def test_source_of_a_position_is_uniform_over_clients():
    trials = 4000
    counts = np.zeros((M, N), dtype=np.int64)
    for seed in range(trials):
        perms = LayerShuffler(seed).permutations(N, M)
        counts[np.arange(M), perms[:, 7]] += 1  # report 7, every layer
    for j in range(M):
        assert stats.chisquare(counts[j]).pvalue > 1e-3


def test_layers_of_a_report_come_from_independent_clients():
    """P(layers 0 and 1 of a report come from the same client) = 1/N: the layers are not linked."""
    trials = 4000
    gen = np.random.default_rng(7)
    same = sum(
        int(perms[0, 3] == perms[1, 3]) for perms in (LayerShuffler(gen).permutations(N, M) for _ in range(trials))
    )
    assert stats.binomtest(same, trials, 1.0 / N).pvalue > 1e-3


def test_seeded_shuffles_reproduce_and_default_rng_differs():
    reports, weights = make_reports()
    a = LayerShuffler(42).shuffle(reports, weights)
    b = LayerShuffler(42).shuffle(reports, weights)
    assert [[origin(s) for s in r] for r in a[0]] == [[origin(s) for s in r] for r in b[0]]
    fresh = LayerShuffler()
    assert not np.array_equal(fresh.permutations(N, M), fresh.permutations(N, M))
    gen = np.random.default_rng(1)
    assert LayerShuffler(gen).permutations(N, M).shape == (M, N)


@pytest.mark.parametrize(
    "reports, weights",
    [
        ([], []),
        ([[np.ones(1)], [np.ones(1)]], [1.0]),
        ([[np.ones(1)], [np.ones(1), np.ones(1)]], [1.0, 1.0]),
        ([[np.ones(1)], [np.ones(1)]], [1.0, float("nan")]),
        ([[]], [1.0]),
    ],
)
def test_malformed_input_raises(reports, weights):
    with pytest.raises(ValueError):
        LayerShuffler(0).shuffle(reports, weights)


def test_layer_groups():
    keys = ["conv.weight", "fc1.weight", "conv.bias", "fc1.bias", "scale", "block.0.weight"]
    assert layer_groups(keys) == {
        "conv": ["conv.weight", "conv.bias"],
        "fc1": ["fc1.weight", "fc1.bias"],
        "scale": ["scale"],
        "block.0": ["block.0.weight"],
    }
    assert layer_groups(["0", "1"]) == {"0": ["0"], "1": ["1"]}
    assert layer_groups(keys, lambda k: k.split(".")[0])["block"] == ["block.0.weight"]
