"""Personalised federated learning as a local composition (ComFedL §1.1 and §5.2).

Every client is a task. MAML (ComFedL eq. 7) adapts the shared model x to client k with one
(or a few) gradient steps on a support batch B and is scored on a query batch B̃ of the same
client::

    g_k(x; B) = x − α ∇L_k(x; B)                       (inner map, p = d)
    f_k(y; B̃) = L_k(y; B̃)                              (outer function)
    F(x)      = (1/K) Σ_k f_k(g_k(x))                   (eq. 7)

DA-MAML (eq. 10) is the KL-regularised distribution-agnostic version: the minimax problem
``min_x max_{p ∈ Δ_K} Σ p_k f_k(g_k(x)) − γ Σ p_k log(K p_k)`` (eq. 9) has the closed form
``γ log((1/K) Σ_k exp(f_k(g_k(x))/γ))``; ComFedL minimises the monotone transform
``(1/K) Σ_k exp(f_k(g_k(x))/γ)``, i.e. the outer function becomes ``exp(L_k(y; B̃)/γ)``. It
runs with the stable shift and normaliser of :mod:`lit_fedco.objectives.dro` (the client's
post-adaptation loss at the broadcast model is the probe).

The meta-gradient is the one implementation of :mod:`lit_fedco.objectives.maml`
(:func:`~lit_fedco.objectives.maml.adapt` and :func:`~lit_fedco.objectives.maml.maml_loss`):
differentiating ``f(g(x))`` through the inner gradient gives the exact
``(I − α ∇²L(x; B)) ∇L(y; B̃)`` with Hessian-vector products.

Every method on this problem, MAML or not, is evaluated the same way: each client takes
``eval_steps`` steps of size α on a fixed support batch of its own training rows, and its
adapted model is scored on its own data (``FedAvg`` "trained with one step at test time", as
the paper compares it). Ditto evaluates its personal models instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from lit_fedco.errors import ConfigError
from lit_fedco.objectives.base import (
    Batch,
    Context,
    Objective,
    Params,
    Problem,
    ProblemParams,
    register_problem,
)
from lit_fedco.objectives.dro import FORMS, exp_outer, kl_dro_weights, kl_round_context
from lit_fedco.objectives.maml import adapt, maml_loss
from lit_fedco.protocol import RoundContext
from lit_fedco.state import tree_map


@dataclass(frozen=True)
class PFLParams(ProblemParams):
    """Personalised FL (ComFedL §5.2); config node ``pfl``.

    Attributes:
        inner_lr: α, the adaptation step size, in MAML training and at evaluation for every
            method (ComFedL-DAMAML and TR-MAML: 0.05; FedMAML: 0.1; grid 0.001-1).
        inner_steps: adaptation steps inside the MAML objective (paper: 1).
        eval_steps: adaptation steps before each client is evaluated (paper: 1).
        eval_support: training rows of a client it adapts on at evaluation (0: the run's
            ``batch_size``, the support size it was trained for).
        first_order: first-order MAML (drops the Hessian term); never the default.
        gamma: γ > 0 of DA-MAML's distribution-agnostic objective (paper: 0.5; grid 0.1, 0.5,
            1, 5).
        form: DA-MAML's ``"stable"`` (shared shift and normaliser per round) or ``"literal"``
            exp(L/γ) form.
    """

    inner_lr: float = 0.05
    inner_steps: int = 1
    eval_steps: int = 1
    eval_support: int = 0
    first_order: bool = False
    gamma: float = 0.5
    form: str = "stable"

    def validate(self) -> None:
        self.require("inner_lr", self.inner_lr > 0, "a float > 0", "0.05")
        self.require("inner_steps", self.inner_steps >= 1, "an int >= 1", "1")
        self.require("eval_steps", self.eval_steps >= 1, "an int >= 1", "1")
        self.require("eval_support", self.eval_support >= 0, "an int >= 0 (0: batch_size)", "0")
        self.require("gamma", self.gamma > 0, "a float > 0 (γ)", "0.5")
        self.require("form", self.form in FORMS, f"one of {FORMS}", "stable")


class Personalized(Objective):
    """Plain empirical risk in training, evaluated after ``eval_steps`` adaptation steps on
    each client's support batch (FedAvg, Ditto, DRFL, q-FedAvg on the personalised task).

    Args:
        model: the network.
        params: the problem's :class:`PFLParams`.
    """

    def __init__(self, model: nn.Module, params: PFLParams) -> None:
        super().__init__(model)
        self.settings = params
        self.eval_adapt_steps = params.eval_steps
        self.eval_support = params.eval_support

    def batch_loss(self, params: Params, x: Tensor, y: Tensor) -> Tensor:
        """The mean loss of the network on rows ``(x, y)``."""
        return self.losses(params, {"x": x, "y": y}).mean()

    def adapt_for_eval(self, params: Params, support: Batch) -> Params:
        """``eval_steps`` steps ``x ← x − α ∇L_k(x; support)`` (no graph kept)."""
        p = self.settings
        return adapt(
            self.batch_loss, params, support["x"], support["y"], p.inner_lr, p.eval_steps, True
        )

    def describe(self) -> dict[str, Any]:
        return {"objective": type(self).__name__}


class MetaLearning(Personalized):
    """MAML as a local composition (ComFedL eq. 7): inner ``x − α ∇L_k(x; B)``, outer
    ``L_k(y; B̃)`` on an independent query batch of the same client."""

    composition: ClassVar[str] = "local"
    outer_needs_batch: ClassVar[bool] = True

    def inner(self, params: Params, batch: Batch, ctx: Context) -> Any:
        """``g_k(x; B) = x − α ∇L_k(x; B)`` (``inner_steps`` steps), differentiable in x."""
        p = self.settings
        return adapt(
            self.batch_loss, params, batch["x"], batch["y"], p.inner_lr, p.inner_steps,
            p.first_order,
        )  # fmt: skip

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """``f_k(y; B̃) = L_k(y; B̃)``."""
        if batch is None:
            raise ConfigError("MAML's outer function needs the query batch (role 'outer')")
        return self.batch_loss(y, batch["x"], batch["y"])

    def meta_loss(self, params: Params, batches: dict[str, Batch]) -> Tensor:
        """``L_k(x − α ∇L_k(x; B); B̃)`` by :func:`~lit_fedco.objectives.maml.maml_loss`."""
        p = self.settings
        s, q = batches["inner"], batches["outer"]
        return maml_loss(
            self.batch_loss, params, (s["x"], s["y"]), (q["x"], q["y"]), p.inner_lr,
            p.inner_steps, p.first_order,
        )  # fmt: skip

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        return self.meta_loss(params, batches)

    def step_logs(self, y: Any, batches: dict[str, Batch], ctx: Context) -> dict[str, Tensor]:
        """The query loss ``L_k(y; B̃)`` at the adapted parameters y."""
        q = batches["outer"]
        return {"loss": self.batch_loss(tree_map(lambda t: t.detach(), y), q["x"], q["y"])}

    def describe(self) -> dict[str, Any]:
        return {"objective": "MetaLearning", "first_order": self.settings.first_order}


class DAMAML(MetaLearning):
    """DA-MAML (ComFedL eq. 10): outer ``exp(L_k(y; B̃)/γ)``, stable or literal (γ and the
    form from the problem's :class:`PFLParams`). Its own composition key ``"damaml"``: an
    updater asks for it by name (ComFedL-DAMAML).

    Args:
        model: the network.
        params: the problem's :class:`PFLParams`.
    """

    composition: ClassVar[str] = "damaml"
    has_probe: ClassVar[bool] = True

    def __init__(self, model: nn.Module, params: PFLParams) -> None:
        super().__init__(model, params)
        self.gamma, self.form = float(params.gamma), params.form

    def probe(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """The client's post-adaptation loss ``L_k(x̄ − α ∇L_k(x̄; B); B̃)`` on the round's
        first batches: the shift and normaliser of the stable form come from the cohort's."""
        return self.meta_loss(params, batches)

    def step_logs(self, y: Any, batches: dict[str, Batch], ctx: Context) -> dict[str, Tensor]:
        """The query loss L and the step's multiplier of the MAML direction
        (``train/step_weight``): ``f′(L) = exp((L − c)/γ)/Z`` (stable; mean 1 over the cohort
        at the broadcast model) or ``exp(L/γ)/γ`` (literal). Values far above 1 are the large
        steps the exponential gives a batch whose loss exceeds the round's shift."""
        logs = super().step_logs(y, batches, ctx)
        logs["step_weight"] = exp_outer(logs["loss"], self.gamma, self.form, ctx) / self.gamma
        return logs

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """``exp(L_k(y; B̃)/γ)`` or its stable form ``γ exp((L − c)/γ)/Z``."""
        return exp_outer(super().outer(y, batch, ctx), self.gamma, self.form, ctx)

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        return exp_outer(self.meta_loss(params, batches), self.gamma, self.form, ctx)

    def round_context(self, probes: Tensor) -> RoundContext:
        """Shift, normaliser and implied weights from the cohort's post-adaptation losses."""
        return kl_round_context(probes, self.gamma)

    def client_weights(self, losses: Tensor) -> Tensor | None:
        """``softmax(L/γ)``: the maximising p of eq. 9 at the given post-adaptation losses."""
        return kl_dro_weights(losses, self.gamma)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "objective": "DAMAML", "gamma": self.gamma, "form": self.form}


@register_problem("pfl")
class PFLProblem(Problem):
    """Personalised FL (ComFedL §5.2): the MAML composition for the meta-learning updaters
    (ComFedL-MAML, ComFedL-DAMAML, FedMAML, TR-MAML), empirical risk for the others; every
    method evaluated after adapting on each client's own support rows."""

    params_cls = PFLParams

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, PFLParams)
        return {
            "local": MetaLearning(model, p),
            "damaml": DAMAML(model, p),
            "erm": Personalized(model, p),
        }
