"""The fused DP-SGD step beyond ``nn.Linear`` (issue 40 item 3): Conv2d, Embedding, LayerNorm, GroupNorm, LoRA.

The same checks as ``tests/test_dp_sgd_fused.py`` for the Linear path, per layer type and on two whole
models (a GroupNorm ResNet-like conv net; a transformer block with Embedding + LayerNorm + attention Linear
layers + LoRA adapters on two projections):

* the clipped sum Σ_i clip_C(g_i) of a fixed batch equals Opacus' (hooks mode, ``DPOptimizer``) to float
  tolerance, whether the clipping bites on every sample (C = 0.05), some (C = 1) or none (C = 100), both
  where the step uses ghost norms and where it materialises per-sample gradients (layers called twice,
  convolutions over many positions);
* the noise on the sum has std z*C per coordinate: over d trainable coordinates the sample std has relative
  standard error 1/sqrt(2d); the test allows 5 standard errors and checks that this is below 5 % (so a std
  10 % off fails), and that frozen parameters (the LoRA base) get neither gradient nor noise;
* whole ``DpSgdTrainer`` rounds on the fused path give the same weights, events, histories and ε as the
  hooks path;
* modules the step cannot clip are refused with a ``ValueError`` naming the module.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from client_mods.dp_sgd import DpSgdTrainer, load_history
from client_mods.dp_sgd_fused import FusedDpSgd, LoRALinear, fused_eligible, fused_refusal
from client_mods.dp_sgd_trainer import clear_wrapped_cache

VOCAB, SEQ = 20, 6


# ---------------------------------------------------------------------------------------------- models
def _conv() -> nn.Module:
    """Conv2d over 64 positions (per-sample gradients materialised) then over 4 (ghost norms), groups, dilation."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 8, 3, stride=2, padding="valid", dilation=1),
        nn.Tanh(),
        nn.Conv2d(8, 16, 2, groups=2, bias=False),  # 3x3 -> 2x2: T = 4 positions, ghost norm per group
        nn.Flatten(),
        nn.Linear(64, 3),
    )


def _conv_1x1_out() -> nn.Module:
    """A conv whose output has one position (T = 1) and a dilated conv."""
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, dilation=2),  # 8x8 -> 4x4
        nn.ReLU(),
        nn.Conv2d(6, 12, 4),  # 4x4 -> 1x1
        nn.Flatten(),
        nn.Linear(12, 3),
    )


def _conv_pixel() -> nn.Module:
    """Convs where the pixel-Gram ghost norm is the cheapest (stride 1, many channels, few positions), one with
    groups and dilation."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),  # 8x8 -> 4x4
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.Tanh(),
        nn.Conv2d(16, 32, 3, padding=2, dilation=2, groups=2),
        nn.Flatten(),
        nn.Linear(32 * 16, 3),
    )


def _groupnorm() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.GroupNorm(3, 6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 64, 3)
    )


class _SharedConv(nn.Module):
    """One Conv2d and one GroupNorm called twice (per-sample gradients summed over the calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv, self.norm = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 3, padding=1), nn.GroupNorm(2, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = torch.relu(self.norm(self.conv(h)))
        h = torch.relu(self.norm(self.conv(h)))
        return self.head(h.mean((2, 3)))


class _Block(nn.Module):
    """A ResNet basic block with GroupNorm instead of BatchNorm (as Opacus' ModuleValidator.fix makes it)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1, groups: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.gn1 = nn.GroupNorm(groups, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.gn2 = nn.GroupNorm(groups, c_out)
        self.short = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.GroupNorm(groups, c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.gn1(self.conv1(x)))
        return torch.relu(self.gn2(self.conv2(out)) + self.short(x))


def _resnet() -> nn.Module:
    """A small ResNet-like conv net (stem, two blocks, one downsampling; GroupNorm), 3x8x8 -> 3."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.GroupNorm(2, 8),
        nn.ReLU(),
        _Block(8, 8),
        _Block(8, 16, stride=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 3),
    )


