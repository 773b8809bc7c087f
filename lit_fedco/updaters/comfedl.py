"""ComFedL (Huang, Li, Huang — Compositional Federated Learning, Algorithm 1).

Each cohort client runs I local compositional-gradient steps from the broadcast x̄; the server
averages the results (Algorithm 1 lines 3-20). With inner ``g_k`` and outer ``f_k`` (the paper
names them the other way round) the step at client k is (lines 8-16)::

    y = g_k(x; B)                         # inner value on minibatch B
    u = ∇g_k(x; B)ᵀ ∇f_k(y; B̃)            # one vector-Jacobian product
    x ← x − η u

The estimator u is biased (y is a minibatch value inside a non-linear f). On the client-level
KL-DRO objective, u = exp(L_k(x; B)/γ) ∇L_k(x; B) / γ (paper §3); see
:mod:`lit_fedco.objectives.dro` for the stable form that ran by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn
from torch.func import grad, vjp

from lit_fedco.errors import ConfigError
from lit_fedco.objectives.base import Batch, Context, Objective
from lit_fedco.objectives.dro import FORMS, ClientKLDRO, exp_outer
from lit_fedco.objectives.personalized import DAMAML, MetaLearning, PFLParams
from lit_fedco.state import State, tree_axpy, tree_map
from lit_fedco.updaters.base import CompositionalUpdater, H, Hparams, register


@dataclass(frozen=True)
class ComFedLHparams(Hparams):
    """ComFedL hyperparameters.

    Attributes:
        lr: η, the client step size (paper §5.1: 0.01).
        gamma: γ, the KL regularisation of the DRO objective (paper §5.1: 0.5; grid 0.1-5).
        form: ``"stable"`` (shared log-space shift and normaliser; default) or ``"literal"``
            (exp(L/γ)/γ as in the paper).
    """

    gamma: float = 0.5
    form: str = "stable"

    def validate(self) -> None:
        super().validate()
        self.require("gamma", self.gamma > 0, "a float > 0", "0.5")
        self.require("form", self.form in FORMS, f"one of {FORMS}", "stable")


@register("comfedl")
class ComFedL(CompositionalUpdater[H]):
    """ComFedL, Algorithm 1, on a local compositional objective (KL-DRO by default). Each
    step draws B for the inner value, and B̃ for the outer gradient when f reads data."""

    hparams_cls: ClassVar[type[Hparams]] = ComFedLHparams
    compositions: ClassVar[tuple[str, ...]] = ("local",)

    def build_objective(self, model: nn.Module) -> Objective:
        hp = self.hparams
        assert isinstance(hp, ComFedLHparams)
        return ClientKLDRO(model, gamma=hp.gamma, form=hp.form)

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
        self, state: State, batches: dict[str, Batch], ctx: Context, step: int
    ) -> tuple[State, dict[str, Tensor]]:
        u, y = self.direction(state["x"], batches, ctx)
        logs = {"loss": y} if isinstance(y, Tensor) and y.dim() == 0 else {}
        return {"x": tree_axpy(-self.hparams.lr, u, state["x"])}, logs


# ---------------------------------------------------------------------- personalised FL
def _meta_objective(model: nn.Module, objective: Objective | None) -> MetaLearning:
    """The MAML composition of the ``pfl`` problem, or one with its default parameters."""
    if objective is None:
        return MetaLearning(model, PFLParams())
    if not isinstance(objective, MetaLearning):
        raise ConfigError(
            f"objective: got {type(objective).__name__}, expected the MAML composition of "
            "objective=pfl (ComFedL-MAML and ComFedL-DAMAML run on personalised FL)"
        )
    return objective


@register("comfedl_maml")
class ComFedLMAML(ComFedL[H]):
    """ComFedL-MAML: Algorithm 1 on the MAML composition (ComFedL eq. 7, §5.2).

    With ``g_k(x; B) = x − α ∇L_k(x; B)`` and ``f_k(y; B̃) = L_k(y; B̃)`` the step is::

        u = (I − α ∇²L_k(x; B)) ∇L_k(x − α ∇L_k(x; B); B̃)      # one vjp through adapt
        x ← x − η u

    which is the exact gradient of the one-task MAML loss on (B, B̃): since f_k is the query
    loss itself, the bias of the compositional estimator vanishes. FedMAML (Per-FedAvg) takes
    the Hessian on a third, independent batch; with ``fedmaml.hessian=support`` the two
    estimators coincide on the same batches and the methods differ only in their step sizes.
    """

    hparams_cls = Hparams

    def __init__(self, hparams: H, model: nn.Module, objective: Objective | None = None) -> None:
        super().__init__(hparams, model, _meta_objective(model, objective))

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: int
    ) -> tuple[State, dict[str, Tensor]]:
        u, y = self.direction(state["x"], batches, ctx)
        obj = self.objective
        assert isinstance(obj, MetaLearning)
        q = batches["outer"]
        loss = obj.batch_loss(tree_map(lambda t: t.detach(), y), q["x"], q["y"])
        return {"x": tree_axpy(-self.hparams.lr, u, state["x"])}, {"loss": loss}


@register("comfedl_damaml")
class ComFedLDAMAML(ComFedLMAML[ComFedLHparams]):
    """ComFedL-DAMAML: Algorithm 1 on DA-MAML (ComFedL eq. 10, §5.2)::

        u = exp(L_k(y; B̃)/γ)/γ · (I − α ∇²L_k(x; B)) ∇L_k(y; B̃),  y = x − α ∇L_k(x; B)
        x ← x − η u

    In the stable form (default) ``exp(L/γ)/γ`` becomes ``exp((L − c)/γ)/Z`` with c and Z
    shared per round from the cohort's post-adaptation losses at the broadcast model (the
    probe), as in :mod:`lit_fedco.objectives.dro`: client weights ``K · softmax(L/γ)``.
    """

    hparams_cls = ComFedLHparams

    def __init__(
        self, hparams: Hparams, model: nn.Module, objective: Objective | None = None
    ) -> None:
        meta = _meta_objective(model, objective)
        if not isinstance(hparams, ComFedLHparams):
            raise ConfigError("comfedl_damaml: hyperparameters must be a ComFedLHparams")
        damaml = DAMAML(model, meta.settings, hparams.gamma, hparams.form)
        CompositionalUpdater.__init__(self, hparams, model, damaml)

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: int
    ) -> tuple[State, dict[str, Tensor]]:
        """The ComFedL step, and its multiplier of the MAML direction logged as
        ``train/step_weight``: ``f′(L) = exp((L − c)/γ)/Z`` (stable; mean 1 over the cohort at
        the broadcast model) or ``exp(L/γ)/γ`` (literal), L the step's query loss. Values far
        above 1 are the large steps the exponential gives a batch whose loss exceeds the round's
        shift."""
        new, logs = super().client_step(state, batches, ctx, step)
        hp = self.hparams
        logs["step_weight"] = exp_outer(logs["loss"], hp.gamma, hp.form, ctx) / hp.gamma
        return new, logs

    def probe(self, state: State, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """The client's post-adaptation loss ``L_k(x̄ − α ∇L_k(x̄; B); B̃)`` on the round's first
        batches: the shift and normaliser of the stable form come from the cohort's values."""
        obj = self.objective
        assert isinstance(obj, MetaLearning)
        return obj.meta_loss(state["x"], batches)
