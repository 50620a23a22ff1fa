r"""The fused DP-SGD step for models whose trainable parameters sit in ``nn.Linear``, ``nn.Conv2d``,
``nn.Embedding``, ``nn.LayerNorm`` and ``nn.GroupNorm`` layers (LoRA adapters included: :class:`LoRALinear`).

``DpSgdTrainer(grad_sample_mode="fused")`` -- and ``"auto"`` wherever it applies (flat clipping, no
virtual steps, no ``secure_mode``, every module holding a trainable parameter one of :data:`FUSED_LAYERS`
with a supported configuration, :func:`fused_refusal`) -- runs each DP-SGD step with :class:`FusedDpSgd`
instead of Opacus' ``GradSampleModule`` + ``DPOptimizer``. Everything else stays Opacus': the Poisson
batches (Opacus' sampler), the accountant (Opacus' own, stepped once per step as its optimizer hook does),
the declared event.

Contract: the step computes exactly what Opacus' ``DPOptimizer`` computes with flat clipping and
``loss_reduction="mean"`` (the trainer's criterion), in the same order of operations where it matters:

1. per-sample gradients are those of the mean loss times the batch length :math:`n` (Opacus' "mean"
   convention). One forward pass records each layer's input :math:`a` and output :math:`z`; one backward
   pass (``autograd.grad`` with respect to the outputs only: no parameter gradient is formed) gives
   :math:`g = \partial L/\partial z`. The batch is the first dimension of every recorded input and output
   (Opacus' ``batch_first``; a layer seeing another layout is refused at the step);
2. per-sample norms :math:`\lVert G_i\rVert` over all trainable tensors, without materialising per-sample
   gradients wherever that is cheaper ("ghost norms", Goodfellow 2015; Li et al. 2022, "Large language
   models can be strong differentially private learners", ICLR 2022, sec. 4; Bu et al. 2023,
   "Differentially private optimization on large model at small cost", ICML 2023, book-keeping):

   * ``nn.Linear`` on 2-D inputs: :math:`\lVert g_i a_i^\top\rVert_F^2 = \lVert g_i\rVert^2\lVert a_i\rVert^2`,
     the bias's :math:`\lVert g_i\rVert^2`;
   * ``nn.Linear`` on inputs with T positions (sequences), and ``nn.Conv2d`` as a Linear over the
     :math:`T = H'W'` unfolded patches of its input (Rochette et al. 2019, "Efficient per-example gradient
     computations in convolutional neural networks"; per group when ``groups > 1``): the ghost norm
     :math:`\lVert G_i\rVert^2 = \langle A_i A_i^\top, B_i B_i^\top\rangle` (:math:`A_i`: T x d_in inputs,
     :math:`B_i`: T x d_out output gradients), cost :math:`T^2(d_{in}+d_{out})`, where
     :math:`T(d_{in}+d_{out}) < d_{in}d_{out}`, else the per-sample gradient :math:`B_i^\top A_i`
     (cost :math:`T d_{in} d_{out}`) -- Li et al.'s layer-wise choice; the bias's
     :math:`\lVert\sum_t B_{i,t}\rVert^2`. For a Conv2d the cheapest by multiply-adds of: the per-sample
     gradients in one weight-gradient convolution with the batch folded into the groups (Rochette et al.'s
     trick: no unfolded copy; early layers, many positions), the ghost norm over the unfolded patches
     (strided layers, few positions), or the ghost norm with :math:`A_iA_i^\top` summed from the padded
     input's pixel Gram matrix over the :math:`k_hk_w` kernel offsets (cost :math:`(H_pW_p)^2 C_{in}`
     instead of :math:`T^2 C_{in}k_hk_w`: stride-1 layers with many channels). On ResNet-18 (32x32, B = 32,
     one CPU thread) the norms of all convolutions cost about 0.3x a plain SGD step;
   * ``nn.Embedding``: the per-sample gradient's row :math:`v` is the sum of the output gradients at the
     positions holding index :math:`v`, so :math:`\lVert G_i\rVert^2 = \sum_{t,t'} [x_{i,t} = x_{i,t'}]
     \langle B_{i,t}, B_{i,t'}\rangle` (the index counts, without the vocabulary-sized gradient); positions
     holding ``padding_idx`` have no gradient (PyTorch's convention; Opacus' sampler gives them one, which
     only makes its norms larger);
   * ``nn.LayerNorm`` / ``nn.GroupNorm``: the per-sample gradients of weight and bias are the sums of
     :math:`g\odot\hat a` and :math:`g` over the positions (:math:`\hat a` the normalised input), cheap to
     materialise;

   a layer called several times in one forward pass has its per-sample gradient materialised and summed
   over the calls (the cross terms do not factor);
3. clip factors :math:`f_i = \min(1, C/(\lVert G_i\rVert + 10^{-6}))` (Opacus' formula);
4. the clipped sum per layer from the recorded activations and the rescaled output gradients
   :math:`g\odot f` (book-keeping, Bu et al. 2023: no second backward pass): one matmul for a Linear,
   PyTorch's convolution weight-gradient kernel for a Conv2d, an ``index_add`` for an Embedding, a
   weighted sum of the per-sample gradients for the norms; written into one flat gradient buffer whose
   slices are the parameters' ``.grad``;
5. Gaussian noise of std :math:`zC` drawn per trainable parameter tensor in Opacus' order and shape from
   the round's generator (the same draws as Opacus' ``add_noise`` with that generator), added to the sum;
   frozen parameters (``requires_grad=False``: a LoRA adapter's base layer) get neither gradient nor noise;
6. division by Opacus' expected batch size (:math:`\lfloor qN\rfloor` for Poisson batches, else B),
   then the wrapped optimizer's ``step`` (SGD, momentum, ``optimizer_fn``: post-processing);
7. one ``accountant.step(noise_multiplier=z, sample_rate=q)`` per step, empty batches included (an empty
   Poisson batch is a step of pure noise, as in Opacus).

So the release of every step is :math:`\sum_i \bar g_i + \mathcal N(0, z^2C^2 I)` over a Poisson batch
of rate :math:`q`, each :math:`\lVert\bar g_i\rVert \le C`: the Sampled Gaussian Mechanism declared by
the trainer, whatever the mode. ``tests/test_dp_sgd_fused.py`` checks it against Opacus' hooks mode: the
same clipped sum on a fixed batch (float tolerance) for every layer type, a GroupNorm ResNet and a
transformer block with a LoRA adapter, the same weights after a seeded round, a noise std of :math:`zC`
on the sum (a 10 % error fails), the same sampling rate, steps and booked event.

Why not Opacus' ghost clipping (``grad_sample_mode="ghost"``, ``GradSampleModuleFastGradientClipping``)?
It computes the same norms (for Linear, Conv2d via unfold, Embedding, the norms layers) but then runs a
second backward pass for the clipped sum, plus Opacus' per-step hooks and per-parameter loops; the
book-keeping step above reuses the one backward pass, and draws the noise in one flat buffer.

Not covered (the trainer keeps Opacus for them, and ``grad_sample_mode="fused"`` raises a ``ValueError``
naming the module): per-layer clipping, virtual steps, ``secure_mode``, any other module holding a
trainable parameter (``nn.MultiheadAttention``, whose projections are parameters of its own -- build
attention from ``nn.Linear`` layers --, RNNs, BatchNorm, a custom module's own ``nn.Parameter``),
``nn.Conv2d`` with a padding mode other than ``"zeros"`` or ``padding="same"``, ``nn.Embedding`` with
``max_norm`` or ``sparse=True``, tied parameters, mixed dtypes or devices. A layer output modified in
place (``nn.ReLU(inplace=True)``, ``out += x``) is detected on the first step and the outputs are then
copied before use.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

#: Opacus' per-sample clip factor is C / (norm + this) (``DPOptimizer.clip_and_accumulate``).
CLIP_EPS = 1e-6

#: The module types whose trainable parameters the fused step clips (exact types, not subclasses).
FUSED_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d, nn.Embedding, nn.LayerNorm, nn.GroupNorm)

_Views = tuple[Optional[torch.Tensor], Optional[torch.Tensor]]


def _conv_padding(m: nn.Conv2d) -> Optional[tuple[int, ...]]:
    if isinstance(m.padding, str):
        return (0, 0) if m.padding == "valid" else None
    return tuple(m.padding)


def _layer_refusal(name: str, m: nn.Module) -> Optional[str]:
    kind = type(m).__name__
    if type(m) not in FUSED_LAYERS:
        supported = ", ".join(t.__name__ for t in FUSED_LAYERS)
        return (
            f"module {name!r} ({kind}) holds trainable parameters and the fused step has no per-sample gradient "
            f"for it (supported: {supported}, exactly those types)"
        )
    if isinstance(m, nn.Conv2d) and (m.padding_mode != "zeros" or _conv_padding(m) is None):
        return f"module {name!r} ({kind}) uses padding={m.padding!r}, padding_mode={m.padding_mode!r}: unsupported"
    if isinstance(m, nn.Embedding) and (m.max_norm is not None or m.sparse):
        return f"module {name!r} ({kind}) uses max_norm or sparse gradients: unsupported"
    return None


def fused_refusal(model: nn.Module) -> Optional[str]:
    """None when :class:`FusedDpSgd` can run ``model``, else why not, naming the module: every module that
    holds a trainable parameter is one of :data:`FUSED_LAYERS` in a supported configuration (and there is
    one), no trainable parameter is held by two modules (tied weights), and all trainable parameters share
    one dtype and device."""
    holders = [
        (name or "<root>", m)
        for name, m in model.named_modules()
        if any(p.requires_grad for p in m.parameters(recurse=False))
    ]
    if not holders:
        return "the model has no trainable parameter"
    for name, m in holders:
        reason = _layer_refusal(name, m)
        if reason is not None:
            return reason
    owners: dict[int, str] = {}
    for name, m in holders:
        for p in m.parameters(recurse=False):
            if p.requires_grad and owners.setdefault(id(p), name) != name:
                return f"a trainable parameter is shared by modules {owners[id(p)]!r} and {name!r} (tied weights)"
    held = [p for _, m in holders for p in m.parameters(recurse=False) if p.requires_grad]
    if len({(p.dtype, p.device) for p in held}) != 1:
        return "the trainable parameters have several dtypes or devices"
    return None


def fused_eligible(model: nn.Module) -> bool:
    """:func:`fused_refusal` finds nothing: the fused step can run ``model``."""
    return fused_refusal(model) is None


class LoRALinear(nn.Module):
    r"""A LoRA-adapted Linear layer (Hu et al. 2022, "LoRA: low-rank adaptation of large language models"):
    :math:`y = \mathrm{base}(x) + \frac{\alpha}{r} B(A(x))` with ``base`` frozen (its parameters'
    ``requires_grad`` set False) and the adapters ``lora_A`` (d_in -> r) and ``lora_B`` (r -> d_out) plain
    bias-free ``nn.Linear`` layers (as in ``peft``), so the fused step clips them as Linear layers and
    leaves ``base`` without gradient or noise. ``lora_B`` starts at zero (the adapted layer is ``base``).
    Any adapter built from ``nn.Linear`` submodules is handled the same way."""

    def __init__(self, base: nn.Linear, rank: int, alpha: Optional[float] = None) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.base = base.requires_grad_(False)
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **factory)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **factory)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = float(alpha if alpha is not None else rank) / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


# ----------------------------------------------------------------------------------------------------------
# Per layer type: ``sq`` (per-sample squared norm of the trainable tensors' gradients of one call, and a cache
# for ``add``), ``per_sample`` (the per-sample gradients, (n, numel) each or None, for layers called several
# times) and ``add`` (Σ_i of the per-sample gradients rescaled by ``scale``, added into the views). ``g`` is the
# mean loss's gradient with respect to the layer's output; the batch is dimension 0 of ``a`` and ``g``.


def _sq(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(len(t), -1).square().sum(1)


def _total(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(len(t), -1).sum(1)


def _ghost_or_sample(a3: torch.Tensor, g3: torch.Tensor) -> torch.Tensor:
    """||B_i^T A_i||_F^2 per sample for A (..., T, d_in), B (..., T, d_out), summed over the middle dims: the
    ghost norm <A A^T, B B^T> where T (d_in + d_out) < d_in d_out (Li et al. 2022), else materialised."""
    t, d_in, d_out = a3.shape[-2], a3.shape[-1], g3.shape[-1]
    if t * (d_in + d_out) < d_in * d_out:
        if t == 1:
            return _total(a3.square().sum(-1).mul_(g3.square().sum(-1)))
        return _total(torch.matmul(a3, a3.transpose(-1, -2)).mul_(torch.matmul(g3, g3.transpose(-1, -2))))
    return _sq(torch.matmul(g3.transpose(-1, -2), a3))


def _linear_sq(m: nn.Linear, a: torch.Tensor, g: torch.Tensor, w: bool, b: bool) -> tuple[torch.Tensor, Any]:
    n = len(g)
    if g.dim() == 2:  # closed form: ||g_i||^2 (||a_i||^2 + 1)
        gg = torch.linalg.vecdot(g, g)
        if not w:
            return gg, None
        aa = torch.linalg.vecdot(a, a)
        return (gg.mul_(aa.add_(1.0)) if b else gg.mul_(aa)), None
    g3, a3 = g.reshape(n, -1, g.shape[-1]), a.reshape(n, -1, a.shape[-1])
    sq = _ghost_or_sample(a3, g3) if w else None
    if b:
        sb = _sq(g3.sum(1))
        sq = sb if sq is None else sq.add_(sb)
    assert sq is not None
    return sq, None


def _linear_per_sample(m: nn.Module, a: torch.Tensor, g: torch.Tensor, w: bool, b: bool) -> list:
    n = len(g)
    g3, a3 = g.reshape(n, -1, g.shape[-1]), a.reshape(n, -1, a.shape[-1])
    return [torch.bmm(g3.transpose(1, 2), a3) if w else None, g3.sum(1) if b else None]


def _linear_add(m: nn.Module, a, g, scale, wv, bv, cache) -> None:
    n = len(g)
    if g.dim() == 2:
        if wv is not None:
            wv.addmm_(g.mul(scale.unsqueeze(1)).t(), a)
        if bv is not None:
            bv.addmv_(g.t(), scale)
        return
    gs = g.mul(scale.view((n,) + (1,) * (g.dim() - 1))).reshape(-1, g.shape[-1])
    if wv is not None:
        wv.addmm_(gs.t(), a.reshape(-1, a.shape[-1]))
    if bv is not None:
        bv.add_(gs.sum(0))


def _conv_unfold(m: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The input's patches (n, groups, L, C_in/groups k_h k_w) and the output gradient (n, groups, L, C_out/groups)
    (Rochette et al. 2019): the Conv2d is a Linear over the L = H'W' output positions, per group."""
    n, groups = len(g), m.groups
    patches = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=_conv_padding(m), stride=m.stride)
    a4 = patches.view(n, groups, -1, patches.shape[-1]).transpose(2, 3)
    g4 = g.reshape(n, groups, -1, patches.shape[-1]).transpose(2, 3)
    return a4, g4


