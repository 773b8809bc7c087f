"""Objectives (``ALGORITHMS.md``, "Problem families")."""

from lit_fedco.objectives.base import Batch, Context, Objective, Params, cross_entropy, model_params
from lit_fedco.objectives.dro import (
    ClientKLDRO,
    kl_dro_primal,
    kl_dro_value,
    kl_dro_weights,
    shift_and_norm,
)

__all__ = [
    "Batch",
    "ClientKLDRO",
    "Context",
    "Objective",
    "Params",
    "cross_entropy",
    "kl_dro_primal",
    "kl_dro_value",
    "kl_dro_weights",
    "model_params",
    "shift_and_norm",
]
