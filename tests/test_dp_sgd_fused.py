"""The fused DP-SGD step (client_mods.dp_sgd_fused, ``grad_sample_mode="fused"``) against Opacus' hooks mode.

What must not change with the mode: the clipped sum of a batch (compared on fixed batches with Opacus'
``DPOptimizer`` after a backward pass: float tolerance), the noise (std z*C on the sum, per coordinate:
the sample std of d = 80 400 draws has relative standard error 1/sqrt(2d) = 0.25 %; the test allows
1 %, so a std 10 % off fails by 40 standard errors), the Poisson sampling rate, the steps, the booked
history and the declared event. With the same seed the fused round draws the same batches and the same
noise as Opacus', so whole rounds give the same weights up to float rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from client_mods.dp_sgd import DpSgdTrainer, load_history
from client_mods.dp_sgd_fused import FusedLinearDpSgd, fused_eligible
from client_mods.dp_sgd_trainer import clear_wrapped_cache


class _Shared(nn.Module):
    """One Linear called twice (its per-sample gradient is a sum over the calls: no closed-form norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.out = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inner(torch.tanh(self.inner(x)))))


class _Sequence(nn.Module):
    """Linear layers on (batch, time, features) inputs, pooled over time."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x.view(len(x), 2, 4).repeat(1, 1, 2)))).mean(1)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))


def _inplace() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(inplace=True), nn.Linear(6, 3))


def _frozen() -> nn.Module:
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3, bias=False))
    model[0].weight.requires_grad_(False)  # only its bias is trained
    return model


def _for_opacus(model: nn.Module) -> nn.Module:
    """A copy Opacus' hooks can run: the same function, without in-place ReLU (which Opacus' backward hooks refuse)."""
    clone = copy.deepcopy(model)
    for name, m in clone.named_children():
        if isinstance(m, nn.ReLU) and m.inplace:
            setattr(clone, name, nn.ReLU())
    return clone


def _data(n: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g) * 3, torch.randint(0, 3, (n,), generator=g)


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


@pytest.mark.parametrize("make", [_mlp, _inplace, _frozen, _Shared, _Sequence])
@pytest.mark.parametrize("clip", [0.05, 1.0, 100.0])
def test_clipped_sum_is_opacus_clipped_sum(make, clip):
    """Same Σ_i clip_C(g_i) as Opacus on a fixed batch, whether the clipping bites on every sample (C = 0.05),
    on some (C = 1) or on none (C = 100)."""
    torch.manual_seed(3)
    model = make()
    x, y = _data()
    reference = _opacus_clipped_sum(_for_opacus(model), x, y, clip)
    params = [p for p in model.parameters() if p.requires_grad]
    kernel = FusedLinearDpSgd(
        model, torch.optim.SGD(params, lr=0.1), nn.CrossEntropyLoss(), noise_multiplier=1.0, max_grad_norm=clip
    )
    for _ in range(2):  # the second call finds in-place outputs already detected
        kernel.clipped_sum(x, y)
        for p, expected in zip(params, reference):
            torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-6)
    kernel.close()
    assert all(p.grad is None for p in params)
    assert not any(m._forward_hooks for m in model.modules())  # a plain module again


def test_noise_std_is_z_times_c_on_the_sum():
    """The noise added to the clipped sum has mean 0 and std z*C per coordinate (a 10 % error fails)."""
    z, clip, n = 1.3, 0.7, 20
    model = nn.Linear(200, 400)  # 80 400 coordinates
    params = list(model.parameters())
    kernel = FusedLinearDpSgd(
        model, torch.optim.SGD(params, lr=1.0), nn.MSELoss(), noise_multiplier=z, max_grad_norm=clip
    )
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 200, generator=g), torch.randn(n, 400, generator=g)
    before = torch.cat([p.detach().flatten().clone() for p in params])
    kernel.clipped_sum(x, y)
    clipped = kernel.flat.clone()
    before_step = torch.cat([p.detach().flatten().clone() for p in params])
    assert torch.equal(before, before_step)
    history: list = []

    class _Accountant:
        def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
            history.append((noise_multiplier, sample_rate))

    kernel.step(
        x,
        y,
        generator=torch.Generator().manual_seed(1),
        expected_batch_size=n,
        accountant=_Accountant(),
        sample_rate=0.5,
    )
    after = torch.cat([p.detach().flatten() for p in params])
    noise = (before - after) * n - clipped.double().float()  # lr 1: Δθ = -(sum + noise) / n
    std = float(noise.double().std())
    assert abs(float(noise.double().mean())) < 5 * z * clip / noise.numel() ** 0.5
    assert abs(std / (z * clip) - 1) < 0.01, std
    assert abs(std / (1.1 * z * clip) - 1) > 0.05 and abs(std / (0.9 * z * clip) - 1) > 0.05
    assert history == [(z, 0.5)]  # one booked step per step


def _round(mode: str, make, data, state, weights, *, cache_key=None, **kwargs):
    if mode == "hooks" and make is _inplace:
        make = _mlp  # the same function (Opacus' hooks refuse in-place ReLU)
    trainer = DpSgdTrainer(make, noise_multiplier=1.1, max_grad_norm=0.5, grad_sample_mode=mode, seed=7, **kwargs)
    return trainer.train_round(weights, data, state, cache_key=cache_key)


@pytest.mark.parametrize(
    "make, kwargs, cached",
    [
        (_mlp, {"batch_size": 8, "local_epochs": 2}, True),
        (_mlp, {"batch_size": 8, "local_epochs": 2}, False),
        (_mlp, {"batch_size": 2, "momentum": 0.5}, True),  # q = 0.05: empty Poisson batches (pure-noise steps)
        (_inplace, {"batch_size": 6, "poisson_sampling": False}, False),
        (_frozen, {"batch_size": 8, "optimizer_fn": lambda ps: torch.optim.Adam(ps, lr=0.01)}, True),
    ],
)
def test_fused_round_is_the_opacus_round(make, kwargs, cached):
    """Over two rounds: the same weights (same batches, same clipping, same noise draws), sampling rate, steps,
    booked history, declared event and ε as Opacus' hooks mode."""
    clear_wrapped_cache()
    x, y = _data(40)
    weights = {m: ArrayRecord(make().state_dict()) for m in ("fused", "hooks")}
    weights["hooks"] = weights["fused"]
    states = {m: RecordDict() for m in weights}
    with pytest.warns(UserWarning) if kwargs.get("poisson_sampling") is False else _nothing():
        for _ in range(2):
            out = {
                m: _round(m, make, (x, y), states[m], weights[m], cache_key="c" if cached else None, **kwargs)
                for m in weights
            }
            fused, hooks = out["fused"], out["hooks"]
            assert fused.grad_sample_mode == "fused"
            for k in hooks.state_dict:
                torch.testing.assert_close(fused.state_dict[k], hooks.state_dict[k], rtol=1e-4, atol=1e-5)
            assert fused.event == hooks.event and fused.neighboring_relation == hooks.neighboring_relation
            assert (fused.sample_rate, fused.steps, fused.noise_multiplier) == (
                hooks.sample_rate,
                hooks.steps,
                hooks.noise_multiplier,
            )
            assert fused.epsilon == hooks.epsilon and fused.epsilon_round_only == hooks.epsilon_round_only
            weights = {m: ArrayRecord(out[m].state_dict) for m in out}
    assert load_history(states["fused"])[0] == load_history(states["hooks"])[0]
    assert dict(states["fused"]["dp-sgd/opacus"]) == dict(states["hooks"]["dp-sgd/opacus"])
    clear_wrapped_cache()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_auto_picks_fused_only_where_it_applies():
    conv = lambda: nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3))  # noqa: E731 (no fused Conv1d)
    conv2d = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3))  # tests/test_dp_sgd_fused_layers.py
    assert fused_eligible(_mlp()) and fused_eligible(_Shared()) and fused_eligible(conv2d)
    assert not fused_eligible(conv())
    tied = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    tied[2].weight = tied[0].weight  # one parameter in two layers: its per-sample norm has cross terms
    mixed = _mlp().double()
    mixed[0].float()
    assert not fused_eligible(tied) and not fused_eligible(mixed)
    assert DpSgdTrainer(_mlp, noise_multiplier=1.0).grad_sample_mode == "fused"
    assert DpSgdTrainer(conv, noise_multiplier=1.0).grad_sample_mode == "hooks"
    assert DpSgdTrainer(_mlp, noise_multiplier=1.0, clipping="per_layer").grad_sample_mode == "hooks"
    assert DpSgdTrainer(_mlp, noise_multiplier=1.0, max_physical_batch_size=4).grad_sample_mode != "fused"
    for kwargs in (
        {"model": conv},
        {"model": _mlp, "clipping": "per_layer"},
        {"model": _mlp, "max_physical_batch_size": 4},
    ):
        with pytest.raises(ValueError, match="fused"):
            DpSgdTrainer(noise_multiplier=1.0, grad_sample_mode="fused", **kwargs)


