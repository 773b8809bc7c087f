"""Client executors: run one function for every cohort client of this rank.

Both executors call the *same* per-client function (an updater's ``client_step`` or
``probe``); only the batching differs, so their numbers agree to floating-point rounding
(``tests/engine/test_executors.py`` holds them to it).

- :class:`VectorizedExecutor` — ``torch.func.vmap`` over stacked client states and batches, in
  chunks of ``chunk_size`` clients to bound memory. Fast for small models and many clients.
- :class:`SequentialExecutor` — a plain loop over clients. For models that cannot be vmapped
  (data-dependent control flow, in-place buffers, an updater's ``unvmappable_models``) and, on
  the CPU, ResNet-20, where a loop is a little faster and needs a fifth of the memory
  (:func:`choose_executor`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.func import vmap

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.state import index, stack, tree_map

if TYPE_CHECKING:
    from lit_fedco.updaters.base import CompositionalUpdater

ClientFn = Callable[[Any, Any, Any], Any]
"""``fn(state, batches, ctx) -> output`` for one client; outputs are pytrees of tensors."""


class Executor:
    """Runs a per-client function over the leading (client) dimension of stacked inputs."""

    name = "base"
    stacks = False
    """Whether :meth:`map` can run a function written over the stacked clients (``stacked``)."""
    in_place = False
    """Whether the executor runs an updater's in-place step (its :meth:`map` calls ``fn`` on
    views of each client's rows, one client after another)."""

    def __init__(self, chunk_size: int = 0, fast_steps: bool = True) -> None:
        if chunk_size < 0:
            raise ConfigError.bad_value(
                "chunk_size", chunk_size, "an int >= 0 (0: no chunks)", "256"
            )
        self.chunk_size = chunk_size
        self.fast_steps = fast_steps
        """Whether an updater's fast forms of its step run (``client_step_stacked`` on this
        executor's stacked clients, ``client_step_inplace`` into its rows) where it has them;
        False (config ``fast_steps=false``): every step goes through ``client_step``, with the
        same numbers (tested)."""

    def map(
        self, fn: ClientFn, states: Any, batches: Any, ctx: Any, n: int, stacked: bool = False
    ) -> Any:
        """Apply ``fn`` to each of the ``n`` clients; outputs stacked along dim 0. With
        ``stacked`` (executors that :attr:`stacks`), ``fn`` itself takes the stacked clients
        (an updater's ``client_step_stacked``) and the executor only splits them in chunks.

        With ``n = 0`` (a process that runs no client this round but takes part in the
        round's collectives, which need the outputs' shapes) ``fn`` runs once on a phantom
        client of ones (zeros for integer entries) and the outputs come back with 0 rows."""
        if stacked and not self.stacks:
            raise ValueError(f"the {self.name} executor runs clients one by one, not stacked")
        if n > 0:
            return self._map(fn, states, batches, ctx, n, stacked)

        def phantom(v: Tensor) -> Tensor:
            make = torch.ones if v.is_floating_point() else torch.zeros
            return make((1, *v.shape[1:]), dtype=v.dtype, device=v.device)

        rows = None if batches is None else tree_map(phantom, batches)
        out = self._map(fn, tree_map(phantom, states), rows, ctx, 1, stacked)
        return tree_map(lambda v: v[:0], out)

    def _map(self, fn: ClientFn, states: Any, batches: Any, ctx: Any, n: int, stacked: bool) -> Any:
        raise NotImplementedError


class VectorizedExecutor(Executor):
    """All of a rank's cohort clients as one batched computation (``torch.func.vmap``)."""

    name = "vectorized"
    stacks = True

    def _map(self, fn: ClientFn, states: Any, batches: Any, ctx: Any, n: int, stacked: bool) -> Any:
        vfn = (
            fn
            if stacked
            else vmap(fn, in_dims=(0, None if batches is None else 0, None), randomness="error")
        )
        size = self.chunk_size or n
        if size >= n:
            return vfn(states, batches, ctx)
        outs = [
            vfn(
                index(states, slice(i, i + size)),
                None if batches is None else index(batches, slice(i, i + size)),
                ctx,
            )
            for i in range(0, n, size)
        ]
        return tree_map(lambda *ts: torch.cat(ts), *outs)


