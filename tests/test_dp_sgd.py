"""DP-SGD client trainer (client_mods.dp_sgd): accounting across rounds, clipping, noise, keys, errors.

Tolerances
* Ledger vs Opacus: both are RDP accountants of the same Sampled Gaussian events
  with the same Balle et al. 2020 conversion; they differ only in the grid of
  orders (dp-accounting adds 11 and 128..1024 and drops fractional orders whose
  series does not converge) and in the numerics of fractional orders. Measured
  gap: < 0.1 %; the tests allow 1 %. The ledger's reported ε (min of RDP and PLD)
  may be lower (PLD is 5-40 % tighter here), never higher than RDP.
* Noise: the sample std of d i.i.d. Gaussians has relative standard error
  1/sqrt(2d) (0.5 % for d = 20 000); the tests allow 5 standard errors (2.5 %),
  so a noise multiplier 10 % off (20 standard errors) fails.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.serverapp.strategy import FedAvg
from opacus.accountants.utils import get_noise_multiplier
from torch import nn

from client_mods.dp_sgd import (
    EPSILON_METRIC,
    ROUND_EPSILON_METRIC,
    STATE_KEY,
    DpSgdBudgetExhausted,
    DpSgdTrainer,
    choose_grad_sample_mode,
    combined_noise_multiplier,
    dp_sgd_event,
    dp_sgd_relation,
    dp_sgd_train_reply,
    DATASET_SIZE_LABEL,
    history_delta,
    load_history,
)
from flwr_dp_strategies.declarations import PRIVACY_RECORD, declare_release, read_declarations
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.strategy import AccountedFedAvg
from loopback import LoopbackGrid, run_round

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dp-sgd"
DELTA = 1e-5
RDP_TOLERANCE = 0.01


def mlp(features: int = 8, hidden: int = 6, classes: int = 3) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def toy_data(n: int = 64, features: int = 8, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=generator), torch.randint(0, classes, (n,), generator=generator)


def rebuilt(state: RecordDict) -> RecordDict:
    """A new RecordDict holding copies of ``state``'s records, as a rebuilt ClientApp would get."""
    return RecordDict({key: ConfigRecord(dict(record)) for key, record in state.config_records.items()})


def flat(state_dict: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([value.flatten() for value in state_dict.values()])


# ---------------------------------------------------------------------- (i) accounting across rounds
@pytest.mark.parametrize("grad_sample_mode", ["hooks", "ghost"])
def test_declared_events_compose_to_opacus_cumulative_epsilon(grad_sample_mode):
    x, y = toy_data()
    weights = mlp().state_dict()
    ledger, state = PrivacyLedger(DELTA), RecordDict()
    opacus_eps, round_only, ledger_eps = [], [], []
    for server_round in (1, 2, 3, 4):
        trainer = DpSgdTrainer(
            mlp,
            noise_multiplier=1.1,
            batch_size=16,
            local_epochs=1,
            grad_sample_mode=grad_sample_mode,
            seed=server_round,
        )  # rebuilt every round
        state = rebuilt(state)
        result = trainer.train_round(weights, (x, y), state)
        weights = result.state_dict
        reply = RecordDict()
        declare_release(reply, result.event, label="dp-sgd/opacus", neighboring_relation="add_or_remove_one")
        for declaration in read_declarations(reply):  # what the server reads
            ledger.record(
                declaration.event,
                server_round=server_round,
                client=7,
                label=declaration.label,
                neighboring_relation=declaration.neighboring_relation,
            )
        report = ledger.report(7)
        opacus_eps.append(result.epsilon)
        round_only.append(result.epsilon_round_only)
        ledger_eps.append(report.epsilon)
        assert report.epsilon_rdp == pytest.approx(result.epsilon, rel=RDP_TOLERANCE)
        assert report.epsilon <= result.epsilon * (1 + RDP_TOLERANCE)
        assert result.event == dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(0.25, dp_event.GaussianDpEvent(1.1)), 4
        )
        assert result.rounds == server_round and result.steps == 4 and result.sample_rate == 0.25
    assert all(b > a for a, b in zip(opacus_eps, opacus_eps[1:]))  # cumulative: grows with rounds
    assert all(b > a for a, b in zip(ledger_eps, ledger_eps[1:]))
    assert round_only == pytest.approx([opacus_eps[0]] * 4)  # what a fresh engine per round reports
    assert opacus_eps[-1] > 1.5 * round_only[-1]
    history, _ = load_history(state)
    assert history == [(1.1, 0.25, 16)]  # Opacus' own history, merged over the 4 rounds


def test_history_delta_splits_merged_entries():
    assert history_delta([], [(1.0, 0.1, 5)]) == [(1.0, 0.1, 5)]
    assert history_delta([(1.0, 0.1, 5)], [(1.0, 0.1, 9)]) == [(1.0, 0.1, 4)]
    assert history_delta([(1.0, 0.1, 5)], [(1.0, 0.1, 5), (2.0, 0.1, 3)]) == [(2.0, 0.1, 3)]
    with pytest.raises(RuntimeError):
        history_delta([(1.0, 0.1, 5)], [(1.5, 0.1, 9)])
    two = dp_sgd_event([(1.0, 0.1, 4), (2.0, 0.2, 3)])
    assert isinstance(two, dp_event.ComposedDpEvent) and len(two.events) == 2


