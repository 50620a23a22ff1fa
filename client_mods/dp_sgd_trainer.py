r"""The DP-SGD trainer on Opacus: one Flower round of per-sample-clipped, noised SGD.

Its accounting (the event it returns, the history it keeps) is derived in
:mod:`client_mods.dp_sgd_accounting`; the Flower glue is :mod:`client_mods.dp_sgd`.

Virtual steps (``max_physical_batch_size``, Opacus' ``BatchMemoryManager``) split a
logical Poisson batch into physical batches; clipping is per sample and noise is
added once per logical batch, so the mechanism and its accounting are unchanged.

Target ε. With ``target_epsilon`` (instead of ``noise_multiplier``), z is
calibrated ONCE, on the client's first round, for the whole planned run of
``planned_rounds * local_epochs`` epochs -- the binary search of Opacus'
``make_private_with_epsilon`` (``opacus.accountants.utils.get_noise_multiplier``,
with the exact step count) -- and stored in the state; later rounds reuse it.
Calibrating per round, as calling ``make_private_with_epsilon`` every round
would, spends the whole budget in each round. A round that would push the
client's cumulative ε above ``target_epsilon`` raises
:class:`DpSgdBudgetExhausted` before anything is trained or sent.

Wrapped models kept between rounds. Where the ClientApp process lives on between
messages (Flower's simulation: one process serves many clients round after round),
``train_round(..., cache_key=k)`` keeps the client's Opacus-wrapped model, its
DP optimizer (and ghost-clipping loss) and its ``PrivacyEngine`` in a process-wide
cache, so a round costs the training steps, not ``make_private``. What is reused
is validated: the entry is rebuilt when anything it was built from differs (the
model's architecture, lr, momentum, ``optimizer_fn``, criterion, z, C, clipping,
``grad_sample_mode``, Poisson sampling, accountant, device, batch size and dataset
size, which fix q). Every round starts as a fresh one would: the received weights
are loaded, the optimizer's state is cleared, the noise and sampling generators
are seeded for the round, a new Poisson loader is built over the given data, and
the accountant's history is loaded from ``state`` (the client's true history, as
without the cache), so the release, its event and every ε are those of the
uncached round. The cache holds at most :data:`CACHE_MAX_CLIENTS` entries and
:data:`CACHE_MAX_BYTES` of parameters, gradients and optimizer state (estimated as
three copies of the parameters), least recently used out first; ``secure_mode``
is never cached. :func:`clear_wrapped_cache` empties it. With ``grad_sample_mode="fused"`` an entry holds the
plain model with its fused step (:class:`~client_mods.dp_sgd_fused.FusedLinearDpSgd`) and optimizer instead,
validated and reset the same way (the kept model's weights are copied in place of ``load_state_dict``).

Round cost. Poisson batches of a ``TensorDataset`` (what an ``(x, y)`` pair becomes) are read
by indexing the tensors with Opacus' own sampler and generator, the same draws and examples as
``DPDataLoader`` (:class:`_PoissonTensorBatches`); other datasets and virtual steps use
``DPDataLoader``. ``grad_sample_mode="auto"`` runs models made of ``nn.Linear``, ``nn.Conv2d``,
``nn.Embedding``, ``nn.LayerNorm`` and ``nn.GroupNorm`` layers (LoRA adapters of Linear layers included, and
parameter-free modules) with the fused step of :mod:`client_mods.dp_sgd_fused` (Opacus' per-step hooks and
per-parameter loops cost ~1 ms a step on the simulation's MLP, 3x a plain SGD step; the fused step ~1.5x), other models
with Opacus, keeping per-sample gradients (hooks) for small batch x model sizes
(:func:`choose_grad_sample_mode`). None of this changes the mechanism or its events.

See :mod:`client_mods.dp_sgd_accounting` for the references.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
import secrets
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Optional, Union, cast

import numpy as np
import torch
from dp_accounting import dp_event
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from . import dp_sgd_accounting  # noqa: F401  (first: it imports Opacus without its root log handler)
from opacus import PrivacyEngine
from opacus.accountants import create_accountant
from opacus.data_loader import DPDataLoader
from opacus.accountants.utils import get_noise_multiplier
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.utils.batch_memory_manager import BatchMemoryManager
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from flwr_dp_strategies.privacy.validation import check_delta, check_int, check_nonnegative, check_positive

from .dp_sgd_fused import FusedLinearDpSgd, fused_refusal
from .dp_sgd_accounting import (
    ACCOUNTANTS,
    STATE_KEY,
    History,
    combined_noise_multiplier,
    dp_sgd_event,
    dp_sgd_relation,
    history_delta,
    history_epsilon,
    history_record,
    load_history,
)
from .reply_metrics import PUBLIC_WEIGHT

EPSILON_METRIC = "dp-sgd/epsilon-opacus"
ROUND_EPSILON_METRIC = "dp-sgd/epsilon-round-only"
NOISE_METRIC = "dp-sgd/noise-multiplier"
DECLARATION_LABEL = "dp-sgd/opacus"
CLIPPING_MODES = ("flat", "per_layer")
GRAD_SAMPLE_MODES = ("auto", "hooks", "ghost", "functorch", "fused")  # "ew" fails on empty Poisson batches

ModelSource = Union[nn.Module, Callable[[], nn.Module]]
Weights = Union[ArrayRecord, Mapping[str, Any]]
DataSource = Union[Dataset, tuple[Any, Any]]

#: At most this many clients' wrapped models are kept in one process (least recently used out first).
CACHE_MAX_CLIENTS = 128
#: At most this many bytes of cached parameters, gradients and optimizer state (3 x the parameters' bytes).
CACHE_MAX_BYTES = 256 * 2**20
#: ``grad_sample_mode="auto"`` keeps per-sample gradients ("hooks") while batch size x trainable parameters
#: is at most this (128 Ki elements, 512 KiB of float32 per-sample gradients a step); above it, ghost clipping.
HOOKS_MAX_GRAD_SAMPLE_ELEMENTS = 2**17

# Warnings Opacus raises on every round that say nothing new here.
_QUIET = ("Secure RNG turned off", "Full backward hook is firing", "Using a non-full backward hook")


class DpSgdBudgetExhausted(RuntimeError):
    """A round would push the client's cumulative ε above ``target_epsilon``: nothing was trained or sent."""


