"""lit_fedco: federated compositional optimization on Lightning Fabric.

Algorithms are :class:`CompositionalUpdater` plug-ins registered by name; recipes in
``lit_fedco.recipes`` run the papers' experiments end to end.

The updaters' names are imported on first use (PEP 562), so that ``import lit_fedco`` and a
recipe's ``--help`` do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.version import VERSION

if TYPE_CHECKING:
    from lit_fedco.updaters import (
        CompositionalUpdater,
        Hparams,
        available_updaters,
        get_updater,
        register,
    )

__version__ = VERSION

_LAZY = {
    "CompositionalUpdater": "lit_fedco.updaters",
    "Hparams": "lit_fedco.updaters",
    "available_updaters": "lit_fedco.updaters",
    "get_updater": "lit_fedco.updaters",
    "register": "lit_fedco.updaters",
}
"""Exported name → the module that defines it, imported on first access."""

__all__ = [
    "CompositionalUpdater",
    "ConfigError",
    "Hparams",
    "__version__",
    "available_updaters",
    "get_updater",
    "register",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'lit_fedco' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