# ---------------------------------------------------------------------- (ii) target epsilon
def test_target_epsilon_calibrated_once_for_the_planned_rounds():
    x, y = toy_data()
    target, planned = 3.0, 3
    weights, state, ledger = mlp().state_dict(), RecordDict(), PrivacyLedger(DELTA)
    zs = []
    for server_round in range(1, planned + 1):
        trainer = DpSgdTrainer(mlp, target_epsilon=target, planned_rounds=planned, batch_size=16, seed=1)
        state = rebuilt(state)
        result = trainer.train_round(weights, (x, y), state)
        weights = result.state_dict
        ledger.record(result.event, server_round=server_round, client=1)
        zs.append(result.noise_multiplier)
    assert len(set(zs)) == 1  # calibrated on the first round only
    with warnings.catch_warnings():  # the bisection passes through z where an edge order is optimal
        warnings.filterwarnings("ignore", message="Optimal order is the")
        per_round_z = get_noise_multiplier(
            target_epsilon=target, target_delta=DELTA, sample_rate=0.25, steps=4, accountant="rdp"
        )
    assert zs[0] > per_round_z * 1.2  # calibrating per round would spend the budget every round
    assert ledger.epsilon(1) <= target
    assert ledger.epsilon(1, method="rdp") == pytest.approx(target, rel=0.02)
    assert target - 0.011 <= result.epsilon <= target  # Opacus' bisection stops within 0.01 below
    trainer = DpSgdTrainer(mlp, target_epsilon=target, planned_rounds=planned, batch_size=16, seed=1)
    before = dict(state[STATE_KEY])
    with pytest.raises(DpSgdBudgetExhausted):
        trainer.train_round(weights, (x, y), state)
    assert dict(state[STATE_KEY]) == before  # nothing trained, nothing recorded
    other = DpSgdTrainer(mlp, target_epsilon=2 * target, planned_rounds=planned, batch_size=16)
    with pytest.raises(ValueError, match="target_epsilon"):
        other.train_round(weights, (x, y), state)