@dataclass(frozen=True)
class DpSgdRound:
    """What one round of DP-SGD produced.

    Attributes:
        state_dict: the new weights (CPU tensors) under the global model's keys, in the received order.
        event: this round's release, ``SelfComposed(PoissonSampled(q, Gaussian(z)), steps)`` (Poisson
            batches) or ``SelfComposed(Gaussian(z/2), passes)`` (shuffled batches).
        neighboring_relation: the relation ``event`` is calibrated under (declare it with the event).
        epsilon: the client's cumulative ε over all its rounds (Opacus' accountant, at ``delta``).
        epsilon_round_only: ε of this round alone (what a fresh ``PrivacyEngine`` per round reports).
        delta: the δ of both ε values.
        noise_multiplier: z (for per-layer clipping the combined z*, equal to z).
        sample_rate: q of the Poisson sampling.
        steps: noisy steps taken in this round.
        num_examples: N, the size of the local dataset (local use: :meth:`metrics` does not send it).
        rounds: rounds this client has trained so far, this one included.
        train_loss: mean training loss of the round (local use only: it is not privatised).
        grad_sample_mode: the Opacus per-sample gradient mode used.
        public_sampling: True when q, ``steps`` and the divisor are public settings (the trainer's
            ``sample_rate``); False under Opacus' convention, where ``event`` reveals ceil(N/B).
    """

    state_dict: dict[str, torch.Tensor]
    event: dp_event.DpEvent
    epsilon: float
    epsilon_round_only: float
    delta: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    num_examples: int
    rounds: int
    train_loss: float
    grad_sample_mode: str
    neighboring_relation: str = "add_or_remove_one"
    public_sampling: bool = False

    @property
    def reveals_dataset_size(self) -> bool:
        """True when ``event`` is a function of N under the relation it is declared under: Poisson batches
        under Opacus' convention (add/remove-one changes N); a public ``sample_rate``, or shuffled batches
        (replace-one: N is the same in both neighbours), reveal nothing about it."""
        return not self.public_sampling and self.neighboring_relation == "add_or_remove_one"

    def metrics(self, weighted_by_key: str = "num-examples") -> dict[str, Union[int, float]]:
        """The reply's metrics: the public weight ``{weighted_by_key: 1.0}``, cumulative and round-only ε, z.

        Nothing here is data-dependent beyond the declared events: the ε values and z are functions of
        them, and the weight is public (the exact N is a count of the client's records, un-noised; it is
        not sent, so FedAvg's weighted mean is the plain mean of the clients' updates).
        """
        return {
            weighted_by_key: PUBLIC_WEIGHT,
            EPSILON_METRIC: float(self.epsilon),
            ROUND_EPSILON_METRIC: float(self.epsilon_round_only),
            NOISE_METRIC: float(self.noise_multiplier),
        }


@dataclass(frozen=True)
class _RoundPlan:
    """What a round needs before training: restored history, loader, z."""

    history: History
    rounds: int
    loader: DataLoader
    sample_rate: float
    z: float
    planned_steps: int
    noise_seed: int


@dataclass
class _Wrapped:
    """One client's Opacus objects kept between rounds, with what they were built from."""

    fingerprint: tuple
    sources: tuple  # the optimizer_fn and criterion objects (compared by identity; kept alive here)
    engine: Optional[PrivacyEngine]  # None for grad_sample_mode="fused" (optimizer: the fused kernel)
    module: nn.Module
    optimizer: Any
    criterion: Callable
    nbytes: int
    copy_in_place: bool = False  # the fused step's kept model loads weights by copying (see DpSgdTrainer._load)


_WRAPPED: "OrderedDict[Hashable, _Wrapped]" = OrderedDict()


def clear_wrapped_cache() -> None:
    """Forget every client's cached wrapped model (the next rounds wrap anew)."""
    _WRAPPED.clear()


def _keep_wrapped(key: Hashable, entry: _Wrapped) -> None:
    """Store ``entry`` as the most recent one; evict the least recent beyond the bounds."""
    _WRAPPED[key] = entry
    _WRAPPED.move_to_end(key)
    while len(_WRAPPED) > CACHE_MAX_CLIENTS or (
        len(_WRAPPED) > 1 and sum(e.nbytes for e in _WRAPPED.values()) > CACHE_MAX_BYTES
    ):
        _WRAPPED.popitem(last=False)
    if entry.nbytes > CACHE_MAX_BYTES:
        _WRAPPED.pop(key, None)


def _architecture(model: nn.Module) -> tuple:
    """Every submodule's path, class and settings, and every state entry's shape, dtype and trainability."""
    layers = tuple(
        (name, f"{type(m).__module__}.{type(m).__qualname__}", m.extra_repr()) for name, m in model.named_modules()
    )
    state = tuple(
        (k, tuple(v.shape), str(v.dtype), bool(v.requires_grad)) for k, v in model.state_dict(keep_vars=True).items()
    )
    return layers, state


def _criterion_key(criterion: Callable) -> tuple:
    """A loss module by class, settings and buffers (e.g. class weights); another callable by identity."""
    if not isinstance(criterion, nn.Module):
        return ("callable",)
    buffers = tuple((k, tuple(v.shape), v.detach().cpu().numpy().tobytes()) for k, v in criterion.state_dict().items())
    return (
        f"{type(criterion).__module__}.{type(criterion).__qualname__}",
        repr(criterion),
        getattr(criterion, "reduction", None),
        buffers,
    )


def _plain_state_loading(model: nn.Module) -> bool:
    """Every module loads its state with ``nn.Module``'s own code and no load hooks (a copy per tensor is then
    exactly what ``load_state_dict`` does)."""
    return all(
        type(m)._load_from_state_dict is nn.Module._load_from_state_dict
        and not m._load_state_dict_pre_hooks
        and not m._load_state_dict_post_hooks
        for m in model.modules()
    )


