"""Small models used by the recipes. All are plain ``nn.Module`` s without buffers, so that
``torch.func.functional_call`` over a parameter dict is the whole model state."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from lit_fedco.core.errors import ConfigError


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


class _BasicBlock(nn.Module):
    """Two 3×3 convolutions with GroupNorm and a parameter-free shortcut (He et al. option A:
    subsample and zero-pad the channels where the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(2, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(2, c_out)
        self.stride, self.pad = stride, c_out - c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        short = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.pad:
            short = nn.functional.pad(short, (0, 0, 0, 0, 0, self.pad))
        return torch.relu(out + short)


class ResNet20(nn.Module):
    """The CIFAR ResNet-20 of He et al. (2016, §4.2): a 3×3 convolution with 16 channels, three
    stages of three basic blocks (16, 32, 64 channels, strides 1, 2, 2), global average
    pooling and a linear layer; 0.27M parameters.

    GroupNorm (2 groups) replaces BatchNorm: running statistics are buffers that
    ``functional_call`` under ``vmap`` cannot keep per client, and batch statistics would make
    evaluation depend on how rows are batched; Hsieh et al. (2020) recommend GroupNorm for
    non-IID federated training.
    """

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.norm = nn.GroupNorm(2, 16)
        blocks: list[nn.Module] = []
        c_in = 16
        for c_out, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                blocks.append(_BasicBlock(c_in, c_out, stride if i == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(torch.relu(self.norm(self.conv(x))))
        return self.fc(out.mean(dim=(2, 3)))


class LinearScore(nn.Module):
    """A linear map without bias, ``x ↦ Wx`` (FCSG §5.1: the score aᵀx of x ∈ R^d)."""

    def __init__(self, in_features: int, outputs: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, outputs, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class SmallCNN(nn.Module):
    """Two 3×3 convolutions (16 and 32 channels, ReLU, 2×2 max-pooling), a hidden layer of
    ``hidden`` units and a linear output (the "small CNN" of FCSG §5.3). No normalisation, so a
    row's prediction does not depend on the other rows of its batch."""

    def __init__(self, input_shape: tuple[int, ...], outputs: int, hidden: int) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * (h // 4) * (w // 4), hidden)
        self.fc2 = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class Conv4(nn.Module):
    """The four-layer CNN of MAML (Finn et al. 2017) for Omniglot: four blocks of a 3×3
    convolution with ``filters`` channels and stride 2, batch normalisation and ReLU, then the
    spatial mean and a linear layer.

    Batch normalisation uses the statistics of the batch it sees, always
    (``track_running_stats=False``): there are no buffers, ``functional_call`` over the
    parameters is the whole model, and under ``vmap`` each task is normalised by its own rows —
    as in MAML, which normalises with the statistics of the current batch at test time too.
    """

    def __init__(self, in_channels: int, outputs: int, filters: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for _ in range(4):
            layers += [
                nn.Conv2d(c, filters, 3, stride=2, padding=1),
                nn.BatchNorm2d(filters, track_running_stats=False),
                nn.ReLU(),
            ]
            c = filters
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(filters, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


MODELS = ("logreg", "mlp", "resnet20", "linear", "cnn", "conv4")


# ---------------------------------------------------------------------- stateless forwards
Params = dict[str, torch.Tensor]


def _linear(m: nn.Linear, p: Params, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, p[f"{name}.weight"], p[f"{name}.bias"] if m.bias is not None else None)


def _conv(m: nn.Conv2d, p: Params, name: str, x: torch.Tensor) -> torch.Tensor:
    bias = p[f"{name}.bias"] if m.bias is not None else None
    return F.conv2d(x, p[f"{name}.weight"], bias, m.stride, m.padding, m.dilation, m.groups)


def _logreg(m: LogisticRegression, p: Params, x: torch.Tensor) -> torch.Tensor:
    return _linear(m.linear, p, "linear", x.flatten(1))


def _linear_score(m: LinearScore, p: Params, x: torch.Tensor) -> torch.Tensor:
    return _linear(m.linear, p, "linear", x.flatten(1))


def _mlp(m: MLP, p: Params, x: torch.Tensor) -> torch.Tensor:
    return _linear(m.fc2, p, "fc2", torch.tanh(_linear(m.fc1, p, "fc1", x.flatten(1))))


def _small_cnn(m: SmallCNN, p: Params, x: torch.Tensor) -> torch.Tensor:
    x = F.max_pool2d(torch.relu(_conv(m.conv1, p, "conv1", x)), 2)
    x = F.max_pool2d(torch.relu(_conv(m.conv2, p, "conv2", x)), 2)
    return _linear(m.fc2, p, "fc2", torch.relu(_linear(m.fc1, p, "fc1", x.flatten(1))))


STATELESS: dict[type[nn.Module], Callable[[Any, Params, torch.Tensor], torch.Tensor]] = {
    LogisticRegression: _logreg,
    LinearScore: _linear_score,
    MLP: _mlp,
    SmallCNN: _small_cnn,
}
"""The small models' forwards written over a parameter dict: the same operations, in the same
order, as their ``forward`` (so the same numbers), without ``functional_call``'s swapping of the
module's parameters, which costs more than the model itself at these sizes (measured in
:func:`call`'s docstring). Looked up by exact class: a subclass (which may override
``forward``) takes ``functional_call``."""


# ---------------------------------------------------------------------- stacked forwards
def _linear_stacked(m: nn.Linear, p: Params, name: str, x: torch.Tensor) -> torch.Tensor:
    weight = p[f"{name}.weight"].transpose(1, 2)
    if m.bias is None:
        return torch.bmm(x, weight)
    return torch.baddbmm(p[f"{name}.bias"].unsqueeze(1), x, weight)


def _logreg_stacked(m: LogisticRegression, p: Params, x: torch.Tensor) -> torch.Tensor:
    return _linear_stacked(m.linear, p, "linear", x.flatten(2))


def _linear_score_stacked(m: LinearScore, p: Params, x: torch.Tensor) -> torch.Tensor:
    return _linear_stacked(m.linear, p, "linear", x.flatten(2))


def _mlp_stacked(m: MLP, p: Params, x: torch.Tensor) -> torch.Tensor:
    hidden = torch.tanh(_linear_stacked(m.fc1, p, "fc1", x.flatten(2)))
    return _linear_stacked(m.fc2, p, "fc2", hidden)


STACKED: dict[type[nn.Module], Callable[[Any, Params, torch.Tensor], torch.Tensor]] = {
    LogisticRegression: _logreg_stacked,
    LinearScore: _linear_score_stacked,
    MLP: _mlp_stacked,
}
"""Forwards of n clients at once, each with its own parameters: every parameter has a leading
client dimension (``[n, out, in]``) and so have the inputs (``[n, b, ...]``); a linear layer is
one batched matrix product (``baddbmm``), the product ``vmap`` makes of :data:`STATELESS`'s
``F.linear``, without ``vmap``'s wrapping of every tensor. Looked up by exact class, like
:data:`STATELESS`; the executors use it through :func:`call_stacked`."""


def stacks(model: nn.Module) -> bool:
    """Whether ``model`` has a stacked forward (:data:`STACKED`)."""
    return type(model) in STACKED


def call_stacked(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """The outputs ``[n, b, ...]`` of n copies of ``model``, copy i with parameters
    ``params[·][i]`` on inputs ``x[i]``: :data:`STACKED`'s forward, else ``vmap`` of
    :func:`call`."""
    fast = STACKED.get(type(model))
    if fast is not None:
        return fast(model, params, x)
    return torch.func.vmap(lambda p, v: call(model, p, v))(params, x)


def call(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """``model``'s output for ``x`` under ``params``: for lit_fedco's own small models
    (:data:`STATELESS`) the same forward over the dict directly; else the module's own
    ``forward`` with ``params`` in place of its parameters (:func:`_swapped_call`)."""
    fast = STATELESS.get(type(model))
    if fast is not None:
        return fast(model, params, x)
    return _swapped_call(model, params, x)


_Slot = tuple[nn.Module | None, str, nn.Parameter]
"""Where a parameter lives: (its module, None for the model itself; its attribute; itself)."""
_Link = tuple[nn.Module | None, str, nn.Module]
"""One step of the path to a parameter: (a module, None for the model; a child's name; the
child)."""
_PLACES: weakref.WeakKeyDictionary[nn.Module, tuple[dict[str, _Slot], list[_Link]] | None] = (
    weakref.WeakKeyDictionary()
)


def _places(model: nn.Module) -> tuple[dict[str, _Slot], list[_Link]] | None:
    """Where each parameter of ``model`` lives, by name, and the links from the model down to
    their modules (each held by its parent, never the model itself, so that the model can be
    collected); None when one parameter has two names (tied weights, which
    ``functional_call`` unties). Found once, and again when a link or a parameter changed."""
    if model in _PLACES:
        places = _PLACES[model]
        if places is None or all(
            (model if parent is None else parent)._modules.get(name) is child
            for parent, name, child in places[1]
        ):
            return places
    slots: dict[str, _Slot] = {}
    links: dict[tuple[int, str], _Link] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:  # tied: functional_call unties them
            _PLACES[model] = None
            return None
        seen.add(id(p))
        *path, attr = name.split(".")
        owner = model
        for step in path:
            child = owner._modules[step]
            assert child is not None  # named_parameters walks no empty slot
            links[(id(owner), step)] = (None if owner is model else owner, step, child)
            owner = child
        slots[name] = (None if owner is model else owner, attr, p)
    _PLACES[model] = found = (slots, list(links.values()))
    return found


def _swapped_call(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """:func:`torch.func.functional_call` ``(model, params, (x,))``: each tensor of ``params``
    put where its parameter lives for the forward, the parameters put back after it. The same
    swap ``functional_call`` makes, with the parameters' places found once per model (and again
    after the model changed) instead of at every call: a ``simple_cnn`` step 60–90 µs less.
    Tied weights, or a name that is no parameter, go to ``functional_call`` itself."""
    places = _places(model)
    if places is None or not params.keys() <= places[0].keys():
        return functional_call(model, params, (x,))
    slots = places[0]
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    try:
        for name, t in params.items():
            owner, attr, p = slots[name]
            module = model if owner is None else owner
            if module._parameters.get(attr) is not p:  # a parameter replaced: found again next
                _PLACES.pop(model, None)
                break
            module._parameters[attr] = t  # type: ignore[assignment]
            swapped.append((module, attr, p))
        else:
            return model(x)
    finally:
        for module, attr, p in swapped:
            module._parameters[attr] = p
    return functional_call(model, params, (x,))


BATCH_STATISTICS_MODELS = frozenset({"conv4"})
"""Models whose batch norm normalises with each batch's own statistics. A vjp of a gradient
through them (ComFedL-MAML's pullback of the adaptation step, Per-FedAvg's Hessian-vector
product) raises under ``vmap`` in torch 2.14 ("accessing `data` under vmap transform is not
allowed"); grad of grad (FCSG's MAML) does not."""


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
        if name == "resnet20":
            if len(input_shape) != 3:
                raise ConfigError.bad_value(
                    "model.name", name, f"images [C, H, W] for resnet20, got {input_shape}", "mlp"
                )
            return ResNet20(input_shape[0], num_classes)
        if name == "linear":
            return LinearScore(in_features, num_classes)
        if name in ("cnn", "conv4"):
            if len(input_shape) != 3 or hidden < 1:
                raise ConfigError.bad_value(
                    "model.name",
                    name,
                    f"images [C, H, W] and model.hidden >= 1 for {name}, "
                    f"got {input_shape} and {hidden}",
                    "mlp",
                )
            if name == "cnn":
                return SmallCNN(input_shape, num_classes, hidden)
            return Conv4(input_shape[0], num_classes, hidden)
    raise ConfigError.bad_value("model.name", name, f"one of {MODELS}", "logreg")