def test_fused_round_rejects_wrong_shapes_and_keys_on_the_kept_model():
    clear_wrapped_cache()
    x, y = _data(16)
    trainer = DpSgdTrainer(_mlp, noise_multiplier=1.0, batch_size=8, seed=1)
    state = RecordDict()
    good = _mlp().state_dict()
    trainer.train_round(good, (x, y), state, cache_key="k")
    bad = dict(good)
    bad["0.weight"] = torch.zeros(6, 9)
    with pytest.raises(ValueError, match="shape"):
        trainer.train_round(bad, (x, y), state, cache_key="k")
    with pytest.raises(ValueError, match="keys"):
        trainer.train_round({"_module." + k: v for k, v in good.items()}, (x, y), state, cache_key="k")
    assert load_history(state)[0] == [(1.0, 0.5, 2)]  # only the good round was booked
    clear_wrapped_cache()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_round_on_cuda_is_the_opacus_round():
    """On the GPU too: the same weights, event and history as Opacus' hooks mode (same CUDA noise draws)."""
    x, y = _data(40)
    weights = ArrayRecord(_mlp().state_dict())
    out = {
        m: DpSgdTrainer(
            _mlp, noise_multiplier=1.1, max_grad_norm=0.5, batch_size=8, grad_sample_mode=m, seed=7, device="cuda"
        ).train_round(weights, (x, y), RecordDict())
        for m in ("fused", "hooks")
    }
    assert out["fused"].event == out["hooks"].event and out["fused"].steps == out["hooks"].steps
    for k, v in out["hooks"].state_dict.items():
        assert out["fused"].state_dict[k].device.type == "cpu"
        torch.testing.assert_close(out["fused"].state_dict[k], v, rtol=1e-4, atol=1e-5)
