"""A researcher's own updaters and problems, brought in by module path from any recipe.

``updater=my_lab.methods:Scaffold`` imports ``my_lab.methods`` and runs its class ``Scaffold``
(registered under the name its ``@lit_fedco.register`` gave it, or, undecorated, under its
class name in snake case: ``scaffold``); ``plugins=[my_lab.methods]`` imports the module so that
the updaters and problems it registers can be named (``updaters=[my_scaffold,fedavg]``).
Nothing inside lit_fedco is edited or regenerated: ``--help`` describes the imported classes
from their dataclasses. The modules are found on ``sys.path``: the current folder when a
recipe runs as ``python -m lit_fedco.recipes.<name>``, ``PYTHONPATH``, or an installed package.

The run's config records every module in ``plugins`` and each class by its registered name,
so that ``config.yaml``, a resume and the processes Fabric starts import the same code.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lit_fedco.config.messages import as_plain
from lit_fedco.config.parser import CommandLine, is_ref
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.imports import import_module


def snake(name: str) -> str:
    """``MyScaffold`` → ``my_scaffold`` (the name an undecorated class is registered under)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def resolve_class(ref: str) -> str:
    """Import ``module:Class`` and return the name the updater class is registered under
    (registering it under :func:`snake` of its class name if it is not yet).

    Raises:
        ConfigError: a missing module or class, or a class that is not an updater.
    """
    from lit_fedco.updaters.base import _REGISTRY, CompositionalUpdater, register

    module_name, _, class_name = ref.partition(":")
    module = import_module(module_name, "updater")
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(
            k for k, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, CompositionalUpdater)
            and v.__module__ == module.__name__
        )  # fmt: skip
        raise ConfigError(
            f"updater: module {module_name!r} has no class {class_name!r} (its updaters: "
            f"{', '.join(found) or 'none'}); name one of them, e.g. "
            f"updater={module_name}:{found[0] if found else 'MyUpdater'}",
            key="updater",
        )
    if not (isinstance(cls, type) and issubclass(cls, CompositionalUpdater)):
        raise ConfigError(
            f"updater: {ref!r} is a {type(cls).__name__}, expected a subclass of "
            "lit_fedco.CompositionalUpdater",
            key="updater",
        )
    if cls.name and _REGISTRY.get(cls.name) is cls:
        return cls.name
    name = snake(cls.__name__)
    try:
        register(name)(cls)
    except (ConfigError, TypeError) as err:
        raise ConfigError(f"updater: {ref!r} cannot be registered as {name!r}: {err}",
                          key="updater") from None  # fmt: skip
    return name


def import_plugins(cmd: CommandLine) -> CommandLine:
    """Import every module the command line names and put the registered names of its
    ``module:Class`` updaters in their place; ``plugins`` then lists every module imported.
    Without such names, nothing is imported (and torch stays unimported).

    Raises:
        ConfigError: a module or class that cannot be found, imported or registered.
    """
    _node_params(cmd)
    refs = cmd.plugin_refs()
    if not refs:
        return cmd
    names: dict[str, str] = {}
    for ref in refs:
        if is_ref(ref):
            names[ref] = resolve_class(ref)
        else:
            import_module(ref, "plugins")
    modules = list(dict.fromkeys(ref.partition(":")[0] for ref in refs))
    layers = [(source, _replaced(layer, names)) for source, layer in cmd.layers]
    record = ("the plugins the command line names", {"plugins": modules})
    return dataclasses.replace(cmd, layers=[*layers, record])


def _last_name(cmd: CommandLine, node: str) -> str | None:
    """The ``<node>.name`` the command line's layers set last (None: none sets it)."""
    name = None
    for _, layer in cmd.layers:
        values = as_plain(layer)
        part = values.get(node) if isinstance(values, dict) else None
        if isinstance(part, dict) and isinstance(part.get("name"), str):
            name = part["name"]
    return name


def _node_params(cmd: CommandLine) -> None:
    """When the command line's last ``model.name`` is a researcher's model ``MODULE:NAME``, or
    its last ``data.name`` a data function ``MODULE:FUNCTION`` (:mod:`lit_fedco.data.user`),
    import it and make the fields of its ``Params`` dataclass (if any) keys of that node
    (:func:`lit_fedco.config.catalog.extend_node`).

    Raises:
        ConfigError: (key ``model.name`` or ``data.name``) a module or name that cannot be
            found or imported, or data parameters that clash with lit_fedco's own data keys.
    """
    from lit_fedco.config.catalog import extend_node, load
    from lit_fedco.data.names import is_function_ref

    model = _last_name(cmd, "model")
    if model is not None and ":" in model:
        from lit_fedco.core.models import model_factory

        _, params_cls = model_factory(model)
        if params_cls is not None:
            extend_node("model", params_cls)
    data = _last_name(cmd, "data")
    if data is not None and is_function_ref(data):
        from lit_fedco.data.user import params_class, resolve_function

        params_cls = params_class(resolve_function(data), data, load()["nodes"]["data"]["keys"])
        if params_cls is not None:
            extend_node("data", params_cls)


def _replaced(layer: Any, names: dict[str, str]) -> Any:
    """``layer`` with every ``module:Class`` of its ``updaters`` replaced by a registered name."""
    values = as_plain(layer)
    if not isinstance(values, dict) or not isinstance(values.get("updaters"), list):
        return layer
    if not any(is_ref(v) for v in values["updaters"]):
        return layer
    values = {**values, "updaters": [names.get(str(v), v) for v in values["updaters"]]}
    return OmegaConf.create(values) if isinstance(layer, DictConfig) else values
