"""DELM §6.1 data scenarios (IID, n-class non-IID, low-quality data) and the baseline client updates."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from dp_accounting.dp_event import GaussianDpEvent

from flwr_dp_experiments.baselines import evaluate, get_params, ldp_fl_sigma, ldp_fl_update, local_sgd, make_mlp
from flwr_dp_experiments.datasets import EMNIST_LETTERS_FILES, load_digits_split, load_emnist_letters, shared_data_dir
from flwr_dp_strategies.privacy import gaussian_sigma
from flwr_dp_experiments.scenarios import Scenario, build_scenario, corrupt_low_quality, partition_indices, share


@pytest.fixture(scope="module")
def digits():
    return load_digits_split()


@pytest.fixture
def one_thread():
    """torch on one thread, as the experiment runner sets it; restored afterwards."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def test_iid_partitions_cover_every_index_once_and_are_seeded(digits):
    y = digits[1]
    parts = partition_indices(y, 100, "iid", seed=3)
    assert len(parts) == 100 and all(len(p) > 0 for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(y)))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    again, other = partition_indices(y, 100, "iid", seed=3), partition_indices(y, 100, "iid", seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize("partitions", [0, 451, 2.5])
def test_iid_partitions_refuse_more_partitions_than_examples(partitions):
    from flwr_dp_experiments.datasets import iid_partition_indices

    with pytest.raises(ValueError, match=r"num_partitions must be an integer in \[1, 450\]"):
        iid_partition_indices(450, partitions)


@pytest.mark.parametrize("scheme,n", [("1-class", 1), ("2-class", 2)])
def test_n_class_partitions_hold_exactly_n_labels_without_duplicates(digits, scheme, n):
    y = digits[1]
    parts = partition_indices(y, 100, scheme, seed=7)
    assert len(parts) == 100 and all(len(p) > 0 for p in parts)
    assert all(len(np.unique(y[p])) == n for p in parts)
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat) and flat.min() >= 0 and flat.max() < len(y)
    again = partition_indices(y, 100, scheme, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    if n == 1:  # first-deterministic: client p holds class p mod 10, each class goes to 10 clients
        assert [int(y[p][0]) for p in parts] == [p % 10 for p in range(100)]
        assert np.array_equal(np.sort(flat), np.arange(len(y)))


def test_bad_partition_parameters_raise(digits):
    y = digits[1]
    for scheme in ("non-iid", "0-class", "class"):
        with pytest.raises(ValueError, match="scheme"):
            partition_indices(y, 10, scheme)
    with pytest.raises(ValueError, match="num_partitions"):
        partition_indices(y, 0, "iid")
    with pytest.raises(ValueError, match="class_assignment"):
        partition_indices(y, 10, "2-class", class_assignment="sorted")


def test_low_quality_corrupts_exactly_the_chosen_share(digits):
    x, y = digits[0], digits[1]
    parts = partition_indices(y, 20, "iid", seed=1)
    x_new, y_new, lq = corrupt_low_quality(x, y, parts, lq_user=0.3, lq_data=0.5, num_classes=10, seed=2)
    assert len(lq) == share(0.3, 20) == 6 and len(set(lq)) == 6
    for client, p in enumerate(parts):
        changed = y_new[p] != y[p]
        noised = np.any(x_new[p] != x[p], axis=1)
        expected = share(0.5, len(p)) if client in lq else 0
        assert changed.sum() == expected and np.array_equal(changed, noised)
    assert x_new.min() >= x.min() and x_new.max() <= x.max() and x_new.dtype == x.dtype
    assert np.array_equal(y, digits[1]) and y_new.min() >= 0 and y_new.max() < 10  # inputs untouched
    again = corrupt_low_quality(x, y, parts, lq_user=0.3, lq_data=0.5, num_classes=10, seed=2)
    assert again[2] == lq and np.array_equal(again[1], y_new) and np.array_equal(again[0], x_new)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"lq_user": 1.5}, "lq_user"),
        ({"lq_data": -0.1}, "lq_data"),
        ({"num_classes": 1}, "num_classes"),
        ({"noise_std": -1.0}, "noise_std"),
    ],
)
def test_low_quality_rejects_bad_parameters(digits, kwargs, name):
    x, y = digits[0], digits[1]
    args = {"lq_user": 0.3, "lq_data": 0.3, "num_classes": 10, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=name):
        corrupt_low_quality(x, y, partition_indices(y, 10, "iid"), **args)


