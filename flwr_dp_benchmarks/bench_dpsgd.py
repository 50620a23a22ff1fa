"""DP-SGD client: one round of :class:`client_mods.dp_sgd_trainer.DpSgdTrainer` vs Opacus alone vs non-private SGD.

Subject: ``DpSgdTrainer(model, noise_multiplier=1.1, max_grad_norm=1.0, batch_size=B, grad_sample_mode=mode)
.train_round(weights, (x, y), RecordDict())`` with Opacus' mode rule
(``mode = choose_grad_sample_mode(model, batch_size=B)``; ``"auto"`` would pick the package's fused
Linear step for the MLP, which Opacus alone cannot run) -- everything a client does in a Flower round: fresh model, load the received weights, a fresh
``PrivacyEngine`` (accountant history restored from the state), ``make_private``,
one epoch of Poisson-sampled DP-SGD, unwrap, write the accountant back, compute the
cumulative and round-only ε, return the new weights and the round's DpEvent.

Baselines (same model, same weights, same data, same batch size, same z and C, same
``grad_sample_mode`` as the trainer resolved, same sampling and noise seeds, so the
same Poisson batches):

* **Opacus alone** -- the same round written directly against Opacus: fresh model +
  ``load_state_dict``, ``PrivacyEngine()``, ``make_private(...)``, the plain loop
  ``zero_grad / criterion(module(x), y) / backward / step`` over the DP loader. No
  ε query, no unwrapping, no state: the minimal Opacus round. Target ≤ 1.05×.
* **Opacus alone + ε** (cold-process row) -- the same round followed by
  ``engine.get_epsilon(1e-5)``, as Flower's Opacus example does every round, against the
  trainer with its cached Opacus RDP curve cleared first: in a deployed ClientApp every
  round runs in a fresh process, and computing the curve (``compute_rdp`` over Opacus'
  151 orders) costs 0.1-1.5 s on this machine for one (q, z), often more than the
  training itself. Target ≤ 1.05×.
* **non-private** -- the same model trained by ``torch.optim.SGD`` over a shuffled
  ``DataLoader`` with the same batch size and the same number of steps. Reported:
  this is the price of per-sample gradients, which depends on the model (see
  ``shared/reference/perf-floors.md``: 2–2.5× for a small CNN with hooks, 12–59× for
  the DELM MLP with hooks, ≈ 4× with ghost clipping).
* **Opacus with the other mode** vs non-private (reported): shows that
  :func:`client_mods.dp_sgd.choose_grad_sample_mode` picked the faster mode
  ("ghost" for the all-Linear MLP, "hooks" for the CNN).

Models: the Opacus MNIST example CNN (26 010 parameters, 1×28×28 input) and the DELM
paper's MLP 784-64-10 (:func:`flwr_dp_experiments.baselines.make_mlp`). Inputs are
synthetic N(0, 1) images and uniform labels (the cost does not depend on the values).
Times are per step (round time / ⌈N/B⌉ steps) with ``torch.set_num_threads(1)``,
interleaved subject/baseline runs (``_common.time_pair``), medians.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from client_mods import dp_sgd_accounting
from client_mods.dp_sgd import DpSgdTrainer, choose_grad_sample_mode
from flwr_dp_experiments.baselines import make_mlp

from ._common import row, time_pair

NAME = "dpsgd"
NOISE_MULTIPLIER, MAX_GRAD_NORM, LR, DELTA = 1.1, 1.0, 0.05, 1e-5
TORCH_THREADS = 1

#: kwargs of :func:`run` per mode ("tiny" is for the smoke test only: meaningless timings).
MODES: dict[str, dict[str, Any]] = {
    "full": {"models": ("cnn", "mlp"), "batch_sizes": (64, 256), "num_examples": 4096, "repeats": 11},
    "quick": {"models": ("cnn", "mlp"), "batch_sizes": (64, 256), "num_examples": 2048, "repeats": 3},
    "tiny": {"models": ("cnn", "mlp"), "batch_sizes": (16,), "num_examples": 48, "repeats": 1},
}


def make_cnn(seed: int = 0) -> nn.Module:
    """The Opacus MNIST example CNN (26 010 parameters): 2 conv + 2 linear, tanh, 1×28×28 → 10."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv2d(1, 16, 8, 2, padding=3),
            nn.Tanh(),
            nn.MaxPool2d(2, 1),
            nn.Conv2d(16, 32, 4, 2),
            nn.Tanh(),
            nn.MaxPool2d(2, 1),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 32),
            nn.Tanh(),
            nn.Linear(32, 10),
        )


