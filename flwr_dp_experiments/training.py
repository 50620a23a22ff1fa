"""Plain (non-private) torch training and evaluation loops shared by the examples.

These are the baselines' loops and the local training of apps whose privacy
comes from a mod on the reply (local noise, central DP): nothing here is DP.
DP-SGD lives in :mod:`client_mods.dp_sgd`.
"""

from __future__ import annotations

from typing import Union

import numpy as np
import torch
from torch import nn

Device = Union[None, str, torch.device]


def resolve_device(device: Device = None) -> torch.device:
    """``None``: CUDA when torch sees a GPU (e.g. a Ray client given ``num_gpus``), else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def train_sgd(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int = 32,
    seed: int = 0,
    device: Device = None,
) -> float:
    """Minibatch SGD on cross-entropy (shuffled with ``seed``); the mean loss of the last epoch.

    Trains on ``device`` (CUDA when available by default) and leaves ``model`` on the CPU,
    where Flower's ``ArrayRecord`` reads it.
    """
    target_device = resolve_device(device)
    generator = torch.Generator().manual_seed(seed)
    model.to(target_device)
    inputs, targets = torch.from_numpy(x).to(target_device), torch.from_numpy(y).to(target_device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    losses: list[float] = []
    for _ in range(epochs):
        losses = []
        order = torch.randperm(len(targets), generator=generator).to(target_device)
        for start in range(0, len(targets), batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs[batch]), targets[batch])
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    model.to("cpu")
    return float(torch.stack(losses).mean()) if losses else 0.0


@torch.no_grad()
def evaluate_classifier(model: nn.Module, x: np.ndarray, y: np.ndarray, device: Device = None) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on (x, y), computed on ``device``; the model stays put."""
    target_device = resolve_device(device)
    model.eval()
    original = next(model.parameters()).device
    logits = model.to(target_device)(torch.from_numpy(x).to(target_device))
    model.to(original)
    targets = torch.from_numpy(y).to(target_device)
    loss = float(nn.functional.cross_entropy(logits, targets))
    accuracy = float((logits.argmax(dim=1) == targets).float().mean())
    return loss, accuracy


__all__ = ["Device", "evaluate_classifier", "resolve_device", "train_sgd"]
