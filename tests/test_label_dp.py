"""Label DP (seed 003): randomized response on labels, and randomising once per node.

Statistical tests use fixed seeds and check the sample against the claimed law
(must not reject at p = 1e-3) *and* against the law with the probability 10 %
off in either direction (must reject at p = 1e-3), so a mis-scaled flip or keep
probability fails. Sample sizes put the 10 % alternatives many standard errors
away (numbers in each test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
import torch
from flwr.app import Context, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from client_mods.label_dp import LabelDp
from client_mods.label_dp_data import (
    LABEL_DP_DECLARATION,
    LabelDpDataset,
    declare_label_release,
    is_label_release_declared,
    label_release_event,
    private_labels,
)
from flwr_dp_strategies.declarations import read_declarations
from flwr_dp_strategies.privacy import PrivacyLedger, rr_event

ALPHA = 1e-3
OFF = (0.9, 1.1)


def _binom_p(successes: int, n: int, p: float) -> float:
    return stats.binomtest(int(successes), n, p).pvalue


def _assert_rate(successes: int, n: int, p: float) -> None:
    """The claimed rate is not rejected; the rates 10 % off are."""
    assert _binom_p(successes, n, p) > ALPHA
    for factor in OFF:
        assert _binom_p(successes, n, factor * p) < ALPHA


# ---------------------------------------------------------------------------- the law
@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_binary_flip_probability(eps):
    # n = 200 000: at eps = 3 (f = 0.047) the SE is 4.7e-4 and a 10 % error (4.7e-3) is 10 SE away.
    n = 200_000
    labels = np.arange(n) % 2
    noisy = LabelDp(eps, rng=11)(labels)
    f = 1.0 / (1.0 + math.exp(eps))
    _assert_rate(np.count_nonzero(noisy != labels), n, f)
    assert LabelDp(eps).flip_probability(2) == pytest.approx(f, rel=1e-12)


@pytest.mark.parametrize("eps,k", [(1.0, 5), (2.0, 10)])
def test_one_hot_keep_probability(eps, k):
    # n = 100 000: keep = 0.40 (k = 5) or 0.45 (k = 10); SE <= 1.6e-3 vs a 10 % error of >= 0.04.
    n = 100_000
    rng = np.random.default_rng(3)
    true = rng.integers(0, k, n)
    noisy = LabelDp(eps, rng=12)(np.eye(k, dtype=np.float32)[true])
    kept = np.count_nonzero(noisy.argmax(axis=1) == true)
    keep = math.exp(eps) / (math.exp(eps) + k - 1)
    _assert_rate(kept, n, keep)
    assert LabelDp(eps).keep_probability(k) == pytest.approx(keep, rel=1e-12)


def test_one_hot_moves_uniformly_to_the_other_classes():
    # All true labels are class 2 of k = 6; the moved outputs must be uniform on {0, 1, 3, 4, 5}.
    # About 68 000 moved labels: 13 600 per class, SE 105; one class at 1.1x its share is ~11 SE off.
    n, k, eps = 100_000, 6, 1.0
    noisy = LabelDp(eps, rng=13)(np.tile(np.eye(k)[2], (n, 1)))
    counts = np.bincount(noisy.argmax(axis=1), minlength=k)
    others = np.delete(counts, 2)
    assert stats.chisquare(others).pvalue > ALPHA
    for factor in OFF:  # a law putting 10 % more (less) mass on one other class is rejected
        expected = np.full(k - 1, 1.0)
        expected[0] = factor
        expected = expected / expected.sum() * others.sum()
        assert stats.chisquare(others, expected).pvalue < ALPHA
    _assert_rate(counts[2], n, LabelDp(eps).keep_probability(k))


def test_integer_labels_k_ary_keep_and_other_class_law():
    # num_classes = 10, integer labels: keep = e^1/(e^1 + 9) = 0.232, n = 100 000 (SE 1.3e-3 vs 0.023).
    n, k, eps = 100_000, 10, 1.0
    true = np.random.default_rng(4).integers(0, k, n)
    noisy = LabelDp(eps, num_classes=k, rng=14)(true)
    _assert_rate(np.count_nonzero(noisy == true), n, LabelDp(eps).keep_probability(k))
    shift = (noisy - true)[noisy != true] % k  # which other class, relative to the true one
    assert stats.chisquare(np.bincount(shift, minlength=k)[1:]).pvalue > ALPHA


def test_num_classes_two_uses_the_binary_rule():
    n, eps = 100_000, 1.0
    labels = np.arange(n) % 2
    noisy = LabelDp(eps, num_classes=2, rng=15)(labels)
    _assert_rate(np.count_nonzero(noisy != labels), n, 1.0 / (1.0 + math.e))


def test_probabilities_are_consistent_and_exact_for_large_eps():
    dp = LabelDp(1.5)
    for k in (2, 3, 10):
        assert dp.keep_probability(k) + dp.flip_probability(k) == pytest.approx(1.0, abs=1e-15)
        assert dp.other_class_probability(k) * (k - 1) == pytest.approx(dp.flip_probability(k), rel=1e-12)
    # No silent cap at 100 (MindSpore reassigns eps > 100 to 100): eps = 150 must be used exactly.
    big = LabelDp(150.0)
    assert big.eps == 150.0
    assert big.flip_probability(2) == pytest.approx(math.exp(-150.0), rel=1e-12)
    assert big.flip_probability(2) < LabelDp(100.0).flip_probability(2)
    assert big.keep_probability(10) == 1.0 - 9 * math.exp(-150.0)  # 1 to double precision, no overflow
    labels = np.random.default_rng(5).integers(0, 10, 1000)
    assert np.array_equal(LabelDp(1000.0, num_classes=10, rng=1)(labels), labels)


def test_event_is_rr_event_and_accountable_only_under_replace_one():
    dp = LabelDp(2.0, num_classes=10)
    assert dp.event() == rr_event(2.0, 10)
    assert dp.event(4) == rr_event(2.0, 4)
    assert LabelDp(2.0).release(np.eye(4)).event == rr_event(2.0, 4)
    assert LabelDp(2.0).release(np.array([0, 1, 1])).event == rr_event(2.0, 2)
    with pytest.raises(ValueError, match="num_classes"):
        LabelDp(2.0).event()
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(dp.event(), server_round=0, client="label-party")
    assert ledger.epsilon() == pytest.approx(2.0, rel=1e-3)
    with pytest.raises(ValueError, match="replace_one"):
        PrivacyLedger(1e-5).record(dp.event(), server_round=0, client="x")


# ---------------------------------------------------------------------------- types
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.float32, np.float64, np.bool_])
@pytest.mark.parametrize("shape", [(50,), (50, 1)])
def test_numpy_binary_keeps_type_dtype_and_shape(dtype, shape):
    labels = (np.arange(50) % 2).reshape(shape).astype(dtype)
    out = LabelDp(0.5, rng=1)(labels)
    assert isinstance(out, np.ndarray) and out.dtype == labels.dtype and out.shape == labels.shape
    assert set(np.unique(out).astype(int)) <= {0, 1}
    assert not np.array_equal(out, labels)  # 50 labels at f = 0.38: some flipped


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float16, torch.bfloat16, torch.bool])
def test_torch_one_hot_keeps_type_dtype_device_and_shape(dtype):
    labels = torch.eye(4)[torch.arange(40) % 4].to(dtype)
    out = LabelDp(0.5, rng=2)(labels)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == labels.dtype and out.device == labels.device and out.shape == labels.shape
    assert torch.all(out.to(torch.float32).sum(dim=1) == 1)


def test_torch_integer_labels_keep_type_and_do_not_need_grad():
    labels = torch.arange(30) % 10
    out = LabelDp(1.0, num_classes=10, rng=3)(labels)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64 and out.shape == (30,)
    assert int(out.min()) >= 0 and int(out.max()) < 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_torch_cuda_device_is_kept():
    labels = torch.eye(3, device="cuda")[torch.arange(12, device="cuda") % 3]
    assert LabelDp(1.0, rng=4)(labels).device == labels.device


def test_empty_batch():
    assert LabelDp(1.0)(np.zeros(0, dtype=np.int64)).shape == (0,)
    assert LabelDp(1.0)(np.zeros((0, 3))).shape == (0, 3)


# ---------------------------------------------------------------------------- validation
def test_every_one_hot_row_is_validated():
    # MindSpore checks only the total count of ones (3 ones for 3 rows passes there); every row is checked here.
    labels = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert labels.sum() == len(labels)
    with pytest.raises(ValueError, match=r"one-hot.*row\(s\) \[0, 1\]"):
        LabelDp(1.0)(labels)
    with pytest.raises(ValueError, match="one-hot"):
        LabelDp(1.0)(torch.tensor([[0.0, 1.0], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="one-hot"):
        LabelDp(1.0)(np.array([[0, 2, 0], [1, 0, 0]]))


@pytest.mark.parametrize(
    "labels,num_classes,match",
    [
        (np.array([0, 1, 2]), None, r"0 or 1.*row\(s\) \[2\]"),
        (np.array([0.0, 0.5, 1.0]), None, "0 or 1"),
        (np.array([0, -1]), None, "0 or 1"),
        (np.array([0.0, np.nan]), None, "0 or 1"),
        (np.array([0, 3, 10]), 10, r"integers in \[0, 9\].*row\(s\) \[2\]"),
        (np.array([[1], [4]]), 3, r"integers in \[0, 2\]"),
        (np.zeros((2, 2, 2)), None, "1-D"),
        (np.array(1), None, "1-D"),
        (np.eye(3), 4, "num_classes=4"),
        (np.array(["a", "b"]), None, "numeric"),
    ],
)
def test_invalid_labels_raise(labels, num_classes, match):
    with pytest.raises(ValueError, match=match):
        LabelDp(1.0, num_classes=num_classes)(labels)


@pytest.mark.parametrize("eps", [0, 0.0, -1.0, math.inf, math.nan, "1", None, True])
def test_bad_eps_raises_naming_eps(eps):
    with pytest.raises(ValueError, match=r"eps must be .*\(0, inf\)"):
        LabelDp(eps)


@pytest.mark.parametrize("num_classes", [1, 0, 2.0, True])
def test_bad_num_classes_raises(num_classes):
    with pytest.raises(ValueError, match="num_classes"):
        LabelDp(1.0, num_classes=num_classes)


# ---------------------------------------------------------------------------- randomness
def test_default_rng_is_fresh_os_entropy_not_a_fixed_seed():
    labels = np.arange(2000) % 2
    np.random.seed(0)
    state = np.random.get_state()
    a = LabelDp(1.0)(labels)
    np.random.seed(0)
    b = LabelDp(1.0)(labels)
    assert not np.array_equal(a, b)  # P(equal) = (f^2 + (1-f)^2)^2000, about 1e-267
    dp = LabelDp(1.0)
    assert not np.array_equal(dp(labels), dp(labels))  # successive calls draw fresh noise
    np.random.seed(0)
    LabelDp(1.0)(labels)
    assert all(np.array_equal(x, y) for x, y in zip(np.random.get_state(), state) if isinstance(x, np.ndarray))


def test_seeded_rng_is_reproducible():
    labels = np.arange(500) % 10
    assert np.array_equal(LabelDp(1.0, num_classes=10, rng=7)(labels), LabelDp(1.0, num_classes=10, rng=7)(labels))


# ---------------------------------------------------------------------------- randomise once
def test_dataset_randomises_once_and_keeps_the_labels():
    n, k, eps = 4000, 10, 1.0
    x = torch.randn(n, 3)
    y = torch.arange(n) % k
    ds = LabelDpDataset(TensorDataset(x, y), eps, k, rng=21)
    first = torch.cat([b for _, b in DataLoader(ds, batch_size=512)])
    second = torch.cat([b for _, b in DataLoader(ds, batch_size=512)])
    assert torch.equal(first, second) and torch.equal(first, ds.labels)  # no new randomisation per epoch
    assert torch.equal(ds[5][0], x[5])
    keep = LabelDp(eps).keep_probability(k)
    kept = int((ds.labels == y).sum())
    assert abs(kept / n - keep) < 5 * math.sqrt(keep * (1 - keep) / n)
    assert ds.event == rr_event(eps, k) and len(ds) == n


class _PairDataset(torch.utils.data.Dataset):
    """A plain (x, y) dataset without ``targets``: labels are read in one pass."""

    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 2), torch.arange(n) % 5

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def test_dataset_without_targets_reads_labels_once():
    base = _PairDataset(200)
    ds = LabelDpDataset(base, 1.0, 5, rng=2)
    assert ds.labels.shape == (200,) and ds.labels.dtype == torch.int64
    assert torch.equal(ds[3][0], base.x[3]) and ds[3][1] == ds.labels[3]
    assert not torch.equal(ds.labels, base.y)


def test_dataset_from_arrays_and_length_check():
    x, y = np.random.default_rng(0).normal(size=(20, 2)), np.arange(20) % 3
    ds = LabelDpDataset((x, y), 2.0, 3, rng=1)
    assert ds.labels.dtype == torch.int64 and ds[0][0].shape == (2,)
    with pytest.raises(ValueError, match="same length"):
        LabelDpDataset((x, y[:5]), 2.0, 3)
    with pytest.raises(ValueError, match="eps"):
        LabelDpDataset((x, y), 0.0, 3)


def _rebuilt(context: Context) -> Context:
    """A new Context with the state round-tripped through protobuf, as Flower persists it between messages."""
    state = recorddict_from_proto(recorddict_to_proto(context.state))
    return Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=dict(context.node_config),
        state=state,
        run_config=dict(context.run_config),
    )


def test_private_labels_persist_across_rebuilt_contexts_and_declare_once():
    labels = torch.arange(300) % 10
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    noisy1, new1 = private_labels(context, labels, 1.0, 10)
    reply1 = RecordDict()
    assert declare_label_release(context, reply1) is True
    assert declare_label_release(context, reply1) is False  # once, even within the same round

    later = _rebuilt(context)  # round 2: the ClientApp is rebuilt
    noisy2, new2 = private_labels(later, labels, 1.0, 10)
    reply2 = RecordDict()
    assert declare_label_release(later, reply2) is False
    assert new1 is True and new2 is False
    assert isinstance(noisy2, torch.Tensor) and noisy2.dtype == labels.dtype
    assert torch.equal(noisy1, noisy2)
    assert not torch.equal(noisy1, labels)
    assert is_label_release_declared(later) and label_release_event(later) == rr_event(1.0, 10)

    (declaration,) = read_declarations(reply1)
    assert declaration.event == rr_event(1.0, 10) and declaration.label == LABEL_DP_DECLARATION
    (later_declaration,) = read_declarations(reply2)  # post-processing: a no-op, not a new release
    assert later_declaration.event == dp_event.NoOpDpEvent()
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    for server_round, reply in ((1, reply1), (2, reply2)):
        for decl in read_declarations(reply):
            ledger.record(decl.event, server_round=server_round, client=7, label=decl.label)
    rr_releases = [e for _, e, _ in ledger.events(7) if e == rr_event(1.0, 10)]
    assert len(rr_releases) == 1 and ledger.epsilon() == pytest.approx(1.0, rel=1e-3)


def test_private_labels_refuse_a_second_release():
    labels = np.arange(100) % 4
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    private_labels(context, labels, 2.0, 4)
    with pytest.raises(ValueError, match="second release"):
        private_labels(context, labels, 3.0, 4)
    with pytest.raises(ValueError, match="labels differ"):
        private_labels(context, (labels + 1) % 4, 2.0, 4)
    other, new = private_labels(context, (labels + 1) % 4, 2.0, 4, key="other-dataset")
    assert new and other.shape == labels.shape


def test_declare_before_release_raises():
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="private_labels first"):
        declare_label_release(context, RecordDict())
    assert label_release_event(context) is None and not is_label_release_declared(context)