def make_model(name: str) -> nn.Module:
    """``"cnn"`` (:func:`make_cnn`) or ``"mlp"`` (DELM's MLP 784-64-10, :func:`make_mlp`)."""
    if name == "cnn":
        return make_cnn()
    if name == "mlp":
        return make_mlp(784, 64, 10, seed=0)
    raise ValueError(f"model must be 'cnn' or 'mlp', got {name!r}")


def synthetic_data(name: str, num_examples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST-shaped inputs (N×1×28×28 for the CNN, N×784 for the MLP) and labels in 0..9."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_examples, 1, 28, 28) if name == "cnn" else (num_examples, 784)
    return torch.randn(shape, generator=gen), torch.randint(0, 10, (num_examples,), generator=gen)


def round_seeds(seed: int, round_index: int = 0) -> tuple[int, int]:
    """(sampling seed, noise seed) of a seeded trainer's round (mirrors ``client_mods.dp_sgd_trainer._round_seeds``).

    If the trainer's derivation changes, the baseline just draws other Poisson batches:
    the comparison stays valid in distribution.
    """
    a, b = np.random.SeedSequence([seed, round_index]).generate_state(2, dtype=np.uint32)
    return int(a), int(b)


def opacus_round(
    model_fn: Callable[[], nn.Module],
    weights: dict[str, torch.Tensor],
    data: tuple[torch.Tensor, torch.Tensor],
    *,
    batch_size: int,
    mode: str,
    seed: int,
    report_epsilon: bool = False,
) -> None:
    """One round written directly with Opacus: make_private, one epoch of Poisson DP-SGD (the baseline).

    ``report_epsilon``: also ask the engine for ε at δ = 1e-5 after the epoch, as Flower's
    Opacus example does every round (a fresh engine: nothing of the RDP curve is cached).
    """
    from opacus import PrivacyEngine

    sample_seed, noise_seed = round_seeds(seed)
    model = model_fn()
    model.load_state_dict(weights)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(
        TensorDataset(*data), batch_size=batch_size, generator=torch.Generator().manual_seed(sample_seed)
    )
    criterion = nn.CrossEntropyLoss()
    engine = PrivacyEngine()
    out = engine.make_private(
        module=model,
        optimizer=optimizer,
        criterion=criterion,
        data_loader=loader,
        noise_multiplier=NOISE_MULTIPLIER,
        max_grad_norm=MAX_GRAD_NORM,
        poisson_sampling=True,
        grad_sample_mode=mode,
        noise_generator=torch.Generator().manual_seed(noise_seed),
    )
    if mode == "ghost":
        module, dp_optimizer, criterion, dp_loader = out
    else:
        module, dp_optimizer, dp_loader = out
    module.train()
    for inputs, targets in dp_loader:
        dp_optimizer.zero_grad()
        loss = criterion(module(inputs), targets)
        loss.backward()
        dp_optimizer.step()
    if report_epsilon:
        engine.get_epsilon(DELTA)


def nonprivate_round(
    model_fn: Callable[[], nn.Module],
    weights: dict[str, torch.Tensor],
    data: tuple[torch.Tensor, torch.Tensor],
    *,
    batch_size: int,
    seed: int,
) -> None:
    """One epoch of plain minibatch SGD (shuffled, same batch size and step count)."""
    model = model_fn()
    model.load_state_dict(weights)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(
        TensorDataset(*data), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    criterion = nn.CrossEntropyLoss()
    model.train()
    for inputs, targets in loader:
        optimizer.zero_grad()
        criterion(model(inputs), targets).backward()
        optimizer.step()


def run(
    *,
    models: tuple[str, ...] = ("cnn", "mlp"),
    batch_sizes: tuple[int, ...] = (64, 256),
    num_examples: int = 4096,
    repeats: int = 7,
    seed: int = 0,
) -> list[dict]:
    """Rows per model × batch size: ours vs Opacus alone (≤ 1.05×), ours vs non-private and the
    other Opacus mode vs non-private (reported). Values are seconds per DP-SGD step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(TORCH_THREADS)
    rows: list[dict] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus' secure-RNG and hook warnings, every round
            for name in models:
                model_fn = lambda name=name: make_model(name)
                weights = {k: v.clone() for k, v in model_fn().state_dict().items()}
                data = synthetic_data(name, num_examples, seed)
                for batch in batch_sizes:
                    rows += _cases(name, model_fn, weights, data, batch, num_examples, repeats, seed)
    finally:
        torch.set_num_threads(threads)
    return rows


def _cases(
    name: str,
    model_fn: Callable[[], nn.Module],
    weights: dict[str, torch.Tensor],
    data: tuple[torch.Tensor, torch.Tensor],
    batch: int,
    num_examples: int,
    repeats: int,
    seed: int,
) -> list[dict]:
    trainer = DpSgdTrainer(
        model_fn,
        lr=LR,
        noise_multiplier=NOISE_MULTIPLIER,
        max_grad_norm=MAX_GRAD_NORM,
        batch_size=batch,
        # Opacus' own rule (what "auto" picks where the fused Linear step does not apply): this benchmark
        # measures the trainer's overhead over Opacus alone in the same mode
        grad_sample_mode=choose_grad_sample_mode(model_fn(), batch_size=batch),
        device="cpu",
        seed=seed,
    )
    mode = trainer.grad_sample_mode
    other = "hooks" if mode == "ghost" else "ghost"
    steps = math.ceil(num_examples / batch)
    params = {
        "model": name,
        "parameters": sum(p.numel() for p in model_fn().parameters()),
        "batch_size": batch,
        "num_examples": num_examples,
        "steps": steps,
        "grad_sample_mode": mode,
        "noise_multiplier": NOISE_MULTIPLIER,
        "max_grad_norm": MAX_GRAD_NORM,
        "torch_threads": TORCH_THREADS,
    }
    case = f"{name} B={batch}"

    def ours(_: Any) -> None:
        trainer.train_round(weights, data, RecordDict())

    def opacus(_: Any, mode: str = mode) -> None:
        opacus_round(model_fn, weights, data, batch_size=batch, mode=mode, seed=seed)

    def plain(_: Any) -> None:
        nonprivate_round(model_fn, weights, data, batch_size=batch, seed=seed)

    def per_step(values: list[float]) -> list[float]:
        return [v / steps for v in values]

    rows = []
    sub, base = time_pair(ours, opacus, repeats=repeats)
    rows.append(
        row(
            NAME,
            f"{case}: ours vs Opacus alone ({mode})",
            params,
            metric="time_s",
            values=per_step(sub),
            baseline=f"Opacus PrivacyEngine loop ({mode})",
            baseline_values=per_step(base),
            target="<= 1.05x",
            target_ratio=1.05,
            notes=f"one round (setup + 1 epoch, {steps} Poisson steps) / steps; ours includes "
            "state restore/save and the ε queries (RDP curve cached: warm process)",
        )
    )
    clear = getattr(getattr(dp_sgd_accounting, "_sgm_rdp", None), "cache_clear", None)
    if clear is not None:  # a ClientApp runs every round in a fresh process: nothing is cached
        sub, base = time_pair(
            ours,
            lambda _s: opacus_round(
                model_fn, weights, data, batch_size=batch, mode=mode, seed=seed, report_epsilon=True
            ),
            repeats=repeats,
            setup=clear,
        )
        rows.append(
            row(
                NAME,
                f"{case}: ours, cold process vs Opacus + get_epsilon ({mode})",
                params,
                metric="time_s",
                values=per_step(sub),
                baseline=f"Opacus loop ({mode}) + engine.get_epsilon(1e-5)",
                baseline_values=per_step(base),
                target="<= 1.05x",
                target_ratio=1.05,
                notes="RDP curve cache cleared before each round of ours (as in a fresh ClientApp "
                "process); the baseline reports ε every round as Flower's Opacus example does",
            )
        )
    sub, base = time_pair(ours, plain, repeats=repeats)
    rows.append(
        row(
            NAME,
            f"{case}: ours ({mode}) vs non-private",
            params,
            metric="time_s",
            values=per_step(sub),
            baseline="torch SGD, same batch size and steps",
            baseline_values=per_step(base),
            target="report",
            notes=f"Opacus' rule (choose_grad_sample_mode) chose {mode!r}",
        )
    )
    alt, base = time_pair(lambda _s: opacus(_s, other), plain, repeats=repeats)
    rows.append(
        row(
            NAME,
            f"{case}: Opacus {other} vs non-private",
            {**params, "grad_sample_mode": other},
            metric="time_s",
            values=per_step(alt),
            baseline="torch SGD, same batch size and steps",
            baseline_values=per_step(base),
            target="report",
            notes=f"the mode Opacus' rule did not pick; compare with the row above ({mode})",
        )
    )
    return rows
