"""Streaming aggregation: zero-copy reads, in-place weighted / clipped sums equal to plain numpy, O(d) memory."""

from __future__ import annotations

import gc
import math
import tracemalloc
from io import BytesIO

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords, aggregate_metricrecords

from loopback import LoopbackGrid
from flwr_dp_strategies import AccountedFedAvg, AccountedPoissonFixedClipping, AccountedServerSideFixedClipping
from flwr_dp_strategies.rounds.metrics import aggregate_reply_metrics
from flwr_dp_strategies.rounds.streaming_aggregation import (
    ClippedSum,
    NonFiniteReplies,
    WeightedMean,
    add_gaussian_noise,
    all_finite,
    mean_of_records,
    non_finite_records,
    npy_view,
    to_array,
)

DTYPES = [
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.int32,
    np.int64,
    np.uint8,
    np.bool_,
    np.complex64,
    np.dtype(">f4"),
    np.dtype(">i8"),
]


def sample(dtype, shape=(3, 4), seed: int = 0) -> np.ndarray:
    gen = np.random.default_rng(seed)
    values = gen.normal(size=shape) * 5
    if np.dtype(dtype).kind == "c":
        values = values + 1j * gen.normal(size=shape)
    return np.asarray(values).astype(dtype)


# ---------------------------------------------------------------------- reading and writing payloads
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 4), (), (0,), (2, 3, 5)], ids=str)
def test_npy_view_equals_array_numpy_and_shares_the_payload(dtype, shape):
    arr = Array(sample(dtype, shape))
    view, decoded = npy_view(arr), arr.numpy()
    assert view.dtype == decoded.dtype and view.shape == decoded.shape
    np.testing.assert_array_equal(view, decoded)
    assert not view.flags.writeable
    if view.size:
        assert np.shares_memory(view, np.frombuffer(arr.data, dtype=np.uint8))  # zero-copy


@pytest.mark.parametrize(
    "make",
    [
        lambda x: np.asfortranarray(x),  # np.save writes fortran_order=True
        lambda x: x[:, ::2],  # non-contiguous source: saved as a C copy
        lambda x: x.T,
    ],
)
def test_unusual_memory_layouts_read_correctly(make):
    source = make(sample(np.float64, (6, 8)))
    arr = Array(source)
    np.testing.assert_array_equal(npy_view(arr), source)
    np.testing.assert_array_equal(npy_view(arr), arr.numpy())


