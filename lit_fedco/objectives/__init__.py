"""Objectives: the mathematics an updater differentiates, by where the composition lives:
``erm`` (plain empirical risk), ``local`` (f_k(g_k(x)) within each client: ComFedL, FCSG's
MAML), ``distributed`` (f(mean_k g_k(x)) across clients: FedDRO), ``conditional``
(E_ξ f_ξ(E_{η|ξ} g_η(x, ξ)): FCSG). What depends on the data and the task lives in
:mod:`lit_fedco.problems`."""

from lit_fedco.objectives.base import (
    Batch,
    Context,
    Objective,
    Params,
    cross_entropy,
    model_params,
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
from lit_fedco.objectives.personalized import DAMAML, MetaLearning

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
    "Params",
    "ScoreERM",
    "TaskERM",
    "adapt",
    "cross_entropy",
    "kl_dro_primal",
    "kl_dro_value",
    "kl_dro_weights",
    "maml_loss",
    "model_params",
    "per_fedavg_direction",
    "plugin_gradient",
    "shift_and_norm",
]
