"""The DRO problems: client-level KL-DRO (ComFedL §5.1) and sample-level KL / χ² DRO over the
union of the clients' data (FedDRO paper §2.1). Their parameters (γ and the form; the kind and
λ) are the problems' config nodes ``client_dro`` and ``sample_dro``."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from lit_fedco.objectives.base import Objective
from lit_fedco.objectives.distributed import DISTRIBUTED_OBJECTIVES, make_distributed_objective
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

    def validate(self) -> None:
        self.require("gamma", self.gamma > 0, "a float > 0 (γ)", "0.5")
        self.require("form", self.form in FORMS, f"one of {FORMS}", "stable")


@register_problem("client_dro")
class ClientDROProblem(Problem):
    """Classification with client-level KL-DRO (ComFedL §5.1): ComFedL minimises
    ``γ log mean_k exp(L_k/γ)`` (the local composition :class:`ClientKLDRO`); the baselines
    (DRFL, q-FedAvg, FedAvg) get the empirical risk and bring their own robustness."""

    params_cls = ClientDROParams

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

    def validate(self) -> None:
        kinds = DISTRIBUTED_OBJECTIVES
        self.require("kind", self.kind in kinds, f"one of {kinds}", "kl")
        self.require("lam", self.lam > 0, "a float > 0 (λ)", "1.0")


@register_problem("sample_dro")
class SampleDROProblem(Problem):
    """Classification with sample-level DRO over the union of the clients' data (FedDRO
    paper eq. 2): the FedDRO family gets the distributed composition, the others the empirical
    risk."""

    params_cls = SampleDROParams

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, SampleDROParams)
        return {
            "distributed": make_distributed_objective(p.kind, model, p.lam),
            "erm": Objective(model),
        }