def _embedding() -> nn.Module:
    class _Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.head = nn.Embedding(VOCAB, 8), nn.Linear(8, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(torch.tanh(self.emb(ids)).mean(1))

    return _Bag()


def _layernorm() -> nn.Module:
    """LayerNorm on 2-D inputs, on 3-D inputs over the last two dims, and one with a frozen bias (Opacus' sampler
    fails on ``bias=False``)."""

    class _Norms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 8)
            self.ln_tokens, self.ln_all = nn.LayerNorm(8), nn.LayerNorm((SEQ, 8))
            self.ln_all.bias.requires_grad_(False)
            self.ln_flat, self.head = nn.LayerNorm(8), nn.Linear(8, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.ln_all(torch.tanh(self.ln_tokens(self.emb(ids))))
            return self.head(self.ln_flat(h.sum(1)))

    return _Norms()


class _SharedSequence(nn.Module):
    """One Embedding and one LayerNorm called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm, self.head = nn.Embedding(VOCAB, 8), nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.emb(ids[:, :3])).mean(1) + self.norm(torch.tanh(self.emb(ids[:, 3:]))).mean(1)
        return self.head(h)


class _Attention(nn.Module):
    """Multi-head self-attention built from nn.Linear projections (nn.MultiheadAttention holds its own
    parameters: refused), LoRA adapters on the query and value projections."""

    def __init__(self, d: int, heads: int, rank: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        if rank:
            self.q, self.v = LoRALinear(self.q, rank, alpha=2 * rank), LoRALinear(self.v, rank, alpha=2 * rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        split = lambda h: h.view(n, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        out = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(out.transpose(1, 2).reshape(n, t, d))


class TransformerBlock(nn.Module):
    """Token + position Embedding, a pre-norm transformer block (LayerNorm, attention, MLP), mean-pooled head."""

    def __init__(
        self, vocab: int = VOCAB, seq: int = SEQ, d: int = 16, heads: int = 2, rank: int = 2, classes: int = 3
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln1, self.attn = nn.LayerNorm(d), _Attention(d, heads, rank)
        self.ln2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # batch first, as every input
        h = self.tok(ids) + self.pos(positions)
        h = h + self.attn(self.ln1(h))
        h = h + self.mlp(self.ln2(h))
        return self.head(self.ln_f(h).mean(1))


def _transformer() -> nn.Module:
    model = TransformerBlock()
    for m in model.modules():  # non-zero LoRA B, so that A's gradient is not zero in the checks
        if isinstance(m, LoRALinear):
            nn.init.normal_(m.lora_B.weight, std=0.3)
    return model


IMAGE_MODELS = {
    "conv": _conv,
    "conv_1x1": _conv_1x1_out,
    "conv_pixel": _conv_pixel,
    "groupnorm": _groupnorm,
    "shared_conv": _SharedConv,
}
IMAGE_MODELS["resnet"] = _resnet
SEQUENCE_MODELS = {"embedding": _embedding, "layernorm": _layernorm, "shared_seq": _SharedSequence}
SEQUENCE_MODELS["transformer"] = _transformer
MODELS = {**IMAGE_MODELS, **SEQUENCE_MODELS}


def _data(name: str, n: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if name in IMAGE_MODELS:
        x = torch.randn(n, 3, 8, 8, generator=g) * 3
    else:
        x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return x, torch.randint(0, 3, (n,), generator=g)


# ---------------------------------------------------------------------------------------------- references
def _opacus_clipped_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float) -> list[torch.Tensor]:
    """Opacus' Σ_i clip_C(g_i) (``p.summed_grad``) for one batch, hooks mode, no noise."""
    params = [p for p in model.parameters() if p.requires_grad]
    module, optimizer, _ = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(params, lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=len(y)),
        noise_multiplier=0.0,
        max_grad_norm=clip,
        grad_sample_mode="hooks",
    )
    nn.CrossEntropyLoss()(module(x), y).backward()
    optimizer.clip_and_accumulate()
    sums = [p.summed_grad.detach().clone() for p in params]
    module.to_standard_module()
    return sums


