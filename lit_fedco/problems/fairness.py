"""Fairness-constrained classification (FedDRO paper §6, Figure 2): equality of opportunity on
UCI Adult as the problem ``h + f(mean_k g_k)`` (:mod:`lit_fedco.objectives.fairness`); its
parameters are the config node ``fairness``."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torchmetrics import Metric

from lit_fedco.data import FederatedData
from lit_fedco.errors import ConfigError
from lit_fedco.metrics import TPRGapViolation
from lit_fedco.objectives.base import Objective
from lit_fedco.objectives.fairness import EqualOpportunity
from lit_fedco.problems.base import Problem, ProblemParams, register_problem


@dataclass(frozen=True)
class FairnessParams(ProblemParams):
    """Equality of opportunity as a penalty on smoothed TPR gaps; config node ``fairness``.

    Attributes:
        lam: λ > 0, the weight of the squared gaps (10: comparable to the cross-entropy at
            Adult's unconstrained gaps; :mod:`lit_fedco.objectives.fairness`).
        tau: τ > 0, the smoothing temperature of the predictions ``σ(z/τ)``.
        slack: κ ≥ 0, the gap tolerated before the penalty starts (0: plain squared gaps).
        floor: ε > 0, the least value a positive share (``P(y=1)``, ``P(y=1, A=a)``) is read
            at in the ratios.
    """

    lam: float = 10.0
    tau: float = 0.5
    slack: float = 0.0
    floor: float = 1e-3

    def validate(self) -> None:
        self.require("lam", self.lam > 0, "a float > 0 (λ)", "10.0")
        self.require("tau", self.tau > 0, "a float > 0 (τ)", "0.5")
        self.require("slack", self.slack >= 0, "a float >= 0 (κ)", "0.0")
        self.require("floor", self.floor > 0, "a float > 0 (ε)", "1e-3")


def num_groups(data: FederatedData) -> int:
    """G, the protected groups of ``data`` (its targets' second column).

    Raises:
        ConfigError: the targets carry no group.
    """
    if data.y_train.dim() != 2 or data.y_train.shape[1] < 2:
        raise ConfigError(
            f"objective=fairness: data {data.name!r} has targets of shape "
            f"{list(data.y_train.shape)}, expected [n, 2] (label, protected group); use "
            "data.name=adult",
            key="objective",
        )
    groups = data.stats.get("groups")
    return len(groups) if groups else int(data.y_train[:, 1].max()) + 1


@register_problem("fairness")
class FairnessProblem(Problem):
    """Equality of opportunity (Hardt et al. 2016) on data with a protected group (Adult): the
    FedDRO family and GCIVR get :class:`EqualOpportunity` (composition ``"distributed"``),
    the unconstrained baselines (FedAvg) the cross-entropy alone. Evaluation adds the
    violation ``max_a |TPR − TPR_a|`` (hard predictions) as ``train/violation`` and
    ``val/violation``."""

    params_cls = FairnessParams

    def __init__(self, params: ProblemParams, data: FederatedData) -> None:
        super().__init__(params, data)
        self.num_groups = num_groups(data)

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, FairnessParams)
        fair = EqualOpportunity(model, self.num_groups, p.lam, p.tau, p.slack, p.floor)
        return {"distributed": fair, "erm": Objective(model)}

    def eval_metrics(self) -> dict[str, Metric]:
        return {"violation": TPRGapViolation(self.num_groups)}
