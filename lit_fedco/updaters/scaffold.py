"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh 2020, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", Algorithm 1, option II).

The server keeps a control variate c, each client its own c_i (kept across rounds, zero before
its first round). Client i corrects its local gradient by ``c − c_i``, an estimate of the drift
between its gradient and the federation's, so that heterogeneous clients step as if on the
average objective::

    server sends (x, c)                                                     (line 5)
    client i:  y_i ← x
               for k = 1..K:  y_i ← y_i − η_l (g_i(y_i) − c_i + c)           (lines 7-10)
               c_i⁺ ← c_i − c + (x − y_i) / (K η_l)                          (line 12, option II)
               sends (Δy_i, Δc_i) = (y_i − x, c_i⁺ − c_i);  c_i ← c_i⁺        (lines 13-14)
    server:    x ← x + η_g mean Δy_i,   c ← c + (|S| / N) mean Δc_i          (lines 16-17)

Here a client uploads y_i itself, whose mean is ``x + mean Δy_i``; η_g is the run's server
optimizer (``server_opt.name=sgd server_opt.lr=η_g``; none: η_g = 1). |S| is the number of
clients whose upload arrived (``info.participants``) and N the federation's K. A client that
stops early (``failures.partial``) divides by the steps it completed.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from lit_fedco.core.protocol import RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.state import State, foreach_axpy_, own_storage, tree_map
from lit_fedco.objectives.base import Batch, Context
from lit_fedco.updaters.base import CompositionalUpdater, register
from lit_fedco.updaters.hparams import Hparams


@register("scaffold")
class Scaffold(CompositionalUpdater[Hparams]):
    """SCAFFOLD, Algorithm 1 option II: local SGD corrected by ``c − c_i`` (module docstring).

    Hyperparameters: η_l (``lr``); η_g is the server optimizer's (``server_opt``).
    """

    compositions: ClassVar[tuple[str, ...]] = ("erm",)
    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "c_i": Sync.KEEP, "dc": Sync.ROUND}
    broadcast_keys: ClassVar[tuple[str, ...]] = ("x", "c")

    def init_server(self, params: dict[str, Tensor], num_clients: int) -> State:
        """x⁰ and the server's control variate c = 0."""
        return {"x": {k: v.clone() for k, v in params.items()},
                "c": {k: torch.zeros_like(v) for k, v in params.items()}}  # fmt: skip

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        """``y_i ← y_i − η_l (g_i(y_i) − c_i + c)`` (line 10)."""
        g, loss = self.loss_gradient(state["x"], batches, ctx)
        return self._corrected(state, g), {"loss": loss}

    def client_step_stacked(
        self, states: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        """:meth:`client_step` of the vectorized executor's clients at once (the gradients of
        one stacked forward and backward; the same arithmetic row by row)."""
        g, loss = self.loss_gradient(states["x"], batches, ctx, stacked=True)
        return self._corrected(states, g), {"loss": loss}

    def _corrected(self, state: State, g: State) -> State:
        """``state`` with ``y ← y − η_l (g − c_i + c)``: one client's, or stacked clients'."""
        lr = self.hparams.lr
        x = tree_map(lambda y, gi, ci, c: y - lr * (gi - ci + c), state["x"], g, state["c_i"],
                     state["c"])  # fmt: skip
        return {**state, "x": x}

    def client_step_inplace(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> dict[str, Tensor]:
        """:meth:`client_step` written into the client's rows: the same operations in the same
        order (``g − c_i``, ``+ c``, ``· η_l``, then subtracted from y: added as ``(−η_l) d``,
        the same number)."""
        g, loss = self.loss_gradient(state["x"], batches, ctx)
        own = own_storage(list(g.values()), list(state["x"].values()))  # written over if so
        ds = []
        for k in state["x"]:
            d = g[k].sub_(state["c_i"][k]) if own else g[k] - state["c_i"][k]
            ds.append(d.add_(state["c"][k]))
        foreach_axpy_(-self.hparams.lr, ds, list(state["x"].values()))
        return {"loss": loss}

    def client_end(self, state: State, start: State, ctx: Context, steps: Tensor) -> State:
        """``c_i⁺ = c_i − c + (x − y_i) / (K η_l)`` (line 12, option II); uploads Δc_i and
        keeps c_i⁺."""
        scale = 1.0 / (steps * self.hparams.lr)
        c_new = tree_map(lambda ci, c, x, y: ci - c + (x - y) * scale, state["c_i"], state["c"],
                         start["x"], state["x"])  # fmt: skip
        dc = tree_map(torch.sub, c_new, state["c_i"])
        return {"x": state["x"], "c_i": c_new, "dc": dc}

    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """``x ← mean y_i``, ``c ← c + (|S| / N) mean Δc_i`` (lines 16-17)."""
        share = (info.participants or info.cohort_size) / info.num_clients
        c = tree_map(lambda c, d: c + share * d, server["c"], mean["dc"])
        return {**server, "x": mean["x"], "c": c}
