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

How every method is evaluated on this task (after adaptation) is the ``pfl`` problem's
(:mod:`lit_fedco.problems.personalized`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import RoundContext
from lit_fedco.core.state import tree_map
from lit_fedco.objectives.base import Batch, Context, Objective, Params
from lit_fedco.objectives.dro import FORMS, exp_outer, kl_dro_weights, kl_round_context
from lit_fedco.objectives.maml import adapt, maml_loss


class MetaLearning(Objective):
    """MAML as a local composition (ComFedL eq. 7): inner ``x − α ∇L_k(x; B)``, outer
    ``L_k(y; B̃)`` on an independent query batch of the same client.

    Args:
        model: the network.
        inner_lr: α, the adaptation step size.
        inner_steps: adaptation steps inside the composition (paper: 1).
        first_order: drop the Hessian term (first-order MAML); never the default.
    """

    composition: ClassVar[str] = "local"
    outer_needs_batch: ClassVar[bool] = True

    def __init__(
        self, model: nn.Module, inner_lr: float, inner_steps: int = 1, first_order: bool = False
    ) -> None:
        super().__init__(model)
        self.inner_lr, self.inner_steps, self.first_order = inner_lr, inner_steps, first_order

    def batch_loss(self, params: Params, x: Tensor, y: Tensor) -> Tensor:
        """The mean loss of the network on rows ``(x, y)``."""
        return self.losses(params, {"x": x, "y": y}).mean()

    def inner(self, params: Params, batch: Batch, ctx: Context) -> Any:
        """``g_k(x; B) = x − α ∇L_k(x; B)`` (``inner_steps`` steps), differentiable in x."""
        return adapt(
            self.batch_loss, params, batch["x"], batch["y"], self.inner_lr, self.inner_steps,
            self.first_order,
        )  # fmt: skip

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """``f_k(y; B̃) = L_k(y; B̃)``."""
        if batch is None:
            raise ConfigError("MAML's outer function needs the query batch (role 'outer')")
        return self.batch_loss(y, batch["x"], batch["y"])

    def meta_loss(self, params: Params, batches: dict[str, Batch]) -> Tensor:
        """``L_k(x − α ∇L_k(x; B); B̃)`` by :func:`~lit_fedco.objectives.maml.maml_loss`."""
        s, q = batches["inner"], batches["outer"]
        return maml_loss(
            self.batch_loss, params, (s["x"], s["y"]), (q["x"], q["y"]), self.inner_lr,
            self.inner_steps, self.first_order,
        )  # fmt: skip

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        return self.meta_loss(params, batches)

    def step_logs(self, y: Any, batches: dict[str, Batch], ctx: Context) -> dict[str, Tensor]:
        """The query loss ``L_k(y; B̃)`` at the adapted parameters y."""
        q = batches["outer"]
        return {"loss": self.batch_loss(tree_map(lambda t: t.detach(), y), q["x"], q["y"])}

    def describe(self) -> dict[str, Any]:
        return {
            "objective": "MetaLearning",
            "inner_lr": self.inner_lr,
            "inner_steps": self.inner_steps,
            "first_order": self.first_order,
        }


class DAMAML(MetaLearning):
    """DA-MAML (ComFedL eq. 10): outer ``exp(L_k(y; B̃)/γ)``, stable or literal. Its own
    composition key ``"damaml"``: an updater asks for it by name (ComFedL-DAMAML).

    Args:
        model, inner_lr, inner_steps, first_order: as :class:`MetaLearning`.
        gamma: γ > 0 (paper: 0.5; grid 0.1, 0.5, 1, 5).
        form: ``"stable"`` (shared shift and normaliser per round) or ``"literal"``.
    """

    composition: ClassVar[str] = "damaml"
    has_probe: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        inner_lr: float,
        inner_steps: int = 1,
        first_order: bool = False,
        gamma: float = 0.5,
        form: str = "stable",
    ) -> None:
        super().__init__(model, inner_lr, inner_steps, first_order)
        if form not in FORMS:
            raise ConfigError.bad_value("form", form, f"one of {FORMS}", "stable")
        self.gamma, self.form = float(gamma), form

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """``exp(L_k(y; B̃)/γ)`` or its stable form ``γ exp((L − c)/γ)/Z``."""
        return exp_outer(super().outer(y, batch, ctx), self.gamma, self.form, ctx)

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        return exp_outer(self.meta_loss(params, batches), self.gamma, self.form, ctx)

    def probe(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """The client's post-adaptation loss ``L_k(x̄ − α ∇L_k(x̄; B); B̃)`` on the round's
        first batches: the shift and normaliser of the stable form come from the cohort's."""
        return self.meta_loss(params, batches)

    def round_context(self, probes: Tensor) -> RoundContext:
        """Shift, normaliser and implied weights from the cohort's post-adaptation losses."""
        return kl_round_context(probes, self.gamma)

    def client_weights(self, losses: Tensor) -> Tensor | None:
        """``softmax(L/γ)``: the maximising p of eq. 9 at the given post-adaptation losses."""
        return kl_dro_weights(losses, self.gamma)

    def step_logs(self, y: Any, batches: dict[str, Batch], ctx: Context) -> dict[str, Tensor]:
        """The query loss L and the step's multiplier of the MAML direction
        (``train/step_weight``): ``f′(L) = exp((L − c)/γ)/Z`` (stable; mean 1 over the cohort
        at the broadcast model) or ``exp(L/γ)/γ`` (literal). Values far above 1 are the large
        steps the exponential gives a batch whose loss exceeds the round's shift."""
        logs = super().step_logs(y, batches, ctx)
        logs["step_weight"] = exp_outer(logs["loss"], self.gamma, self.form, ctx) / self.gamma
        return logs

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "objective": "DAMAML", "gamma": self.gamma, "form": self.form}
