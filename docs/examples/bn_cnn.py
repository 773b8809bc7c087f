"""A researcher's CNN with batch normalisation, for ``model.name=bn_cnn:BNCNN``.

Run from this folder (or put it on ``PYTHONPATH``)::

    python -m lit_fedco.recipes.comfedl_dro model.name=bn_cnn:BNCNN model.width=16 \
        data.name=imagefolder data.data_dir=/path/to/tree 'updaters=[fedavg,comfedl]'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class BNCNN(nn.Module):
    """Two 3×3 convolutions, each followed by batch normalisation, ReLU and 2×2 max-pooling,
    then global average pooling and a linear layer.

    Built by lit_fedco as ``BNCNN(input_shape, num_classes, params)``: ``input_shape`` is one
    row's shape ``(C, H, W)``, ``num_classes`` the data's classes, ``params`` the ``model.*``
    keys below. The running statistics of the batch norms are part of the federated state
    (``model.buffers=average`` or ``local``).
    """

    @dataclass(frozen=True)
    class Params:
        """The model's keys.

        Attributes:
            width: channels of the first convolution (the second has twice as many).
        """

        width: int = 16

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, params: Params | None = None
    ) -> None:
        super().__init__()
        width = (params or self.Params()).width
        channels = input_shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))
