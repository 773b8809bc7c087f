"""Personalised FL (ComFedL §5.2): every client is a task, and every method is scored on each
client's own data after that client's own adaptation.

Each client takes ``eval_steps`` steps of size α on a fixed support batch of its own training
rows, and its adapted model is scored on its own data (FedAvg "trained with one step at test
time", as the paper compares it). Ditto is scored with its personal models instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from lit_fedco.core.ranges import Bound
from lit_fedco.data import FederatedData
from lit_fedco.objectives.base import Batch, Objective, Params
from lit_fedco.objectives.dro import FORMS
from lit_fedco.objectives.maml import adapt
from lit_fedco.objectives.personalized import DAMAML, MetaLearning
from lit_fedco.problems.base import Problem, ProblemParams, register_problem


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

    bounds: ClassVar[dict[str, Bound]] = {
        "inner_lr": Bound("a float > 0", "0.05", gt=0),
        "inner_steps": Bound("an int >= 1", "1", ge=1),
        "eval_steps": Bound("an int >= 1", "1", ge=1),
        "eval_support": Bound("an int >= 0 (0: batch_size)", "0", ge=0),
        "gamma": Bound("a float > 0 (γ)", "0.5", gt=0),
    }

    def validate(self) -> None:
        super().validate()
        self.require("form", self.form in FORMS, f"one of {FORMS}", "stable")


@register_problem("pfl")
class PFLProblem(Problem):
    """Personalised FL (ComFedL §5.2): the MAML composition for the meta-learning updaters
    (ComFedL-MAML, FedMAML, TR-MAML), DA-MAML for ComFedL-DAMAML, empirical risk for the
    others; every method evaluated after adapting on each client's own support rows."""

    params_cls = PFLParams
    offers = ("local", "damaml", "erm")

    def __init__(self, params: ProblemParams, data: FederatedData) -> None:
        super().__init__(params, data)
        assert isinstance(params, PFLParams)
        self.p = params
        self.eval_adapt_steps = params.eval_steps
        self.eval_support = params.eval_support

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.p
        maml = (p.inner_lr, p.inner_steps, p.first_order)
        return {
            "local": MetaLearning(model, *maml),
            "damaml": DAMAML(model, *maml, gamma=p.gamma, form=p.form),
            "erm": Objective(model),
        }

    def adapt_for_eval(self, objective: Objective, params: Params, support: Batch) -> Params:
        """``eval_steps`` steps ``x ← x − α ∇L_k(x; support)`` (no graph kept)."""

        def loss(p: Params, x: Tensor, y: Tensor) -> Tensor:
            return objective.losses(p, {"x": x, "y": y}).mean()

        p = self.p
        return adapt(loss, params, support["x"], support["y"], p.inner_lr, p.eval_steps, True)
