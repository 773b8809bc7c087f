"""Problems: the data-dependent parts of a task (samplers, conditional samples, evaluation),
and which objective each updater gets; registered by name (config ``objective``)."""

from lit_fedco.problems.base import (
    Classification,
    Problem,
    ProblemParams,
    available_problems,
    get_problem,
    register_problem,
)
from lit_fedco.problems.conditional import (
    AUPRCParams,
    AUPRCProblem,
    InvariantLogRegParams,
    InvariantLogRegProblem,
)
from lit_fedco.problems.dro import (
    ClientDROParams,
    ClientDROProblem,
    SampleDROParams,
    SampleDROProblem,
)
from lit_fedco.problems.fairness import FairnessParams, FairnessProblem
from lit_fedco.problems.fewshot import MAMLParams, MAMLProblem
from lit_fedco.problems.personalized import PFLParams, PFLProblem

__all__ = [
    "AUPRCParams",
    "AUPRCProblem",
    "Classification",
    "ClientDROParams",
    "ClientDROProblem",
    "FairnessParams",
    "FairnessProblem",
    "InvariantLogRegParams",
    "InvariantLogRegProblem",
    "MAMLParams",
    "MAMLProblem",
    "PFLParams",
    "PFLProblem",
    "Problem",
    "ProblemParams",
    "SampleDROParams",
    "SampleDROProblem",
    "available_problems",
    "get_problem",
    "register_problem",
]
