"""Record-level canary audit (client_mods.record_audit) of DpSgdTrainer runs (Steinke, Nasr & Jagielski 2023).

Set-up of the end-to-end runs: n = 100 synthetic records (4 Gaussian clusters in d = 50), m = 100 canaries
(random directions at the data's mean norm, random labels, each in w.p. ½), an MLP 50-32-4, one round of
20 epochs at B = 16, lr = 1, C = 1 (CPU, < 1 s). Score: the decrease in loss from the received model to
the trained one. Guesses: k+ = k− = 25 (r = 50), bound at 95 % and δ = 1e-5 (the trainer's δ).

Measured (seed 0, used by the tests; seeds 0-9 in brackets): honest z = 10 (declared ε = 0.56 [0.53-0.59]):
23/50 correct, bound 0 [0-0.06]; honest z = 1 (declared ε = 11.0): 28/50, bound 0 [0-0.77]; the broken
trainer (Opacus' noise replaced by zeros while the accountant still books z = 10, so it declares
ε = 0.56): 50/50 correct, bound 2.78 [44-50 of 50 correct, bound 1.25-2.78] > 0.56 on every seed; a
non-private run (z = 0.01, declared ε = 3e6): 50/50, bound 2.78 [1.25-2.78]. r = 50 caps the bound at
2.78 (all guesses right), so a larger gap would need more canaries.

Functional mechanism (replace-one, Laplace, pure ε; δ = 0 in the bound): n = 50 unit rows on a 4-dim
subspace of q = 256, 3 classes, the same m = 100 and k± = 25, canaries random unit vectors, excluded
slots filled with a zero row, 3000 smooth steps from a zero head. Seeds 0-5: honest ε = 1 and ε = 10:
22-28/50 correct, bound 0; noise removed while ε = 1 is declared: 50/50, bound 2.78 on every seed.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn

import client_mods.dp_sgd_fused as dp_sgd_fused
import client_mods.functional_mechanism as fm_module
import opacus.optimizers.optimizer as opacus_optimizer
from client_mods.dp_sgd_trainer import DpSgdTrainer
from client_mods.functional_mechanism import FunctionalMechanismTrainer
from client_mods.record_audit import (
    CanaryRecords,
    RecordAudit,
    insert_canaries,
    make_canary_records,
    record_audit_bound,
    score_canaries,
)
from flwr_dp_strategies.declarations import read_declarations
from flwr_dp_strategies.privacy import PrivacyLedger

DELTA = 1e-5
N, D, CLASSES, HIDDEN = 100, 50, 4, 32
M, K = 100, 25


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models: one thread is fastest (several threads on a busy machine cost 10x)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def synthetic(n: int = N, d: int = D, classes: int = CLASSES, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.5, (classes, d))
    y = rng.integers(0, classes, n)
    return (centers[y] + rng.normal(0.0, 1.0, (n, d))).astype(np.float32), y.astype(np.int64)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def audited_round(noise_multiplier: float, *, seed: int = 0, grad_sample_mode: str = "auto") -> RecordAudit:
    """One DP-SGD round with canaries; the audit of its output beside the trainer's declared ε."""
    x, y = synthetic(seed=seed)
    canaries = make_canary_records(M, (x, y), seed=seed + 1)
    data, mask = insert_canaries((x, y), canaries, seed=seed + 2)
    torch.manual_seed(seed)
    received = mlp()
    trainer = DpSgdTrainer(
        received,
        noise_multiplier=noise_multiplier,
        local_epochs=20,
        lr=1.0,
        batch_size=16,
        max_grad_norm=1.0,
        target_delta=DELTA,
        device="cpu",
        seed=seed + 3,
        grad_sample_mode=grad_sample_mode,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = trainer.train_round(received.state_dict(), data)
    trained = mlp()
    trained.load_state_dict(result.state_dict)
    scores = score_canaries(trained, canaries, reference=received)
    return record_audit_bound(scores, mask, K, K, confidence=0.95, delta=result.delta, declared_epsilon=result.epsilon)


# ---------------------------------------------------------------------- end to end (DP-SGD)
@pytest.mark.parametrize("noise_multiplier", [10.0, 1.0])
def test_a_sound_dp_sgd_run_is_never_contradicted(noise_multiplier):
    audit = audited_round(noise_multiplier=noise_multiplier)
    assert audit.declared_epsilon > 0
    assert audit.guesses_made == 2 * K
    assert audit.epsilon_lower_bound <= audit.declared_epsilon
    assert not audit.contradicts_declaration


@pytest.mark.parametrize("grad_sample_mode", ["hooks", "fused"])
def test_a_trainer_that_declares_noise_it_does_not_add_is_caught(monkeypatch, grad_sample_mode):
    # broken configuration: Opacus' accountant books z = 10 for every step, but the noise is zero (plain
    # clipped SGD); the declared ε is the honest run's, the model is a non-private one. Both steps: Opacus'
    # DPOptimizer (hooks) and the fused Linear step ("auto" for this MLP)
    monkeypatch.setattr(
        opacus_optimizer,
        "_generate_noise",
        lambda std, reference, generator=None, secure_mode=False: torch.zeros_like(reference),
    )
    monkeypatch.setattr(dp_sgd_fused.FusedLinearDpSgd, "add_noise", lambda self, generator: None)
    audit = audited_round(noise_multiplier=10.0, grad_sample_mode=grad_sample_mode)
    assert audit.declared_epsilon < 1
    assert audit.guesses_correct >= 0.85 * audit.guesses_made
    assert audit.epsilon_lower_bound > 2 * audit.declared_epsilon
    assert audit.contradicts_declaration


def test_a_non_private_run_memorises_canaries_but_declares_a_huge_epsilon():
    audit = audited_round(noise_multiplier=0.01)
    assert audit.epsilon_lower_bound > 1.2  # the canaries are memorised
    assert audit.declared_epsilon > 1e3  # and the ledger says so: no contradiction
    assert not audit.contradicts_declaration


# ---------------------------------------------------------------------- end to end (functional mechanism)
FM_Q, FM_N, FM_CLASSES = 256, 50, 3


def fm_audited_run(epsilon: float, *, seed: int = 0) -> RecordAudit:
    """One FunctionalMechanismTrainer reply with canaries (replace-one: excluded slots hold a zero record).

    Features: unit rows on a 4-dim subspace of q = 256 (a padded feature map); canaries: random unit
    directions in all 256 dimensions. The head descends 3000 smooth steps (1/L) from zero, close to the
    noisy objective's minimiser, where a canary's term in S = Σ x xᵀ makes the head fit it.
    """
    rng = np.random.default_rng(seed)
    x = np.zeros((FM_N, FM_Q))
    x[:, :4] = rng.normal(0.0, 1.0, (FM_N, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    canaries = make_canary_records(M, (x, y), seed=seed + 1, input_norm=1.0, num_classes=FM_CLASSES)
    (xi, yi), mask = insert_canaries((x, y), canaries, seed=seed + 2, fill_with=(np.zeros(FM_Q), 0))
    assert len(xi) == FM_N + M  # the record count does not depend on the mask (replace-one)
    trainer = FunctionalMechanismTrainer(
        epsilon, num_classes=FM_CLASSES, local_steps=3000, learning_rate=None, rng=seed + 3
    )
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    start = np.zeros((FM_Q, FM_CLASSES), dtype=np.float32)
    msg = Message(
        RecordDict({"arrays": ArrayRecord({"head.weight": Array(start)}), "config": ConfigRecord()}),
        dst_node_id=7,
        message_type="train",
    )
    reply = trainer.train(msg, context, xi, yi)
    ledger = PrivacyLedger(DELTA, neighboring_relation="replace_one")
    for declaration in read_declarations(reply.content):
        ledger.record(declaration.event, server_round=1, client=7)
    head = reply.content["arrays"]["head.weight"].numpy()
    scores = score_canaries(head, canaries, reference=start)
    return record_audit_bound(scores, mask, K, K, confidence=0.95, delta=0.0, declared_epsilon=ledger.epsilon(7))


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_a_sound_functional_mechanism_run_is_never_contradicted(epsilon):
    audit = fm_audited_run(epsilon)
    assert audit.declared_epsilon == pytest.approx(epsilon, rel=1e-3)
    assert audit.epsilon_lower_bound <= audit.declared_epsilon
    assert not audit.contradicts_declaration


@pytest.mark.usefixtures("task_identity")
def test_a_functional_mechanism_that_declares_noise_it_does_not_add_is_caught(monkeypatch):
    real = fm_module.functional_mechanism
    # broken: the declared event is the ε = 1 Laplace release's, the coefficients are the exact ones
    monkeypatch.setattr(
        fm_module, "functional_mechanism", lambda stats, **kw: dataclasses.replace(real(stats, **kw), value=stats)
    )
    audit = fm_audited_run(1.0)
    assert audit.declared_epsilon == pytest.approx(1.0, rel=1e-3)
    assert audit.guesses_correct >= 0.9 * audit.guesses_made
    assert audit.epsilon_lower_bound > 2 * audit.declared_epsilon
    assert audit.contradicts_declaration


# ---------------------------------------------------------------------- canaries and inclusion
def test_inclusion_is_one_half_per_canary_and_reproducible_from_the_seed():
    x, y = synthetic()
    canaries = make_canary_records(4000, (x, y), seed=7)
    (xi, yi), mask = insert_canaries((x, y), canaries, seed=11)
    # Bin(4000, ½): sd = 31.6; 5 sd
    assert abs(int(mask.sum()) - 2000) <= 5 * math.sqrt(4000 * 0.25)
    assert xi.shape == (N + mask.sum(), D) and yi.shape == (N + mask.sum(),)
    np.testing.assert_array_equal(xi[N:], canaries.inputs[mask])
    np.testing.assert_array_equal(yi[N:], canaries.labels[mask])
    np.testing.assert_array_equal(xi[:N], x)
    _, again = insert_canaries((x, y), canaries, seed=11)
    np.testing.assert_array_equal(mask, again)
    _, other = insert_canaries((x, y), canaries, seed=12)
    assert not np.array_equal(mask, other)
    # pairs of canaries are independent: both in w.p. ¼
    both = np.mean(mask[::2] & mask[1::2])
    assert abs(both - 0.25) <= 5 * math.sqrt(0.25 * 0.75 / 2000)


def test_canaries_are_seeded_random_directions_with_random_labels():
    x, y = synthetic()
    a = make_canary_records(50, (x, y), seed=3)
    b = make_canary_records(50, (x, y), seed=3)
    c = make_canary_records(50, (x, y))  # OS entropy
    assert isinstance(a, CanaryRecords) and len(a) == 50
    np.testing.assert_array_equal(a.inputs, b.inputs)
    assert not np.array_equal(a.inputs, c.inputs)
    assert a.inputs.dtype == np.float32 and a.inputs.shape == (50, D)
    norms = np.linalg.norm(a.inputs, axis=1)
    np.testing.assert_allclose(norms, np.mean(np.linalg.norm(x, axis=1)), rtol=1e-5)
    assert set(a.labels) <= set(range(CLASSES)) and len(set(a.labels)) > 1
    unit = make_canary_records(10, (x, y), seed=3, input_norm=1.0, num_classes=9)
    np.testing.assert_allclose(np.linalg.norm(unit.inputs, axis=1), 1.0, rtol=1e-5)
    assert unit.labels.max() < 9


def test_torch_pairs_datasets_and_replace_one_filling():
    x, y = synthetic()
    canaries = make_canary_records(20, (x, y), seed=1)
    (xt, yt), mask = insert_canaries((torch.as_tensor(x), torch.as_tensor(y)), canaries, seed=2)
    assert isinstance(xt, torch.Tensor) and xt.shape[0] == N + mask.sum() and yt.dtype == torch.int64
    dataset = torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
    from_dataset = make_canary_records(20, dataset, seed=1)
    np.testing.assert_array_equal(from_dataset.inputs, canaries.inputs)
    joined, mask_d = insert_canaries(dataset, canaries, seed=2)
    assert len(joined) == N + mask_d.sum()
    np.testing.assert_array_equal(mask, mask_d)
    (xf, yf), mask_f = insert_canaries((x, y), canaries, seed=2, fill_with=(np.zeros(D), 0))
    assert xf.shape[0] == N + 20  # replace-one: the size does not depend on the mask
    np.testing.assert_array_equal(xf[N:][mask_f], canaries.inputs[mask_f])
    assert not xf[N:][~mask_f].any() and not yf[N:][~mask_f].any()


# ---------------------------------------------------------------------- scores and the bound
def test_scores_are_minus_the_loss_or_its_decrease():
    x, y = synthetic()
    canaries = make_canary_records(6, (x, y), seed=1)
    torch.manual_seed(0)
    before, after = mlp(), mlp()
    loss = nn.CrossEntropyLoss(reduction="none")
    with torch.no_grad():
        l_before = loss(before(torch.as_tensor(canaries.inputs)), torch.as_tensor(canaries.labels)).numpy()
        l_after = loss(after(torch.as_tensor(canaries.inputs)), torch.as_tensor(canaries.labels)).numpy()
    np.testing.assert_allclose(score_canaries(after, canaries), -l_after, rtol=1e-6)
    np.testing.assert_allclose(
        score_canaries(after, canaries, reference=before), l_before - l_after, rtol=1e-5, atol=1e-6
    )
    # a linear head (numpy): softmax cross-entropy of x·W
    w = np.random.default_rng(0).normal(size=(D, CLASSES))
    logits = canaries.inputs.astype(np.float64) @ w
    expected = np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(6), canaries.labels]
    np.testing.assert_allclose(score_canaries(w, canaries), -expected, rtol=1e-9)


def test_guesses_are_the_top_and_bottom_scores():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    mask = np.array([True, True, False, True, False, False])
    audit = record_audit_bound(scores, mask, 2, 2, declared_epsilon=1.0)
    assert (audit.guesses_made, audit.guesses_correct, audit.num_canaries) == (4, 4, 6)
    assert audit.declared_epsilon == 1.0 and audit.confidence == 0.95 and audit.delta == 0.0
    assert record_audit_bound(scores, mask, 3, 0).guesses_correct == 2
    assert record_audit_bound(scores, mask, 0, 3).guesses_correct == 2
    assert record_audit_bound(scores, mask, 0, 0).epsilon_lower_bound == 0.0
    big = np.arange(1000.0)
    perfect = record_audit_bound(big, big >= 500, 100, 100)
    assert perfect.guesses_correct == 200 and perfect.epsilon_lower_bound > 3
    assert not record_audit_bound(big, big >= 500, 100, 100).contradicts_declaration  # nothing declared


# ---------------------------------------------------------------------- argument validation
@pytest.mark.parametrize(
    "call, name",
    [
        (lambda x, y, c: make_canary_records(0, (x, y)), "num_canaries"),
        (lambda x, y, c: make_canary_records(3, (x, y), seed=-1), "seed"),
        (lambda x, y, c: make_canary_records(3, (x, y), num_classes=1), "num_classes"),
        (lambda x, y, c: make_canary_records(3, (x, y), input_norm=0.0), "input_norm"),
        (lambda x, y, c: make_canary_records(3, (x, y[:5])), "like"),
        (lambda x, y, c: make_canary_records(3, "data"), "like"),
        (lambda x, y, c: insert_canaries((x, y), c, seed=1.5), "seed"),
        (lambda x, y, c: insert_canaries((x[:, :3], y), c), "canaries"),
        (lambda x, y, c: insert_canaries((x, y), c, fill_with=(np.zeros(3), 0)), "fill_with"),
        (lambda x, y, c: insert_canaries([1, 2], c), "data"),
        (lambda x, y, c: score_canaries(np.zeros((3, 4)), c), "model_or_params"),
        (lambda x, y, c: score_canaries(np.zeros((D, 4)), c, loss="hinge"), "loss"),
        (lambda x, y, c: score_canaries(mlp(), c, criterion=nn.CrossEntropyLoss()), "criterion"),
        (lambda x, y, c: record_audit_bound(np.zeros(4), np.ones(4, bool), 3, 2), "k_plus"),
        (lambda x, y, c: record_audit_bound(np.zeros(4), np.ones(4, bool), -1, 2), "k_plus"),
        (lambda x, y, c: record_audit_bound(np.zeros(4), np.ones(4, bool), 1, -2), "k_minus"),
        (lambda x, y, c: record_audit_bound(np.zeros(4), np.ones(3, bool), 1, 1), "inserted_mask"),
        (lambda x, y, c: record_audit_bound(np.zeros(4), np.ones(4), 1, 1), "inserted_mask"),
        (lambda x, y, c: record_audit_bound(np.array([0, np.nan]), np.ones(2, bool), 1, 1), "scores"),
        (lambda x, y, c: record_audit_bound(np.zeros(4), np.ones(4, bool), 1, 1, confidence=1.0), "confidence"),
        (lambda x, y, c: record_audit_bound(np.zeros(4), np.ones(4, bool), 1, 1, delta=1.0), "delta"),
        (
            lambda x, y, c: record_audit_bound(np.zeros(4), np.ones(4, bool), 1, 1, declared_epsilon=-1),
            "declared_epsilon",
        ),
    ],
)
def test_arguments_are_validated(call, name):
    x, y = synthetic(n=10)
    canaries = make_canary_records(4, (x, y), seed=0)
    with pytest.raises(ValueError, match=name):
        call(x, y, canaries)