def _conv_per_sample_weight(m: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The per-sample weight gradients (n, C_out, C_in/groups, k_h, k_w) in one convolution weight-gradient call,
    the batch folded into the groups (Rochette et al. 2019): no unfolded copy of the input."""
    n, c_in = a.shape[:2]
    c_out = g.shape[1]
    pw = torch.nn.grad.conv2d_weight(
        a.reshape(1, n * c_in, *a.shape[2:]),
        (n * c_out, c_in // m.groups, *m.kernel_size),
        g.reshape(1, n * c_out, *g.shape[2:]),
        m.stride,
        _conv_padding(m),
        m.dilation,
        n * m.groups,
    )
    return pw.view(n, c_out, *pw.shape[1:])


def _conv_pixel_ghost(m: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The ghost norm with the patches' Gram matrix built from the padded input's pixel Gram matrix P:
    <U_t, U_t'> = Σ_(i,j) P[p_t + (i,j)d, p_t' + (i,j)d] over the kernel offsets, so the C_in k_h k_w-long
    patches are never formed (cost (H_p W_p)^2 C_in instead of (H'W')^2 C_in k_h k_w: cheaper for stride 1)."""
    n, c_in = a.shape[:2]
    groups, (ph, pw) = m.groups, _conv_padding(m)
    padded = F.pad(a, (pw, pw, ph, ph)) if ph or pw else a
    hp, wp = padded.shape[2:]
    x = padded.reshape(n, groups, c_in // groups, hp * wp)
    pixel = torch.matmul(x.transpose(-1, -2), x).view(n, groups, hp, wp, hp, wp)
    ho, wo = g.shape[2:]
    (sh, sw), (dh, dw), (kh, kw) = m.stride, m.dilation, m.kernel_size
    patches: Optional[torch.Tensor] = None
    for i in range(kh):
        rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
        for j in range(kw):
            cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            block = pixel[:, :, rows, cols, rows, cols]
            patches = block.clone() if patches is None else patches.add_(block)
    assert patches is not None
    out = g.reshape(n, groups, -1, ho * wo)
    grams = torch.matmul(out.transpose(-1, -2), out)
    return _total(patches.view(n, groups, ho * wo, ho * wo).mul_(grams))


def _conv_sq(m: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, w: bool, b: bool) -> tuple[torch.Tensor, Any]:
    sq = None
    if w:
        # the cheapest of three exact computations by multiply-adds per sample (Li et al.'s layer-wise choice)
        positions = g.shape[2] * g.shape[3]
        (ph, pw), taps = _conv_padding(m), m.kernel_size[0] * m.kernel_size[1]
        pixels = (a.shape[2] + 2 * ph) * (a.shape[3] + 2 * pw)
        k, c_in, c_out = m.weight[0].numel(), m.in_channels // m.groups, m.out_channels // m.groups
        costs = {
            "sample": positions * k * c_out,  # per-sample gradients, the batch as groups
            "unfold": positions * positions * (k + c_out),  # ghost norm over the unfolded patches
            "pixel": pixels * pixels * c_in + positions * positions * (c_out + taps),  # ghost, pixel Gram
        }
        method = min(costs, key=costs.__getitem__)
        if method == "sample":
            sq = _sq(_conv_per_sample_weight(m, a, g))
        elif method == "unfold":
            sq = _ghost_or_sample(*_conv_unfold(m, a, g))
        else:
            sq = _conv_pixel_ghost(m, a, g)
    if b:
        sb = _sq(g.sum((2, 3)))
        sq = sb if sq is None else sq.add_(sb)
    assert sq is not None
    return sq, None


def _conv_per_sample(m: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, w: bool, b: bool) -> list:
    return [_conv_per_sample_weight(m, a, g) if w else None, g.sum((2, 3)) if b else None]


def _conv_add(m: nn.Conv2d, a, g, scale, wv, bv, cache) -> None:
    gs = g.mul(scale.view(-1, 1, 1, 1))
    if wv is not None:  # PyTorch's weight-gradient kernel on the rescaled output gradient
        wv.add_(torch.nn.grad.conv2d_weight(a, wv.shape, gs, m.stride, _conv_padding(m), m.dilation, m.groups))
    if bv is not None:
        bv.add_(gs.sum((0, 2, 3)))


def _embedding_grads(m: nn.Embedding, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(g)
    ids, g3 = a.reshape(n, -1), g.reshape(n, -1, g.shape[-1])
    if m.padding_idx is not None:  # PyTorch gives the padding row no gradient
        g3 = g3 * (ids != m.padding_idx).unsqueeze(-1).to(g3.dtype)
    return ids, g3


def _embedding_sq(m: nn.Embedding, a: torch.Tensor, g: torch.Tensor, w: bool, b: bool) -> tuple[torch.Tensor, Any]:
    ids, g3 = _embedding_grads(m, a, g)
    if ids.shape[1] == 1:
        return _sq(g3), None
    same = (ids.unsqueeze(2) == ids.unsqueeze(1)).to(g3.dtype)  # [x_t = x_t'] from the index counts
    return _total(torch.bmm(g3, g3.transpose(1, 2)).mul_(same)), None


def _embedding_per_sample(m: nn.Embedding, a: torch.Tensor, g: torch.Tensor, w: bool, b: bool) -> list:
    ids, g3 = _embedding_grads(m, a, g)
    out = torch.zeros((len(g3),) + tuple(m.weight.shape), dtype=g3.dtype, device=g3.device)
    out.scatter_add_(1, ids.unsqueeze(-1).expand(-1, -1, g3.shape[-1]), g3)
    return [out, None]


def _embedding_add(m: nn.Embedding, a, g, scale, wv, bv, cache) -> None:
    ids, g3 = _embedding_grads(m, a, g)
    wv.index_add_(0, ids.reshape(-1), g3.mul(scale.view(-1, 1, 1)).reshape(-1, g3.shape[-1]))


def _norm_per_sample(m: nn.Module, a: torch.Tensor, g: torch.Tensor, w: bool, b: bool) -> list:
    n = len(g)
    if isinstance(m, nn.LayerNorm):
        shape = m.normalized_shape
        numel = math.prod(shape)
        normed = F.layer_norm(a, shape, eps=m.eps) if w else None
        flat = lambda t: t.reshape(n, -1, numel).sum(1)  # noqa: E731
    else:
        normed = F.group_norm(a, m.num_groups, eps=m.eps) if w else None
        flat = lambda t: t.reshape(n, g.shape[1], -1).sum(2)  # noqa: E731
    return [flat(g * normed) if w else None, flat(g) if b else None]


def _norm_sq(m: nn.Module, a: torch.Tensor, g: torch.Tensor, w: bool, b: bool) -> tuple[torch.Tensor, Any]:
    grads = _norm_per_sample(m, a, g, w, b)
    total = torch.zeros(len(g), dtype=g.dtype, device=g.device)
    for t in grads:
        if t is not None:
            total.add_(_sq(t))
    return total, grads


def _norm_add(m: nn.Module, a, g, scale, wv, bv, cache) -> None:
    grads = cache if cache is not None else _norm_per_sample(m, a, g, wv is not None, bv is not None)
    for view, per_sample in zip((wv, bv), grads):
        if view is not None:
            view.add_((scale @ per_sample).view_as(view))


_KERNELS: dict[type, tuple[Callable, Callable, Callable]] = {
    nn.Linear: (_linear_sq, _linear_per_sample, _linear_add),
    nn.Conv2d: (_conv_sq, _conv_per_sample, _conv_add),
    nn.Embedding: (_embedding_sq, _embedding_per_sample, _embedding_add),
    nn.LayerNorm: (_norm_sq, _norm_per_sample, _norm_add),
    nn.GroupNorm: (_norm_sq, _norm_per_sample, _norm_add),
}


class FusedDpSgd:
    """DP-SGD steps on ``model`` (layers of :data:`FUSED_LAYERS`) with Opacus' flat clipping, noise and scaling.

    Args:
        model: the plain module (never wrapped); forward hooks are registered on its layers holding trainable
            parameters until :meth:`close`.
        optimizer: a torch optimizer over the trainable parameters (their ``.grad`` become slices of one
            flat buffer).
        criterion: the loss, ``reduction="mean"``.
        noise_multiplier, max_grad_norm: z and C.

    Raises:
        ValueError: the model has a layer the step cannot clip (:func:`fused_refusal`, naming the module).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        criterion: Callable,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
    ) -> None:
        reason = fused_refusal(model)
        if reason is not None:
            raise ValueError(f"grad_sample_mode='fused' cannot run this model: {reason}")
        self.model, self.optimizer, self.criterion = model, optimizer, criterion
        self.noise_multiplier, self.max_grad_norm = float(noise_multiplier), float(max_grad_norm)
        self.params = [p for p in model.parameters() if p.requires_grad]
        first = self.params[0]
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=first.dtype, device=first.device)
        self.noise = torch.empty_like(self.flat)
        self._grads: list[torch.Tensor] = []
        self._noises: list[torch.Tensor] = []
        views: dict[int, torch.Tensor] = {}
        offset = 0
        for p in self.params:
            view = self.flat[offset : offset + p.numel()].view(p.shape)
            self._grads.append(view)
            self._noises.append(self.noise[offset : offset + p.numel()].view(p.shape))
            views[id(p)] = view
            offset += p.numel()
        # per layer holding a trainable parameter: (weight grad view or None, bias grad view or None)
        self._layers: dict[nn.Module, _Views] = {}
        self._names: dict[nn.Module, str] = {}
        for name, m in model.named_modules():
            if type(m) in FUSED_LAYERS and any(p.requires_grad for p in m.parameters(recurse=False)):
                weight, bias = getattr(m, "weight", None), getattr(m, "bias", None)
                w = views.get(id(weight)) if weight is not None and weight.requires_grad else None
                b = views.get(id(bias)) if bias is not None and bias.requires_grad else None
                self._layers[m] = (w, b)
                self._names[m] = name or "<root>"
        self._records: list[tuple[nn.Module, torch.Tensor, torch.Tensor, int, int]] = []
        self._copy_outputs = False
        self._handles = [m.register_forward_hook(self._capture) for m in self._layers]
        self.attach_grads()

    def _plain_sgd_lr(self) -> Optional[float]:
        """The learning rate when the optimizer is ``torch.optim.SGD`` over exactly these parameters with no
        momentum, weight decay, nesterov or maximize (its step is then ``p -= lr * grad``); else None."""
        opt = self.optimizer
        if type(opt) is not torch.optim.SGD or len(opt.param_groups) != 1:
            return None
        group = opt.param_groups[0]
        if group["momentum"] or group["weight_decay"] or group["nesterov"] or group["maximize"]:
            return None
        lr = group["lr"]
        if not isinstance(lr, float) or len(group["params"]) != len(self.params):
            return None
        return lr

    def attach_grads(self) -> None:
        """Make the parameters' ``.grad`` the slices of the flat buffer (again, after anything reset them)."""
        for p, view in zip(self.params, self._grads):
            p.grad = view

    def close(self) -> None:
        """Remove the hooks and the gradient slices: ``model`` is a plain module again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for p in self.params:
            p.grad = None

    def _capture(self, module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> Optional[torch.Tensor]:
        a = inputs[0].detach()
        if self._copy_outputs:
            self._records.append((module, a.clone(), output, 0, 0))
            return output.clone()  # the layer's own output stays untouched; the model goes on with a copy
        self._records.append((module, a, output, a._version, output._version))
        return None

    def _forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self._records = []
        loss = self.criterion(self.model(inputs), targets)
        if not self._copy_outputs and any(
            a._version != va or out._version != vo for _, a, out, va, vo in self._records
        ):
            # a layer's input or output was modified in place (nn.ReLU(inplace=True)): its recorded activation or
            # gradient would not be the layer's. From now on both are copies (forward again, once)
            self._copy_outputs = True
            self._records = []
            loss = self.criterion(self.model(inputs), targets)
        return loss

    def clipped_sum(self, inputs: torch.Tensor, targets: torch.Tensor) -> Optional[torch.Tensor]:
        """Write Σ_i clip_C(g_i) into the flat buffer (the parameters' ``.grad``); return the mean loss
        (None for an empty batch, whose sum is 0)."""
        n = len(targets)
        self.flat.zero_()
        if n == 0:
            return None
        loss = self._forward(inputs, targets)
        records = self._records
        grads = torch.autograd.grad(loss, [r[2] for r in records], allow_unused=True)
        used = [(r[0], r[1], g) for r, g in zip(records, grads) if g is not None]
        layers = self._layers
        once = len({m for m, _, _ in used}) == len(used)
        calls = Counter(m for m, _, _ in used) if not once else None
        sq: Optional[torch.Tensor] = None
        sums: dict[nn.Module, list[Optional[torch.Tensor]]] = {}
        caches: list[Any] = []
        for m, a, g in used:
            if len(a) != n or len(g) != n or (type(m) is nn.Conv2d and a.dim() != 4):
                raise ValueError(
                    f"the fused step needs the batch first: module {self._names[m]!r} ({type(m).__name__}) saw an "
                    f"input of shape {tuple(a.shape)} in a batch of {n}"
                )
            w, b = layers[m]
            cache = None
            if calls is not None and calls[m] > 1:
                # called several times: the per-sample gradient is a sum over the calls (cross terms)
                acc = sums.setdefault(m, [None, None])
                for j, t in enumerate(_KERNELS[type(m)][1](m, a, g, w is not None, b is not None)):
                    if t is not None:
                        acc[j] = t if acc[j] is None else acc[j] + t
                caches.append(None)
                continue
            if type(m) is nn.Linear and g.dim() == 2:  # ||g_i||^2 (||a_i||^2 + 1), inline (the MLP's hot path)
                term = torch.linalg.vecdot(g, g)
                if w is not None:
                    aa = torch.linalg.vecdot(a, a)
                    term.mul_(aa.add_(1.0) if b is not None else aa)
            else:  # closed-form / ghost norm of this call
                term, cache = _KERNELS[type(m)][0](m, a, g, w is not None, b is not None)
            sq = term if sq is None else sq.add_(term)
            caches.append(cache)
        if sq is None:
            sq = torch.zeros(n, dtype=self.flat.dtype, device=self.flat.device)
        for pw, pb in sums.values():
            for t in (pw, pb):
                if t is not None:
                    sq.add_(_sq(t))
        # per-sample gradients are n x the mean loss's (Opacus' "mean" convention): norm_i = n sqrt(sq_i), and
        # the clipped sum Σ_i f_i (n g_i) a_i^T = (g * s)^T a with s_i = n min(1, C / (norm_i + 1e-6))
        norms = sq.sqrt_().mul_(n)
        scale = (self.max_grad_norm / norms.add_(CLIP_EPS)).clamp_(max=1.0).mul_(n)
        for (m, a, g), cache in zip(used, caches):
            w, b = layers[m]
            if type(m) is nn.Linear and g.dim() == 2:
                if w is not None:
                    w.addmm_(g.mul(scale.unsqueeze(1)).t(), a)
                if b is not None:
                    b.addmv_(g.t(), scale)
            else:
                _KERNELS[type(m)][2](m, a, g, scale, w, b, cache)
        return loss.detach()

    def add_noise(self, generator: Optional[torch.Generator]) -> None:
        """Add N(0, (zC)^2) to every coordinate of the clipped sum: Opacus' draws, one normal per parameter
        tensor in order, from ``generator``."""
        std = self.noise_multiplier * self.max_grad_norm
        if std > 0:
            for view in self._noises:
                view.normal_(0.0, std, generator=generator)
            self.flat.add_(self.noise)

    def step(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        generator: Optional[torch.Generator],
        expected_batch_size: float,
        accountant: Any,
        sample_rate: float,
    ) -> Optional[torch.Tensor]:
        """One DP-SGD step: clipped sum, noise N(0, (zC)^2) per coordinate, / expected batch size, optimizer
        step, one accountant step. Returns the batch's mean loss (None for an empty batch)."""
        loss = self.clipped_sum(inputs, targets)
        self.add_noise(generator)
        self.flat.div_(expected_batch_size)
        lr = self._plain_sgd_lr()
        if lr is None:
            self.optimizer.step()
        else:  # what SGD's step does without momentum, weight decay or maximize, minus its per-call Python
            with torch.no_grad():
                torch._foreach_add_(self.params, self._grads, alpha=-lr)
        accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=sample_rate)
        return loss


#: The name of :class:`FusedDpSgd` when it ran ``nn.Linear`` layers only (kept for existing imports).
FusedLinearDpSgd = FusedDpSgd

__all__ = [
    "CLIP_EPS",
    "FUSED_LAYERS",
    "FusedDpSgd",
    "FusedLinearDpSgd",
    "LoRALinear",
    "fused_eligible",
    "fused_refusal",
]