def _loop_clipped_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float) -> list[torch.Tensor]:
    """Σ_i clip_C(∇ loss(x_i, y_i)) by one backward pass per example (the definition)."""
    params = [p for p in model.parameters() if p.requires_grad]
    sums = [torch.zeros_like(p) for p in params]
    for i in range(len(y)):
        grads = torch.autograd.grad(nn.CrossEntropyLoss()(model(x[i : i + 1]), y[i : i + 1]), params)
        norm = torch.sqrt(sum(g.square().sum() for g in grads))
        f = min(1.0, clip / (float(norm) + 1e-6))
        for s, g in zip(sums, grads):
            s.add_(g, alpha=f)
    return sums


def _kernel(model: nn.Module, clip: float, z: float = 1.0, lr: float = 0.1) -> FusedDpSgd:
    params = [p for p in model.parameters() if p.requires_grad]
    return FusedDpSgd(
        model, torch.optim.SGD(params, lr=lr), nn.CrossEntropyLoss(), noise_multiplier=z, max_grad_norm=clip
    )


# ---------------------------------------------------------------------------------------------- clipped sums
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("clip", [0.05, 1.0, 100.0])
def test_clipped_sum_is_opacus_clipped_sum(name, clip):
    torch.manual_seed(3)
    model = MODELS[name]()
    assert fused_eligible(model), fused_refusal(model)
    x, y = _data(name)
    reference = _opacus_clipped_sum(copy.deepcopy(model), x, y, clip)
    params = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    kernel = _kernel(model, clip)
    for _ in range(2):
        kernel.clipped_sum(x, y)
        for p, expected in zip(params, reference):
            torch.testing.assert_close(p.grad, expected, rtol=1e-4, atol=1e-6)
        assert all(p.grad is None for p in frozen)
    kernel.close()
    assert all(p.grad is None for p in params)
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize(
    "c_in, c_out, size, kernel, stride, padding, dilation, groups",
    [
        (3, 8, 9, 3, 1, 1, 1, 1),
        (4, 6, 8, 3, 2, 0, 1, 2),
        (6, 12, 7, (3, 2), (1, 2), (2, 1), (2, 1), 3),
        (16, 16, 4, 3, 1, 1, 1, 1),
        (8, 8, 5, 5, 1, 0, 1, 1),
        (8, 4, 6, 1, 1, 0, 1, 4),
    ],
)
def test_conv_norm_methods_agree(c_in, c_out, size, kernel, stride, padding, dilation, groups):
    """The three per-sample weight-norm computations of a Conv2d (per-sample gradients with the batch as
    groups, ghost norm over unfolded patches, ghost norm from the pixel Gram matrix) agree with the norm of the
    per-sample gradients of a per-example backward pass, whichever the step picks."""
    from client_mods import dp_sgd_fused as fused

    torch.manual_seed(0)
    m = nn.Conv2d(c_in, c_out, kernel, stride, padding, dilation, groups, bias=False)
    a = torch.randn(5, c_in, size, size, dtype=torch.float64)
    m = m.double()
    out = m(a)
    g = torch.randn_like(out)
    exact = torch.stack([torch.autograd.grad((m(a[i : i + 1]) * g[i : i + 1]).sum(), m.weight)[0] for i in range(5)])
    expected = exact.reshape(5, -1).square().sum(1)
    patches, grads = fused._conv_unfold(m, a, g)
    for sq in (
        fused._sq(fused._conv_per_sample_weight(m, a, g)),
        fused._ghost_or_sample(*fused._conv_unfold(m, a, g)),
        fused._total((patches @ patches.transpose(-1, -2)) * (grads @ grads.transpose(-1, -2))),  # ghost, always
        fused._conv_pixel_ghost(m, a, g),
        fused._conv_sq(m, a, g, True, False)[0],
    ):
        torch.testing.assert_close(sq, expected)