class SequentialExecutor(Executor):
    """A loop over clients, calling the same per-client function."""

    name = "sequential"
    in_place = True

    def _map(self, fn: ClientFn, states: Any, batches: Any, ctx: Any, n: int, stacked: bool) -> Any:
        outs = [
            fn(index(states, i), None if batches is None else index(batches, i), ctx)
            for i in range(n)
        ]
        return stack(outs)


EXECUTORS: dict[str, type[Executor]] = {
    "vectorized": VectorizedExecutor,
    "sequential": SequentialExecutor,
}


AUTO = "auto"
"""The config value that lets :func:`choose_executor` pick the executor."""
SEQUENTIAL_ON_CPU = frozenset({"resnet20"})
""":func:`lit_fedco.core.models.build_model` names that ``auto`` runs sequentially on the CPU."""
UNVMAPPABLE = frozenset({"char_lstm"})
"""Built-in models that cannot run under ``vmap`` (an LSTM has no batching rule): ``auto`` runs
them sequentially on any device."""


def choose_executor(
    name: str,
    model: str,
    accelerator: str,
    updaters: Sequence[type[CompositionalUpdater]] = (),
) -> str:
    """The executor a run uses: ``name`` itself, or for ``auto`` the one measured faster
    for the model and device (``python -m lit_fedco.benchmarks.throughput``, 1 thread,
    client-steps/s as a fraction of a plain per-client loop's):

    - ``sequential`` for ResNet-20 on the CPU (:data:`SEQUENTIAL_ON_CPU`): 0.73× against
      vectorized 0.68× (8 clients, b = 16; FedAvg's in-place step: 0.97×), with a fifth of the
      memory per client (18 MB against 98 MB).
    - ``vectorized`` for everything else, and for every model on a GPU: 8× the plain loop
      for logistic regression at 100 clients; on Fashion-MNIST with cohort 50, 0.86× and 0.85×
      for the ``cnn`` and ``conv4`` nets against 0.64× and 0.75× sequential (FedAvg, whose
      in-place step runs sequentially, measured 0.87× and 0.82× against 0.89× and 0.88× on
      MNIST; the recipes' other updaters step out of place); on the embedded digits 2–4×
      faster than sequential for the ``cnn`` and ``conv4`` recipes (``fcsg_auprc``,
      ``fcsg_maml``).
    - ``sequential`` for a model that cannot run under ``vmap`` at all (:data:`UNVMAPPABLE`),
      and wherever an updater of the run cannot run under ``vmap`` on the model
      (its ``unvmappable_models``: ComFedL-(DA)MAML and FedMAML on ``conv4``), on any device.

    Args:
        name: the config's ``executor``.
        model: the config's ``model.name``.
        accelerator: the config's ``accelerator`` (``auto``: a GPU when one is visible).
        updaters: the run's updater classes.
    """
    if name != AUTO:
        return name
    if model in UNVMAPPABLE or any(model in u.unvmappable_models for u in updaters):
        return "sequential"
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    return "sequential" if on_cpu and model in SEQUENTIAL_ON_CPU else "vectorized"


def make_executor(name: str, chunk_size: int = 0, fast_steps: bool = True) -> Executor:
    """The executor called ``name`` (config key ``executor``; ``auto`` must have been
    resolved by :func:`choose_executor`), running updaters' fast step forms where
    ``fast_steps`` (config ``fast_steps``)."""
    if name not in EXECUTORS:
        raise ConfigError.bad_value("executor", name, f"one of {sorted([AUTO, *EXECUTORS])}", AUTO)
    return EXECUTORS[name](chunk_size, fast_steps)