# ---------------------------------------------------------------------- (iii) per-sample clipping
def one_outlier_step(mode: str, clipping: str = "flat", max_grad_norm=0.5):
    """One DP-SGD step (q = 1, lr = 1, z tiny) on a single example whose gradient norm is ~1e4."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 4))
    x = torch.full((1, 16), 1e3)
    with torch.no_grad():
        y = model(x).argmin(dim=1)  # the least likely class: the loss gradient is far from zero
    loss = nn.functional.cross_entropy(model(x), y)
    grad_norm = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))]).norm()
    trainer = DpSgdTrainer(
        model,
        noise_multiplier=1e-6,
        lr=1.0,
        batch_size=1,
        max_grad_norm=max_grad_norm,
        clipping=clipping,
        grad_sample_mode=mode,
        seed=0,
    )
    result = trainer.train_round(model.state_dict(), (x, y))
    deltas = {k: result.state_dict[k] - v for k, v in model.state_dict().items()}
    return float(grad_norm), deltas


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")  # z = 1e-6: epsilon is huge
@pytest.mark.parametrize("mode", ["hooks", "ghost", "functorch"])
def test_each_example_contributes_at_most_the_clipping_norm(mode):
    grad_norm, deltas = one_outlier_step(mode)
    assert grad_norm > 1000 * 0.5  # without clipping the step would be this long
    step = float(flat(deltas).norm())
    assert step == pytest.approx(0.5, rel=1e-3)  # clipped to C = 0.5 (noise std 5e-7 per coordinate)


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")
def test_per_layer_clipping_bounds_each_parameter_tensor():
    bounds = [0.1, 0.02, 0.3, 0.04]
    grad_norm, deltas = one_outlier_step("hooks", clipping="per_layer", max_grad_norm=bounds)
    assert grad_norm > 1000
    norms = [float(d.norm()) for d in deltas.values()]
    assert norms == pytest.approx(bounds, rel=1e-3)
    # per-layer accounting: noise std z*||C|| on every tensor -> combined z* = z
    sigma = 1.3 * math.sqrt(sum(c * c for c in bounds))
    assert combined_noise_multiplier([sigma] * 4, bounds) == pytest.approx(1.3)
    assert combined_noise_multiplier([2.0, 2.0], [1.0, 1.0]) == pytest.approx(2 / math.sqrt(2))


# ---------------------------------------------------------------------- (iv) noise scale
@pytest.mark.parametrize("mode,physical", [("hooks", None), ("hooks", 16), ("ghost", None)])
def test_noise_std_is_z_times_c_over_batch_size(mode, physical):
    z, clip, batch = 1.3, 0.7, 64
    model = nn.Linear(200, 100, bias=False)
    nn.init.zeros_(model.weight)
    x, y = torch.zeros(batch, 200), torch.zeros(batch, dtype=torch.long)  # zero input: zero gradient
    trainer = DpSgdTrainer(
        model,
        noise_multiplier=z,
        lr=1.0,
        batch_size=batch,
        max_grad_norm=clip,
        max_physical_batch_size=physical,
        grad_sample_mode=mode,
        seed=11,
    )
    result = trainer.train_round(model.state_dict(), (x, y))
    assert result.steps == 1 and result.sample_rate == 1.0
    step = result.state_dict["weight"].flatten().double()
    d = step.numel()
    expected = z * clip / batch  # noise N(0, (zC)^2) on the sum, divided by the expected batch size
    tolerance = 5 / math.sqrt(2 * d)
    assert abs(float(step.std()) / expected - 1) < tolerance
    assert abs(float(step.std()) / (1.1 * expected) - 1) > tolerance  # a z 10 % off would be caught
    assert abs(float(step.mean())) < 5 * expected / math.sqrt(d)


def test_randomness_from_os_entropy_unless_seeded():
    x, y = toy_data()
    model = mlp()
    runs = {
        seed: [
            flat(
                DpSgdTrainer(model, noise_multiplier=1.0, batch_size=16, seed=seed)
                .train_round(model.state_dict(), (x, y))
                .state_dict
            )
            for _ in range(2)
        ]
        for seed in (None, 5)
    }
    assert not torch.equal(runs[None][0], runs[None][1])
    assert torch.equal(runs[5][0], runs[5][1])


# ---------------------------------------------------------------------- (v) keys, hooks, rounds
@pytest.mark.parametrize("mode", ["hooks", "ghost", "fused"])
def test_keys_unchanged_and_consecutive_rounds_reuse_the_model(mode):
    model = mlp()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = DpSgdTrainer(model, noise_multiplier=1.0, batch_size=16, grad_sample_mode=mode, seed=2)
    x, y = toy_data()
    weights = model.state_dict()
    for _ in range(2):  # #608: a second round must not wrap an already wrapped module
        result = trainer.train_round(ArrayRecord(weights), (x, y))
        assert list(result.state_dict) == list(model.state_dict())  # no "_module." prefix (#435)
        assert not torch.equal(flat(result.state_dict), flat(weights))
        weights = result.state_dict
    assert trainer.epsilon() == pytest.approx(result.epsilon)
    assert all(torch.equal(original[k], v) for k, v in model.state_dict().items())  # template untouched
    assert not model._forward_hooks and not any(hasattr(p, "grad_sample") for p in model.parameters())
    prefixed = {f"_module.{k}": v for k, v in weights.items()}
    with pytest.raises(ValueError, match="weights must have exactly the model's keys"):
        trainer.train_round(prefixed, (x, y))


def cached_and_fresh_rounds(make_trainer, rounds: int, data, key) -> tuple[list, list, RecordDict, RecordDict]:
    """The same seeded rounds with the wrapped model kept under ``key`` and wrapped anew."""
    runs, states = ([], []), (RecordDict(), RecordDict())
    weights = mlp().state_dict()
    for r in range(rounds):
        for run, state, cache_key in zip(runs, states, (key, None)):
            run.append(make_trainer(r).train_round(ArrayRecord(weights), data, state, cache_key=cache_key))
        weights = runs[1][-1].state_dict
    return runs[0], runs[1], states[0], states[1]


@pytest.mark.parametrize("mode", ["hooks", "ghost", "fused"])
def test_kept_wrapped_model_gives_the_uncached_rounds(mode):
    """Same seeds: the same weights, the same declared events, the same epsilon, the same state (issue 27.4)."""
    from client_mods.dp_sgd_trainer import _WRAPPED, clear_wrapped_cache

    clear_wrapped_cache()
    make = lambda r: DpSgdTrainer(
        mlp,
        noise_multiplier=1.0,
        batch_size=16,
        momentum=0.5,  # noqa: E731
        grad_sample_mode=mode,
        seed=3,
    )
    cached, fresh, cached_state, fresh_state = cached_and_fresh_rounds(make, 3, toy_data(48), "client-1")
    assert len(_WRAPPED) == 1
    module = next(iter(_WRAPPED.values())).module
    ledgers = (
        PrivacyLedger(DELTA, neighboring_relation="add_or_remove_one"),
        PrivacyLedger(DELTA, neighboring_relation="add_or_remove_one"),
    )
    for r, (a, b) in enumerate(zip(cached, fresh), start=1):
        assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in b.state_dict)
        assert a.event == b.event and a.epsilon == b.epsilon and a.epsilon_round_only == b.epsilon_round_only
        for ledger, result in zip(ledgers, (a, b)):
            ledger.record(
                result.event, server_round=r, client=1, label="dp-sgd", neighboring_relation=result.neighboring_relation
            )
        assert ledgers[0].epsilon() == ledgers[1].epsilon()
        assert next(iter(_WRAPPED.values())).module is module  # wrapped once, kept
    assert dict(cached_state[STATE_KEY]) == dict(fresh_state[STATE_KEY])
    clear_wrapped_cache()


@pytest.mark.parametrize(
    "change",
    [
        {"lr": 0.05},
        {"noise_multiplier": 2.0},
        {"max_grad_norm": 0.3},
        {"batch_size": 8},
        {"momentum": 0.9},
        {"model": lambda: mlp(hidden=7)},
        {"criterion": nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0]))},
        {"optimizer_fn": lambda params: torch.optim.Adam(params, lr=0.01)},
        {"grad_sample_mode": "ghost"},
        {"grad_sample_mode": "fused"},
        ("fused", {"grad_sample_mode": "hooks"}),
        ("fused", {"noise_multiplier": 2.0}),
        ("fused", {"model": lambda: mlp(hidden=7)}),
        ("fused", {"optimizer_fn": lambda params: torch.optim.Adam(params, lr=0.01)}),
    ],
)
def test_kept_wrapped_model_is_rebuilt_when_the_trainer_changes(change):
    """A round after a change of model or hyper-parameters is the uncached round with the new settings (the kept
    Opacus-wrapped model, or the kept fused step when the first mode is "fused")."""
    from client_mods.dp_sgd_trainer import clear_wrapped_cache

    clear_wrapped_cache()
    first_mode, change = change if isinstance(change, tuple) else ("hooks", change)
    base = {"model": mlp, "noise_multiplier": 1.0, "batch_size": 16, "grad_sample_mode": first_mode, "seed": 4}

    def make(r):
        kwargs = {**base, **(change if r else {})}
        return DpSgdTrainer(kwargs.pop("model"), **kwargs)

    hidden = 7 if "model" in change else 6
    runs, states = ([], []), (RecordDict(), RecordDict())
    for r in range(2):
        weights = mlp(hidden=hidden if r else 6).state_dict()
        for run, state, key in zip(runs, states, ("client-2", None)):
            run.append(make(r).train_round(ArrayRecord(weights), toy_data(48), state, cache_key=key))
    (cached, fresh) = (runs[0][-1], runs[1][-1])
    assert all(torch.equal(cached.state_dict[k], fresh.state_dict[k]) for k in fresh.state_dict)
    assert cached.event == fresh.event and cached.epsilon == fresh.epsilon
    clear_wrapped_cache()


def test_kept_wrapped_model_takes_the_accountant_history_from_the_state():
    """The cached engine never carries a history of its own: a new state starts at round 1."""
    from client_mods.dp_sgd_trainer import clear_wrapped_cache

    clear_wrapped_cache()
    trainer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=16, seed=5)
    weights, data = ArrayRecord(mlp().state_dict()), toy_data(48)
    first = trainer.train_round(weights, data, RecordDict(), cache_key="client-3")
    state = RecordDict()
    for _ in range(2):
        second = trainer.train_round(weights, data, state, cache_key="client-3")
    restarted = trainer.train_round(weights, data, RecordDict(), cache_key="client-3")
    assert second.epsilon > first.epsilon
    assert restarted.epsilon == first.epsilon and restarted.event == first.event
    clear_wrapped_cache()


def test_kept_wrapped_models_are_bounded(monkeypatch):
    from client_mods import dp_sgd_trainer
    from client_mods.dp_sgd_trainer import _WRAPPED, clear_wrapped_cache

    clear_wrapped_cache()
    monkeypatch.setattr(dp_sgd_trainer, "CACHE_MAX_CLIENTS", 2)
    trainer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=16, seed=6)
    weights, data = ArrayRecord(mlp().state_dict()), toy_data(32)
    for key in ("a", "b", "a", "c"):
        trainer.train_round(weights, data, RecordDict(), cache_key=key)
    assert list(_WRAPPED) == [("a", STATE_KEY), ("c", STATE_KEY)]  # b was the least recently used
    monkeypatch.setattr(dp_sgd_trainer, "CACHE_MAX_BYTES", 100)  # less than one client's parameters
    trainer.train_round(weights, data, RecordDict(), cache_key="d")
    assert ("d", STATE_KEY) not in _WRAPPED and len(_WRAPPED) <= 2
    clear_wrapped_cache()


def test_grad_sample_mode_default_rule():
    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    assert choose_grad_sample_mode(mlp()) == "ghost"
    assert choose_grad_sample_mode(conv) == "hooks"
    assert choose_grad_sample_mode(mlp(), clipping="per_layer") == "hooks"
    assert DpSgdTrainer(mlp, noise_multiplier=1.0, clipping="per_layer").grad_sample_mode == "hooks"


# ---------------------------------------------------------------------- (vi) errors
@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({}, "noise_multiplier"),
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": 1.0, "target_epsilon": 2.0}, "noise_multiplier and target_epsilon"),
        ({"target_epsilon": 2.0}, "planned_rounds"),
        ({"target_epsilon": -2.0, "planned_rounds": 3}, "target_epsilon"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 0.0}, "max_grad_norm"),
        ({"noise_multiplier": 1.0, "max_grad_norm": [1.0, 1.0]}, "max_grad_norm"),
        ({"noise_multiplier": 1.0, "clipping": "per_layer", "max_grad_norm": [1.0, 1.0, 1.0]}, "max_grad_norm"),
        (
            {"noise_multiplier": 1.0, "clipping": "per_layer", "max_grad_norm": [1.0, 1.0, -1.0, 1.0]},
            r"max_grad_norm\[2\]",
        ),
        ({"noise_multiplier": 1.0, "clipping": "adaptive"}, "clipping"),
        ({"noise_multiplier": 1.0, "grad_sample_mode": "ew"}, "grad_sample_mode"),
        ({"noise_multiplier": 1.0, "clipping": "per_layer", "grad_sample_mode": "ghost"}, "grad_sample_mode"),
        ({"noise_multiplier": 1.0, "batch_size": 0}, "batch_size"),
        ({"noise_multiplier": 1.0, "max_physical_batch_size": 0}, "max_physical_batch_size"),
        ({"noise_multiplier": 1.0, "local_epochs": 0}, "local_epochs"),
        ({"noise_multiplier": 1.0, "target_delta": 1.0}, "target_delta"),
        ({"noise_multiplier": 1.0, "lr": 0.0}, "lr"),
        ({"noise_multiplier": 1.0, "momentum": 1.0}, "momentum"),
        ({"noise_multiplier": 1.0, "accountant": "gdp"}, "accountant"),
        ({"noise_multiplier": 1.0, "seed": -1}, "seed"),
        ({"noise_multiplier": 1.0, "device": "tpu:7"}, "device"),
        ({"noise_multiplier": 1.0, "criterion": nn.CrossEntropyLoss(reduction="sum")}, "reduction"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DpSgdTrainer(mlp, **kwargs)


def test_bad_model_and_data_raise_value_error():
    with pytest.raises(ValueError, match="ModuleValidator.fix"):
        DpSgdTrainer(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), noise_multiplier=1.0)
    with pytest.raises(ValueError, match="model"):
        DpSgdTrainer("not a model", noise_multiplier=1.0)  # type: ignore[arg-type]
    trainer = DpSgdTrainer(mlp, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="dataset"):
        trainer.train_round(mlp().state_dict(), (torch.zeros(0, 8), torch.zeros(0, dtype=torch.long)))
    with pytest.raises(ValueError, match="same length"):
        trainer.train_round(mlp().state_dict(), (torch.zeros(3, 8), torch.zeros(2, dtype=torch.long)))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            DpSgdTrainer(mlp, noise_multiplier=1.0, device="cuda")
    with pytest.raises(ValueError, match="seed"):
        DpSgdTrainer(mlp, noise_multiplier=1.0, secure_mode=True, seed=3)
    if importlib.util.find_spec("torchcsprng") is None:
        with pytest.raises(ImportError, match="torchcsprng"):
            DpSgdTrainer(mlp, noise_multiplier=1.0, secure_mode=True)
    with pytest.warns(UserWarning, match="heuristic"):
        DpSgdTrainer(mlp, noise_multiplier=1.0, poisson_sampling=False)


# ---------------------------------------------------------------------- (vii) CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_round_on_cuda():
    x, y = toy_data()
    trainer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=16, seed=4)
    assert trainer.device.type == "cuda"  # device=None picks CUDA when available
    result = trainer.train_round(mlp().state_dict(), (x, y))
    assert all(v.device.type == "cpu" for v in result.state_dict.values())
    assert result.epsilon > 0 and torch.isfinite(flat(result.state_dict)).all()


# ---------------------------------------------------------------------- Flower glue, in process
def test_train_reply_is_accounted_by_accounted_fedavg(task_identity):
    nodes = [11, 12]
    data = {node: toy_data(n=48 + 16 * i, seed=i) for i, node in enumerate(nodes)}
    strategy = AccountedFedAvg(
        min_train_nodes=2,
        min_available_nodes=2,
        fraction_evaluate=0.0,
        ledger=PrivacyLedger(DELTA),
        per_client_metrics=True,
    )
    arrays = ArrayRecord(mlp().state_dict())
    keys = list(arrays.keys())

    def client(msg, context):  # each node keeps its Context (and its accountant's state) across rounds
        node = int(context.node_id)
        trainer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=16, sample_rate=0.25, seed=node)
        reply = dp_sgd_train_reply(msg, context, trainer, data[node], num_threads=None)
        assert list(reply.content["arrays"].keys()) == keys
        assert PRIVACY_RECORD in reply.content
        assert set(reply.content["metrics"]) >= {"num-examples", EPSILON_METRIC, ROUND_EPSILON_METRIC}
        return reply

    grid = LoopbackGrid(client, nodes)
    for server_round in (1, 2):
        _, replies, (arrays, metrics) = run_round(strategy, grid, arrays, server_round)
        assert len(replies) == 2 and not grid.errors, grid.errors
        assert arrays is not None and strategy.rejections["train"]["declaration"] == 0.0
    opacus = {r.metadata.src_node_id: float(r.content["metrics"][EPSILON_METRIC]) for r in replies}
    for node in nodes:
        assert float(metrics[f"privacy/epsilon/node-{node}"]) <= opacus[node] * (1 + RDP_TOLERANCE)
        assert strategy.ledger.epsilon(node, method="rdp") == pytest.approx(opacus[node], rel=RDP_TOLERANCE)
    assert float(metrics["privacy/epsilon"]) == pytest.approx(strategy.ledger.epsilon())
    assert isinstance(strategy, FedAvg)


def test_train_reply_sends_a_public_weight_not_the_dataset_size(task_identity):
    """The exact num-examples is a count of the client's records: un-noised, it must not leave the client."""
    arrays = ArrayRecord(mlp().state_dict())
    (msg,) = FedAvg(min_train_nodes=1, min_available_nodes=1).configure_train(
        1, arrays, ConfigRecord(), LoopbackGrid(None, [11])
    )
    sent = []
    for n in (32, 33, 48):  # ceil(n/16) = 2, 3, 3 batches: Opacus' q and steps would differ; the public ones do not
        context = Context(run_id=1, node_id=11, node_config={}, state=RecordDict(), run_config={})
        trainer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=16, sample_rate=1 / 3, seed=1)
        reply = dp_sgd_train_reply(msg, context, trainer, toy_data(n=n), num_threads=None)
        declared = read_declarations(reply.content)
        assert [type(d.event) for d in declared] == [dp_event.SelfComposedDpEvent]
        sent.append((dict(reply.content["metrics"]), declared[0].event))
    assert sent[0][0]["num-examples"] == 1.0
    assert sent[0] == sent[1] == sent[2]  # nothing in the metrics or the event tells 32, 33 or 48 records apart
    context = Context(run_id=1, node_id=11, node_config={}, state=RecordDict(), run_config={})
    trainer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=16, sample_rate=1 / 3, seed=1)
    reply = dp_sgd_train_reply(
        msg, context, trainer, toy_data(n=33), num_threads=None, release_metrics=True, weighted_by_key="n"
    )
    assert reply.content["metrics"]["n"] == 33 and "train-loss" in reply.content["metrics"]
    declared = read_declarations(reply.content)
    assert [type(d.event) for d in declared] == [dp_event.SelfComposedDpEvent, dp_event.NonPrivateDpEvent]
    assert declared[1].neighboring_relation == declared[0].neighboring_relation


