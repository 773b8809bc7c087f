"""The models: the recipes' small networks, a researcher's own (``model.name=MODULE:NAME``), and
the stateless forwards the objectives call.

The model's state is a plain dict: its parameters and, for a model with batch normalisation,
its running statistics (``running_mean`` / ``running_var`` of every ``_BatchNorm`` that tracks
them: :func:`running_stats`). Training forwards normalise with each batch's own statistics and
leave the running ones untouched (:func:`call`); the round updates them after every local step
from the step's batch (:func:`updated_stats`), and evaluation, in eval mode, normalises with
them. Every other buffer stays in the module, read-only."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from lit_fedco.core.autodiff import transformed
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.imports import import_module


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
    (:data:`STATELESS`) the same forward over the dict directly; for a model with running
    statistics (:func:`running_stats`) its ``forward`` through ``functional_call`` (in train
    mode on copies of the statistics, which the forward updates and this call drops: the
    output and its gradient are a plain training forward's, and no tensor of ``params`` is
    written; in eval mode on the statistics themselves); else the module's own ``forward``
    with ``params`` in place of its parameters (:func:`_swapped_call`)."""
    fast = STATELESS.get(type(model))
    if fast is not None:
        return fast(model, params, x)
    if running_stats(model):
        return _call_with_stats(model, params, x)
    return _swapped_call(model, params, x)


