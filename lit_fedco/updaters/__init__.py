"""Updaters: one file per algorithm family, registered by name."""

from lit_fedco.updaters.base import (
    CompositionalUpdater,
    Hparams,
    available_updaters,
    get_updater,
    register,
)
from lit_fedco.updaters.comfedl import ComFedL, ComFedLHparams
from lit_fedco.updaters.fedavg import FedAvg

__all__ = [
    "ComFedL",
    "ComFedLHparams",
    "CompositionalUpdater",
    "FedAvg",
    "Hparams",
    "available_updaters",
    "get_updater",
    "register",
]
