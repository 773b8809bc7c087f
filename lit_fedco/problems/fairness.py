"""Fairness-constrained classification (FedDRO paper §6, Figure 2): equality of opportunity on
UCI Adult as the problem ``h + f(mean_k g_k)`` (:mod:`lit_fedco.objectives.fairness`); its
parameters are the config node ``fairness``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.metrics import TPRGapViolation
from lit_fedco.core.ranges import Bound
from lit_fedco.data import FederatedData
from lit_fedco.objectives.base import Objective
from lit_fedco.objectives.fairness import EqualOpportunity, fairness_penalty
from lit_fedco.problems.base import Problem, ProblemParams, register_problem


@dataclass(frozen=True)
class FairnessParams(ProblemParams):
    """Equality of opportunity as a penalty on smoothed TPR gaps; config node ``fairness``.

    Attributes:
        lam: λ > 0, the weight of the squared gaps (10: at the unconstrained solution on Adult
            the penalty is about half the cross-entropy; :mod:`lit_fedco.objectives.fairness`).
        tau: τ > 0, the smoothing temperature of the predictions ``σ(z/τ)``.
        slack: κ ≥ 0, the gap tolerated before the penalty starts (0: plain squared gaps).
        floor: ε > 0, the least value a positive share (``P(y=1)``, ``P(y=1, A=a)``) is read
            at in the ratios.
    """

    lam: float = 10.0
    tau: float = 0.5
    slack: float = 0.0
    floor: float = 1e-3

    bounds: ClassVar[dict[str, Bound]] = {
        "lam": Bound("a float > 0 (λ)", "10.0", gt=0),
        "tau": Bound("a float > 0 (τ)", "0.5", gt=0),
        "slack": Bound("a float >= 0 (κ)", "0.0", ge=0),
        "floor": Bound("a float > 0 (ε)", "1e-3", gt=0),
    }


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


class FairnessObjectiveValue(Metric):
    """Φ on a split: the mean cross-entropy plus λ times the squared smoothed TPR gaps of the
    split's rows pooled (:mod:`lit_fedco.objectives.fairness`), logged as
    ``<split>/objective``. With equal client sizes it is ``mean_k h_k + f(mean_k g_k)``
    exactly; the value each constrained method minimises, whatever its estimator.

    Sum states: the cross-entropy sum and row count, and per group the positives and the sum
    of their smoothed predictions ``σ(z/τ)``.

    Args:
        num_groups: G.
        params: the problem's λ, τ, κ, ε.
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    ce_sum: Tensor
    count: Tensor
    s_pos: Tensor
    pos: Tensor

    def __init__(self, num_groups: int, params: FairnessParams, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_groups, self.p = num_groups, params
        f64 = torch.float64
        self.add_state("ce_sum", torch.zeros((), dtype=f64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("s_pos", torch.zeros(num_groups, dtype=f64), dist_reduce_fx="sum")
        self.add_state("pos", torch.zeros(num_groups, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor, client: Tensor) -> None:  # type: ignore[override]
        label, group = target[:, 0], target[:, 1]
        ce = F.cross_entropy(logits.to(torch.float64), label, reduction="none")
        self.ce_sum += ce.sum()
        self.count += len(label)
        positive = label == 1
        s = torch.sigmoid((logits[:, 1] - logits[:, 0]).to(torch.float64) / self.p.tau)
        self.s_pos.index_add_(0, group[positive], s[positive])
        self.pos.index_add_(0, group[positive], torch.ones_like(group[positive]))

    def compute(self) -> Tensor:  # type: ignore[override]
        n = self.count.to(torch.float64).clamp_min(1)
        per_group = torch.stack([self.s_pos / n, self.pos.to(torch.float64) / n], -1)
        u = torch.cat([torch.stack([self.s_pos.sum() / n, self.pos.sum() / n]),
                       per_group.reshape(-1)])  # fmt: skip
        penalty = fairness_penalty(u, self.p.lam, self.p.slack, self.p.floor)
        return self.ce_sum / n + penalty


@register_problem("fairness")
class FairnessProblem(Problem):
    """Equality of opportunity (Hardt et al. 2016) on data with a protected group (Adult): the
    FedDRO family and GCIVR get :class:`EqualOpportunity` (composition ``"distributed"``),
    the unconstrained baselines (FedAvg) the cross-entropy alone. Evaluation adds the
    violation ``max_a |TPR − TPR_a|`` (hard predictions) as ``train/violation`` and
    ``val/violation``, and the objective Φ itself as ``train/objective``, ``val/objective``."""

    params_cls = FairnessParams
    offers = ("distributed", "erm")

    def __init__(self, params: ProblemParams, data: FederatedData) -> None:
        super().__init__(params, data)
        self.num_groups = num_groups(data)

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, FairnessParams)
        fair = EqualOpportunity(model, self.num_groups, p.lam, p.tau, p.slack, p.floor)
        return {"distributed": fair, "erm": Objective(model)}

    def eval_metrics(self) -> dict[str, Metric]:
        p = self.params
        assert isinstance(p, FairnessParams)
        return {
            "violation": TPRGapViolation(self.num_groups),
            "objective": FairnessObjectiveValue(self.num_groups, p),
        }
