"""The models: the recipes' small networks, a researcher's own (``model.name=MODULE:NAME``), and
the stateless forwards the objectives call.

The model's state is a plain dict: its parameters and, for a model with batch normalisation,
its running statistics (``running_mean`` / ``running_var`` of every ``_BatchNorm`` that tracks
them: :func:`~lit_fedco.core.model_stats.running_stats`). Training forwards normalise with each
batch's own statistics and leave the running ones untouched (:func:`call`); the round updates
them after every local step from the step's batch
(:func:`~lit_fedco.core.model_stats.updated_stats`), and evaluation, in eval mode, normalises
with them. Every other buffer stays in the module, read-only.

The running statistics live in :mod:`lit_fedco.core.model_stats`, the parameter swap of a
module's own forward in :mod:`lit_fedco.core.swap`, and a researcher's model
(``MODULE:NAME``) in :mod:`lit_fedco.core.user_models`; the names other code imports from here
are re-exported."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.model_stats import call_with_stats
from lit_fedco.core.model_stats import model_state as model_state
from lit_fedco.core.model_stats import running_stats as running_stats
from lit_fedco.core.model_stats import set_model_state as set_model_state
from lit_fedco.core.model_stats import updated_stats as updated_stats
from lit_fedco.core.swap import Params, swapped_call
from lit_fedco.core.user_models import MODEL_BUFFERS as MODEL_BUFFERS
from lit_fedco.core.user_models import MODEL_KEYS as MODEL_KEYS
from lit_fedco.core.user_models import build_user_model
from lit_fedco.core.user_models import is_model_ref as is_model_ref
from lit_fedco.core.user_models import model_factory as model_factory


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


class CharLSTM(nn.Module):
    """A character-level next-token model (LEAF's Shakespeare, Caldas et al. 2018): an
    embedding of 8 dimensions, a two-layer LSTM of ``hidden`` units and a linear layer on the
    last position's output. Inputs are token ids ``[b, L]`` (int64), outputs ``[b, V]``. An
    LSTM has no ``vmap`` rule in torch, so ``executor=auto`` runs it sequentially."""

    def __init__(self, vocab: int, outputs: int, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.lstm = nn.LSTM(8, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x.long()))
        return self.head(out[:, -1])


MODELS = ("logreg", "mlp", "resnet20", "linear", "cnn", "conv4", "char_lstm")


# ---------------------------------------------------------------------- stateless forwards
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
    (:data:`STATELESS`) the same forward over the dict directly; for a model with running
    statistics (:func:`running_stats`) its ``forward`` through ``functional_call`` (in train
    mode on copies of the statistics, which the forward updates and this call drops: the
    output and its gradient are a plain training forward's, and no tensor of ``params`` is
    written; in eval mode on the statistics themselves); else the module's own ``forward``
    with ``params`` in place of its parameters (:func:`~lit_fedco.core.swap.swapped_call`)."""
    fast = STATELESS.get(type(model))
    if fast is not None:
        return fast(model, params, x)
    if running_stats(model):
        return call_with_stats(model, params, x)
    return swapped_call(model, params, x)


def draws_randomly(model: nn.Module) -> bool:
    """Whether ``model``'s training forward draws random numbers (it holds a dropout module):
    the round then seeds each client's forwards by (seed, client, round, step)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())


BATCH_STATISTICS_MODELS = frozenset({"conv4"})
"""Models whose batch norm normalises with each batch's own statistics. A vjp of a gradient
through them (ComFedL-MAML's pullback of the adaptation step, Per-FedAvg's Hessian-vector
product) raises under ``vmap`` in torch 2.14 ("accessing `data` under vmap transform is not
allowed"); grad of grad (FCSG's MAML) does not."""


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    hidden: int = 64,
    params: dict[str, Any] | None = None,
) -> nn.Module:
    """Build a model with parameters drawn from a generator seeded by ``seed``: a built-in
    name (:data:`MODELS`) or a researcher's ``MODULE:NAME`` (:func:`build_user_model`, with
    ``params`` its ``model.*`` keys).

    The global RNG is left untouched (``torch.random.fork_rng``).
    """
    if is_model_ref(name):
        return build_user_model(name, input_shape, num_classes, seed, params)
    in_features = math.prod(input_shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "char_lstm":
            if len(input_shape) != 1 or hidden < 1:
                raise ConfigError.bad_value(
                    "model.name", name,
                    f"token sequences [L] (data.name=text) and model.hidden >= 1, got "
                    f"{list(input_shape)} and {hidden}", "mlp",
                )  # fmt: skip
            return CharLSTM(num_classes, num_classes, hidden)
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
