"""Registered combinations: an algorithm run with other declarations under a name of its own
(:func:`combine`), no method overridden."""

from __future__ import annotations

from typing import Any

from lit_fedco.updaters.base import CompositionalUpdater, register
from lit_fedco.updaters.declarations import DECLARATIONS
from lit_fedco.updaters.hparams import Hparams


def combine(
    name: str,
    algorithm: type[CompositionalUpdater],
    *,
    hparams_cls: type[Hparams] | None = None,
    doc: str = "",
    **declarations: Any,
) -> type[CompositionalUpdater]:
    """Register ``algorithm`` with other declarations under a name of its own: a method that
    is one algorithm on another composition (ComFedL-MAML is ComFedL on the MAML composition,
    TR-MAML is DRFL on it) or with a server optimizer (FedAdam is FedAvg with ``adam``). Only
    declarations change; no method is overridden.

    Args:
        name: the new updater's name (and config key).
        algorithm: the registered algorithm it runs.
        hparams_cls: its hyperparameters (default: the algorithm's).
        doc: its docstring (one line: the method, with the paper's equation).
        **declarations: any of :data:`DECLARATIONS` (``compositions``, ``default_problem``,
            ``server_optimizer``, ...); ``unvmappable_models`` adds to the algorithm's.
    """
    unknown = sorted(set(declarations) - set(DECLARATIONS))
    if unknown:
        raise TypeError(f"combine({name!r}): {unknown} are not declarations; use {DECLARATIONS}")
    attrs: dict[str, Any] = {
        **declarations,
        "unvmappable_models": algorithm.unvmappable_models
        | frozenset(declarations.get("unvmappable_models", ())),
        "hparams_cls": hparams_cls or algorithm.hparams_cls,
        "__doc__": doc or algorithm.__doc__,
        "__module__": algorithm.__module__,
    }
    cls = type("".join(w.capitalize() for w in name.split("_")), (algorithm,), attrs)
    return register(name)(cls)