@pytest.mark.filterwarnings("ignore:DpSgdTrainer without sample_rate")
def test_opacus_convention_reveals_the_dataset_size_and_the_reply_declares_it(task_identity):
    """Opacus' q = 1/ceil(N/B): 32 and 33 records (add one) give different events, so the reply books the size
    as non-private; a public sample_rate gives the same event for both and declares nothing else."""
    arrays = ArrayRecord(mlp().state_dict())
    (msg,) = FedAvg(min_train_nodes=1, min_available_nodes=1).configure_train(
        1, arrays, ConfigRecord(), LoopbackGrid(None, [11])
    )

    def declared(n: int, **kw) -> list:
        context = Context(run_id=1, node_id=11, node_config={}, state=RecordDict(), run_config={})
        trainer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=16, seed=1, **kw)
        return read_declarations(dp_sgd_train_reply(msg, context, trainer, toy_data(n=n), num_threads=None).content)

    small, large = declared(32), declared(33)
    assert small[0].event != large[0].event  # positive control: Opacus' event tells the neighbours apart
    for d in (small, large):
        assert [type(x.event) for x in d] == [dp_event.SelfComposedDpEvent, dp_event.NonPrivateDpEvent]
        assert d[1].label == DATASET_SIZE_LABEL and d[1].neighboring_relation == d[0].neighboring_relation
    public = [declared(n, sample_rate=0.4) for n in (32, 33)]
    assert public[0] == public[1] and len(public[0]) == 1
    # int(1/0.4) = 2 steps an epoch at the public rate, whatever N is
    assert public[0][0].event == dp_sgd_event([(1.0, 0.4, 2)], True)


