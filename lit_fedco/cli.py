"""The recipes' entry point: help and key checks first, without torch; then the run.

``python -m lit_fedco.recipes.<name> --help`` (``-h``, ``help``) and ``--help-all`` are
answered from the catalog (:mod:`lit_fedco.config.catalog`, :mod:`lit_fedco.config.helptext`), and
the keys of a command line, its preset and the recipe's defaults are checked against it, before
torch,
Lightning or W&B is imported: an unknown key ends the process with exit code 2 and the full
check's one-line message in well under a second. Everything else (values, ranges, files) is
checked by :func:`lit_fedco.experiment.runner.main`, which runs next.

A script that registers its own updater or problem imported torch to do so, and the catalog
does not know its keys: :func:`main` then hands everything to the runner at once.
"""

from __future__ import annotations

import sys
from typing import Any

from lit_fedco.config import catalog
from lit_fedco.config.helptext import HELP_FLAGS, print_help
from lit_fedco.core.errors import ConfigError


def load_for_help(argv: list[str], defaults: dict[str, Any]) -> Any:
    """The config ``argv`` would run with: the catalog's merge, or where it cannot judge the
    command line, :func:`lit_fedco.config.load.load_config` (which raises the exact error)."""
    cfg = catalog.check(argv, defaults)
    if cfg is None:
        from lit_fedco.config.load import load_config

        cfg = load_config(argv, defaults)
    return cfg


def main(
    recipe: str,
    defaults: dict[str, Any],
    argv: list[str] | None = None,
    columns: list[tuple[str, str]] | None = None,
    callbacks: list[Any] | None = None,
    evaluated_on: str = "validation",
) -> list[Any]:
    """Entry point of every recipe (the arguments of :func:`lit_fedco.experiment.runner.main`).

    Help is printed from the catalog; an unknown key ends the process with exit code 2 and a
    one-line message; both without importing torch. Otherwise the run starts:
    :func:`lit_fedco.experiment.runner.main` with the same arguments.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not catalog.runtime_extras():
        if any(a in HELP_FLAGS for a in argv):
            return print_help(recipe, defaults, argv, load_for_help)
        try:
            catalog.check(argv, defaults)
        except ConfigError as err:
            print(f"lit_fedco: {err}", file=sys.stderr)
            raise SystemExit(2) from None
    from lit_fedco.experiment.runner import main as run

    return run(recipe, defaults, argv, columns, callbacks, evaluated_on)
