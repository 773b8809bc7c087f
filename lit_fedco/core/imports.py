"""Importing a researcher's module by name (``updater=``, ``plugins=``, ``model.name=``,
``data.name=``): a module that is missing, or that raises while it is imported or called, is
one line naming the config key, never a traceback. Standard library only (no torch)."""

from __future__ import annotations

import importlib
import traceback
from typing import Any

from lit_fedco.core.errors import ConfigError


def import_module(module: str, key: str) -> Any:
    """Import ``module`` for config key ``key``.

    Raises:
        ConfigError: the module is not found (how to make it found), or it raised while it was
            imported (:func:`raised`).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and (module == err.name or module.startswith(f"{err.name}.")):
            raise ConfigError(
                f"{key}: cannot import module {module!r} ({err}); run from the folder that "
                "holds it, put that folder on PYTHONPATH, or install the package",
                key=key,
            ) from None
        raise raised(f"importing module {module!r}", key, err, "fix the module") from None
    except Exception as err:  # the user's module raised while it was imported
        raise raised(f"importing module {module!r}", key, err, "fix the module") from None


def raised(what: str, key: str, err: BaseException, fix: str = "fix it") -> ConfigError:
    """One line for a researcher's code that raised while doing ``what``: the error's first
    line and where it was raised, then ``fix``."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    if isinstance(err, SyntaxError):
        where = f" at {err.filename}:{err.lineno}"
    first = (str(err).splitlines() or [""])[0][:200]
    return ConfigError(
        f"{key}: {what} failed ({type(err).__name__}: {first}{where}); {fix}", key=key
    )
