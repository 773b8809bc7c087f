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

Task batches are laid out as in :mod:`lit_fedco.data.samplers` (T tasks × N classes × (K + Q)
rows, support first); labels are the class positions 0..N−1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, grad_and_value, vjp, vmap

from lit_fedco.objectives.base import (
    Batch,
    Context,
    Objective,
    Params,
    Problem,
    ProblemParams,
    register_problem,
)
from lit_fedco.objectives.conditional import ConditionalObjective
from lit_fedco.state import tree_map

if TYPE_CHECKING:
    from lit_fedco.data import BatchSampler, FederatedData

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
    """Shared by the objectives of the few-shot task: task batches from
    :class:`~lit_fedco.data.samplers.TaskSampler`, cross-entropy over the N ways, and
    evaluation after ``eval_steps`` adaptation steps on tasks drawn from each client's
    held-out classes.

    Args:
        model: an N-output network (``conv4``).
        ways: N. shots: K. queries: Q (per class).
        inner_lr: α. eval_steps: adaptation steps at evaluation. eval_tasks: tasks per client
            per evaluation.
    """

    def __init__(
        self,
        model: nn.Module,
        ways: int,
        shots: int,
        queries: int,
        inner_lr: float,
        eval_steps: int,
        eval_tasks: int,
    ) -> None:
        super().__init__(model)
        self.ways, self.shots, self.queries = ways, shots, queries
        self.inner_lr, self.eval_steps, self.eval_tasks = inner_lr, eval_steps, eval_tasks

    def task_loss(self, params: Params, x: Tensor, y: Tensor) -> Tensor:
        """Mean cross-entropy of the network on one batch of rows."""
        return F.cross_entropy(functional_call(self.model, params, (x,)), y)

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

    def eval_classes(self, num_classes: int) -> int:
        return self.ways

    def make_sampler(self, data: FederatedData, seed: int) -> BatchSampler:
        from lit_fedco.data import TaskSampler

        return TaskSampler(data, seed, self.ways, self.shots + self.queries)

    def eval_outputs(
        self,
        params: Params,
        x_all: Tensor,
        y_all: Tensor,
        rows: Tensor,
        owner: Tensor,
        chunk: int,
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """Query logits after ``eval_steps`` steps on each task's support set, for
        ``eval_tasks`` tasks per client drawn from its rows with a fixed generator (the same
        tasks at every evaluation). Clients with too few classes are skipped."""
        from lit_fedco.data.samplers import rows_by_class, sample_task_rows

        per_class = self.shots + self.queries
        owners = owner.cpu().numpy()
        for k in np.unique(owners).tolist():
            mine = rows[torch.from_numpy(np.flatnonzero(owners == k)).to(rows.device)]
            by_class = {c: r for c, r in rows_by_class(y_all[mine]).items() if len(r) >= per_class}
            if len(by_class) < self.ways:
                continue
            g = torch.Generator().manual_seed(0xE7A1 * 1_000_003 + k)
            local = sample_task_rows(by_class, self.ways, per_class, self.eval_tasks, g)
            sx, sy, qx, qy = self.split({"x": x_all[mine[local.to(mine.device)]]})

            def one(s: Tensor, q: Tensor) -> Tensor:
                fast = adapt(self.task_loss, params, s, sy, self.inner_lr, self.eval_steps, True)
                return functional_call(self.model, fast, (q,))

            logits = vmap(one)(sx, qx)  # [T, N·Q, N]
            target = qy.repeat(len(sx))
            yield logits.reshape(-1, self.ways), target, torch.full_like(target, k)


class MAML(FewShot, ConditionalObjective):
    """The conditional MAML objective (FCSG eq. 5): inner = adapted parameters per task,
    outer = mean query loss; ``value`` = mean over tasks of :func:`maml_loss`.

    Args:
        inner_steps: adaptation steps in training (paper: 1, α = 0.4).
        first_order: first-order MAML (never the default).
    """

    def __init__(
        self,
        model: nn.Module,
        ways: int,
        shots: int,
        queries: int,
        inner_lr: float,
        inner_steps: int,
        eval_steps: int,
        eval_tasks: int,
        first_order: bool = False,
    ) -> None:
        super().__init__(model, ways, shots, queries, inner_lr, eval_steps, eval_tasks)
        self.inner_steps, self.first_order = inner_steps, first_order

    # The T tasks of a batch are a Python loop, not a vmap: with batch normalisation, grad of a
    # vmap over tasks returns a wrong second-order term (torch 2.14; vmap of grad, as the
    # executors do over clients, is right) — tests/test_maml.py checks against differences.
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
    all rows of the sampled tasks (support and query), labels by position. Evaluated like MAML,
    after the same adaptation steps."""

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        sx, sy, qx, qy = self.split(batches["inner"])
        x = torch.cat([sx, qx], dim=1)
        y = torch.cat([sy, qy])
        return torch.stack([self.task_loss(params, t, y) for t in x.unbind(0)]).mean()


@dataclass(frozen=True)
class MAMLParams(ProblemParams):
    """Federated few-shot learning (FCSG §5.2); data: ``data.partition=classes``.

    Attributes:
        ways: N classes per task (paper: 5).
        shots: K support images per class (paper: 1 and 5).
        queries: Q query images per class (paper: 15).
        inner_lr: α, the adaptation step size (paper: 0.4).
        inner_steps: adaptation steps in training (paper: 1).
        eval_steps: adaptation steps at evaluation (paper: 3).
        eval_tasks: tasks per client and split at each evaluation.
        first_order: first-order MAML instead of the exact second-order meta-gradient.
    """

    ways: int = 5
    shots: int = 1
    queries: int = 15
    inner_lr: float = 0.4
    inner_steps: int = 1
    eval_steps: int = 3
    eval_tasks: int = 10
    first_order: bool = False

    def validate(self) -> None:
        for key in ("ways", "shots", "queries", "inner_steps", "eval_steps", "eval_tasks"):
            self.require(key, getattr(self, key) >= 1, "an int >= 1", "5")
        self.require("ways", self.ways >= 2, "an int >= 2", "5")
        self.require("inner_lr", self.inner_lr > 0, "a float > 0", "0.4")


@register_problem("maml")
class MAMLProblem(Problem):
    """FCSG §5.2: conditional MAML for the FCSG family and Local-SCGD(M), task-level ERM for
    FedAvg; all evaluated by query accuracy after ``eval_steps`` adaptation steps."""

    params_cls = MAMLParams

    def num_outputs(self) -> int:
        p = self.params
        assert isinstance(p, MAMLParams)
        return p.ways

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, MAMLParams)
        common = (p.ways, p.shots, p.queries, p.inner_lr)
        return {
            "conditional": MAML(
                model, *common, p.inner_steps, p.eval_steps, p.eval_tasks, p.first_order
            ),
            "erm": TaskERM(model, *common, p.eval_steps, p.eval_tasks),
        }
