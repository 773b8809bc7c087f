"""The names an updater is declared by: the hooks it may override (:data:`HOOKS`), the class
attributes that declare how its state travels (:data:`DECLARATIONS`), its aggregations, and
where a class defines a hook (:func:`defining_class`)."""

from __future__ import annotations

HOOKS = (
    "init_server",
    "init_client",
    "round_context",
    "client_step",
    "client_end",
    "server_update",
    "client_weights",
    "eval_params",
)
"""The methods an updater may override (the plug-in surface)."""

AGGREGATIONS = ("uniform", "samples")

DECLARATIONS = (
    "client_state", "model_key", "personal_key", "broadcast_keys", "roles", "compositions",
    "default_problem", "aggregation", "server_optimizer", "unvmappable_models",
)  # fmt: skip
"""The class attributes that declare how an updater's state travels and what it runs on."""


def defining_class(cls: type, hook: str) -> type:
    """The class of ``cls``'s method resolution order that defines ``hook``: the one way an
    overridden hook is found (:class:`~lit_fedco.updaters.base.CompositionalUpdater`'s ``_own``
    and ``implements``, :func:`~lit_fedco.updaters.base.overridden`)."""
    return next(c for c in cls.__mro__ if hook in c.__dict__)