@pytest.mark.parametrize(
    "mode,physical,cache_key",
    [
        ("hooks", None, None),
        ("hooks", 8, None),
        ("ghost", None, "c"),
        ("fused", None, None),
        ("fused", None, "c"),
    ],
)
def test_public_sample_rate_sets_q_steps_and_the_divisor(mode, physical, cache_key):
    """Every path books the public q and local_epochs * int(1/q) steps, and divides the noisy sum by the
    public batch_size: zero gradients leave noise of std z C / B (a divisor of N q, or z 10 % off, fails)."""
    z, clip, batch, n = 1.3, 0.7, 40, 64  # N q = 64: a divisor taken from the data would be 1.6x off
    model = nn.Linear(200, 100, bias=False)
    nn.init.zeros_(model.weight)
    x, y = torch.zeros(n, 200), torch.zeros(n, dtype=torch.long)  # zero input: zero gradient
    trainer = DpSgdTrainer(
        model,
        noise_multiplier=z,
        lr=1.0,
        batch_size=batch,
        max_grad_norm=clip,
        max_physical_batch_size=physical,
        grad_sample_mode=mode,
        sample_rate=1.0,
        seed=11,
    )
    for round_index in range(2 if cache_key else 1):  # the second round runs on the kept model
        state = RecordDict()
        result = trainer.train_round(model.state_dict(), (x, y), state, cache_key=cache_key)
        assert result.public_sampling and not result.reveals_dataset_size
        assert (result.sample_rate, result.steps) == (1.0, 1)
        assert result.event == dp_sgd_event([(z, 1.0, 1)], True)
        step = result.state_dict["weight"].flatten().double()
        d = step.numel()
        expected = z * clip / batch
        tolerance = 5 / math.sqrt(2 * d)
        assert abs(float(step.std()) / expected - 1) < tolerance, round_index
        assert abs(float(step.std()) / (1.1 * expected) - 1) > tolerance
    two = DpSgdTrainer(
        mlp,
        noise_multiplier=z,
        batch_size=8,
        sample_rate=0.3,
        local_epochs=2,
        seed=1,
        grad_sample_mode=mode,
        max_physical_batch_size=physical,
    )
    for n_records in (20, 21, 50):
        r = two.train_round(mlp().state_dict(), toy_data(n=n_records), RecordDict(), cache_key=cache_key)
        assert r.event == dp_sgd_event([(z, 0.3, 6)], True), n_records  # 2 epochs x int(1/0.3) = 3 steps


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"sample_rate": 0.0}, ValueError),
        ({"sample_rate": 1.5}, ValueError),
        ({"sample_rate": "0.1"}, TypeError),
        ({"sample_rate": True}, TypeError),
        ({"sample_rate": 0.1, "poisson_sampling": False}, ValueError),
    ],
)
def test_bad_sample_rate_is_refused_naming_it(kwargs, error):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error, match="sample_rate"):
            DpSgdTrainer(mlp, noise_multiplier=1.0, **kwargs)


