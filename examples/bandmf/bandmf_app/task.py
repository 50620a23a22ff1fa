"""The model (multinomial logistic regression, numpy), the data (sklearn digits, IID shards) and the defaults."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.datasets import load_digits

DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 20,
    "num-partitions": 40,
    "num-bands": 4,
    "noise-multiplier": 1.0,
    "eval-noise-multiplier": 5.0,
    "clipping-norm": 1.0,
    "factorization": "banded-sqrt",
    "target-delta": 1e-5,
    "ledger-path": "",
    "resume-ledger": False,
    "local-epochs": 1,
    "lr": 0.5,
}
CLASSES, FEATURES = 10, 64


def run_config(context: Any) -> dict[str, Any]:
    """The run config over :data:`DEFAULTS` (an app started without one gets the defaults)."""
    return {**DEFAULTS, **dict(getattr(context, "run_config", {}) or {})}


def initial_model() -> dict[str, np.ndarray]:
    return {"weight": np.zeros((FEATURES, CLASSES), np.float32), "bias": np.zeros(CLASSES, np.float32)}


def shard(partition: int, partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Partition ``partition`` of a fixed shuffle of sklearn digits (features scaled to [0, 1])."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order] / 16.0, y[order]
    return x[partition::partitions], y[partition::partitions]


def train(model: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, epochs: int, lr: float) -> dict[str, np.ndarray]:
    """Full-batch gradient descent on the softmax cross-entropy."""
    w, b = model["weight"].astype(np.float64), model["bias"].astype(np.float64)
    onehot = np.eye(CLASSES)[y]
    for _ in range(epochs):
        logits = x @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - onehot) / len(y)
        w -= lr * x.T @ grad
        b -= lr * grad.sum(axis=0)
    return {"weight": w.astype(np.float32), "bias": b.astype(np.float32)}


def accuracy(model: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(x @ model["weight"] + model["bias"], axis=1) == y))
