"""Model-agnostic meta-learning as a conditional problem (FCSG §5.2, eq. 5; Finn et al. 2017).

A task ξ = (task i, query set Q_i) is drawn first and its support set η = S_i is drawn given
the task. With the adapted parameters ``g(x; S) = x − α ∇L(x; S)`` (the mean over the support
samples of ``x − α ∇L(x; s)``: the plug-in inner mean of FCSG) and ``f_ξ(y) = L(y; Q)``::

    F̂(x) = mean over the batch's tasks of L(x − α ∇L(x; S_i); Q_i),
    ∇F̂(x) = mean_i (I − α ∇²L(x; S_i)) ∇L(y_i; Q_i).

:func:`maml_loss` is the one implementation of this meta-objective: ``torch.func.grad`` of it
differentiates through the inner gradient (Hessian-vector products, the exact second-order
meta-gradient); ``first_order=True`` stops the gradient at the inner gradient (first-order
MAML: ∇F̂ ≈ mean_i ∇L(y_i; Q_i)). It takes any per-batch loss ``loss(params, x, y)``, so other
updaters (ComFedL-MAML) reuse it.

Task batches are laid out as :class:`~lit_fedco.data.TaskSampler` draws them (T tasks ×
N classes × (K + Q) rows, support first); labels are the class positions 0..N−1. The ``maml``
problem (:mod:`lit_fedco.problems.fewshot`) draws them and evaluates after adaptation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import grad, grad_and_value, vjp

from lit_fedco.core.models import call
from lit_fedco.core.state import tree_map
from lit_fedco.objectives.base import Batch, Context, Objective, Params
from lit_fedco.objectives.conditional import ConditionalObjective

LossFn = Callable[[Params, Tensor, Tensor], Tensor]
"""``loss(params, inputs, labels) -> scalar`` (the mean loss of a batch)."""


def adapt(
    loss: LossFn,
    params: Params,
    x: Tensor,
    y: Tensor,
    lr: float,
    steps: int = 1,
    first_order: bool = False,
) -> Params:
    """``steps`` gradient steps ``x ← x − α ∇L(x; S)`` on the support set (x, y).

    Differentiable in ``params`` (through the inner gradients) unless ``first_order``, which
    detaches each inner gradient (first-order MAML).
    """
    for _ in range(steps):
        g = grad(loss)(params, x, y)
        if first_order:
            g = tree_map(lambda t: t.detach(), g)
        params = tree_map(lambda p, d: p - lr * d, params, g)
    return params


def maml_loss(
    loss: LossFn,
    params: Params,
    support: tuple[Tensor, Tensor],
    query: tuple[Tensor, Tensor],
    lr: float,
    steps: int = 1,
    first_order: bool = False,
) -> Tensor:
    """The meta-objective of one task, ``L(x − α ∇L(x; S); Q)`` (FCSG eq. 5 for one ξ)."""
    return loss(adapt(loss, params, *support, lr, steps, first_order), *query)


def per_fedavg_direction(
    loss: LossFn,
    params: Params,
    support: tuple[Tensor, Tensor],
    query: tuple[Tensor, Tensor],
    hessian: tuple[Tensor, Tensor],
    lr: float,
    first_order: bool = False,
) -> tuple[Params, Tensor]:
    """Per-FedAvg's stochastic meta-gradient (Fallah, Mokhtari, Ozdaglar 2020, Algorithm 1)::

        y = x − α ∇L(x; D)                        (one adaptation step on D)
        u = (I − α ∇²L(x; D″)) ∇L(y; D′)           (the Hessian on a third batch D″)

    one Hessian-vector product. With D″ = D this is ``grad`` of :func:`maml_loss` on (D, D′),
    the exact meta-gradient of the sampled task (tested); the independent D″ is Per-FedAvg's
    choice. ``first_order`` drops the Hessian term (Per-FedAvg (FO): u = ∇L(y; D′)).

    Returns:
        u and the post-adaptation query loss ``L(y; D′)``.
    """
    y = adapt(loss, params, *support, lr, 1, first_order=True)  # ∇L(y; D′) is taken at y itself
    g_query, value = grad_and_value(loss)(y, *query)
    if first_order:
        return g_query, value
    hvp = vjp(lambda p: grad(loss)(p, *hessian), params)[1]
    (h,) = hvp(g_query)
    return tree_map(lambda g, hv: (g - lr * hv).detach(), g_query, h), value


def relative_labels(ways: int, per_class: int, device: torch.device | None = None) -> Tensor:
    """``[0]*per_class + [1]*per_class + ...``: the labels of one task's rows by position."""
    return torch.arange(ways, device=device).repeat_interleave(per_class)


