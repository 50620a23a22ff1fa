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


# ------------------------------------------------------------------------------------------------------------
# Layers beyond nn.Linear (issue 40 item 3): seconds per DP-SGD step, fused vs Opacus vs non-private.
#
#     python -m flwr_dp_benchmarks.bench_dpsgd [--quick] [--out flwr_dp_benchmarks/results/dpsgd_layers]
#
# Not part of run.py's suite (its CNN and MLP rows above are unchanged): writes results.json and results.md into
# ``--out``. Subject per model: one DP-SGD step on a fixed batch of B examples (z = 1.1, C = 1, SGD), by
#
# * ``fused``: client_mods.dp_sgd_fused.FusedDpSgd.step (closed-form / ghost norms, book-keeping clipped sum,
#   flat noise; what DpSgdTrainer runs with grad_sample_mode "fused", and "auto" for these models);
# * ``hooks``: Opacus' GradSampleModule + DPOptimizer (per-sample gradients materialised), what the trainer ran
#   for these models before (``"auto"`` -> Opacus' rule, "hooks" for convolutions and embeddings);
# * ``ghost``: Opacus' fast gradient clipping (GradSampleModuleFastGradientClipping: ghost norms, then a second
#   backward pass for the clipped sum);
#
# each against the non-private step (zero_grad, backward, torch SGD step) of the same model on the same batch,
# interleaved (``_common.time_pair``), medians; target: fused <= 1.5x non-private.

#: kwargs of :func:`run_layers` per mode ("tiny": smoke test only).
LAYER_MODES: dict[str, dict[str, Any]] = {
    "full": {"models": ("resnet18", "transformer"), "batch_size": 32, "repeats": 5},
    "quick": {"models": ("resnet18", "transformer"), "batch_size": 32, "repeats": 3},
    "tiny": {"models": ("resnet_tiny", "transformer_tiny"), "batch_size": 4, "repeats": 1},
}


class _BasicBlock(nn.Module):
    """ResNet's basic block with GroupNorm in place of BatchNorm (what ``opacus.validators.ModuleValidator.fix``
    substitutes: GroupNorm(min(32, C), C)); residual sum out of place."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        norm = lambda c: nn.GroupNorm(min(32, c), c)  # noqa: E731
        self.conv1, self.gn1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), norm(c_out)
        self.conv2, self.gn2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), norm(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), norm(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.gn1(self.conv1(x)))
        return torch.relu(self.gn2(self.conv2(out)) + self.shortcut(x))


def make_resnet18_gn(width: int = 64, blocks: tuple[int, ...] = (2, 2, 2, 2), classes: int = 10, seed: int = 0):
    """ResNet-18 for 32x32x3 inputs (CIFAR stem: one 3x3 conv, no max-pool), GroupNorm, 10 classes: 11.2 M
    parameters at width 64 (torchvision is not a dependency)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.GroupNorm(min(32, width), width)]
        layers.append(nn.ReLU())
        c = width
        for i, count in enumerate(blocks):
            c_out = width * 2**i
            for j in range(count):
                layers.append(_BasicBlock(c, c_out, 2 if (j == 0 and i > 0) else 1))
                c = c_out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
        return nn.Sequential(*layers)