# ---------------------------------------------------------------------- (viii) the example app
def test_example_pyproject_matches_code_defaults():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from dpsgd_app.config import DEFAULTS
    finally:
        sys.path.remove(str(EXAMPLE))
    with open(EXAMPLE / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert pyproject["tool"]["flwr"]["app"]["config"] == DEFAULTS
    assert pyproject["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "dpsgd_app.server_app:app",
        "clientapp": "dpsgd_app.client_app:app",
    }


@pytest.mark.integration
def test_example_two_rounds_three_clients(tmp_path):
    args = ["--rounds", "2", "--num-clients", "3", "--results-dir", str(tmp_path), "--client-cpus", "2"]
    code = "import sys, run_demo; run_demo.main(sys.argv[1:])"
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", RAY_DISABLE_USAGE_STATS="1")
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.png").stat().st_size > 0
    rounds = results["rounds"]
    assert [row["round"] for row in rounds] == [1, 2]
    final = rounds[-1]
    assert final["privacy_epsilon_metric"] == pytest.approx(final["epsilon_ledger"])
    assert final["epsilon_ledger"] == pytest.approx(results["privacy"]["epsilon"])
    assert final["epsilon_opacus_max"] == pytest.approx(max(final["epsilon_opacus_clients"]))
    assert len(final["epsilon_opacus_clients"]) == 3
    assert final["epsilon_ledger_rdp"] == pytest.approx(final["epsilon_opacus_max"], rel=RDP_TOLERANCE)
    assert final["epsilon_ledger"] <= final["epsilon_opacus_max"] * (1 + RDP_TOLERANCE)
    assert rounds[0]["epsilon_ledger"] < final["epsilon_ledger"]
    assert final["epsilon_flower_example"] == pytest.approx(rounds[0]["epsilon_flower_example"])
    assert final["epsilon_flower_example"] < final["epsilon_opacus_max"]
    assert final["accuracy"] > 0.2  # 10 classes: chance is 0.1
    assert len(results["privacy"]["per_client_epsilon"]) == 3
    assert np.isfinite(final["epsilon_ledger"])


def test_shuffled_batches_declare_no_amplification():
    """Audit: poisson_sampling=False declared PoissonSampled (booked 1.33 at z = 1, q = 0.01, 500 steps) where
    the sound unamplified bound is 11.48: five passes, each record in one step per pass."""
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(
        dp_sgd_event([(1.0, 0.01, 500)], poisson_sampling=False),
        server_round=1,
        client=1,
        neighboring_relation=dp_sgd_relation(False),
    )
    unamplified = PrivacyLedger(1e-5)
    unamplified.record(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.0), 5), server_round=1, client=1)
    poisson = PrivacyLedger(1e-5)
    poisson.record(dp_sgd_event([(1.0, 0.01, 500)]), server_round=1, client=1)
    assert poisson.epsilon() == pytest.approx(1.33, abs=0.01)
    assert unamplified.epsilon() == pytest.approx(11.48, abs=0.01)
    assert ledger.epsilon() >= unamplified.epsilon()  # replace-one: sensitivity 2C
    assert dp_sgd_event([(1.0, 0.01, 500)], poisson_sampling=False) == dp_event.SelfComposedDpEvent(
        dp_event.GaussianDpEvent(0.5), 5
    )
    with pytest.raises(ValueError, match="replace_one"):
        PrivacyLedger(1e-5).record(
            dp_sgd_event([(1.0, 0.01, 500)], False),
            server_round=1,
            client=1,
            neighboring_relation=dp_sgd_relation(False),
        )


