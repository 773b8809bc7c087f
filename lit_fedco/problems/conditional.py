"""The conditional problems of the FCSG paper: invariant logistic regression (§5.1), whose
conditional samples η | ξ the problem draws, and federated online AUPRC (§5.3), whose AP
surrogate needs positives in every batch and whose clients are scored by average precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torchmetrics import Metric

from lit_fedco.core.metrics import PooledAccuracyAtPrior, PooledAveragePrecision
from lit_fedco.core.ranges import Bound
from lit_fedco.data import BatchSampler, FederatedData, PositiveSampler
from lit_fedco.objectives.base import Batch, Objective
from lit_fedco.objectives.conditional import AUCMinMax, AveragePrecision, InvariantLogReg, ScoreERM
from lit_fedco.problems.base import Problem, ProblemParams, register_problem


@dataclass(frozen=True)
class InvariantLogRegParams(ProblemParams):
    """Invariant logistic regression (FCSG §5.1); data: ``data.name=invariant_logreg``.

    Attributes:
        sigma2: σ₂ of η ~ N(a, σ₂² I) (paper: σ₂/σ₁ ∈ {1, 1.5, 2} with σ₁ = 1).
        m: inner samples η per outer sample ξ (paper: 1, 10, 100).
        lam: λ of the non-convex regulariser (paper: 0.001).
        gamma: γ of the non-convex regulariser (paper: 10).
    """

    sigma2: float = 1.0
    m: int = 10
    lam: float = 0.001
    gamma: float = 10.0

    bounds: ClassVar[dict[str, Bound]] = {
        "sigma2": Bound("a float >= 0", "1.0", ge=0),
        "m": Bound("an int >= 1", "10", ge=1),
        "lam": Bound("a float >= 0", "0.001", ge=0),
        "gamma": Bound("a float > 0", "10", gt=0),
    }


@register_problem("invariant_logreg")
class InvariantLogRegProblem(Problem):
    """FCSG §5.1; the model is a score (``model.name=linear``, one output)."""

    params_cls = InvariantLogRegParams
    offers = ("conditional",)

    def num_outputs(self) -> int:
        return 1

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, InvariantLogRegParams)
        return {"conditional": InvariantLogReg(model, p.lam, p.gamma)}

    def draws_conditional(self, objective: Objective) -> bool:
        return isinstance(objective, InvariantLogReg)

    def augment(
        self, objective: Objective, batch: Batch, generators: list[torch.Generator]
    ) -> Batch:
        """Add ``eta`` [n, b, m, d]: ``η_ij = a_i + σ₂ ε_ij``, ε from client i's generator."""
        p = self.params
        assert isinstance(p, InvariantLogRegParams)
        a = batch["x"]
        _, b, d = a.shape
        eps = torch.stack([torch.randn(b, p.m, d, generator=g, dtype=a.dtype) for g in generators])
        return {**batch, "eta": a.unsqueeze(2) + p.sigma2 * eps.to(a.device)}


@dataclass(frozen=True)
class AUPRCParams(ProblemParams):
    """Federated online AUPRC (FCSG §5.3); data: ``data.binary=true``.

    Attributes:
        margin: s of the squared hinge ℓ (and CODA+'s margin; LibAUC's default 1.0).
        positives: positives in every minibatch of the AP objective (D-AUPRC: 4 of 20).
    """

    margin: float = 1.0
    positives: int = 4

    bounds: ClassVar[dict[str, Bound]] = {
        "margin": Bound("a float > 0", "1.0", gt=0),
        "positives": Bound("an int >= 1", "4", ge=1),
    }


@register_problem("auprc")
class AUPRCProblem(Problem):
    """FCSG §5.3: the AP surrogate for conditional updaters, cross-entropy for FedAvg, the
    min-max AUC loss for CODA+ — all scored by average precision on the unchanged test set."""

    params_cls = AUPRCParams
    offers = ("conditional", "erm", "minimax")

    def num_outputs(self) -> int:
        return 1

    def positive_ratio(self) -> float:
        """p, the fraction of positives among all clients' training rows (from the class
        counts: the whole data set's, also where a process holds some clients' rows)."""
        counts = self.data.class_counts("train").double()
        return float(counts[:, 1].sum() / counts.sum())

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, AUPRCParams)
        return {
            "conditional": AveragePrecision(model, p.margin),
            "erm": ScoreERM(model),
            "minimax": AUCMinMax(model, self.positive_ratio(), p.margin),
        }

    def sampler(self, objective: Objective, data: FederatedData, seed: int) -> BatchSampler:
        """``positives`` positives in every batch of the AP surrogate (its outer samples ξ⁺);
        plain minibatches for the other objectives."""
        p = self.params
        assert isinstance(p, AUPRCParams)
        if isinstance(objective, AveragePrecision):
            return PositiveSampler(data, seed, p.positives)
        return BatchSampler(data, seed)

    def eval_metrics(self) -> dict[str, Metric]:
        """Average precision and the accuracy at the prior-matched threshold
        (:func:`~lit_fedco.core.metrics.accuracy_at_prior`), over all rows of the split (pooled
        over clients)."""
        return {"ap": PooledAveragePrecision(), "acc_prior": PooledAccuracyAtPrior()}
