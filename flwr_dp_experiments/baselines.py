r"""Baseline client updates of the DELM paper's comparison (§6.1.2), in plain torch.

* FedAvg: :func:`local_sgd` with ``proximal_mu=0`` (no privacy).
* FedProx (Li et al. 2020, the paper's ref. [39]): :func:`local_sgd` with
  ``proximal_mu > 0`` adds :math:`\frac{\mu}{2}\lVert w - w_{global}\rVert_2^2` to every
  minibatch loss, as Flower's FedProx clients do.
* LDP-FL (ref. [11], as specified for this reproduction): :func:`ldp_fl_update` clips the
  whole update to L2 norm C and adds Gaussian noise with :math:`\Delta_2 = 2C`,
  calibrated per round by the analytic Gaussian mechanism of the privacy core
  (:func:`~flwr_dp_strategies.privacy.gaussian_sigma`,
  :func:`~flwr_dp_strategies.privacy.gaussian_mechanism`), the same release as
  ``client_mods.LocalUpdateNoiseMod``. The returned DpEvent is one round; the runner
  composes the rounds with its accountant.

The model is the paper's three-layer MLP (§3.3: input → hidden ReLU → output), trained
with softmax cross-entropy. Parameters travel as numpy arrays in ``state_dict`` order
(``0.weight, 0.bias, 2.weight, 2.bias``). Nothing here sets torch's thread count.
"""

from __future__ import annotations

import numpy as np
import torch
from dp_accounting import dp_event
from torch import nn

from flwr_dp_strategies.privacy import gaussian_mechanism, gaussian_sigma
from flwr_dp_strategies.privacy.rng import RngLike
from flwr_dp_strategies.privacy.validation import check_positive

Params = list[np.ndarray]
EVAL_BATCH = 8192


def make_mlp(
    in_dim: int, hidden: int = 64, num_classes: int = 10, seed: int = 0, *, bias: bool = True
) -> nn.Sequential:
    """The paper's 3-layer MLP (§3.3, eq. (1)): Linear(in, hidden) → ReLU → Linear(hidden, classes).

    Initialised by torch's defaults under ``seed`` (the global torch RNG is left untouched).
    ``bias=False`` gives the paper's bias-free W1, W2; the baselines use biases by default.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(in_dim, hidden, bias=bias), nn.ReLU(), nn.Linear(hidden, num_classes, bias=bias))


def get_params(model: nn.Module) -> Params:
    """The model's ``state_dict`` values as numpy copies, in order."""
    return [value.detach().cpu().numpy().copy() for value in model.state_dict().values()]


def mlp_from_params(params: Params) -> nn.Sequential:
    """An MLP of :func:`make_mlp`'s architecture holding ``params`` (2 arrays: no bias, 4: with bias)."""
    if len(params) not in (2, 4) or np.ndim(params[0]) != 2 or np.ndim(params[-2 if len(params) == 4 else -1]) != 2:
        raise ValueError("params must be the MLP's state_dict values: [W1, (b1,) W2, (b2)]")
    hidden, in_dim = np.shape(params[0])
    num_classes = np.shape(params[2 if len(params) == 4 else 1])[0]
    model = make_mlp(int(in_dim), int(hidden), int(num_classes), bias=len(params) == 4)
    keys = list(model.state_dict().keys())
    model.load_state_dict({k: torch.as_tensor(np.asarray(p, dtype=np.float32)) for k, p in zip(keys, params)})
    return model


def _proximal_term(model: nn.Module, anchors: list[torch.Tensor]) -> torch.Tensor:
    """‖w − w_global‖² over all parameters (FedProx, Li et al. 2020, eq. (2))."""
    return sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchors))