# ---------------------------------------------------------------------- running statistics
_STATS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[str, ...], tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _stats_names(model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of ``model``'s running statistics and of their ``num_batches_tracked``
    counters, found once per model."""
    found = _STATS.get(model)
    if found is None:
        stats: list[str] = []
        counters: list[str] = []
        for prefix, m in model.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                dot = f"{prefix}." if prefix else ""
                stats += [f"{dot}running_mean", f"{dot}running_var"]
                counters.append(f"{dot}num_batches_tracked")
        found = (tuple(stats), tuple(counters))
        _STATS[model] = found
    return found


def draws_randomly(model: nn.Module) -> bool:
    """Whether ``model``'s training forward draws random numbers (it holds a dropout module):
    the round then seeds each client's forwards by (seed, client, round, step)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())


def running_stats(model: nn.Module) -> tuple[str, ...]:
    """The names of ``model``'s running statistics (``running_mean`` and ``running_var`` of
    every batch norm that tracks them), which are part of its state dict (:func:`model_state`);
    empty for a model without them (every built-in model)."""
    return _stats_names(model)[0]


def check_running_stats(model: nn.Module, where: str) -> None:
    """Refuse batch norms whose running statistics are cumulative averages (``momentum=None``):
    their update depends on a count of batches that the federated state does not carry.

    Raises:
        ConfigError: naming ``where`` (the config key) and the module.
    """
    for prefix, m in model.named_modules():
        bn = isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        if bn and m.momentum is None:
            raise ConfigError(
                f"{where}: the model's batch norm {prefix or type(m).__name__!r} has "
                "momentum=None (a cumulative average of its statistics), which federated "
                "training cannot carry; give it a momentum (e.g. the default 0.1)",
                key=where,
            )


_CAPTURE: weakref.WeakKeyDictionary[nn.Module, list[Any]] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def capturing_stats(model: nn.Module) -> Iterator[list[Any]]:
    """Within it, the first training forward of ``model`` run outside every ``torch.func``
    transform records ``(inputs, the running statistics it left, the tensors it started
    from)`` in the yielded list: a step's own forward gives the statistics the round would
    otherwise compute with a forward of its own (:func:`updated_stats`)."""
    slot: list[Any] = []
    _CAPTURE[model] = slot
    try:
        yield slot
    finally:
        _CAPTURE.pop(model, None)


def _buffer_slot(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, attr = name.split(".")
    module = model
    for step in path:
        module = module._modules[step]  # type: ignore[assignment]
    return module, attr


def _call_with_stats(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """:func:`call` of a model with running statistics: the statistics of ``params`` (train
    mode: fresh copies, and fresh counters, which the forward updates) put in the batch norms'
    buffers for the forward and the module's own put back after it; the parameters swapped as
    :func:`_swapped_call` swaps them."""
    stats, counters = _stats_names(model)
    values = _with_stats_copies(model, params)
    plain = {k: v for k, v in params.items() if k not in stats}
    swapped: list[tuple[nn.Module, str, Any]] = []
    try:
        for name in (*stats, *counters) if model.training else stats:
            module, attr = _buffer_slot(model, name)
            swapped.append((module, attr, module._buffers[attr]))
            module._buffers[attr] = values[name]
        out = _swapped_call(model, plain, x)
    finally:
        for module, attr, own in reversed(swapped):
            module._buffers[attr] = own
    slot = _CAPTURE.get(model)
    if slot is not None and not slot and model.training and not transformed():
        slot.append((x, {n: values[n] for n in stats}, {n: params[n] for n in stats}))
    return out


def _with_stats_copies(model: nn.Module, params: Params) -> Params:
    """``params`` with, in train mode, fresh copies of the running statistics (and counters)
    for a forward to update; in eval mode the statistics themselves, detached."""
    stats, counters = _stats_names(model)
    out = dict(params)
    if not model.training:  # read, never written; not differentiated (an adapted model's are
        for name in stats:  # computed from the parameters under autograd)
            out[name] = params[name].detach()
        return out
    for name in stats:
        out[name] = params[name].detach().clone()
    for name in counters:
        out[name] = torch.zeros((), dtype=torch.long)
    return out


def updated_stats(model: nn.Module, params: Params, x: torch.Tensor) -> Params:
    """The running statistics after one training forward of ``model`` on ``x`` under
    ``params`` (which holds the statistics before it): what a plain PyTorch loop's forward
    leaves in the batch norms' buffers, ``r ← (1 − momentum)·r + momentum·batch statistic``.
    Computed without gradients; works under ``vmap`` (each client its own statistics)."""
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            copies = _with_stats_copies(model, params)
            functional_call(model, copies, (x,))
    finally:
        model.train(was_training)
    return {name: copies[name] for name in running_stats(model)}


def captured_stats(
    slot: list[Any], model: nn.Module, params: Params, x: torch.Tensor
) -> Params | None:
    """The statistics :func:`capturing_stats` recorded in ``slot``, if its forward was the one
    :func:`updated_stats` would run: on ``x`` itself, from the statistics of ``params`` (the
    same tensors, or views of the same memory); else None."""
    if not slot:
        return None
    inputs, stats, sources = slot[0]
    same_inputs = inputs is x or (
        inputs.data_ptr() == x.data_ptr() and inputs.shape == x.shape
        and inputs.stride() == x.stride()
    )  # fmt: skip
    if not same_inputs:
        return None
    for name, source in sources.items():
        own = params[name]
        if source is not own and (source.data_ptr() != own.data_ptr() or source.shape != own.shape):
            return None
    return dict(stats)


def model_state(model: nn.Module, dtype: torch.dtype | None = None) -> Params:
    """Detached copies of ``model``'s parameters and then its running statistics
    (:func:`running_stats`), as one plain dict: a client's model state."""
    out = {name: p.detach().clone().to(dtype or p.dtype) for name, p in model.named_parameters()}
    buffers = dict(model.named_buffers())
    for name in running_stats(model):
        b = buffers[name]
        out[name] = b.detach().clone().to(dtype or b.dtype)
    return out


def set_model_state(model: nn.Module, state: Params) -> None:
    """Make ``state`` (:func:`model_state`'s layout) the model's parameters and running
    statistics (copies, in their own dtype)."""
    own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name, value in state.items():
        own[name].data = value.detach().clone().to(own[name].device)


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


def is_model_ref(name: str) -> bool:
    """Whether ``model.name`` names a researcher's model, ``MODULE:NAME``."""
    return ":" in name


def model_factory(ref: str) -> tuple[Callable[..., nn.Module], type | None]:
    """The class or factory ``MODULE:NAME`` names, and its parameters' dataclass (its
    ``Params`` attribute, a frozen dataclass whose fields are ``model.*`` keys; None if it
    declares none).

    Raises:
        ConfigError: (key ``model.name``) a module that cannot be imported, a missing name, or
            a name that is neither an ``nn.Module`` class nor a callable.
    """
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr.isidentifier():
        raise ConfigError.bad_value(
            "model.name", ref, "one of the built-in names or MODULE:NAME", "my_models:MyCNN"
        )
    module = import_module(module_name, "model.name")
    obj = getattr(module, attr, None)
    if obj is None or not callable(obj):
        found = sorted(
            k for k, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == module.__name__
        )  # fmt: skip
        what = "no" if obj is None else f"a non-callable {type(obj).__name__}"
        raise ConfigError(
            f"model.name: module {module_name!r} has {what} {attr!r} (its nn.Module classes: "
            f"{', '.join(found) or 'none'}); name an nn.Module class or a factory function, "
            f"e.g. model.name={module_name}:{found[0] if found else 'MyNet'}",
            key="model.name",
        )
    params_cls = getattr(obj, "Params", None)
    if params_cls is not None and not dataclasses.is_dataclass(params_cls):
        raise ConfigError(
            f"model.name: {ref}.Params is a {type(params_cls).__name__}, expected a dataclass "
            "(its fields are the model.* keys); decorate it with @dataclasses.dataclass",
            key="model.name",
        )
    if isinstance(params_cls, type):
        for f in dataclasses.fields(params_cls):
            no_default = f.default is dataclasses.MISSING
            if no_default and f.default_factory is dataclasses.MISSING:
                raise ConfigError(
                    f"model.name: {ref}.Params.{f.name} has no default; give every field of "
                    "Params a default (the model.* key's value when none is set)",
                    key="model.name",
                )
            if f.name in MODEL_KEYS:
                raise ConfigError(
                    f"model.name: {ref}.Params.{f.name} clashes with lit_fedco's own key "
                    f"model.{f.name}; rename the field (lit_fedco's keys: "
                    f"{', '.join(MODEL_KEYS)})",
                    key="model.name",
                )
        return obj, params_cls
    return obj, None


MODEL_BUFFERS = ("average", "local")
"""``model.buffers``: running statistics averaged like the parameters, or kept per client."""
MODEL_KEYS = ("name", "hidden", "buffers")
"""lit_fedco's own ``model.*`` keys, which a researcher's ``Params`` may not reuse."""


def build_user_model(
    ref: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    params: dict[str, Any] | None = None,
) -> nn.Module:
    """Build a researcher's model ``MODULE:NAME``: ``NAME(input_shape, num_classes)`` with
    ``seed=`` and ``params=`` (its ``Params`` built from ``params``, the ``model.*`` keys)
    passed too when its signature takes them, under a generator seeded by ``seed``; its
    output for two rows of zeros must be ``[2, num_classes]``.

    Raises:
        ConfigError: (key ``model.name``) see :func:`model_factory`; a call that fails; a
            result that is not an ``nn.Module``, or outputs of the wrong shape.
    """
    factory, params_cls = model_factory(ref)
    kwargs: dict[str, Any] = {}
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        accepted = {}  # type: ignore[assignment]
    if "seed" in accepted:
        kwargs["seed"] = seed
    if params_cls is not None and "params" in accepted:
        names = {f.name for f in dataclasses.fields(params_cls)}
        kwargs["params"] = params_cls(**{k: v for k, v in (params or {}).items() if k in names})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = factory(tuple(input_shape), num_classes, **kwargs)
        except ConfigError:
            raise
        except Exception as err:
            first = (str(err).splitlines() or [""])[0][:200]
            raise ConfigError(
                f"model.name: {ref}(input_shape={tuple(input_shape)}, num_classes="
                f"{num_classes}{', seed=...' if 'seed' in kwargs else ''}"
                f"{', params=...' if 'params' in kwargs else ''}) raised {type(err).__name__}: "
                f"{first}; a model is built as NAME(input_shape, num_classes[, seed][, params])",
                key="model.name",
            ) from None
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.name: {ref} returned a {type(model).__name__}, expected a torch.nn.Module",
            key="model.name",
        )
    check_running_stats(model, "model.name")
    _check_outputs(model, ref, input_shape, num_classes)
    return model


def _check_outputs(
    model: nn.Module, ref: str, input_shape: tuple[int, ...], num_classes: int
) -> None:
    """One eval-mode forward of two rows of zeros (token id 0 for integer inputs) must give
    ``[2, num_classes]``."""
    p = next(model.parameters(), None)
    dtype = p.dtype if p is not None else torch.get_default_dtype()
    x = torch.zeros((2, *input_shape), dtype=dtype)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                out = model(x)
            except Exception:  # token inputs (an embedding) take integer ids
                out = model(x.long())
    except Exception as err:
        first = (str(err).splitlines() or [""])[0][:200]
        raise ConfigError(
            f"model.name: {ref} fails on inputs of the data's shape [2, "
            f"{', '.join(map(str, input_shape))}] ({type(err).__name__}: {first}); make its "
            "forward take the data set's rows",
            key="model.name",
        ) from None
    finally:
        model.train(was_training)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
    if shape != (2, num_classes):
        raise ConfigError(
            f"model.name: {ref} gives outputs of shape {list(shape) if shape else type(out)} "
            f"for 2 rows, expected [2, {num_classes}] (one output per class of the data); "
            "make its last layer's size the num_classes it is built with",
            key="model.name",
        )


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