class FewShot(Objective):
    """Shared by the objectives of the few-shot task: task batches (T tasks × N classes ×
    (K + Q) rows, support first) and cross-entropy over the N ways, labels by position.

    Args:
        model: an N-output network (``conv4``).
        ways: N. shots: K. queries: Q (per class).
    """

    def __init__(self, model: nn.Module, ways: int, shots: int, queries: int) -> None:
        super().__init__(model)
        self.ways, self.shots, self.queries = ways, shots, queries

    def task_loss(self, params: Params, x: Tensor, y: Tensor) -> Tensor:
        """Mean cross-entropy of the network on one batch of rows."""
        return F.cross_entropy(call(self.model, params, x), y)

    def split(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Support inputs [T, N·K, ...], support labels [N·K], query inputs [T, N·Q, ...] and
        query labels [N·Q] of a task batch."""
        x = batch["x"]
        n, k, q = self.ways, self.shots, self.queries
        tasks = x.reshape(-1, n, k + q, *x.shape[1:])
        sx = tasks[:, :, :k].reshape(len(tasks), n * k, *x.shape[1:])
        qx = tasks[:, :, k:].reshape(len(tasks), n * q, *x.shape[1:])
        return sx, relative_labels(n, k, x.device), qx, relative_labels(n, q, x.device)

    def num_outer(self, batch: Batch) -> int:
        return int(batch["x"].shape[0]) // (self.ways * (self.shots + self.queries))


class MAML(FewShot, ConditionalObjective):
    """The conditional MAML objective (FCSG eq. 5): inner = adapted parameters per task,
    outer = mean query loss; ``value`` = mean over tasks of :func:`maml_loss`.

    Args:
        model, ways, shots, queries: as :class:`FewShot`.
        inner_lr: α (paper: 0.4). inner_steps: adaptation steps in training (paper: 1).
        first_order: first-order MAML (never the default).
    """

    def __init__(
        self,
        model: nn.Module,
        ways: int,
        shots: int,
        queries: int,
        inner_lr: float,
        inner_steps: int = 1,
        first_order: bool = False,
    ) -> None:
        super().__init__(model, ways, shots, queries)
        self.inner_lr, self.inner_steps, self.first_order = inner_lr, inner_steps, first_order

    # The T tasks of a batch are a Python loop, not a vmap: with batch normalisation, grad of a
    # vmap over tasks returns a wrong second-order term (torch 2.14; vmap of grad, as the
    # executors do over clients, is right) — tests/objectives/test_maml.py checks against
    # differences.
    def inner(self, params: Params, batch: Batch, ctx: Context) -> Any:
        """``x − α ∇L(x; S_i)`` for every task i, leaves of leading size T."""
        sx, sy, _, _ = self.split(batch)
        hp = (self.inner_lr, self.inner_steps, self.first_order)
        fast = [adapt(self.task_loss, params, s, sy, *hp) for s in sx.unbind(0)]
        return tree_map(lambda *ts: torch.stack(ts), *fast)

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """``mean_i L(y_i; Q_i)``."""
        assert batch is not None
        _, _, qx, qy = self.split(batch)
        losses = [
            self.task_loss(tree_map(lambda t: t[i], y), q, qy) for i, q in enumerate(qx.unbind(0))
        ]
        return torch.stack(losses).mean()

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        """``mean_i maml_loss(x; S_i, Q_i)`` over the batch's tasks."""
        sx, sy, qx, qy = self.split(batches["inner"])
        hp = (self.inner_lr, self.inner_steps, self.first_order)
        losses = [
            maml_loss(self.task_loss, params, (s, sy), (q, qy), *hp)
            for s, q in zip(sx.unbind(0), qx.unbind(0), strict=True)
        ]
        return torch.stack(losses).mean()

    def describe(self) -> dict[str, Any]:
        return {"objective": "MAML", "first_order": self.first_order}


class TaskERM(FewShot):
    """FedAvg's objective on the few-shot task: the cross-entropy of the unadapted network on
    all rows of the sampled tasks (support and query), labels by position. The ``maml``
    problem evaluates it like MAML, after the same adaptation steps."""

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        sx, sy, qx, qy = self.split(batches["inner"])
        x = torch.cat([sx, qx], dim=1)
        y = torch.cat([sy, qy])
        return torch.stack([self.task_loss(params, t, y) for t in x.unbind(0)]).mean()