def test_what_the_fast_path_cannot_read_falls_back_to_array_numpy():
    structured = np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")])
    arr = Array(structured)
    assert npy_view(arr).dtype == structured.dtype  # decoded by Array.numpy()
    truncated = Array(dtype="float32", shape=(4,), stype="numpy.ndarray", data=Array(np.ones(4, np.float32)).data[:-4])
    with pytest.raises(ValueError):
        npy_view(truncated)  # Array.numpy()'s own error
    foreign = Array(dtype="float32", shape=(4,), stype="torch.tensor", data=b"\x00" * 16)
    with pytest.raises(TypeError):
        npy_view(foreign)
    buffer = BytesIO()
    np.lib.format.write_array(buffer, np.arange(5.0), version=(3, 0))  # not parsed by the fast path
    v3 = Array(dtype="float64", shape=(5,), stype="numpy.ndarray", data=buffer.getvalue())
    np.testing.assert_array_equal(npy_view(v3), np.arange(5.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_to_array_is_byte_identical_to_flower_array(dtype):
    values = sample(dtype, (7, 3))
    assert to_array(values).data == Array(values).data
    assert (to_array(values).dtype, to_array(values).shape) == (Array(values).dtype, Array(values).shape)
    fortran = np.asfortranarray(values)
    np.testing.assert_array_equal(to_array(fortran).numpy(), values)


@pytest.mark.parametrize("shape", [(), (0,), (5,), (7, 3), (3, 7), (2, 3, 4)], ids=str)
def test_to_array_header_cache_keeps_each_shape_and_byte_order_apart(shape):
    for dtype in (np.dtype("<f8"), np.dtype(">f8"), np.dtype(np.float32)):
        values = np.arange(math.prod(shape), dtype=dtype).reshape(shape)
        for _ in range(2):  # the second call reads the cached header
            assert to_array(values).data == Array(values).data
            np.testing.assert_array_equal(to_array(values).numpy(), values)


def test_all_finite_is_exact_even_when_the_sum_overflows():
    assert all_finite(np.full(8, 3e38, dtype=np.float32))  # the sum overflows, the entries do not
    assert not all_finite(np.array([1.0, np.nan]))
    assert not all_finite(np.array([np.inf, -np.inf, 1.0]))  # sums to NaN
    assert all_finite(np.arange(5))  # integers are always finite


# ---------------------------------------------------------------------- weighted mean
def records_of_dtypes(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    gen = np.random.default_rng(seed)
    return [
        {
            "w32": gen.normal(size=(40, 30)).astype(np.float32),  # ≥ 1024 entries: the BLAS axpy path
            "w64": gen.normal(size=(5,)),
            "half": gen.normal(size=(2, 2)).astype(np.float16),
            "count": gen.integers(-50, 50, size=(3,)),
            "flag": gen.random(4) < 0.5,
            "scalar": np.array(gen.normal()),
        }
        for _ in range(n)
    ]


def reference_mean(records: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    total = sum(weights)
    return {key: sum(w * r[key].astype(np.float64) for r, w in zip(records, weights)) / total for key in records[0]}


@pytest.mark.parametrize(
    "weights",
    [[2.0] * 6, [1.0, 5.0, 2.5, 10.0, 7.0, 3.0], [3.0, 3.0, 3.0, 1.0, 3.0, 8.0]],
    ids=["equal", "unequal", "equal-then-unequal"],
)
def test_weighted_mean_equals_numpy_reference_and_keeps_fedavg_dtypes(weights):
    records = records_of_dtypes(len(weights))
    got = mean_of_records([ArrayRecord({k: Array(v) for k, v in r.items()}) for r in records], weights)
    expected = reference_mean(records, weights)
    flower = aggregate_arrayrecords(
        [
            RecordDict({"a": ArrayRecord({k: Array(v) for k, v in r.items()}), "m": MetricRecord({"n": w})})
            for r, w in zip(records, weights)
        ],
        "n",
    )
    assert list(got.keys()) == list(records[0])
    for key, value in expected.items():
        ours = got[key].numpy()
        assert ours.dtype == flower[key].numpy().dtype, key  # FedAvg's output dtypes
        tolerance = {np.float16: 2e-3, np.float32: 2e-6}.get(ours.dtype.type, 1e-12)
        np.testing.assert_allclose(ours, value, rtol=tolerance, atol=tolerance, err_msg=key)


def test_weighted_mean_accepts_ndarrays_and_per_key_weights():
    mean = WeightedMean()
    a, b = np.arange(2000, dtype=np.float32), np.ones(2000, dtype=np.float32)
    mean.add("x", a, 1.0)
    mean.add("x", b, 3.0)  # switches to the weighted accumulation
    mean.add("y", b, 7.0)  # another key, its own total
    out = mean.result()
    np.testing.assert_allclose(out["x"].numpy(), (a + 3 * b) / 4, rtol=1e-6)
    np.testing.assert_array_equal(out["y"].numpy(), b)


def test_round_integers_keeps_the_integer_dtype():
    mean = WeightedMean()
    mean.add("k", np.array([1, 2, 9], dtype=np.int16), 1.0)
    mean.add("k", np.array([2, 2, 0], dtype=np.int16), 1.0)
    got = mean.mean("k", round_integers=True)
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, [2, 2, 4])  # 1.5 -> 2, 2, 4.5 -> 4 (half to even, np.rint)


@pytest.mark.parametrize("weight", [0.0, -1.0, math.inf, math.nan])
def test_bad_weights_and_shapes_raise(weight):
    mean = WeightedMean()
    with pytest.raises(ValueError, match="weights"):
        mean.add("k", np.ones(3), weight)
    mean.add("k", np.ones(3), 1.0)
    with pytest.raises(ValueError, match="shape"):
        mean.add("k", np.ones(4), 1.0)


def test_non_finite_records_are_named_and_nothing_is_returned():
    records = [ArrayRecord([np.ones(3000, np.float32)]) for _ in range(4)]
    records[2] = ArrayRecord([np.array([1.0, np.nan, 2.0], np.float32).repeat(1000)])
    records[3] = ArrayRecord([np.full(3000, np.inf, np.float32)])
    assert non_finite_records(records) == [2, 3]
    with pytest.raises(NonFiniteReplies) as err:
        mean_of_records(records, [1.0] * 4)
    assert err.value.indices == [2, 3]


def test_fast_metric_aggregation_equals_flowers():
    contents = [
        RecordDict({"m": MetricRecord({"num-examples": w, "loss": 0.5 * i, "acc": [0.1 * i, 0.2], "count": i})})
        for i, w in enumerate([3, 1, 7.5, 2])
    ]
    ours = aggregate_reply_metrics(aggregate_metricrecords, contents, "num-examples")
    assert dict(ours) == dict(aggregate_metricrecords(contents, "num-examples"))
    custom = aggregate_reply_metrics(lambda cs, key: MetricRecord({"n": float(len(cs))}), contents, "num-examples")
    assert custom["n"] == 4.0


# ---------------------------------------------------------------------- clipped sum
def reference_clipped_sum(reference, replies, factors, clip):
    out = {k: np.zeros(v.shape) for k, v in reference.items()}
    for reply, factor in zip(replies, factors):
        diffs = {k: reply[k].astype(np.float64) - reference[k] for k in reference}
        norm = math.sqrt(sum(float(np.sum(d * d)) for d in diffs.values()))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        for k in out:
            out[k] += factor * scale * diffs[k]
    return out


def test_clipped_sum_equals_reference_over_keys_and_dtypes():
    gen = np.random.default_rng(3)
    reference = {"big": gen.normal(size=(700, 3)).astype(np.float32), "small": gen.normal(size=4)}
    replies = [
        {k: (v + gen.normal(size=v.shape) * s).astype(v.dtype) for k, v in reference.items()}
        for s in (0.001, 0.01, 0.5, 2.0, 0.0)
    ]  # some clipped, some not, one zero update
    factors = [1.0, 2.0, 0.5, 3.0, 1.0]
    summed = ClippedSum({k: npy_view(Array(v)) for k, v in reference.items()}, clipping_norm=1.0)
    norms = [summed.add([Array(r[k]) for k in reference], f) for r, f in zip(replies, factors)]
    expected = reference_clipped_sum(reference, replies, factors, 1.0)
    sums = summed.result()
    assert sums["big"].dtype == np.float32 and sums["small"].dtype == np.float64
    for key, ref in reference.items():
        # rounding: that of w itself (as when Flower adds w back to each clipped update), times Σ f
        atol = 4 * np.finfo(ref.dtype).eps * sum(factors) * float(np.abs(ref).max())
        np.testing.assert_allclose(sums[key], expected[key], rtol=1e-5, atol=atol)
    assert norms[-1] == 0.0 and summed.count == 5 and summed.clipped == 2


def test_clipped_sum_refuses_a_non_finite_reply_without_adding_any_of_it():
    reference = {"a": np.zeros(3000, np.float32)}
    summed = ClippedSum(reference, 1.0)
    assert summed.add([np.full(3000, 0.001, np.float32)]) == pytest.approx(0.001 * math.sqrt(3000))  # not clipped
    bad = np.full(3000, 0.001, np.float32)
    bad[-1] = np.nan
    assert summed.add([bad]) is None
    huge = np.full(3000, 1e30, np.float32)  # the float32 dots overflow: the norm is still found
    assert summed.add([huge]) == pytest.approx(1e30 * math.sqrt(3000), rel=1e-5)
    assert (summed.count, summed.clipped) == (2, 1)
    np.testing.assert_allclose(summed.result()["a"], 0.001 + 1 / math.sqrt(3000), rtol=1e-5)


def test_gaussian_noise_equals_one_generator_call():
    values = np.zeros(200_003)
    add_gaussian_noise(values, 0.7, np.random.default_rng(5))
    np.testing.assert_array_equal(values, np.random.default_rng(5).normal(0.0, 0.7, 200_003))


# ---------------------------------------------------------------------- memory
def peak_during(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def fifty_replies():
    d = 200_000
    gen = np.random.default_rng(0)
    rows = [gen.normal(size=d).astype(np.float32) for _ in range(4)]
    return d, [ArrayRecord([rows[i % 4] + np.float32(i)]) for i in range(50)]


@pytest.mark.parametrize("weights", ["equal", "unequal"])
def test_peak_memory_of_the_weighted_mean_is_o_d(fifty_replies, weights):
    d, records = fifty_replies
    w = [1.0] * 50 if weights == "equal" else [1.0 + i for i in range(50)]
    peak = peak_during(lambda: mean_of_records(records, w))
    assert peak < 4 * 4 * d, peak / (4 * d)  # < 4 model sizes (stacking would be 50)


def test_peak_memory_of_the_clipped_sum_is_o_d(fifty_replies):
    d, records = fifty_replies

    def run():
        summed = ClippedSum({"0": np.zeros(d, np.float32)}, 1.0)
        for record in records:
            summed.add(list(record.values()), 1.0)
        summed.result()

    assert peak_during(run) < 4 * 4 * d


@pytest.mark.usefixtures("task_identity")
def test_peak_memory_of_accounted_fedavg_is_o_d(fifty_replies):
    d, records = fifty_replies
    strategy = AccountedFedAvg(min_train_nodes=50, min_available_nodes=50)
    msgs = list(
        strategy.configure_train(1, ArrayRecord([np.zeros(d, np.float32)]), ConfigRecord(), LoopbackGrid.of(50))
    )
    replies = [
        Message(RecordDict({"arrays": rec, "metrics": MetricRecord({"num-examples": 2.0})}), reply_to=m)
        for m, rec in zip(msgs, records)
    ]
    assert peak_during(lambda: strategy.aggregate_train(1, replies)) < 4 * 4 * d


# ---------------------------------------------------------------------- strategies against Flower's own
def mixed_model(seed: int) -> dict[str, np.ndarray]:
    gen = np.random.default_rng(seed)
    return {
        "conv.weight": gen.normal(size=(32, 40)).astype(np.float32),
        "conv.bias": gen.normal(size=7),
        "fc.weight": gen.normal(size=(3, 3)).astype(np.float32),
    }


def replies_for(msgs, models, weights):
    return [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in model.items()}),
                    "metrics": MetricRecord({"num-examples": w, "loss": 0.1 * w}),
                }
            ),
            reply_to=m,
        )
        for m, model, w in zip(msgs, models, weights)
    ]