def test_transformer_freezes_the_lora_base():
    model = _transformer()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {f"attn.{p}.base.{t}" for p in "qv" for t in ("weight", "bias")}
    assert {n for n, m in model.named_modules() if isinstance(m, LoRALinear)} == {"attn.q", "attn.v"}


def test_embedding_padding_idx_gets_no_gradient():
    """PyTorch's padding_idx row has no gradient (Opacus' sampler gives it one): the fused sum is the
    per-example definition's."""
    torch.manual_seed(0)
    model = _embedding()
    model.emb = nn.Embedding(VOCAB, 8, padding_idx=0)
    x, y = _data("embedding")
    x[:, :2] = 0
    reference = _loop_clipped_sum(model, x, y, 0.5)
    kernel = _kernel(model, 0.5)
    kernel.clipped_sum(x, y)
    for p, expected in zip(kernel.params, reference):
        torch.testing.assert_close(p.grad, expected, rtol=1e-4, atol=1e-6)
    assert torch.equal(model.emb.weight.grad[0], torch.zeros(8))


# ---------------------------------------------------------------------------------------------- noise
@pytest.mark.parametrize("name", ["wide_conv", "transformer"])
def test_noise_std_is_z_times_c_on_the_sum(name):
    """std z*C per trainable coordinate (a 10 % error fails); frozen parameters get no gradient and no noise."""
    z, clip, n = 1.3, 0.7, 16
    torch.manual_seed(1)
    if name == "wide_conv":
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1)
        )
        model.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 3)))
        x, y = _data("conv", n)
    else:
        model = TransformerBlock(d=64, heads=4, rank=4)
        x, y = _data("transformer", n)
    params = [p for p in model.parameters() if p.requires_grad]
    frozen = [(p, p.detach().clone()) for p in model.parameters() if not p.requires_grad]
    assert (name == "transformer") == bool(frozen)
    kernel = _kernel(model, clip, z=z, lr=1.0)
    before = torch.cat([p.detach().flatten().clone() for p in params])
    kernel.clipped_sum(x, y)
    clipped = kernel.flat.clone()
    history: list = []

    class _Accountant:
        def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
            history.append((noise_multiplier, sample_rate))

    kernel.step(
        x,
        y,
        generator=torch.Generator().manual_seed(2),
        expected_batch_size=n,
        accountant=_Accountant(),
        sample_rate=0.5,
    )
    noise = (before - torch.cat([p.detach().flatten() for p in params])).double() * n - clipped.double()
    d = noise.numel()
    tolerance = 5 / math.sqrt(2 * d)  # 5 standard errors of the sample std's relative error
    assert tolerance < 0.05, d  # so a std 10 % off fails
    std = float(noise.std())
    assert abs(float(noise.mean())) < 5 * z * clip / math.sqrt(d)
    assert abs(std / (z * clip) - 1) < tolerance, (std, tolerance)
    assert abs(std / (1.1 * z * clip) - 1) > tolerance and abs(std / (0.9 * z * clip) - 1) > tolerance
    for p, value in frozen:
        assert p.grad is None and torch.equal(p, value)
    assert history == [(z, 0.5)]


# ---------------------------------------------------------------------------------------------- whole rounds
@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "transformer"])
def test_fused_round_is_the_opacus_round(name):
    """Two rounds each: the same weights (same batches, clipping, noise draws), sampling rate, steps, booked
    history, declared event and ε as Opacus' hooks mode."""
    clear_wrapped_cache()
    make = MODELS[name]
    torch.manual_seed(5)
    x, y = _data(name, 40)
    weights = {m: ArrayRecord(make().state_dict()) for m in ("fused", "hooks")}
    weights["hooks"] = weights["fused"]
    states = {m: RecordDict() for m in weights}
    for _ in range(2):
        out = {
            m: DpSgdTrainer(
                make, noise_multiplier=1.1, max_grad_norm=0.5, batch_size=8, grad_sample_mode=m, seed=7
            ).train_round(weights[m], (x, y), states[m], cache_key="c")
            for m in weights
        }
        fused, hooks = out["fused"], out["hooks"]
        assert fused.grad_sample_mode == "fused"
        for k in hooks.state_dict:
            torch.testing.assert_close(fused.state_dict[k], hooks.state_dict[k], rtol=1e-4, atol=1e-5)
        assert fused.event == hooks.event and fused.neighboring_relation == hooks.neighboring_relation
        assert (fused.sample_rate, fused.steps) == (hooks.sample_rate, hooks.steps)
        assert fused.epsilon == hooks.epsilon and fused.epsilon_round_only == hooks.epsilon_round_only
        weights = {m: ArrayRecord(out[m].state_dict) for m in out}
    assert load_history(states["fused"])[0] == load_history(states["hooks"])[0]
    clear_wrapped_cache()


