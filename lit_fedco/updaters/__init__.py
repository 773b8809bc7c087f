"""Updaters: one file per algorithm family, registered by name."""

from lit_fedco.updaters.base import CompositionalUpdater, available_updaters, get_updater, register
from lit_fedco.updaters.combine import combine
from lit_fedco.updaters.comfedl import ComFedL, ComFedLDAMAML, ComFedLMAML
from lit_fedco.updaters.dro_baselines import PDSGD, FastDRO, FastDROHparams, PDSGDHparams
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
from lit_fedco.updaters.fedavg import (
    AdaptiveHparams,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedAvgMHparams,
    FedYogi,
)
from lit_fedco.updaters.feddro import (
    MBSGD,
    DSFedDRO,
    DSFedDROHparams,
    FedAvgCO,
    FedAvgCOCaseI,
    FedAvgCOCaseIHparams,
    FedAvgCOHparams,
    FedDRO,
    FedDROHparams,
    MBSGDHparams,
)
from lit_fedco.updaters.gcivr import GCIVR, GCIVRHparams
from lit_fedco.updaters.hparams import Hparams, ServerOptHparams
from lit_fedco.updaters.personal import Ditto, DittoHparams, FedMAML, FedMAMLHparams
from lit_fedco.updaters.qfedavg import QFedAvg, QFedAvgHparams
from lit_fedco.updaters.robust import DRFL, TRMAML, DRFLHparams, project_simplex
from lit_fedco.updaters.scaffold import Scaffold

__all__ = [
    "DRFL",
    "FCSG",
    "FCSGM",
    "GCIVR",
    "MBSGD",
    "PDSGD",
    "TRMAML",
    "AccFCSGM",
    "AdaptiveHparams",
    "CODAHparams",
    "CODAPlus",
    "ComFedL",
    "ComFedLDAMAML",
    "ComFedLMAML",
    "CompositionalUpdater",
    "DRFLHparams",
    "DSFedDRO",
    "DSFedDROHparams",
    "Ditto",
    "DittoHparams",
    "FCSGHparams",
    "FCSGMHparams",
    "FastDRO",
    "FastDROHparams",
    "FedAdam",
    "FedAvg",
    "FedAvgCO",
    "FedAvgCOCaseI",
    "FedAvgCOCaseIHparams",
    "FedAvgCOHparams",
    "FedAvgM",
    "FedAvgMHparams",
    "FedDRO",
    "FedDROHparams",
    "FedMAML",
    "FedMAMLHparams",
    "FedYogi",
    "GCIVRHparams",
    "Hparams",
    "LocalSCGD",
    "LocalSCGDHparams",
    "LocalSCGDM",
    "MBSGDHparams",
    "PDSGDHparams",
    "QFedAvg",
    "QFedAvgHparams",
    "Scaffold",
    "ServerOptHparams",
    "available_updaters",
    "combine",
    "get_updater",
    "project_simplex",
    "register",
]