@pytest.mark.usefixtures("task_identity")
def test_accounted_fedavg_equals_flower_fedavg_on_mixed_models():
    n, weights = 5, [3.0, 1.0, 7.0, 2.0, 5.5]
    current = ArrayRecord({k: Array(v) for k, v in mixed_model(0).items()})
    models = [mixed_model(i + 1) for i in range(n)]
    results = []
    for strategy in (
        AccountedFedAvg(min_train_nodes=n, min_available_nodes=n),
        FedAvg(min_train_nodes=n, min_available_nodes=n),
    ):
        msgs = list(strategy.configure_train(1, current, ConfigRecord(), LoopbackGrid.of(n)))
        results.append(strategy.aggregate_train(1, replies_for(msgs, models, weights)))
    (ours, our_metrics), (theirs, their_metrics) = results
    assert list(ours.keys()) == list(theirs.keys())
    for key in theirs.keys():
        assert ours[key].numpy().dtype == theirs[key].numpy().dtype
        np.testing.assert_allclose(ours[key].numpy(), theirs[key].numpy(), rtol=2e-6, atol=1e-6)
    assert our_metrics["loss"] == pytest.approx(their_metrics["loss"])


@pytest.mark.usefixtures("task_identity")
def test_server_side_fixed_clipping_equals_a_direct_computation_with_the_same_generator():
    """w + Σ clipped Δ / m + N(0, (zC/m)²) with the generator's own draws (uniform weights: fixed denominator)."""
    n, z, clip = 4, 0.5, 1.0
    base = mixed_model(0)
    current = ArrayRecord({k: Array(v) for k, v in base.items()})
    models = [
        {k: (v + s * np.random.default_rng(i).normal(size=v.shape)).astype(v.dtype) for k, v in base.items()}
        for i, s in enumerate((0.001, 0.01, 1.0, 3.0))
    ]
    strategy = AccountedServerSideFixedClipping(
        FedAvg(min_train_nodes=n, min_available_nodes=n), z, clip, n, rng=np.random.default_rng(5)
    )
    msgs = list(strategy.configure_train(1, current, ConfigRecord(), LoopbackGrid.of(n)))
    ours = strategy.aggregate_train(1, replies_for(msgs, models, [10.0, 20.0, 30.0, 40.0]))[0]
    clipped = reference_clipped_sum(base, models, [1.0] * n, clip)
    gen = np.random.default_rng(5)
    for key, value in base.items():
        expected = value + clipped[key] / n + gen.normal(0.0, z * clip / n, value.shape)
        assert ours[key].numpy().dtype == value.dtype
        np.testing.assert_allclose(ours[key].numpy(), expected.astype(value.dtype), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("task_identity")
def test_poisson_release_equals_a_direct_computation_with_the_same_generator():
    m, z, clip = 3, 0.8, 1.0
    base = mixed_model(0)
    strategy = AccountedPoissonFixedClipping(FedAvg(), z, clip, m, num_clients=m, rng=np.random.default_rng(11))
    msgs = list(
        strategy.configure_train(
            1, ArrayRecord({k: Array(v) for k, v in base.items()}), ConfigRecord(), LoopbackGrid.of(m)
        )
    )  # q = 1: every node is asked
    models = [
        {k: (v + s * np.random.default_rng(i).normal(size=v.shape)).astype(v.dtype) for k, v in base.items()}
        for i, s in enumerate((0.001, 0.5, 2.0))
    ]
    arrays, metrics = strategy.aggregate_train(1, replies_for(msgs, models, [1.0, 1.0, 1.0]))
    clipped = reference_clipped_sum(base, models, [1.0] * m, clip)
    gen = np.random.default_rng(11)
    gen.random(m)  # the Poisson sample drawn in configure_train
    for key, value in base.items():
        expected = value + clipped[key] / m + gen.normal(0.0, z * clip / m, value.shape)
        assert arrays[key].numpy().dtype == value.dtype
        np.testing.assert_allclose(arrays[key].numpy(), expected.astype(value.dtype), rtol=1e-5, atol=1e-5)
    assert "dp/participants" not in metrics


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_inputs_never_give_a_non_finite_mean(dtype):
    """Audit: two float32-max arrays, or a weight of 1e39 / 1e308, gave an all-NaN model; Flower stays finite."""
    top = np.finfo(dtype).max
    cases = [
        ([np.full(2000, top, dtype), np.full(2000, top, dtype)], [1.0, 1.0]),
        ([np.full(2000, top, dtype), np.full(2000, -top, dtype), np.full(2000, 1.0, dtype)], [1e39, 1e39, 1.0]),
        ([np.full(2000, 0.5 * top, dtype), np.full(2000, 1.0, dtype)], [1e308, 1.0]),
    ]
    for arrays, weights in cases:
        mean = mean_of_records([{"w": a} for a in arrays], weights)["w"].numpy()
        assert mean.dtype == dtype and np.isfinite(mean).all()
        shares = np.array(weights) / max(weights)
        shares /= shares.sum()  # convex weights first, so the reference itself cannot overflow
        expected = sum(share * a.astype(np.float64) for a, share in zip(arrays, shares))
        np.testing.assert_allclose(mean, expected.astype(dtype), rtol=1e-6)


@pytest.mark.usefixtures("task_identity")
def test_aggregation_runs_blas_on_one_thread_and_restores_it(monkeypatch):
    """On a busy machine a multi-threaded BLAS axpy spins against the Ray actors (issue 17): the strategies'
    aggregation runs in a single-thread BLAS scope, and the process setting is restored afterwards."""
    from threadpoolctl import threadpool_info

    from flwr_dp_strategies import AccountedFedAvg
    from flwr_dp_strategies.strategy import accounted_fedavg

    def blas_threads() -> list[int]:
        return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]

    seen = []
    original = accounted_fedavg.mean_of_records

    def spying(*args, **kwargs):
        seen.append(blas_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(accounted_fedavg, "mean_of_records", spying)
    before = blas_threads()
    strategy = AccountedFedAvg(min_train_nodes=2, min_available_nodes=2)
    msgs = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(2)))
    strategy.aggregate_train(
        1,
        [
            Message(
                RecordDict({"arrays": ArrayRecord([np.ones(3)]), "metrics": MetricRecord({"num-examples": 1.0})}),
                reply_to=m,
            )
            for m in msgs
        ],
    )
    assert seen and all(n == 1 for n in seen[0])
    assert blas_threads() == before
