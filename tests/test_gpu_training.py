"""CUDA paths of the shared trainers (skipped without a GPU; run them on the GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from flwr_dp_experiments.training import evaluate_classifier, resolve_device, train_sgd


def _blobs(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (np.eye(3)[y] * 3 + rng.normal(size=(n, 3))).astype(np.float32)
    return x, y.astype(np.int64)


def test_default_device_follows_torch_cuda_availability():
    assert resolve_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu").type == "cpu"


def test_cpu_training_learns_and_leaves_the_model_on_cpu():
    x, y = _blobs()
    model = nn.Linear(3, 3)
    train_sgd(model, x, y, epochs=5, lr=0.5, device="cpu")
    assert next(model.parameters()).device.type == "cpu"
    assert evaluate_classifier(model, x, y, device="cpu")[1] > 0.9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_training_matches_cpu_training():
    x, y = _blobs()
    torch.manual_seed(0)
    cpu_model = nn.Linear(3, 3)
    gpu_model = nn.Linear(3, 3)
    gpu_model.load_state_dict(cpu_model.state_dict())
    train_sgd(cpu_model, x, y, epochs=3, lr=0.5, seed=1, device="cpu")
    train_sgd(gpu_model, x, y, epochs=3, lr=0.5, seed=1, device="cuda")
    assert next(gpu_model.parameters()).device.type == "cpu"  # ready for ArrayRecord
    for a, b in zip(cpu_model.parameters(), gpu_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert evaluate_classifier(gpu_model, x, y, device="cuda")[1] > 0.9
