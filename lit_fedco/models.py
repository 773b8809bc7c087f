"""Small models used by the recipes. All are plain ``nn.Module`` s without buffers, so that
``torch.func.functional_call`` over a parameter dict is the whole model state."""

from __future__ import annotations

import math

import torch
from torch import nn

from lit_fedco.errors import ConfigError


class LogisticRegression(nn.Module):
    """Multinomial logistic regression on flattened inputs (ComFedL §5.1)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """One hidden layer with tanh (smooth, so finite-difference checks are exact)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


MODELS = ("logreg", "mlp")


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int, hidden: int = 64
) -> nn.Module:
    """Build a model with parameters drawn from a generator seeded by ``seed``.

    The global RNG is left untouched (``torch.random.fork_rng``).
    """
    in_features = math.prod(input_shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "logreg":
            return LogisticRegression(in_features, num_classes)
        if name == "mlp":
            if hidden < 1:
                raise ConfigError.bad_value("model.hidden", hidden, "an int >= 1", "64")
            return MLP(in_features, num_classes, hidden)
    raise ConfigError.bad_value("model.name", name, f"one of {MODELS}", "logreg")