def test_shuffled_trainer_round_declares_its_passes():
    x, y = toy_data(64)
    with pytest.warns(UserWarning, match="no amplification"):
        trainer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=16, local_epochs=2, poisson_sampling=False, seed=0)
    result = trainer.train_round(mlp().state_dict(), (x, y), RecordDict())
    assert result.neighboring_relation == "replace_one"
    assert result.event == dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(0.5), 2)


def test_declare_opacus_round_declares_the_engines_history_under_its_relation():
    """A client that runs Opacus itself declares its round in one call; an engine that never trained is refused."""
    from types import SimpleNamespace

    from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
    from flwr.app import RecordDict

    from client_mods import declare_opacus_round
    from flwr_dp_strategies.declarations import read_declarations

    engine = SimpleNamespace(accountant=SimpleNamespace(history=[(1.1, 0.05, 40)]))
    content = declare_opacus_round(RecordDict(), engine, public_sample_rate=True)
    (declaration,) = read_declarations(content)
    assert declaration.event == SelfComposedDpEvent(PoissonSampledDpEvent(0.05, GaussianDpEvent(1.1)), 40)
    assert declaration.neighboring_relation == "add_or_remove_one"
    # Opacus' default q = 1/ceil(N/B) is a function of N: the size is declared non-private with it
    declaration, size = read_declarations(declare_opacus_round(RecordDict(), engine))
    assert declaration.event == SelfComposedDpEvent(PoissonSampledDpEvent(0.05, GaussianDpEvent(1.1)), 40)
    assert size.event == dp_event.NonPrivateDpEvent() and size.label == DATASET_SIZE_LABEL
    (shuffled,) = read_declarations(declare_opacus_round(RecordDict(), engine, poisson_sampling=False))
    assert shuffled.neighboring_relation == "replace_one"  # N is the same in both neighbours
    with pytest.raises(ValueError, match="privacy_engine"):
        declare_opacus_round(RecordDict(), SimpleNamespace(accountant=SimpleNamespace(history=[])))


