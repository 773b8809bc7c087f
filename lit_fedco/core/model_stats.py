"""Batch-norm running statistics of a model's state dict.

The model's state is a plain dict: its parameters and, for a model with batch normalisation,
its running statistics (``running_mean`` / ``running_var`` of every ``_BatchNorm`` that tracks
them: :func:`running_stats`). Training forwards normalise with each batch's own statistics and
leave the running ones untouched (:func:`call_with_stats`); the round updates them after every
local step from the step's batch (:func:`updated_stats`), and evaluation, in eval mode,
normalises with them. Every other buffer stays in the module, read-only."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from lit_fedco.core.autodiff import transformed
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.swap import Params, swapped_call

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


def call_with_stats(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """:func:`~lit_fedco.core.models.call` of a model with running statistics: the statistics
    of ``params`` (train mode: fresh copies, and fresh counters, which the forward updates) put
    in the batch norms' buffers for the forward and the module's own put back after it; the
    parameters swapped as :func:`~lit_fedco.core.swap.swapped_call` swaps them."""
    stats, counters = _stats_names(model)
    values = _with_stats_copies(model, params)
    plain = {k: v for k, v in params.items() if k not in stats}
    swapped: list[tuple[nn.Module, str, Any]] = []
    try:
        for name in (*stats, *counters) if model.training else stats:
            module, attr = _buffer_slot(model, name)
            swapped.append((module, attr, module._buffers[attr]))
            module._buffers[attr] = values[name]
        out = swapped_call(model, plain, x)
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