class _LoRAAttention(nn.Module):
    """Multi-head self-attention from nn.Linear projections, each a LoRA-adapted frozen Linear."""

    def __init__(self, d: int, heads: int, rank: int) -> None:
        super().__init__()
        from client_mods.dp_sgd_fused import LoRALinear

        self.heads = heads
        self.q, self.k, self.v, self.o = (LoRALinear(nn.Linear(d, d), rank, alpha=2 * rank) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        split = lambda h: h.view(n, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        out = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(out.transpose(1, 2).reshape(n, t, d))


class LoRATransformer(nn.Module):
    """Token and position Embedding, one pre-norm transformer block (LayerNorm, LoRA attention, MLP 4d), final
    LayerNorm, mean-pooled Linear head. Trainable: embeddings, norms, MLP, head and the LoRA adapters; frozen:
    the attention projections' base weights."""

    def __init__(self, vocab: int, seq: int, d: int, heads: int, rank: int, classes: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln1, self.attn = nn.LayerNorm(d), _LoRAAttention(d, heads, rank)
        self.ln2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device).expand_as(ids).contiguous())
        h = h + self.attn(self.ln1(h))
        h = h + self.mlp(self.ln2(h))
        return self.head(self.ln_f(h).mean(1))


#: name -> (model factory, input shape per example, vocabulary for token inputs or None)
LAYER_MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], Any]] = {
    "resnet18": (lambda: make_resnet18_gn(), (3, 32, 32), None),
    "transformer": (lambda: _seeded(lambda: LoRATransformer(1000, 64, 256, 4, 8, 10)), (64,), 1000),
    "resnet_tiny": (lambda: make_resnet18_gn(width=4, blocks=(1, 1)), (3, 8, 8), None),
    "transformer_tiny": (lambda: _seeded(lambda: LoRATransformer(50, 8, 16, 2, 2, 10)), (8,), 50),
}


def _seeded(make: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def _layer_steps(name: str, batch: int, seed: int) -> dict[str, Callable[[Any], None]]:
    """One step function per path (fused, hooks, ghost, plain), each on its own copy of the model."""
    from opacus import PrivacyEngine
    from opacus.accountants import RDPAccountant

    from client_mods.dp_sgd_fused import FusedDpSgd

    make, shape, vocab = LAYER_MODELS[name]
    gen = torch.Generator().manual_seed(seed)
    x = (
        torch.randint(0, vocab, (batch, *shape), generator=gen)
        if vocab
        else torch.randn((batch, *shape), generator=gen)
    )
    y = torch.randint(0, 10, (batch,), generator=gen)
    criterion = nn.CrossEntropyLoss()

    def trainable(model: nn.Module) -> list[nn.Parameter]:
        return [p for p in model.parameters() if p.requires_grad]

    plain_model = make().train()
    plain_opt = torch.optim.SGD(trainable(plain_model), lr=LR)

    def plain(_: Any) -> None:
        plain_opt.zero_grad()
        criterion(plain_model(x), y).backward()
        plain_opt.step()

    fused_model = make().train()
    kernel = FusedDpSgd(
        fused_model,
        torch.optim.SGD(trainable(fused_model), lr=LR),
        nn.CrossEntropyLoss(),
        noise_multiplier=NOISE_MULTIPLIER,
        max_grad_norm=MAX_GRAD_NORM,
    )
    accountant, noise = RDPAccountant(), torch.Generator().manual_seed(seed)

    def fused(_: Any) -> None:
        kernel.step(x, y, generator=noise, expected_batch_size=batch, accountant=accountant, sample_rate=batch / 1024)

    steps: dict[str, Callable[[Any], None]] = {"plain": plain, "fused": fused}
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    for mode in ("hooks", "ghost"):
        model = make().train()
        out = PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(trainable(model), lr=LR),
            criterion=nn.CrossEntropyLoss(),
            data_loader=loader,
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=MAX_GRAD_NORM,
            grad_sample_mode=mode,
            noise_generator=torch.Generator().manual_seed(seed),
        )
        module, optimizer = out[0], out[1]
        loss_fn = out[2] if mode == "ghost" else criterion

        def opacus_step(_: Any, module=module, optimizer=optimizer, loss_fn=loss_fn) -> None:
            optimizer.zero_grad()
            loss_fn(module(x), y).backward()
            optimizer.step()

        steps[mode] = opacus_step
    return steps


