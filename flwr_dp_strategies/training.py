"""Plain (non-private) torch training and evaluation loops shared by the examples.

These are the baselines' loops and the local training of apps whose privacy
comes from a mod on the reply (local noise, central DP): nothing here is DP.
DP-SGD lives in :mod:`client_mods.dp_sgd`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def train_sgd(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float,
              batch_size: int = 32, seed: int = 0) -> float:
    """Minibatch SGD on cross-entropy (shuffled with ``seed``); the mean loss of the last epoch."""
    generator = torch.Generator().manual_seed(seed)
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    losses: list[float] = []
    for _ in range(epochs):
        losses = []
        order = torch.randperm(len(targets), generator=generator)
        for start in range(0, len(targets), batch_size):
            batch = order[start:start + batch_size]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs[batch]), targets[batch])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return float(np.mean(losses)) if losses else 0.0


@torch.no_grad()
def evaluate_classifier(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on (x, y)."""
    model.eval()
    logits = model(torch.from_numpy(x))
    targets = torch.from_numpy(y)
    loss = float(nn.functional.cross_entropy(logits, targets))
    accuracy = float((logits.argmax(dim=1) == targets).float().mean())
    return loss, accuracy


__all__ = ["evaluate_classifier", "train_sgd"]