def test_overlapping_partitions_are_rejected(digits):
    x, y = digits[0], digits[1]
    with pytest.raises(ValueError, match="disjoint"):
        corrupt_low_quality(x, y, (np.arange(10), np.arange(5, 15)), 0.5, 0.5, 10)


def test_build_scenario_on_digits():
    clients, (x_te, y_te), meta = build_scenario(Scenario("lq", "digits", "2-class", 0.5, 0.3, num_clients=10))
    assert len(clients) == 10 and sum(len(c[1]) for c in clients) == sum(meta["client_sizes"])
    assert all(len(c) == 2 for c in meta["client_classes"]) and len(meta["low_quality_clients"]) == 5
    assert meta["num_classes"] == 10 and meta["input_dim"] == 64 and len(y_te) == len(x_te)


def test_fedprox_stays_closer_to_the_global_model(digits, one_thread):
    x, y = digits[0][:200], digits[1][:200]
    start = get_params(make_mlp(64, 32, 10, seed=0))
    kwargs = {"epochs": 2, "lr": 0.2, "batch_size": 16, "seed": 5}
    plain, prox = local_sgd(start, x, y, **kwargs), local_sgd(start, x, y, proximal_mu=1.0, **kwargs)
    distance = [np.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(p, start))) for p in (plain, prox)]
    assert distance[1] < 0.9 * distance[0]
    assert [a.shape for a in plain] == [a.shape for a in start] and plain[0].dtype == np.float32
    assert np.array_equal(plain[0], local_sgd(start, x, y, **kwargs)[0])  # seeded
    assert evaluate(plain, digits[2], digits[3]) > evaluate(start, digits[2], digits[3])


def test_ldp_fl_noise_std_matches_the_analytic_gaussian_sigma():
    start = get_params(make_mlp(784, 64, 10, seed=0))  # 50 890 coordinates
    clip, eps, delta = 0.5, 2.0, 1e-5
    small = [p + 1e-5 for p in start]  # ‖update‖ ≈ 2e-3 < C: not clipped
    out, event = ldp_fl_update(start, small, clip=clip, epsilon=eps, delta=delta, rng=11)
    residual = np.concatenate([(o.astype(np.float64) - s).ravel() for o, s in zip(out, small)])
    sigma = gaussian_sigma(eps, delta, 2 * clip)
    assert sigma == ldp_fl_sigma(clip, eps, delta) and event == GaussianDpEvent(sigma / (2 * clip))
    tolerance = 6.0 / np.sqrt(2 * residual.size)  # 6 standard errors of a sample std
    assert abs(residual.std() / sigma - 1) < tolerance and abs(residual.mean()) < 6 * sigma / np.sqrt(residual.size)
    assert [o.shape for o in out] == [s.shape for s in start] and out[0].dtype == np.float32


def test_ldp_fl_clips_the_whole_update_to_c_before_noise():
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(8, 4)), rng.normal(size=8)]
    update = [rng.normal(size=(8, 4)), rng.normal(size=8)]
    norm = np.sqrt(sum(float((u**2).sum()) for u in update))
    clip = norm / 10
    big = [s + u for s, u in zip(start, update)]
    clipped = [s + u * (clip / norm) for s, u in zip(start, update)]  # norm exactly C
    kwargs = {"clip": clip, "epsilon": 1.0, "delta": 1e-5, "rng": 3}
    a, _ = ldp_fl_update(start, big, **kwargs)
    b, _ = ldp_fl_update(start, clipped, **kwargs)
    assert all(np.allclose(x, z, rtol=0, atol=1e-12) for x, z in zip(a, b))
    with pytest.raises(ValueError, match="clip"):
        ldp_fl_update(start, big, clip=0.0, epsilon=1.0, delta=1e-5, rng=0)


EMNIST_TRAIN_IMAGES = os.path.join(shared_data_dir("emnist-letters"), EMNIST_LETTERS_FILES["train"][0])


@pytest.mark.skipif(not os.path.exists(EMNIST_TRAIN_IMAGES), reason="EMNIST Letters files not present")
def test_emnist_letters_loads_124800_20800_with_labels_0_to_25():
    x_tr, y_tr, x_te, y_te = load_emnist_letters()
    assert x_tr.shape == (124_800, 784) and x_te.shape == (20_800, 784) and x_tr.dtype == np.float32
    assert np.array_equal(np.unique(y_tr), np.arange(26)) and np.array_equal(np.bincount(y_te), np.full(26, 800))
    assert 0.0 <= x_tr.min() and x_tr.max() <= 1.0
