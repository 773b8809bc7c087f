"""Objectives (``ALGORITHMS.md``, "Problem families")."""

from lit_fedco.objectives.base import (
    Batch,
    Context,
    Objective,
    Params,
    Problem,
    ProblemParams,
    available_problems,
    cross_entropy,
    get_problem,
    model_params,
    register_problem,
)
from lit_fedco.objectives.conditional import (
    AUCMinMax,
    AveragePrecision,
    ConditionalObjective,
    InvariantLogReg,
    ScoreERM,
    plugin_gradient,
)
from lit_fedco.objectives.dro import (
    ClientKLDRO,
    kl_dro_primal,
    kl_dro_value,
    kl_dro_weights,
    shift_and_norm,
)
from lit_fedco.objectives.maml import MAML, TaskERM, adapt, maml_loss, per_fedavg_direction
from lit_fedco.objectives.personalized import (
    DAMAML,
    MetaLearning,
    Personalized,
    PFLParams,
    PFLProblem,
)

__all__ = [
    "DAMAML",
    "MAML",
    "AUCMinMax",
    "AveragePrecision",
    "Batch",
    "ClientKLDRO",
    "ConditionalObjective",
    "Context",
    "InvariantLogReg",
    "MetaLearning",
    "Objective",
    "PFLParams",
    "PFLProblem",
    "Params",
    "Personalized",
    "Problem",
    "ProblemParams",
    "ScoreERM",
    "TaskERM",
    "adapt",
    "available_problems",
    "cross_entropy",
    "get_problem",
    "kl_dro_primal",
    "kl_dro_value",
    "kl_dro_weights",
    "maml_loss",
    "model_params",
    "per_fedavg_direction",
    "plugin_gradient",
    "register_problem",
    "shift_and_norm",
]
