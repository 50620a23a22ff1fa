"""torchvision.transforms' ``Compose``, ``ToTensor`` and ``Normalize``, as plain torch ops.

Only what Flower's examples use: ``Compose([ToTensor(), Normalize(mean, std)])`` on an
H x W x C uint8 image (a PIL image, an ndarray or the nested lists Hugging Face datasets
hand to a transform). Same results as torchvision's for those inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


class Compose:
    """Apply ``transforms`` in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for transform in self.transforms:
            img = transform(img)
        return img


class ToTensor:
    """H x W x C (or H x W) uint8 image -> C x H x W float32 tensor in [0, 1], as torchvision's ToTensor."""

    def __call__(self, pic: Any) -> torch.Tensor:
        array = np.asarray(pic)
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
        if array.dtype == np.uint8:
            return tensor.to(torch.float32).div(255.0)
        return tensor.to(torch.float32)


class Normalize:
    """(x - mean[c]) / std[c] per channel of a C x H x W tensor, as torchvision's Normalize."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std