def test_auto_picks_fused_for_the_new_layers():
    assert DpSgdTrainer(_resnet, noise_multiplier=1.0).grad_sample_mode == "fused"
    assert DpSgdTrainer(_transformer, noise_multiplier=1.0).grad_sample_mode == "fused"


# ---------------------------------------------------------------------------------------------- refusals
class _OwnParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


@pytest.mark.parametrize(
    "model, module",
    [
        (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), "'1' (BatchNorm2d)"),
        (lambda: nn.Sequential(nn.Linear(4, 4), nn.MultiheadAttention(4, 2)), "'1' (MultiheadAttention)"),
        (lambda: nn.Sequential(nn.Conv1d(3, 4, 3)), "'0' (Conv1d)"),
        (_OwnParameter, "'<root>' (_OwnParameter)"),
        (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding="same")), "'0' (Conv2d) uses padding='same'"),
        (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")), "'0' (Conv2d)"),
        (lambda: nn.Sequential(nn.Embedding(5, 4, max_norm=1.0)), "'0' (Embedding) uses max_norm"),
    ],
)
def test_unsupported_modules_are_refused_by_name(model, module):
    assert not fused_eligible(model())
    with pytest.raises(ValueError, match="module " + module.replace("(", r"\(").replace(")", r"\)")):
        _kernel(model(), 1.0)
    with pytest.raises(ValueError) as refused:
        DpSgdTrainer(model, noise_multiplier=1.0, grad_sample_mode="fused")
    message = str(refused.value)  # the fused step's refusal, or Opacus' validator's where it comes first
    assert "Opacus cannot train" in message or ("fused" in message and "module " + module in message), message
    try:
        assert DpSgdTrainer(model, noise_multiplier=1.0).grad_sample_mode != "fused"  # auto keeps Opacus
    except ValueError as error:
        assert "Opacus cannot train" in str(error)


def test_batch_not_first_is_refused_at_the_step():
    class _TimeFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.transpose(0, 1)).mean(0)  # (T, n, d): per-sample norms would mix examples

    kernel = _kernel(_TimeFirst(), 1.0)
    with pytest.raises(ValueError, match="batch first: module 'fc'"):
        kernel.clipped_sum(torch.randn(8, 5, 4), torch.randint(0, 3, (8,)))


# ---------------------------------------------------------------------------------------------- benchmark
@pytest.mark.slow
def test_layers_benchmark_tiny_run_writes_its_rows(tmp_path):
    """``python -m flwr_dp_benchmarks.bench_dpsgd --tiny`` (toy sizes, meaningless timings): one row per model x
    path x clock, the fused rows targeted at 1.5x, and its two files."""
    import json
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from flwr_dp_benchmarks import bench_dpsgd

    assert bench_dpsgd.main(["--tiny", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    keys = {(r["params"]["model"], r["params"]["grad_sample_mode"], r["metric"]) for r in rows}
    models = bench_dpsgd.LAYER_MODES["tiny"]["models"]
    assert len(rows) == len(keys) == len(models) * 3 * 2
    assert all(r["target"] == "<= 1.5x" for r in rows if "fused" in r["case"])
    assert all(r["value"] > 0 and r["baseline_value"] > 0 for r in rows)
    assert "| fused |" in (tmp_path / "results.md").read_text()