def _time_pair_wall_and_cpu(
    subject: Callable[[Any], Any], baseline: Callable[[Any], Any], *, repeats: int
) -> dict[str, tuple[list[float], list[float]]]:
    """``_common.time_pair``'s interleaving (one warm-up each, then alternating which goes first), measuring both
    the wall time and the calling thread's CPU time (``time.thread_time``: with one torch thread, the work itself,
    whatever else loads the machine)."""
    import gc
    import time

    out: dict[str, tuple[list[float], list[float]]] = {"time_s": ([], []), "cpu_time_s": ([], [])}

    def once(fn: Callable[[Any], Any], slot: int, record: bool) -> None:
        gc.collect()
        w, c = time.perf_counter(), time.thread_time()
        fn(None)
        c, w = time.thread_time() - c, time.perf_counter() - w
        if record:
            out["time_s"][slot].append(w)
            out["cpu_time_s"][slot].append(c)

    once(subject, 0, False)
    once(baseline, 1, False)
    for i in range(repeats):
        for slot in (0, 1) if i % 2 == 0 else (1, 0):
            once(subject if slot == 0 else baseline, slot, True)
    return out


def run_layers(
    *, models: tuple[str, ...] = ("resnet18", "transformer"), batch_size: int = 32, repeats: int = 3, seed: int = 0
) -> list[dict]:
    """Rows per model x path (fused, Opacus hooks, Opacus ghost): seconds per DP-SGD step vs the non-private
    step (target for fused: <= 1.5x; the Opacus rows are reported)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(TORCH_THREADS)
    rows: list[dict] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in models:
                make = LAYER_MODELS[name][0]
                probe = make()
                params = {
                    "model": name,
                    "parameters": sum(p.numel() for p in probe.parameters()),
                    "trainable": sum(p.numel() for p in probe.parameters() if p.requires_grad),
                    "batch_size": batch_size,
                    "noise_multiplier": NOISE_MULTIPLIER,
                    "max_grad_norm": MAX_GRAD_NORM,
                    "torch_threads": TORCH_THREADS,
                }
                steps = _layer_steps(name, batch_size, seed)
                for path in ("fused", "hooks", "ghost"):
                    timed = _time_pair_wall_and_cpu(steps[path], steps["plain"], repeats=repeats)
                    fused = path == "fused"
                    for metric, (sub, base) in timed.items():
                        rows.append(
                            row(
                                NAME,
                                f"{name} B={batch_size}: {'fused step' if fused else 'Opacus ' + path} vs non-private"
                                + (" (thread CPU time)" if metric == "cpu_time_s" else ""),
                                {**params, "grad_sample_mode": path},
                                metric=metric,
                                values=sub,
                                baseline="torch SGD step, same model and batch",
                                baseline_values=base,
                                target="<= 1.5x" if fused else "report",
                                target_ratio=1.5 if fused else None,
                                notes="one DP-SGD step on a fixed batch (clip, noise z*C, SGD update); "
                                + (
                                    "wall time"
                                    if metric == "time_s"
                                    else "CPU time of the timing thread (one torch thread: robust to other load on the machine)"
                                ),
                            )
                        )
    finally:
        torch.set_num_threads(threads)
    return rows


def layers_markdown(rows: list[dict], created: str) -> str:
    """The rows as a markdown table (seconds per step and ratio to the non-private step)."""
    lines = [
        "# DP-SGD step beyond nn.Linear: fused vs Opacus vs non-private (seconds per step)",
        "",
        f"{created}; `python -m flwr_dp_benchmarks.bench_dpsgd`; {TORCH_THREADS} torch thread.",
        "",
        "| model | parameters (trainable) | B | path | clock | DP-SGD step | non-private step | ratio | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["params"]
        lines.append(
            f"| {p['model']} | {p['parameters']:,} ({p['trainable']:,}) | {p['batch_size']} | {p['grad_sample_mode']} "
            f"| {'wall' if r['metric'] == 'time_s' else 'thread CPU'} "
            f"| {r['value']:.3f} s | {r['baseline_value']:.3f} s | {r['ratio']:.2f}x | {r['target']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import time
    from pathlib import Path

    from ._common import machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dpsgd_layers")
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    rows = run_layers(**LAYER_MODES[mode])
    created = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"mode": mode, "created": created, "machine": machine(), "rows": rows}
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(layers_markdown(rows, f"{created}, {mode} run"))
    print(layers_markdown(rows, created))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