def local_sgd(
    model_params: Params,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    proximal_mu: float = 0.0,
    seed: int,
) -> Params:
    """One client's local minibatch SGD from the global ``model_params`` (FedAvg / FedProx, §6.1.2).

    Each epoch shuffles the client's samples with ``seed``; the loss is the mean
    cross-entropy plus ``proximal_mu``/2·‖w − w_global‖² when ``proximal_mu`` > 0.
    Returns the trained params (float32, same order and shapes).
    """
    if epochs < 0 or batch_size < 1 or lr <= 0 or proximal_mu < 0:
        raise ValueError("need epochs in [0, inf), batch_size in [1, inf), lr in (0, inf), proximal_mu in [0, inf)")
    model = mlp_from_params(model_params)
    anchors = [p.detach().clone() for p in model.parameters()]
    inputs = torch.as_tensor(np.asarray(x, dtype=np.float32))
    targets = torch.as_tensor(np.asarray(y, dtype=np.int64))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(targets), generator=generator)
        for start in range(0, len(targets), batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs[batch]), targets[batch])
            if proximal_mu > 0:
                loss = loss + 0.5 * proximal_mu * _proximal_term(model, anchors)
            loss.backward()
            optimizer.step()
    return get_params(model)


def ldp_fl_sigma(clip: float, epsilon: float, delta: float) -> float:
    """Per-coordinate noise std of :func:`ldp_fl_update`: analytic Gaussian σ for Δ₂ = 2C."""
    return gaussian_sigma(epsilon, delta, 2.0 * check_positive("clip", clip))


def ldp_fl_update(
    global_params: Params, new_params: Params, *, clip: float, epsilon: float, delta: float, rng: RngLike
) -> tuple[Params, dp_event.DpEvent]:
    r"""LDP-FL baseline release (§6.1.2 (2)): global + clip_C(update) + N(0, σ²I), σ for (ε, δ) with Δ₂ = 2C.

    The update :math:`\Delta` = new − global is flattened over all arrays (one L2 norm)
    and scaled by min(1, C/‖Δ‖₂). Any two clipped updates differ by at most 2C, so the
    release is (ε, δ)-LDP per round. Returns (noised params in the dtypes of
    ``global_params``, ``GaussianDpEvent(σ/2C)`` for this round).
    """
    if len(global_params) != len(new_params) or any(
        np.shape(g) != np.shape(n) for g, n in zip(global_params, new_params)
    ):
        raise ValueError("new_params must have the shapes of global_params")
    sensitivity = 2.0 * check_positive("clip", clip)
    sigma = gaussian_sigma(epsilon, delta, sensitivity)
    update = np.concatenate(
        [(np.asarray(n, np.float64) - np.asarray(g, np.float64)).ravel() for g, n in zip(global_params, new_params)]
    )
    norm = float(np.linalg.norm(update))
    if norm > clip:
        update *= clip / norm
    release = gaussian_mechanism(update, noise_multiplier=sigma / sensitivity, sensitivity=sensitivity, rng=rng)
    pieces = np.split(release.value, np.cumsum([np.size(g) for g in global_params])[:-1])
    out = [
        (np.asarray(g) + piece.reshape(np.shape(g))).astype(np.asarray(g).dtype)
        for g, piece in zip(global_params, pieces)
    ]
    return out, release.event


@torch.no_grad()
def evaluate(params: Params, x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy of the MLP holding ``params`` on (x, y), in batches of ``EVAL_BATCH``."""
    if len(y) == 0:
        raise ValueError("evaluate needs at least one sample")
    model = mlp_from_params(params).eval()
    inputs = torch.as_tensor(np.asarray(x, dtype=np.float32))
    targets = torch.as_tensor(np.asarray(y, dtype=np.int64))
    correct = sum(
        int((model(inputs[s : s + EVAL_BATCH]).argmax(dim=1) == targets[s : s + EVAL_BATCH]).sum())
        for s in range(0, len(targets), EVAL_BATCH)
    )
    return correct / len(targets)


__all__ = [
    "EVAL_BATCH",
    "Params",
    "evaluate",
    "get_params",
    "ldp_fl_sigma",
    "ldp_fl_update",
    "local_sgd",
    "make_mlp",
    "mlp_from_params",
]