# ---------------------------------------------------------------------- model helpers
def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters Opacus clips, in its order (``requires_grad`` ones)."""
    return [p for p in model.parameters() if p.requires_grad]


def choose_grad_sample_mode(
    model: nn.Module, clipping: str = "flat", criterion: Optional[nn.Module] = None, batch_size: Optional[int] = None
) -> str:
    """Default rule for ``grad_sample_mode="auto"``.

    ``"ghost"`` (ghost clipping: per-sample gradient *norms* without materialising
    per-sample gradients) when the clipping is flat, the loss has a ``reduction``
    attribute (ghost needs per-sample losses), every layer that holds trainable
    parameters has an Opacus norm sampler (``nn.Linear``, ``nn.Embedding``) and the
    per-sample gradients would be large: on such models per-sample gradients cost
    12-59x a non-private step on CPU and ghost 3.5-4.3x (MLP 784-64-10,
    ``shared/reference/perf-floors.md``). ``"hooks"`` otherwise: with convolutions
    hooks is as fast as ghost or faster (2.2-2.5x vs 2.2-2.6x on a small CNN) and
    supports per-layer clipping; and when ``batch_size`` x trainable parameters is at
    most :data:`HOOKS_MAX_GRAD_SAMPLE_ELEMENTS`, where ghost's second backward pass
    costs more than the small per-sample gradients (one torch thread, ms a step,
    hooks / ghost: MLP 64-32-10 at B = 8, 32, 64: 0.79/0.95, 0.83/0.97, 0.93/1.06;
    at B = 256 (6.2e5 elements) 2.33/1.64; MLP 784-64-10 at B = 8 (4.1e5) 1.26/1.13).
    Both modes clip every per-sample gradient to the same C and add the same noise:
    the mechanism and its accounting do not depend on the mode.
    """
    if clipping != "flat" or (criterion is not None and not hasattr(criterion, "reduction")):
        return "hooks"
    layers = [m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    samplers = GradSampleModuleFastGradientClipping.NORM_SAMPLERS
    if not layers or not all(type(m) in samplers for m in layers):
        return "hooks"
    if (
        batch_size is not None
        and batch_size * sum(p.numel() for p in trainable_parameters(model)) <= HOOKS_MAX_GRAD_SAMPLE_ELEMENTS
    ):
        return "hooks"
    return "ghost"


class _PoissonTensorBatches:
    """Opacus' Poisson batches of a ``TensorDataset``, read by one index per batch.

    The same sampler (``UniformWithReplacementSampler``), rate and generator as the
    ``DPDataLoader`` that ``DPDataLoader.from_data_loader(loader)`` builds, drawing the same
    random numbers in the same order (the DataLoader iterator's base-seed draw first), so every
    batch holds the same examples; it indexes the tensors with the batch's indices instead of
    calling ``__getitem__`` per example and collating (an empty batch has shape ``(0, ...)``,
    as ``DPDataLoader``'s). Only sampling is touched: clipping, noise and accounting are Opacus'.
    """

    def __init__(self, dataset: TensorDataset, loader: DataLoader, sample_rate: Optional[float] = None) -> None:
        self.tensors = dataset.tensors
        self.generator = loader.generator
        self.sampler = UniformWithReplacementSampler(
            num_samples=len(dataset),
            sample_rate=1.0 / len(loader) if sample_rate is None else sample_rate,
            generator=loader.generator,
        )

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # DataLoader's _base_seed draw
        sampler = self.sampler
        for _ in range(sampler.steps):
            # UniformWithReplacementSampler.__iter__'s draw, kept as a tensor instead of a list of indices
            index = (torch.rand(sampler.num_samples, generator=self.generator) < sampler.sample_rate).nonzero().view(-1)
            yield tuple(t[index] for t in self.tensors)


def _poisson_batches(
    loader: DataLoader,
    dp_loader: Optional[DataLoader] = None,
    *,
    sample_rate: Optional[float] = None,
    virtual: bool = False,
) -> Union[DataLoader, _PoissonTensorBatches]:
    """The round's Poisson batches over ``loader``'s data: indexed from a plain ``TensorDataset`` with a
    seeded generator (see :class:`_PoissonTensorBatches`), else ``dp_loader`` (or
    ``DPDataLoader.from_data_loader(loader)``). ``sample_rate``: the public rate q (``int(1/q)`` batches an
    epoch, Opacus' ``DPDataLoader``) instead of Opacus' ``1/len(loader)``; ``virtual``: a ``DPDataLoader``
    always (what ``BatchMemoryManager`` splits)."""
    if sample_rate is not None:
        if type(loader.dataset) is TensorDataset and loader.generator is not None and not virtual:
            return _PoissonTensorBatches(loader.dataset, loader, sample_rate)
        return DPDataLoader(loader.dataset, sample_rate=sample_rate, generator=loader.generator)
    if type(loader.dataset) is TensorDataset and loader.generator is not None and not virtual:
        return _PoissonTensorBatches(loader.dataset, loader)
    return dp_loader if dp_loader is not None else DPDataLoader.from_data_loader(loader)


def as_dataset(data: DataSource) -> Dataset:
    """A torch Dataset of (input, target) pairs: a Dataset as is, or an ``(x, y)`` pair of arrays."""
    if isinstance(data, tuple) and len(data) == 2:
        x, y = (torch.as_tensor(np.asarray(v)) if not isinstance(v, torch.Tensor) else v for v in data)
        if len(x) != len(y):
            raise ValueError(f"dataset inputs and targets must have the same length, got {len(x)} and {len(y)}")
        data = TensorDataset(x, y)
    if not isinstance(data, Dataset) or not hasattr(data, "__len__"):
        raise ValueError("dataset must be a sized torch Dataset of (input, target) pairs or an (x, y) tuple")
    if len(cast(Sized, data)) < 1:
        raise ValueError("dataset must hold at least 1 example")
    return data


def _resolve_device(device: Union[None, str, torch.device]) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:<index>', got {device!r}") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but CUDA is not available")
    return resolved


def _round_seeds(seed: Optional[int], round_index: int) -> tuple[int, int]:
    """(sampling seed, noise seed): from OS entropy, or derived from ``seed`` and the round."""
    if seed is None:
        return secrets.randbits(63), secrets.randbits(63)
    a, b = np.random.SeedSequence([seed, round_index]).generate_state(2, dtype=np.uint32)
    return int(a), int(b)


@contextlib.contextmanager
def _quiet_opacus() -> Iterator[None]:
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=f".*{message}.*")
        yield


# ---------------------------------------------------------------------- the trainer
class DpSgdTrainer:
    """Per-round DP-SGD on Opacus with cumulative accounting across Flower rounds.

    Args:
        model: a module (deep-copied every round; the original is never wrapped)
            or a zero-argument factory returning a fresh module.
        lr, momentum: SGD settings (ignored when ``optimizer_fn`` is given).
        optimizer_fn: ``params -> torch.optim.Optimizer``; any optimizer is
            post-processing of the noisy gradients.
        criterion: loss with ``reduction="mean"`` (default ``nn.CrossEntropyLoss()``);
            copied every round.
        noise_multiplier: z in (0, inf); exactly one of it and ``target_epsilon``.
        target_epsilon: ε in (0, inf) to reach after ``planned_rounds`` rounds.
        target_delta: δ in (0, 1) of every reported ε (and of the calibration).
        planned_rounds: rounds this client will train (required with ``target_epsilon``).
        local_epochs: epochs per round (integer >= 1).
        max_grad_norm: C in (0, inf); with ``clipping="per_layer"`` one bound per
            trainable parameter tensor, or one number split as C/sqrt(M).
        batch_size: expected logical batch size B. Without ``sample_rate``, Opacus' convention: q = 1/ceil(N/B),
            ceil(N/B) steps an epoch, the noisy sum divided by int(N q) -- all functions of the dataset size N,
            which the declared event then reveals (see ``sample_rate``). With ``sample_rate``, the public divisor
            of the noisy gradient sum.
        sample_rate: the public Poisson rate q in (0, 1] (keyword; recommended for a ClientApp). Every record
            joins each batch with probability q, an epoch is ``int(1/q)`` steps (Opacus' ``DPDataLoader``), the
            noisy sum is divided by ``batch_size``: the event ``SelfComposed(PoissonSampled(q, Gaussian(z)),
            local_epochs * int(1/q))`` and the update's scale are functions of public settings only, so nothing
            about N leaves the client (Opacus' convention ties q, the step count and the divisor to N, and a
            neighbouring dataset one record larger can change ceil(N/B): the event then tells the two apart).
            Needs ``poisson_sampling=True``. None: Opacus' convention (see ``batch_size``);
            :func:`~client_mods.dp_sgd.dp_sgd_train_reply` then declares the size it reveals as non-private.
        max_physical_batch_size: split logical batches into physical ones of at most
            this size (virtual steps); None: no split.
        clipping: ``"flat"`` or ``"per_layer"``.
        grad_sample_mode: ``"auto"``, ``"fused"``, ``"hooks"``, ``"ghost"`` (flat clipping only) or
            ``"functorch"``. ``"fused"``: the package's DP-SGD step for models whose trainable parameters all
            sit in ``nn.Linear``, ``nn.Conv2d``, ``nn.Embedding``, ``nn.LayerNorm`` or ``nn.GroupNorm`` layers
            (:mod:`client_mods.dp_sgd_fused`: Opacus' clipping, noise, sampling and accountant, computed with
            closed-form / ghost per-sample norms and one backward pass; other layers are refused with a
            ``ValueError`` naming the module); it needs flat
            clipping, no virtual steps and no ``secure_mode``. ``"auto"`` picks ``"fused"`` where it applies,
            else Opacus' mode by :func:`choose_grad_sample_mode`.
        poisson_sampling: Poisson batches (True: required for the guarantee).
        secure_mode: Opacus' secure mode (needs ``torchcsprng``; no ``seed``).
        accountant: Opacus accountant for the reported ε: ``"rdp"`` or ``"prv"``.
        device: None (CUDA when available, else CPU), or a torch device.
        seed: None (OS entropy every round) or an int for reproducible tests.
    """

    def __init__(
        self,
        model: ModelSource,
        *,
        lr: float = 0.1,
        momentum: float = 0.0,
        optimizer_fn: Optional[Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]] = None,
        criterion: Optional[nn.Module] = None,
        noise_multiplier: Optional[float] = None,
        target_epsilon: Optional[float] = None,
        target_delta: float = 1e-5,
        planned_rounds: Optional[int] = None,
        local_epochs: int = 1,
        max_grad_norm: Union[float, Sequence[float]] = 1.0,
        batch_size: int = 32,
        max_physical_batch_size: Optional[int] = None,
        clipping: str = "flat",
        grad_sample_mode: str = "auto",
        poisson_sampling: bool = True,
        secure_mode: bool = False,
        accountant: str = "rdp",
        device: Union[None, str, torch.device] = None,
        seed: Optional[int] = None,
        sample_rate: Optional[float] = None,
    ) -> None:
        self._model_source = model
        probe = self._new_model()
        self.criterion = criterion if criterion is not None else nn.CrossEntropyLoss()
        self._check_criterion(self.criterion)
        self.lr = check_positive("lr", lr)
        self.momentum = self._check_momentum(momentum)
        self.optimizer_fn = optimizer_fn
        self.noise_multiplier, self.target_epsilon = self._check_privacy(noise_multiplier, target_epsilon)
        self.target_delta = check_delta(target_delta, "target_delta")
        self.planned_rounds = self._check_planned(planned_rounds)
        self.local_epochs = check_int("local_epochs", local_epochs, minimum=1)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.max_physical_batch_size = (
            None
            if max_physical_batch_size is None
            else check_int("max_physical_batch_size", max_physical_batch_size, minimum=1)
        )
        self.clipping = self._check_choice("clipping", clipping, CLIPPING_MODES)
        self.max_grad_norm = self._check_clip(max_grad_norm, probe)
        self.poisson_sampling = bool(poisson_sampling)
        self.sample_rate = self._check_sample_rate(sample_rate)
        self.secure_mode = self._check_secure(secure_mode, seed)
        self.grad_sample_mode = self._resolve_mode(grad_sample_mode, probe)
        self.accountant = self._check_choice("accountant", accountant, ACCOUNTANTS)
        self.device = _resolve_device(device)
        self.seed = None if seed is None else check_int("seed", seed, minimum=0)
        self._own_state = RecordDict()
        # the validated probe is a fresh, never-trained model: the first round loads into it instead of
        # building another (a trainer is often made per Flower message, where this halves the set-up)
        self._spare_model: Optional[nn.Module] = probe
        self._architecture = _architecture(probe)
        if not self.poisson_sampling:
            warnings.warn(
                "poisson_sampling=False: Opacus' epsilon assumes Poisson sampling (a heuristic for "
                "shuffled batches); the declared event claims no amplification (replace-one)",
                stacklevel=2,
            )

    # ------------------------------------------------------------------ validation
    def _new_model(self) -> nn.Module:
        source = self._model_source
        model = copy.deepcopy(source) if isinstance(source, nn.Module) else source() if callable(source) else None
        if not isinstance(model, nn.Module):
            raise ValueError("model must be a torch.nn.Module or a zero-argument callable returning one")
        errors = ModuleValidator.validate(model, strict=False)
        if errors:
            raise ValueError(
                f"model has layers Opacus cannot train privately ({errors}); "
                "fix it with opacus.validators.ModuleValidator.fix(model)"
            )
        if not trainable_parameters(model):
            raise ValueError("model must have at least one trainable parameter")
        return model

    @staticmethod
    def _check_criterion(criterion: nn.Module) -> None:
        if not callable(criterion):
            raise ValueError("criterion must be a callable loss such as nn.CrossEntropyLoss()")
        if getattr(criterion, "reduction", "mean") != "mean":
            raise ValueError(f"criterion.reduction must be 'mean', got {criterion.reduction!r}")

    def _check_sample_rate(self, sample_rate: Optional[float]) -> Optional[float]:
        if sample_rate is None:
            return None
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)):
            raise TypeError(f"sample_rate must be a number in (0, 1] or None, got {type(sample_rate).__name__}")
        q = float(sample_rate)
        if not 0.0 < q <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        if not self.poisson_sampling:
            raise ValueError("sample_rate is the rate of Poisson batches: it needs poisson_sampling=True")
        return q

    @property
    def public_sampling(self) -> bool:
        """True when q, the step count and the divisor are public settings (``sample_rate`` given)."""
        return self.sample_rate is not None

    @staticmethod
    def _check_momentum(momentum: float) -> float:
        value = check_nonnegative("momentum", momentum)
        if value >= 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        return value

    @staticmethod
    def _check_privacy(
        noise_multiplier: Optional[float], target_epsilon: Optional[float]
    ) -> tuple[Optional[float], Optional[float]]:
        if noise_multiplier is not None and target_epsilon is not None:
            raise ValueError("give exactly one of noise_multiplier and target_epsilon, not both")
        if target_epsilon is not None:
            return None, check_positive("target_epsilon", target_epsilon)
        if noise_multiplier is None:
            raise ValueError("noise_multiplier must be in (0, inf) (or give target_epsilon instead)")
        return check_positive("noise_multiplier", noise_multiplier), None

    def _check_planned(self, planned_rounds: Optional[int]) -> Optional[int]:
        if planned_rounds is None:
            if self.target_epsilon is not None:
                raise ValueError("planned_rounds must be an integer in [1, inf) when target_epsilon is given")
            return None
        return check_int("planned_rounds", planned_rounds, minimum=1)

    @staticmethod
    def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        return value

    def _check_clip(self, max_grad_norm: Union[float, Sequence[float]], probe: nn.Module) -> Union[float, list[float]]:
        count = len(trainable_parameters(probe))
        if self.clipping == "flat":
            if isinstance(max_grad_norm, (list, tuple, np.ndarray)):
                raise ValueError(
                    "max_grad_norm must be a number in (0, inf) for clipping='flat' "
                    "(a list is for clipping='per_layer')"
                )
            return check_positive("max_grad_norm", max_grad_norm)
        if not isinstance(max_grad_norm, (list, tuple, np.ndarray)):
            return [check_positive("max_grad_norm", max_grad_norm) / math.sqrt(count)] * count
        if len(max_grad_norm) != count:
            raise ValueError(
                f"max_grad_norm must hold one bound per trainable parameter tensor "
                f"({count} for this model), got {len(max_grad_norm)}"
            )
        return [check_positive(f"max_grad_norm[{i}]", c) for i, c in enumerate(max_grad_norm)]

    def _resolve_mode(self, mode: str, probe: nn.Module) -> str:
        self._check_choice("grad_sample_mode", mode, GRAD_SAMPLE_MODES)
        fused_ok = self.clipping == "flat" and not self.max_physical_batch_size and not self.secure_mode
        refusal = fused_refusal(probe) if mode in ("auto", "fused") else None
        if mode == "auto":
            if fused_ok and refusal is None:
                return "fused"
            return choose_grad_sample_mode(probe, self.clipping, self.criterion, self.batch_size)
        if mode == "fused" and not (fused_ok and refusal is None):
            raise ValueError(
                "grad_sample_mode='fused' needs clipping='flat', no max_physical_batch_size, no secure_mode and "
                "a model whose trainable parameters all sit in layers it clips (nn.Linear, nn.Conv2d, nn.Embedding, "
                "nn.LayerNorm, nn.GroupNorm)" + (f": {refusal}" if refusal else "") + " (use 'hooks' or 'ghost')"
            )
        if mode == "ghost" and self.clipping != "flat":
            raise ValueError("grad_sample_mode='ghost' supports only clipping='flat'")
        if mode == "ghost" and not hasattr(self.criterion, "reduction"):
            raise ValueError("grad_sample_mode='ghost' needs a criterion with a 'reduction' attribute")
        return mode

    @staticmethod
    def _check_secure(secure_mode: bool, seed: Optional[int]) -> bool:
        if not secure_mode:
            return False
        if seed is not None:
            raise ValueError("seed must be None when secure_mode=True (the CSPRNG cannot be seeded)")
        if importlib.util.find_spec("torchcsprng") is None:
            raise ImportError("secure_mode=True needs the torchcsprng package (pip install torchcsprng)")
        return True

    # ------------------------------------------------------------------ accounting
    def epsilon(
        self, state: Optional[RecordDict] = None, delta: Optional[float] = None, state_key: str = STATE_KEY
    ) -> float:
        """The client's cumulative ε (Opacus' accountant) stored in ``state`` at ``delta``."""
        history, _ = load_history(self._own_state if state is None else state, state_key)
        return history_epsilon(history, self.target_delta if delta is None else check_delta(delta), self.accountant)

    def _noise_for(
        self, record: Optional[ConfigRecord], history: History, sample_rate: float, round_steps: int
    ) -> tuple[float, int]:
        """(z, planned total steps): the given z, the stored calibration, or a new one (first round only)."""
        if self.target_epsilon is None:
            return float(cast(float, self.noise_multiplier)), 0  # set whenever target_epsilon is not
        if record is not None and float(record.get("target-epsilon", 0.0)) > 0:
            if float(record["target-epsilon"]) != self.target_epsilon:
                raise ValueError(
                    f"this state was calibrated for target_epsilon={record['target-epsilon']}, "
                    f"got target_epsilon={self.target_epsilon}; use a new state"
                )
            return float(record["noise-multiplier"]), int(record["planned-steps"])
        if history:
            raise ValueError(
                "target_epsilon needs a state without earlier releases (z is calibrated "
                "once for the whole run); use a new state"
            )
        planned = int(cast(int, self.planned_rounds)) * round_steps  # required with target_epsilon
        with warnings.catch_warnings():  # the bisection visits z far from the answer: edge orders there are fine
            warnings.filterwarnings("ignore", message="Optimal order is the")
            z = get_noise_multiplier(
                target_epsilon=self.target_epsilon,
                target_delta=self.target_delta,
                sample_rate=sample_rate,
                steps=planned,
                accountant=self.accountant,
            )
        return float(z), planned

    def _check_budget(self, history: History, z: float, sample_rate: float, round_steps: int) -> None:
        if self.target_epsilon is None:
            return
        planned = history + [(z, sample_rate, round_steps)]
        eps = history_epsilon(planned, self.target_delta, self.accountant)
        if eps > self.target_epsilon * (1 + 1e-9):
            spent = history_epsilon(history, self.target_delta, self.accountant)
            raise DpSgdBudgetExhausted(
                f"another round would reach epsilon={eps:.4g} > target_epsilon={self.target_epsilon:g} "
                f"at delta={self.target_delta:g} (spent: {spent:.4g})"
            )

    # ------------------------------------------------------------------ one round
    def train_round(
        self,
        weights: Weights,
        dataset: DataSource,
        state: Optional[RecordDict] = None,
        *,
        state_key: str = STATE_KEY,
        cache_key: Optional[Hashable] = None,
    ) -> DpSgdRound:
        """Load ``weights``, train ``local_epochs`` with DP-SGD, update the accountant in ``state``.

        ``state`` is the client's persistent RecordDict (``context.state`` in Flower;
        None: an in-memory one owned by this trainer); it is written only after a
        successful round. ``cache_key``: a key stable for the client in this process (e.g. its
        node id) to keep its wrapped model between rounds (see the module docstring; the
        round is the same as without it); None wraps anew. Raises ValueError for weights
        whose keys differ from the model's, :class:`DpSgdBudgetExhausted` when a target-ε
        budget is spent.
        """
        state = self._own_state if state is None else state
        data = as_dataset(dataset)
        plan = self._plan(data, state, state_key)
        if self.grad_sample_mode == "fused":
            fused_key = None if cache_key is None else (cache_key, state_key)
            model, keys, after, loss = self._train_fused(fused_key, weights, data, plan)
        elif cache_key is None or self.secure_mode:
            model, keys = self._load(weights)
            after, loss = self._train(model, plan.loader, plan.history, plan.z, plan.noise_seed)
        else:
            model, keys, after, loss = self._train_cached((cache_key, state_key), weights, len(data), plan)
        state[state_key] = history_record(
            after,
            accountant=self.accountant,
            rounds=plan.rounds + 1,
            noise_multiplier=plan.z,
            target_epsilon=self.target_epsilon or 0.0,
            planned_steps=plan.planned_steps,
        )
        added = history_delta(plan.history, after)
        new_weights = model.state_dict()
        return DpSgdRound(
            state_dict={k: new_weights[k].detach().to("cpu").clone() for k in keys},
            event=dp_sgd_event(added, self.poisson_sampling),
            neighboring_relation=dp_sgd_relation(self.poisson_sampling),
            epsilon=history_epsilon(after, self.target_delta, self.accountant),
            epsilon_round_only=history_epsilon(added, self.target_delta, self.accountant),
            delta=self.target_delta,
            noise_multiplier=plan.z,
            sample_rate=plan.sample_rate,
            steps=sum(s for _, _, s in added),
            num_examples=len(cast(Sized, data)),
            rounds=plan.rounds + 1,
            train_loss=loss,
            grad_sample_mode=self.grad_sample_mode,
            public_sampling=self.public_sampling,
        )

    def _plan(self, data: Dataset, state: RecordDict, state_key: str) -> "_RoundPlan":
        """Restore the accountant, build the round's loader, fix z, check the budget."""
        history, record = load_history(state, state_key)
        if record is not None and record.get("accountant", self.accountant) != self.accountant:
            raise ValueError(
                f"state was accounted with accountant={record['accountant']!r}, this trainer uses {self.accountant!r}"
            )
        rounds = int(record["rounds"]) if record is not None else 0
        sample_seed, noise_seed = _round_seeds(self.seed, rounds)
        loader = self._loader(data, sample_seed)
        if self.sample_rate is not None:  # public: q given, int(1/q) steps an epoch (Opacus' DPDataLoader)
            sample_rate, round_steps = self.sample_rate, self.local_epochs * int(1.0 / self.sample_rate)
        else:  # Opacus' q = 1/ceil(N/B) and T: functions of N
            sample_rate, round_steps = 1.0 / len(loader), self.local_epochs * len(loader)
        z, planned = self._noise_for(record, history, sample_rate, round_steps)
        self._check_budget(history, z, sample_rate, round_steps)
        return _RoundPlan(history, rounds, loader, sample_rate, z, planned, noise_seed)

    def _loader(self, data: Dataset, seed: int) -> DataLoader:
        generator = None if self.secure_mode else torch.Generator().manual_seed(seed)
        return DataLoader(data, batch_size=self.batch_size, shuffle=not self.poisson_sampling, generator=generator)

    def _load(
        self, weights: Weights, into: Optional[nn.Module] = None, *, copy_in_place: bool = False
    ) -> tuple[nn.Module, list[str]]:
        """A fresh model (or ``into``) holding ``weights`` (keys checked: a ``_module.`` prefix is refused),
        on the device. ``copy_in_place`` (``into`` already on the device, its modules loading state the default
        way: :func:`_plain_state_loading`): each received tensor is copied into the model's own, shapes checked,
        instead of ``load_state_dict``'s per-module walk -- the same values."""
        received = (
            weights.to_torch_state_dict()
            if isinstance(weights, ArrayRecord)
            else {
                k: torch.as_tensor(np.asarray(v)) if not isinstance(v, torch.Tensor) else v for k, v in weights.items()
            }
        )
        if into is None:
            model, self._spare_model = (self._spare_model or self._new_model()), None
        else:
            model = into
        own = model.state_dict(keep_vars=True)
        if received.keys() != own.keys():
            expected = set(own)
            missing, unexpected = sorted(expected - set(received)), sorted(set(received) - expected)
            raise ValueError(
                f"weights must have exactly the model's keys: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        if into is not None and copy_in_place:
            for k, v in received.items():
                if v.shape != own[k].shape:
                    raise ValueError(f"weights[{k!r}] has shape {tuple(v.shape)}, the model's {tuple(own[k].shape)}")
            with torch.no_grad():
                for k, v in received.items():
                    own[k].copy_(v)
            return model, list(received)
        model.load_state_dict(received, strict=True)
        return model.to(self.device), list(received)

    def _make_private(
        self, engine: PrivacyEngine, model: nn.Module, loader: DataLoader, z: float, noise_seed: int
    ) -> tuple[nn.Module, Any, Callable, DataLoader]:
        params = trainable_parameters(model)
        optimizer = (
            self.optimizer_fn(params)
            if self.optimizer_fn is not None
            else torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)
        )
        generator = None if self.secure_mode else torch.Generator(device=self.device).manual_seed(noise_seed)
        criterion = copy.deepcopy(self.criterion)
        out = engine.make_private(
            module=model,
            optimizer=optimizer,
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=z,
            max_grad_norm=self.max_grad_norm,
            poisson_sampling=self.poisson_sampling,
            clipping=self.clipping,
            grad_sample_mode=self.grad_sample_mode,
            noise_generator=generator,
        )
        if self.grad_sample_mode == "ghost":
            module, dp_optimizer, criterion, dp_loader = out
        else:
            module, dp_optimizer, dp_loader = out
        if self.sample_rate is not None:  # the public q in the accountant, the public B as the divisor
            dp_optimizer.expected_batch_size = self.batch_size
            dp_optimizer.attach_step_hook(engine.accountant.get_optimizer_hook_fn(sample_rate=self.sample_rate))
        return module, dp_optimizer, criterion, dp_loader

    def _train(
        self, model: nn.Module, loader: DataLoader, history: History, z: float, noise_seed: int
    ) -> tuple[History, float]:
        """Train in place with a fresh PrivacyEngine holding ``history``; return (new history, mean loss)."""
        with _quiet_opacus():
            engine = PrivacyEngine(accountant=self.accountant, secure_mode=self.secure_mode)
            if history:
                engine.accountant.load_state_dict({"history": list(history), "mechanism": self.accountant})
            module, optimizer, criterion, dp_loader = self._make_private(engine, model, loader, z, noise_seed)
            if self.sample_rate is not None:
                dp_loader = _poisson_batches(
                    loader, sample_rate=self.sample_rate, virtual=bool(self.max_physical_batch_size)
                )
            elif self.poisson_sampling and not self.max_physical_batch_size:
                dp_loader = _poisson_batches(loader, dp_loader)
            self._check_combined_z(optimizer, z)
            try:
                loss = _run_epochs(
                    module,
                    optimizer,
                    criterion,
                    dp_loader,
                    self.local_epochs,
                    self.device,
                    self.max_physical_batch_size,
                )
            finally:
                module.to_standard_module()  # removes hooks and per-sample state (#608, #433)
        return cast(History, [tuple(e) for e in engine.accountant.history]), loss

    def _fingerprint(self, num_examples: int, z: float) -> tuple:
        """What a cached wrapped model was built from (see the module docstring)."""
        clip = tuple(self.max_grad_norm) if isinstance(self.max_grad_norm, list) else self.max_grad_norm
        return (
            self._architecture,
            self.lr,
            self.momentum,
            _criterion_key(self.criterion),
            float(z),
            clip,
            self.clipping,
            self.grad_sample_mode,
            self.poisson_sampling,
            self.accountant,
            str(self.device),
            self.batch_size,
            int(num_examples),
            self.sample_rate,
        )

    def _train_cached(
        self, key: Hashable, weights: Weights, num_examples: int, plan: "_RoundPlan"
    ) -> tuple[nn.Module, list[str], History, float]:
        """The round of :meth:`_train` on the client's cached wrapped model (built on a miss), reset as new."""
        fingerprint = self._fingerprint(num_examples, plan.z)
        entry = _WRAPPED.pop(key, None)
        if entry is not None and (
            entry.fingerprint != fingerprint
            or entry.sources[0] is not self.optimizer_fn
            or (entry.sources[1] is not self.criterion and not isinstance(self.criterion, nn.Module))
        ):
            entry = None
        with _quiet_opacus():
            if entry is None:
                model, keys = self._load(weights)
                engine = PrivacyEngine(accountant=self.accountant)
                module, optimizer, criterion, loader = self._make_private(
                    engine, model, plan.loader, plan.z, plan.noise_seed
                )
                self._check_combined_z(optimizer, plan.z)
                if self.sample_rate is not None:
                    loader = _poisson_batches(
                        plan.loader, sample_rate=self.sample_rate, virtual=bool(self.max_physical_batch_size)
                    )
                elif self.poisson_sampling and not self.max_physical_batch_size:
                    loader = _poisson_batches(plan.loader, loader)
                nbytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
                entry = _Wrapped(
                    fingerprint, (self.optimizer_fn, self.criterion), engine, module, optimizer, criterion, nbytes
                )
            else:
                _, keys = self._load(weights, into=entry.module._module)
                entry.optimizer.state.clear()
                entry.optimizer.generator = torch.Generator(device=self.device).manual_seed(plan.noise_seed)
                loader = (
                    plan.loader
                    if not self.poisson_sampling
                    else _poisson_batches(
                        plan.loader, sample_rate=self.sample_rate, virtual=bool(self.max_physical_batch_size)
                    )
                    if self.sample_rate is not None
                    else DPDataLoader.from_data_loader(plan.loader)
                    if self.max_physical_batch_size
                    else _poisson_batches(plan.loader)
                )
            entry.engine.accountant.history = list(plan.history)  # the client's true history, from its state
            loss = _run_epochs(
                entry.module,
                entry.optimizer,
                entry.criterion,
                loader,
                self.local_epochs,
                self.device,
                self.max_physical_batch_size,
            )  # raises: the entry is not kept
            entry.optimizer.zero_grad(set_to_none=True)
        _keep_wrapped(key, entry)
        return entry.module._module, keys, [tuple(e) for e in entry.engine.accountant.history], loss

    def _train_fused(
        self, cache_key: Optional[Hashable], weights: Weights, data: Dataset, plan: "_RoundPlan"
    ) -> tuple[nn.Module, list[str], History, float]:
        """The round with :class:`~client_mods.dp_sgd_fused.FusedLinearDpSgd` (``grad_sample_mode="fused"``):
        Opacus' batches and accountant, the fused clip-sum-noise step; the kernel and its optimizer are kept
        like a wrapped model when ``cache_key`` is given (reset as new every round)."""
        key = cache_key
        fingerprint = self._fingerprint(len(data), plan.z)
        entry = _WRAPPED.pop(key, None) if key is not None else None
        if entry is not None and (
            entry.fingerprint != fingerprint
            or entry.sources[0] is not self.optimizer_fn
            or (entry.sources[1] is not self.criterion and not isinstance(self.criterion, nn.Module))
        ):
            if isinstance(entry.optimizer, FusedLinearDpSgd):
                entry.optimizer.close()
            entry = None
        if entry is None:
            model, keys = self._load(weights)
            params = trainable_parameters(model)
            optimizer = (
                self.optimizer_fn(params)
                if self.optimizer_fn is not None
                else torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)
            )
            criterion = copy.deepcopy(self.criterion)
            kernel = FusedLinearDpSgd(
                model, optimizer, criterion, noise_multiplier=plan.z, max_grad_norm=float(self.max_grad_norm)
            )
            nbytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
            entry = _Wrapped(
                fingerprint,
                (self.optimizer_fn, self.criterion),
                None,
                model,
                kernel,
                criterion,
                nbytes,
                copy_in_place=_plain_state_loading(model),
            )
            model.train()
        else:
            _, keys = self._load(weights, into=entry.module, copy_in_place=entry.copy_in_place)
            entry.optimizer.optimizer.state.clear()
            entry.optimizer.attach_grads()
        kernel = entry.optimizer
        batches = _poisson_batches(plan.loader, sample_rate=self.sample_rate) if self.poisson_sampling else plan.loader
        if self.sample_rate is not None:  # public q and divisor B
            sample_rate, expected_batch_size = self.sample_rate, float(self.batch_size)
        else:
            sample_rate = 1.0 / len(batches)  # Opacus' q: 1 / len(DP loader)
            expected_batch_size = int(len(cast(Sized, data)) * sample_rate)  # Opacus' make_private
        accountant = create_accountant(mechanism=self.accountant)
        accountant.history = list(plan.history)  # the client's true history, from its state
        generator = torch.Generator(device=self.device).manual_seed(plan.noise_seed)
        total, count = torch.zeros((), device=self.device), 0
        try:
            for _ in range(self.local_epochs):  # the kept model stays in training mode (set when built)
                for inputs, targets in batches:
                    loss = kernel.step(
                        inputs.to(self.device),
                        targets.to(self.device),
                        generator=generator,
                        expected_batch_size=expected_batch_size,
                        accountant=accountant,
                        sample_rate=sample_rate,
                    )
                    if loss is not None:
                        total += loss * len(targets)
                        count += len(targets)
        except BaseException:
            kernel.close()  # raises: the entry is not kept
            raise
        if key is None:
            kernel.close()
        else:
            _keep_wrapped(key, entry)
        history = cast(History, [tuple(e) for e in accountant.history])
        return entry.module, keys, history, float(total / count) if count else float("nan")

    def _check_combined_z(self, optimizer: Any, z: float) -> None:
        """Per-layer clipping: the combined z* of Opacus' optimizer must equal the accounted z."""
        if self.clipping != "per_layer":
            return
        clips = list(optimizer.max_grad_norms)
        sigma = float(optimizer.noise_multiplier) * float(optimizer.max_grad_norm)
        z_star = combined_noise_multiplier([sigma] * len(clips), clips)
        if not math.isclose(z_star, z, rel_tol=1e-6):
            raise RuntimeError(f"Opacus' per-layer noise gives z*={z_star}, not the accounted z={z}")


def _run_epochs(
    module: nn.Module,
    optimizer: Any,
    criterion: Callable,
    loader: DataLoader,
    epochs: int,
    device: torch.device,
    max_physical: Optional[int],
) -> float:
    """The DP-SGD loop; returns the mean loss over non-empty physical batches (nan if none)."""
    total, count = torch.zeros((), device=device), 0
    module.train()
    for _ in range(epochs):
        manager = (
            BatchMemoryManager(data_loader=loader, max_physical_batch_size=max_physical, optimizer=optimizer)
            if max_physical
            else contextlib.nullcontext(loader)
        )
        with manager as batches:
            for inputs, targets in batches:
                optimizer.zero_grad()
                loss = criterion(module(inputs.to(device)), targets.to(device))
                loss.backward()
                optimizer.step()
                if len(targets):
                    total += loss.detach() * len(targets)
                    count += len(targets)
    return float(total / count) if count else float("nan")


__all__ = [
    "CLIPPING_MODES",
    "DECLARATION_LABEL",
    "DataSource",
    "DpSgdBudgetExhausted",
    "DpSgdRound",
    "DpSgdTrainer",
    "EPSILON_METRIC",
    "GRAD_SAMPLE_MODES",
    "NOISE_METRIC",
    "ROUND_EPSILON_METRIC",
    "CACHE_MAX_BYTES",
    "CACHE_MAX_CLIENTS",
    "as_dataset",
    "choose_grad_sample_mode",
    "clear_wrapped_cache",
    "trainable_parameters",
]
