"""lit_fedco: federated compositional optimization on Lightning Fabric.

Algorithms are :class:`CompositionalUpdater` plug-ins registered by name; recipes in
``lit_fedco.recipes`` run the papers' experiments end to end. Everything a researcher's own
updater needs is exported here::

    import lit_fedco
    from lit_fedco import CompositionalUpdater, Hparams, Sync, StepInfo, register, tree_axpy

The names are imported on first use (PEP 562), so that ``import lit_fedco`` and a recipe's
``--help`` do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.version import VERSION

if TYPE_CHECKING:
    from lit_fedco.cli import main, run
    from lit_fedco.core.protocol import Probe, RoundContext, RoundInfo, StepInfo, Sync
    from lit_fedco.core.ranges import Bound
    from lit_fedco.core.server_opt import ServerOptConfig
    from lit_fedco.core.state import (
        State,
        tree_axpy,
        tree_clone,
        tree_dot,
        tree_leaves,
        tree_map,
        tree_scale,
        tree_sub,
        tree_zeros,
    )
    from lit_fedco.data.user import UserData
    from lit_fedco.engine.simulate import run_rounds
    from lit_fedco.objectives.base import Batch, Context, Objective
    from lit_fedco.problems import Problem, register_problem
    from lit_fedco.updaters import (
        CompositionalUpdater,
        Hparams,
        ServerOptHparams,
        available_updaters,
        combine,
        get_updater,
        register,
    )

__version__ = VERSION

_LAZY = {
    # the one entry point: a recipe of one's own is run(name, defaults)
    "run": "lit_fedco.cli",
    "main": "lit_fedco.cli",  # run, then the process ends (a recipe's __main__)
    # the plug-in surface
    "CompositionalUpdater": "lit_fedco.updaters",
    "Hparams": "lit_fedco.updaters",
    "ServerOptHparams": "lit_fedco.updaters",
    "Bound": "lit_fedco.core.ranges",  # a hyperparameter's range (Hparams.bounds)
    "register": "lit_fedco.updaters",
    "combine": "lit_fedco.updaters",
    "get_updater": "lit_fedco.updaters",
    "available_updaters": "lit_fedco.updaters",
    # problems: what depends on the data and the task (samplers, evaluation, objectives)
    "Problem": "lit_fedco.problems",
    "register_problem": "lit_fedco.problems",
    # a data set of one's own: what a data function (data.name=MODULE:FUNCTION) returns
    "UserData": "lit_fedco.data.user",
    # full-participation rounds on fixed batches in one process (examples, tests)
    "run_rounds": "lit_fedco.engine.simulate",
    # the round's vocabulary
    "Sync": "lit_fedco.core.protocol",
    "RoundInfo": "lit_fedco.core.protocol",
    "StepInfo": "lit_fedco.core.protocol",
    "RoundContext": "lit_fedco.core.protocol",
    "Probe": "lit_fedco.core.protocol",
    "ServerOptConfig": "lit_fedco.core.server_opt",
    "Objective": "lit_fedco.objectives.base",
    "Batch": "lit_fedco.objectives.base",
    "Context": "lit_fedco.objectives.base",
    # pytree helpers for states
    "State": "lit_fedco.core.state",
    "tree_map": "lit_fedco.core.state",
    "tree_leaves": "lit_fedco.core.state",
    "tree_axpy": "lit_fedco.core.state",
    "tree_sub": "lit_fedco.core.state",
    "tree_scale": "lit_fedco.core.state",
    "tree_dot": "lit_fedco.core.state",
    "tree_clone": "lit_fedco.core.state",
    "tree_zeros": "lit_fedco.core.state",
}
"""Exported name → the module that defines it, imported on first access."""

__all__ = [
    "Batch",
    "Bound",
    "CompositionalUpdater",
    "ConfigError",
    "Context",
    "Hparams",
    "Objective",
    "Probe",
    "Problem",
    "RoundContext",
    "RoundInfo",
    "ServerOptConfig",
    "ServerOptHparams",
    "State",
    "StepInfo",
    "Sync",
    "UserData",
    "__version__",
    "available_updaters",
    "combine",
    "get_updater",
    "main",
    "register",
    "register_problem",
    "run",
    "run_rounds",
    "tree_axpy",
    "tree_clone",
    "tree_dot",
    "tree_leaves",
    "tree_map",
    "tree_scale",
    "tree_sub",
    "tree_zeros",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'lit_fedco' has no attribute {name!r}")


assert set(__all__) == {"ConfigError", "__version__", *_LAZY}  # the list above is complete


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
