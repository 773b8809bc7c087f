"""The networks of the FCSG authors' D-AUPRC scripts, one per data set, for FCSG §5.3's AUPRC
task where the paper names only "a small CNN" (``model.name=lit_fedco.examples.dauprc_models:
MnistModel``; the presets ``fcsg_auprc_*_scripts`` use them).

- :class:`MnistModel`: two 5×5 convolutions of 20 and 50 channels, each followed by ReLU and 2×2
  max-pooling, a hidden layer of 500 units (ReLU) and the output;
- :class:`FMnistModel`: 5×5 convolutions of 5 and 10 channels with tanh and 2×2 max-pooling, a
  hidden layer of 100 units (tanh) and the output;
- :class:`CIFARModel`: 3×3 convolutions of 16, 32 and 64 channels (ReLU, 2×2 max-pooling after
  each), hidden layers of 512 and 64 units (ReLU) and the output.

Each is built as ``Model(input_shape, num_classes)`` (:func:`lit_fedco.core.models.build_model`
seeds the initialisation), has no normalisation layer (a row's score does not depend on the
other rows of its batch) and works on any image side the pooling divides.
"""

from __future__ import annotations

import torch
from torch import nn


def _side(size: int, kernel: int) -> int:
    """A side after a valid ``kernel`` convolution and a 2×2 max-pooling."""
    return (size - kernel + 1) // 2


class MnistModel(nn.Module):
    """D-AUPRC's MNIST network: conv 20 and 50 (5×5), fc 500."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        flat = 50 * _side(_side(h, 5), 5) * _side(_side(w, 5), 5)
        self.fc1 = nn.Linear(flat, 500)
        self.fc2 = nn.Linear(500, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class FMnistModel(nn.Module):
    """D-AUPRC's Fashion-MNIST network: conv 5 and 10 (5×5, tanh), fc 100 (tanh)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 5, 5)
        self.conv2 = nn.Conv2d(5, 10, 5)
        flat = 10 * _side(_side(h, 5), 5) * _side(_side(w, 5), 5)
        self.fc1 = nn.Linear(flat, 100)
        self.fc2 = nn.Linear(100, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.tanh(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.tanh(self.conv2(x)), 2)
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


class CIFARModel(nn.Module):
    """D-AUPRC's CIFAR-10 network: conv 16, 32 and 64 (3×3, padded), fc 512 and 64."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        c, h, w = input_shape
        self.convs = nn.ModuleList(
            [nn.Conv2d(c, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1),
             nn.Conv2d(32, 64, 3, padding=1)]
        )  # fmt: skip
        self.fc1 = nn.Linear(64 * (h // 8) * (w // 8), 512)
        self.fc2 = nn.Linear(512, 64)
        self.fc3 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = nn.functional.max_pool2d(torch.relu(conv(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))