# ---------------------------------------------------------------------- (vii) round cost (issue 27.4)
class _PerExample(torch.utils.data.Dataset):
    """The same examples as a TensorDataset, read one by one (the DataLoader path)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@pytest.mark.parametrize("n,batch", [(48, 16), (40, 3), (14, 32)])
def test_indexed_poisson_batches_are_opacus_dp_dataloader_batches(n, batch):
    """Same sampler, rate and generator draws as DPDataLoader: the same examples in every batch, empty ones
    included (q = 3/40 leaves some empty), over several epochs from one generator."""
    from opacus.data_loader import DPDataLoader
    from torch.utils.data import DataLoader, TensorDataset

    from client_mods.dp_sgd_trainer import _PoissonTensorBatches, _poisson_batches

    x, y = toy_data(n)
    loaders = [
        DataLoader(TensorDataset(x, y), batch_size=batch, generator=torch.Generator().manual_seed(9)) for _ in range(2)
    ]
    fast = _poisson_batches(loaders[0])
    assert isinstance(fast, _PoissonTensorBatches)
    slow = DPDataLoader.from_data_loader(loaders[1])
    assert len(fast) == len(slow)
    sizes = []
    for _ in range(3):
        for (fx, fy), (sx, sy) in zip(fast, slow, strict=True):
            assert fx.shape == sx.shape and fy.shape == sy.shape and fx.dtype == sx.dtype and fy.dtype == sy.dtype
            assert torch.equal(fx, sx) and torch.equal(fy, sy)
            sizes.append(len(fy))
    if batch == 3:
        assert 0 in sizes


@pytest.mark.parametrize("mode", ["hooks", "ghost", "fused"])
@pytest.mark.parametrize("cache_key", [None, "client-9"])
def test_round_on_indexed_batches_equals_the_dataloader_round(mode, cache_key):
    """A TensorDataset (indexed batches) and a per-example Dataset (Opacus' DPDataLoader) of the same
    examples give the same weights, event, ε and history, round after round."""
    from client_mods.dp_sgd_trainer import clear_wrapped_cache

    clear_wrapped_cache()
    x, y = toy_data(40)
    weights = ArrayRecord(mlp().state_dict())
    states = (RecordDict(), RecordDict())
    for _ in range(2):
        results = [
            DpSgdTrainer(
                mlp, noise_multiplier=1.0, batch_size=8, local_epochs=2, grad_sample_mode=mode, seed=13
            ).train_round(weights, data, state, cache_key=None if cache_key is None else (cache_key, i))
            for i, (data, state) in enumerate(zip(((x, y), _PerExample(x, y)), states))
        ]
        fast, slow = results
        assert all(torch.equal(fast.state_dict[k], slow.state_dict[k]) for k in slow.state_dict)
        assert fast.event == slow.event and fast.epsilon == slow.epsilon
        assert fast.epsilon_round_only == slow.epsilon_round_only and fast.train_loss == slow.train_loss
    assert load_history(states[0])[0] == load_history(states[1])[0] == [(1.0, 0.2, 20)]
    clear_wrapped_cache()


def test_auto_mode_keeps_per_sample_gradients_when_they_are_small():
    """Opacus' rule (:func:`choose_grad_sample_mode`, what "auto" picks where the fused step does not apply): hooks
    while batch x parameters <= 2**17 (ghost's second backward costs more), ghost above. "auto" picks "fused" for an
    all-Linear model with flat clipping; the declared event and ε are those of every explicit mode (the mechanism
    does not depend on it)."""
    from client_mods.dp_sgd_trainer import HOOKS_MAX_GRAD_SAMPLE_ELEMENTS

    params = sum(p.numel() for p in mlp().parameters())  # 75
    assert choose_grad_sample_mode(mlp(), batch_size=HOOKS_MAX_GRAD_SAMPLE_ELEMENTS // params) == "hooks"
    assert choose_grad_sample_mode(mlp(), batch_size=HOOKS_MAX_GRAD_SAMPLE_ELEMENTS // params + 1) == "ghost"
    assert choose_grad_sample_mode(mlp()) == "ghost"  # no batch size: the model alone decides
    big = lambda: nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))  # noqa: E731
    assert DpSgdTrainer(big, noise_multiplier=1.0, batch_size=8).grad_sample_mode == "fused"
    assert DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=32).grad_sample_mode == "fused"
    per_layer = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=32, clipping="per_layer")
    virtual = DpSgdTrainer(mlp, noise_multiplier=1.0, batch_size=32, max_physical_batch_size=8)
    assert per_layer.grad_sample_mode == virtual.grad_sample_mode == "hooks"  # Opacus' rule
    (x, y), weights = toy_data(48), mlp().state_dict()
    results = {
        mode: DpSgdTrainer(
            mlp, noise_multiplier=1.1, batch_size=16, local_epochs=2, grad_sample_mode=mode, seed=21
        ).train_round(weights, (x, y), RecordDict())
        for mode in ("auto", "hooks", "ghost")
    }
    assert results["auto"].grad_sample_mode == "fused"
    for mode in ("hooks", "ghost"):
        assert results[mode].event == results["auto"].event
        assert results[mode].epsilon == results["auto"].epsilon
        assert results[mode].steps == results["auto"].steps == 6
    assert all(
        torch.allclose(results["ghost"].state_dict[k], results["auto"].state_dict[k], atol=1e-5)
        for k in results["auto"].state_dict
    )  # same clipping and the same noise draws


def test_tuned_round_declares_what_the_round_before_27_4_declared():
    """Default trainer on an (x, y) pair (auto -> fused, indexed batches, kept) against the way the round
    ran before issue 27.4 (ghost, per-example DPDataLoader, wrapped anew): over three rounds the same events,
    cumulative and round-only ε, history and state, and the same weights up to float rounding."""
    from client_mods.dp_sgd_trainer import clear_wrapped_cache

    clear_wrapped_cache()
    x, y = toy_data(60)
    weights = ArrayRecord(mlp().state_dict())
    new_state, old_state = RecordDict(), RecordDict()
    for _ in range(3):
        new = DpSgdTrainer(mlp, noise_multiplier=0.9, batch_size=12, local_epochs=2, seed=17).train_round(
            weights, (x, y), new_state, cache_key="node-1"
        )
        old = DpSgdTrainer(
            mlp, noise_multiplier=0.9, batch_size=12, local_epochs=2, seed=17, grad_sample_mode="ghost"
        ).train_round(weights, _PerExample(x, y), old_state)
        assert (new.grad_sample_mode, old.grad_sample_mode) == ("fused", "ghost")
        assert new.event == old.event and new.neighboring_relation == old.neighboring_relation
        assert new.epsilon == old.epsilon and new.epsilon_round_only == old.epsilon_round_only
        assert (new.steps, new.sample_rate, new.noise_multiplier) == (old.steps, old.sample_rate, old.noise_multiplier)
        assert all(torch.allclose(new.state_dict[k], old.state_dict[k], atol=1e-5) for k in old.state_dict)
        weights = ArrayRecord(old.state_dict)
    assert dict(new_state[STATE_KEY]) == dict(old_state[STATE_KEY])
    assert load_history(new_state)[0] == [(0.9, 0.2, 30)]
    clear_wrapped_cache()
