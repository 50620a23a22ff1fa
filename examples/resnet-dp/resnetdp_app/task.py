"""Data and model of the ResNet-18 example: generated CIFAR-shaped images, a GroupNorm ResNet-18.

Data (nothing is downloaded). Every class c has a fixed pattern P_c: a 3 x 4 x 4 Gaussian array upsampled
bilinearly to 3 x S x S (S = 32 at full size: CIFAR's shape) and scaled to unit RMS, drawn from the public
``data-seed``. An example of class c is ``signal * P_c + N(0, I)`` (pixel noise of unit variance): a
low-frequency class signal under heavy noise, which a convolutional network learns and a single example does
not reveal. Each client draws ``examples-per-client`` examples (uniform labels) from its own seed
(``data-seed``, partition id); the server's test set (``test-examples``) from another. Patterns are shared,
examples are not.

Model. torchvision is not a dependency of the package (nor installed here), so the ResNet is defined
locally: ResNet-18's layout (four stages of two basic blocks, widths 64-128-256-512, a 1x1 projection on
the shortcut where the shape changes) with the CIFAR stem (one 3x3 convolution, no max-pool: the variant
used on 32x32 inputs) and GroupNorm(min(32, C), C) in place of every BatchNorm (what Opacus'
``ModuleValidator.fix`` substitutes: BatchNorm mixes the examples of a batch, which per-example clipping
cannot allow). Full size: 11 173 962 parameters, all trainable and all sent. The ``reduced`` size (tests)
keeps the layout at width 4 with one block in each of two stages on 8 x 8 images.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

NUM_CLASSES = 10
#: name -> (width, blocks per stage, image side); "full" is ResNet-18 on 32x32x3 (CIFAR's shape).
SIZES: dict[str, tuple[int, tuple[int, ...], int]] = {
    "full": (64, (2, 2, 2, 2), 32),
    "reduced": (4, (1, 1), 8),
}


def size_of(size: str) -> tuple[int, tuple[int, ...], int]:
    """(width, blocks, image side) of a named size; ValueError for an unknown one."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return SIZES[size]


def norm(channels: int) -> nn.GroupNorm:
    """GroupNorm(min(32, C), C): Opacus' replacement for BatchNorm."""
    return nn.GroupNorm(min(32, channels), channels)


class BasicBlock(nn.Module):
    """ResNet's basic block (two 3x3 convolutions) with GroupNorm; a 1x1 projection where the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.gn1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), norm(c_out)
        self.conv2, self.gn2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), norm(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), norm(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.gn1(self.conv1(x)))
        return torch.relu(self.gn2(self.conv2(out)) + self.shortcut(x))


def build_model(size: str = "full", seed: int = 42) -> nn.Module:
    """The GroupNorm ResNet of ``size``, initialised from ``seed`` (the server's initial model)."""
    width, blocks, _ = size_of(size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), norm(width), nn.ReLU()]
        channels = width
        for stage, count in enumerate(blocks):
            c_out = width * 2**stage
            for j in range(count):
                layers.append(BasicBlock(channels, c_out, 2 if (j == 0 and stage > 0) else 1))
                channels = c_out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, NUM_CLASSES)]
        return nn.Sequential(*layers)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (here: all of them)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def class_patterns(side: int, data_seed: int) -> torch.Tensor:
    """(10, 3, side, side): one unit-RMS low-frequency pattern per class, from the public ``data_seed``."""
    gen = torch.Generator().manual_seed(int(data_seed))
    coarse = torch.randn(NUM_CLASSES, 3, 4, 4, generator=gen)
    fine = nn.functional.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)
    return fine / fine.square().mean(dim=(1, 2, 3), keepdim=True).sqrt()


def generate(count: int, side: int, signal: float, data_seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` examples (float32 images N x 3 x side x side, int64 labels) from stream ``stream``."""
    patterns = class_patterns(side, data_seed)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([int(data_seed), int(stream)]).generate_state(1)[0]))
    labels = torch.randint(0, NUM_CLASSES, (count,), generator=gen)
    images = signal * patterns[labels] + torch.randn(count, 3, side, side, generator=gen)
    return images.numpy().astype(np.float32), labels.numpy().astype(np.int64)


TEST_STREAM = 1_000_000  # the server's test set; clients use streams 0 .. num-partitions - 1


def load_partition(partition_id: int, size: str, count: int, signal: float, data_seed: int):
    """Client ``partition_id``'s own examples."""
    return generate(count, size_of(size)[2], signal, data_seed, partition_id)


def load_test(size: str, count: int, signal: float, data_seed: int):
    """The server's test set (central evaluation)."""
    return generate(count, size_of(size)[2], signal, data_seed, TEST_STREAM)
