"""lit_fedco: federated compositional optimization on Lightning Fabric.

Algorithms are :class:`CompositionalUpdater` plug-ins registered by name; recipes in
``lit_fedco.recipes`` run the papers' experiments end to end.
"""

from lit_fedco.errors import ConfigError
from lit_fedco.updaters import (
    CompositionalUpdater,
    Hparams,
    available_updaters,
    get_updater,
    register,
)

__version__ = "0.1.0"

__all__ = [
    "CompositionalUpdater",
    "ConfigError",
    "Hparams",
    "__version__",
    "available_updaters",
    "get_updater",
    "register",
]
