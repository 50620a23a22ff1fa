r"""The fused DP-SGD step for models whose trainable parameters all sit in ``nn.Linear`` layers.

``DpSgdTrainer(grad_sample_mode="fused")`` -- and ``"auto"`` wherever it applies (flat clipping, no
virtual steps, no ``secure_mode``, every module holding a trainable parameter exactly ``nn.Linear``) --
runs each DP-SGD step with :class:`FusedLinearDpSgd` instead of Opacus' ``GradSampleModule`` +
``DPOptimizer``. Everything else stays Opacus': the Poisson batches (Opacus' sampler), the accountant
(Opacus' own, stepped once per step as its optimizer hook does), the declared event.

Contract: the step computes exactly what Opacus' ``DPOptimizer`` computes with flat clipping and
``loss_reduction="mean"`` (the trainer's criterion), in the same order of operations where it matters:

1. per-sample gradients are those of the mean loss times the batch length :math:`n` (Opacus' "mean"
   convention), :math:`g_i = n\,\partial L/\partial z_i` for each layer output :math:`z = aW^\top + b`;
2. per-sample norms :math:`\lVert G_i\rVert` over all trainable tensors, the weight's part in closed form
   when a layer is called once on a 2-D input: :math:`\lVert g_i a_i^\top\rVert_F^2 = \lVert g_i\rVert^2
   \lVert a_i\rVert^2`, the bias's :math:`\lVert g_i\rVert^2` ("ghost norm", Goodfellow 2015; Li et al.
   2022); a layer called several times, or on inputs with extra dimensions, has its per-sample gradient
   materialised (the cross terms do not factor);
3. clip factors :math:`f_i = \min(1, C/(\lVert G_i\rVert + 10^{-6}))` (Opacus' formula);
4. the clipped sum per layer :math:`\sum_i f_i g_i a_i^\top = (g \odot f)^\top a`, one matmul, written
   into one flat gradient buffer whose slices are the parameters' ``.grad``;
5. Gaussian noise of std :math:`zC` drawn per parameter tensor in Opacus' order and shape from the
   round's generator (the same draws as Opacus' ``add_noise`` with that generator), added to the sum;
6. division by Opacus' expected batch size (:math:`\lfloor qN\rfloor` for Poisson batches, else B),
   then the wrapped optimizer's ``step`` (SGD, momentum, ``optimizer_fn``: post-processing);
7. one ``accountant.step(noise_multiplier=z, sample_rate=q)`` per step, empty batches included (an empty
   Poisson batch is a step of pure noise, as in Opacus).

So the release of every step is :math:`\sum_i \bar g_i + \mathcal N(0, z^2C^2 I)` over a Poisson batch
of rate :math:`q`, each :math:`\lVert\bar g_i\rVert \le C`: the Sampled Gaussian Mechanism declared by
the trainer, whatever the mode. ``tests/test_dp_sgd_fused.py`` checks it against Opacus' hooks mode: the
same clipped sum on a fixed batch (float tolerance), the same weights after a seeded round, a noise std
of :math:`zC` on the sum (a 10 % error fails), the same sampling rate, steps and booked event.

Not covered (the trainer keeps Opacus for them): per-layer clipping, virtual steps, ``secure_mode``,
any layer type other than ``nn.Linear`` holding trainable parameters. A Linear output modified in place
(``nn.ReLU(inplace=True)``) is detected on the first step and the outputs are then copied before use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
from torch import nn

#: Opacus' per-sample clip factor is C / (norm + this) (``DPOptimizer.clip_and_accumulate``).
CLIP_EPS = 1e-6


def fused_eligible(model: nn.Module) -> bool:
    """Every module that holds a trainable parameter is exactly ``nn.Linear`` (and there is one), no trainable
    parameter is held by two modules (tied weights), and all trainable parameters share one dtype and device."""
    holders = [m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    if not holders or not all(type(m) is nn.Linear for m in holders):
        return False
    held = [p for m in holders for p in m.parameters(recurse=False) if p.requires_grad]
    return len({id(p) for p in held}) == len(held) and len({(p.dtype, p.device) for p in held}) == 1


class FusedLinearDpSgd:
    """DP-SGD steps on ``model`` (Linear layers only) with Opacus' flat clipping, noise and scaling.

    Args:
        model: the plain module (never wrapped); forward hooks are registered on its trainable Linear
            layers until :meth:`close`.
        optimizer: a torch optimizer over the trainable parameters (their ``.grad`` become slices of one
            flat buffer).
        criterion: the loss, ``reduction="mean"``.
        noise_multiplier, max_grad_norm: z and C.
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
        if not fused_eligible(model):
            raise ValueError(
                "grad_sample_mode='fused' needs a model whose trainable parameters all sit in nn.Linear layers, "
                "none shared between layers, all of one dtype and device"
            )
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
        # per trainable Linear: (weight grad view or None, bias grad view or None)
        self._layers: dict[nn.Module, tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = {}
        for m in model.modules():
            if type(m) is nn.Linear and any(p.requires_grad for p in m.parameters(recurse=False)):
                w = views.get(id(m.weight)) if m.weight.requires_grad else None
                b = views.get(id(m.bias)) if m.bias is not None and m.bias.requires_grad else None
                self._layers[m] = (w, b)
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
        layers = self._layers
        used = [(layers[r[0]], r[1], g) for r, g in zip(records, grads) if g is not None]
        if len({id(r[0]) for r in records}) == len(records) and all(a.dim() == 2 for _, a, _ in used):
            sq = self._ghost_sq(used)  # every layer called once on 2-D inputs: closed-form norms
        else:
            sq = self._materialised_sq(records, grads, n)
        # per-sample gradients are n x the mean loss's (Opacus' "mean" convention): norm_i = n sqrt(sq_i), and
        # the clipped sum Σ_i f_i (n g_i) a_i^T = (g * s)^T a with s_i = n min(1, C / (norm_i + 1e-6))
        norms = sq.sqrt_().mul_(n)
        scale = (self.max_grad_norm / norms.add_(CLIP_EPS)).clamp_(max=1.0).mul_(n)
        for (w, b), a, g in used:
            if g.dim() == 2:
                if w is not None:
                    w.addmm_(g.mul(scale.unsqueeze(1)).t(), a)
                if b is not None:
                    b.addmv_(g.t(), scale)
                continue
            gs = g.mul(scale.view((n,) + (1,) * (g.dim() - 1))).reshape(-1, g.shape[-1])
            if w is not None:
                w.addmm_(gs.t(), a.reshape(-1, a.shape[-1]))
            if b is not None:
                b.add_(gs.sum(0))
        return loss.detach()

    @staticmethod
    def _ghost_sq(used: list) -> torch.Tensor:
        """Σ over layers of ||g_i a_i^T||² + ||g_i||² = ||g_i||² (||a_i||² + 1) (each term when trainable)."""
        sq: Optional[torch.Tensor] = None
        for (w, b), a, g in used:
            gg = torch.linalg.vecdot(g, g)
            if w is not None:
                aa = torch.linalg.vecdot(a, a)
                term = gg.mul_(aa.add_(1.0)) if b is not None else gg.mul_(aa)
            else:
                term = gg
            sq = term if sq is None else sq.add_(term)
        assert sq is not None
        return sq

    def _materialised_sq(self, records: list, grads: tuple, n: int) -> torch.Tensor:
        """Per-sample squared norms with each layer's per-sample gradient materialised and summed over its calls
        (a layer called several times, or on inputs with extra dimensions: the cross terms do not factor)."""
        sums: dict[nn.Module, list[Optional[torch.Tensor]]] = {}
        for (module, a, *_), g in zip(records, grads):
            if g is None:
                continue
            w, b = self._layers[module]
            acc = sums.setdefault(module, [None, None])
            g3, a3 = g.reshape(n, -1, g.shape[-1]), a.reshape(n, -1, a.shape[-1])
            if w is not None:
                pw = torch.bmm(g3.transpose(1, 2), a3)
                acc[0] = pw if acc[0] is None else acc[0] + pw
            if b is not None:
                pb = g3.sum(1)
                acc[1] = pb if acc[1] is None else acc[1] + pb
        sq = torch.zeros(n, dtype=self.flat.dtype, device=self.flat.device)
        for pw, pb in sums.values():
            for t in (pw, pb):
                if t is not None:
                    sq += t.reshape(n, -1).square().sum(1)
        return sq

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


__all__ = ["CLIP_EPS", "FusedLinearDpSgd", "fused_eligible"]
