"""ComFedL (Huang, Li, Huang — Compositional Federated Learning, Algorithm 1).

Each cohort client runs I local compositional-gradient steps from the broadcast x̄; the server
averages the results (Algorithm 1 lines 3-20). With inner ``g_k`` and outer ``f_k`` (the paper
names them the other way round) the step at client k is (lines 8-16)::

    y = g_k(x; B)                         # inner value on minibatch B
    u = ∇g_k(x; B)ᵀ ∇f_k(y; B̃)            # one vector-Jacobian product
    x ← x − η u

The estimator u is biased (y is a minibatch value inside a non-linear f). On the client-level
KL-DRO objective (the ``client_dro`` problem), u = exp(L_k(x; B)/γ) ∇L_k(x; B) / γ (paper §3);
see :mod:`lit_fedco.objectives.dro` for the stable form that runs by default.

The personalised-FL variants of §5.2 are the same algorithm on other objectives of the ``pfl``
problem, registered as combinations:

- ``comfedl_maml``: on the MAML composition ``g_k(x; B) = x − α ∇L_k(x; B)``,
  ``f_k(y; B̃) = L_k(y; B̃)`` (ComFedL eq. 7). The step is then
  ``u = (I − α ∇²L_k(x; B)) ∇L_k(x − α ∇L_k(x; B); B̃)``, the exact gradient of the one-task
  MAML loss on (B, B̃): since f_k is the query loss itself, the estimator's bias vanishes.
- ``comfedl_damaml``: on DA-MAML (ComFedL eq. 10),
  ``u = exp(L_k(y; B̃)/γ)/γ · (I − α ∇²L_k(x; B)) ∇L_k(y; B̃)``; in the stable form (default)
  ``exp(L/γ)/γ`` becomes ``exp((L − c)/γ)/Z`` with c and Z shared per round from the cohort's
  post-adaptation losses at the broadcast model: client weights ``K · softmax(L/γ)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor
from torch.func import grad, vjp

from lit_fedco.core.models import BATCH_STATISTICS_MODELS
from lit_fedco.core.protocol import StepInfo
from lit_fedco.core.state import State, tree_axpy, tree_map
from lit_fedco.objectives.base import Batch, Context
from lit_fedco.updaters.base import CompositionalUpdater, register
from lit_fedco.updaters.combine import combine
from lit_fedco.updaters.hparams import Hparams


@register("comfedl")
class ComFedL(CompositionalUpdater[Hparams]):
    """ComFedL, Algorithm 1, on a local compositional objective (client-level KL-DRO by
    default). Each step draws B for the inner value, and B̃ for the outer gradient when f reads
    data. Hyperparameters: η (``lr``; paper §5.1: 0.01); γ and the form belong to the problem
    (``client_dro.gamma``, ``client_dro.form``)."""

    compositions: ClassVar[tuple[str, ...]] = ("local",)
    default_problem: ClassVar[str] = "client_dro"

    def direction(
        self, x: dict[str, Tensor], batches: dict[str, Batch], ctx: Context
    ) -> tuple[dict[str, Tensor], Any]:
        """``u = ∇g(x; B)ᵀ ∇f(g(x; B); B̃)`` and the inner value y (Algorithm 1, line 15)."""
        obj = self.objective
        y, pullback = vjp(lambda p: obj.inner(p, batches["inner"], ctx), x)[:2]
        cot = grad(lambda v: obj.outer(v, batches.get("outer"), ctx))(y)
        (u,) = pullback(cot)
        # With batch norm inside a second-order inner map (MAML), torch.func's pullback returns
        # tensors that still carry a graph; detached, the graph does not grow across steps.
        return tree_map(lambda t: t.detach(), u), y

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        u, y = self.direction(state["x"], batches, ctx)
        logs = self.objective.step_logs(y, batches, ctx)
        return {"x": tree_axpy(-self.hparams.lr, u, state["x"])}, logs


ComFedLMAML = combine(
    "comfedl_maml",
    ComFedL,
    compositions=("local",),
    default_problem="pfl",
    doc="ComFedL-MAML: Algorithm 1 on the MAML composition of the pfl problem (eq. 7, §5.2).",
    unvmappable_models=BATCH_STATISTICS_MODELS,
)
ComFedLDAMAML = combine(
    "comfedl_damaml",
    ComFedL,
    compositions=("damaml",),
    default_problem="pfl",
    doc="ComFedL-DAMAML: Algorithm 1 on DA-MAML (eq. 10, §5.2); γ and the form are pfl's.",
    unvmappable_models=BATCH_STATISTICS_MODELS,
)
