"""Updaters: one file per algorithm family, registered by name."""

from lit_fedco.updaters.base import (
    CompositionalUpdater,
    Hparams,
    available_updaters,
    get_updater,
    register,
)
from lit_fedco.updaters.comfedl import ComFedL, ComFedLHparams
from lit_fedco.updaters.fcsg import (
    FCSG,
    FCSGM,
    AccFCSGM,
    CODAHparams,
    CODAPlus,
    FCSGHparams,
    FCSGMHparams,
    LocalSCGD,
    LocalSCGDHparams,
    LocalSCGDM,
)
from lit_fedco.updaters.fedavg import FedAvg
from lit_fedco.updaters.feddro import (
    MBSGD,
    DSFedDRO,
    DSFedDROHparams,
    FedAvgCO,
    FedAvgCOHparams,
    FedDRO,
    FedDROHparams,
)

__all__ = [
    "FCSG",
    "FCSGM",
    "MBSGD",
    "AccFCSGM",
    "CODAHparams",
    "CODAPlus",
    "ComFedL",
    "ComFedLHparams",
    "CompositionalUpdater",
    "DSFedDRO",
    "DSFedDROHparams",
    "FCSGHparams",
    "FCSGMHparams",
    "FedAvg",
    "FedAvgCO",
    "FedAvgCOHparams",
    "FedDRO",
    "FedDROHparams",
    "Hparams",
    "LocalSCGD",
    "LocalSCGDHparams",
    "LocalSCGDM",
    "available_updaters",
    "get_updater",
    "register",
]
