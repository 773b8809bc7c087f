"""The DRO problems: client-level KL-DRO (ComFedL §5.1) and sample-level KL / χ² DRO over the
union of the clients' data (FedDRO paper §2.1). Their parameters (γ and the form; the kind and
λ) are the problems' config nodes ``client_dro`` and ``sample_dro``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from lit_fedco.core.ranges import Bound
from lit_fedco.objectives.base import Objective
from lit_fedco.objectives.distributed import (
    DISTRIBUTED_OBJECTIVES,
    DistributedObjective,
    make_distributed_objective,
)
from lit_fedco.objectives.dro import FORMS, ClientKLDRO
from lit_fedco.problems.base import Problem, ProblemParams, register_problem


@dataclass(frozen=True)
class ClientDROParams(ProblemParams):
    """Client-level KL-DRO (ComFedL §5.1); config node ``client_dro``.

    Attributes:
        gamma: γ > 0, the KL regularisation (paper §5.1: 0.5; grid 0.1, 0.5, 1, 5; the journal
            version 0.2); small γ is close to the worst client.
        form: ``"stable"`` (shared log-space shift and normaliser per round; default) or
            ``"literal"`` (exp(L/γ)/γ as in the paper).
    """

    gamma: float = 0.5
    form: str = "stable"

    bounds: ClassVar[dict[str, Bound]] = {
        "gamma": Bound("a float > 0 (γ)", "0.5", gt=0),
    }

    def validate(self) -> None:
        super().validate()
        self.require("form", self.form in FORMS, f"one of {FORMS}", "stable")


@register_problem("client_dro")
class ClientDROProblem(Problem):
    """Classification with client-level KL-DRO (ComFedL §5.1): ComFedL minimises
    ``γ log mean_k exp(L_k/γ)`` (the local composition :class:`ClientKLDRO`); the baselines
    (DRFL, q-FedAvg, FedAvg) get the empirical risk and bring their own robustness."""

    params_cls = ClientDROParams
    offers = ("local", "erm")

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, ClientDROParams)
        return {"local": ClientKLDRO(model, p.gamma, p.form), "erm": Objective(model)}


@dataclass(frozen=True)
class SampleDROParams(ProblemParams):
    """Sample-level DRO (FedDRO paper §2.1); config node ``sample_dro``.

    Attributes:
        kind: ``"kl"`` (KL-DRO, λ log mean exp(ℓ/λ)) or ``"chi2"`` (χ²-DRO in closed form).
        lam: λ > 0, the divergence weight.
    """

    kind: str = "kl"
    lam: float = 1.0

    bounds: ClassVar[dict[str, Bound]] = {
        "lam": Bound("a float > 0 (λ)", "1.0", gt=0),
    }

    def validate(self) -> None:
        super().validate()
        kinds = DISTRIBUTED_OBJECTIVES
        self.require("kind", self.kind in kinds, f"one of {kinds}", "kl")


@register_problem("sample_dro")
class SampleDROProblem(Problem):
    """Classification with sample-level DRO over the union of the clients' data (FedDRO
    paper eq. 2): the FedDRO family gets the distributed composition, the others the empirical
    risk."""

    params_cls = SampleDROParams
    offers = ("distributed", "erm")

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, SampleDROParams)
        return {
            "distributed": make_distributed_objective(p.kind, model, p.lam),
            "erm": Objective(model),
        }

    def eval_metrics(self) -> dict[str, Metric]:
        """``objective``: the DRO objective Φ(x) of eq. (2) on each split's full data, whatever
        the updater trained (:class:`DistributedObjectiveValue`)."""
        p = self.params
        assert isinstance(p, SampleDROParams)
        objective = make_distributed_objective(p.kind, nn.Identity(), p.lam)
        return {"objective": DistributedObjectiveValue(objective, self.data.num_clients)}


class DistributedObjectiveValue(Metric):
    """``Φ(x) = (1/K) Σ_k h_k(x) + f((1/K) Σ_k g_k(x))`` (FedDRO paper eq. 2) with ``g_k``,
    ``h_k`` the means over *all* of client k's rows of the split: the quantity the FedDRO
    family minimises, evaluated exactly (no minibatch), so that methods are compared on their
    objective and not only on accuracy.

    ``update(logits, target, client)`` keeps each row's per-sample loss (float64) and client;
    ``compute()`` forms each client's ``g_k`` in the unit-free probe form and combines them in
    the units the objective picks from them (the KL shift: no overflow), exactly as a round's
    cohort mean is formed. Clients without rows in the split are left out of the means.

    Args:
        objective: the distributed objective (its λ and kind; the model is not used).
        num_clients: K.
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    def __init__(self, objective: DistributedObjective, num_clients: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.objective = objective
        self.num_clients = num_clients
        self.add_state("losses", [], dist_reduce_fx="cat")
        self.add_state("clients", [], dist_reduce_fx="cat")

    def update(self, logits: Tensor, target: Tensor, client: Tensor) -> None:  # type: ignore[override]
        losses = self.objective.sample_loss(logits.detach().to(torch.float64), target)
        self.losses.append(losses)  # type: ignore[union-attr,operator]
        self.clients.append(client.detach().long())  # type: ignore[union-attr,operator]

    def compute(self) -> Tensor:  # type: ignore[override]
        from torchmetrics.utilities import dim_zero_cat

        losses = dim_zero_cat(self.losses)  # type: ignore[arg-type]
        clients = dim_zero_cat(self.clients)  # type: ignore[arg-type]
        obj = self.objective
        counts = torch.bincount(clients, minlength=self.num_clients).tolist()
        grouped = losses[torch.argsort(clients, stable=True)].split(counts)
        parts = [part for part in grouped if len(part)]  # one sort, not a mask per client
        probes = torch.stack([obj.probe_of_losses(part) for part in parts])
        units = obj.units(probes)
        g = obj.cohort_mean(probes, units)
        h = torch.stack([obj.h_of_losses(part, units) for part in parts]).mean()
        return obj.f(g, units) + h
