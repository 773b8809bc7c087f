"""The configuration's catalog without torch: the committed ``schema.json`` (every key's
type, default and description; :mod:`lit_fedco.config.schema` writes it), the nodes of updaters
and problems registered at run time (a researcher's own), and the typed schema built from them,
into which the command line is merged (:func:`lit_fedco.config.parser.merge`).

Imports: the standard library and OmegaConf; never torch (a registered class of one's own is
described from its dataclass only when its module, and torch with it, was imported).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lit_fedco.config import schema
from lit_fedco.config.schema import TYPES
from lit_fedco.core.errors import ConfigError


@cache
def load() -> dict[str, Any]:
    """The committed catalog (:data:`lit_fedco.config.schema.SCHEMA_FILE`); built from the
    dataclasses (importing torch) if the file is missing."""
    if not schema.SCHEMA_FILE.is_file():
        return schema.build()
    catalog: dict[str, Any] = json.loads(schema.SCHEMA_FILE.read_text(encoding="utf-8"))
    return catalog


def runtime_extras() -> list[str]:
    """Updaters and problems registered in this process that the catalog does not describe
    (a script's own updater), or describes with other parameters. Registries that were never
    imported (no torch yet) hold only the built-in names."""
    nodes = load()["nodes"]
    extras = []
    for module, names, attr in (
        ("lit_fedco.updaters.base", "available_updaters", "hparams_cls"),
        ("lit_fedco.problems.base", "available_problems", "params_cls"),
    ):
        registry = sys.modules.get(module)
        if registry is None:
            continue
        get = registry.get_updater if attr == "hparams_cls" else registry.get_problem
        for name in getattr(registry, names)():
            cls = getattr(get(name), attr)
            if nodes.get(name, {}).get("class") != f"{cls.__module__}.{cls.__qualname__}":
                extras.append(name)
    return extras


NODE_PARAMS: dict[str, type] = {}
"""Dataclasses whose fields extend a run node's keys, by node name: the ``Params`` of a
researcher's model (``model.name=MODULE:NAME`` adds its fields as ``model.*`` keys) or data
function. Filled by :func:`extend_node` when the command line names one."""


def extend_node(node: str, cls: type) -> None:
    """Add dataclass ``cls``'s fields to the keys of run node ``node`` (``model``, ``data``)
    for this process: the typed schema then accepts them and ``--help`` lists them.

    Raises:
        ConfigError: (key ``<node>.name``) a field of a type no config key holds (:data:`TYPES`).
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        if tp not in TYPES.values():
            raise ConfigError(
                f"{node}.name: the parameter {f.name!r} of {cls.__qualname__} has the type "
                f"{getattr(tp, '__name__', tp)}, expected one a config key can hold: "
                f"{', '.join(TYPES)}; change the field's type",
                key=f"{node}.name",
            )
    NODE_PARAMS[node] = cls


def current() -> dict[str, Any]:
    """The catalog with the nodes of :func:`runtime_extras` described from their classes, and
    the run nodes extended by :data:`NODE_PARAMS`."""
    extras = runtime_extras()
    if not extras and not NODE_PARAMS:
        return load()
    nodes = dict(load()["nodes"])
    if extras:
        from lit_fedco.updaters import available_updaters

        updaters = set(available_updaters())
        for name in extras:
            build = schema.updater_entry if name in updaters else schema.problem_entry
            nodes[name] = build(name, strict=False)
    for node, cls in NODE_PARAMS.items():
        entry = schema.node_entry(cls, "config", "", strict=False)
        own = nodes[node]
        added = {k: v for k, v in entry["keys"].items() if k not in own["keys"]}
        nodes[node] = {**own, "keys": {**own["keys"], **added}}
    return {**load(), "nodes": nodes}


# ---------------------------------------------------------------------- the typed schema
def _leaf(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The type and field of one key (a list default through a factory)."""
    default = spec["default"]
    if isinstance(default, list):
        items = tuple(default)
        return TYPES[spec["type"]], dataclasses.field(default_factory=lambda: list(items))
    return TYPES[spec["type"]], dataclasses.field(default=default)


def _dataclass(node: dict[str, Any], children: dict[str, type] | None = None) -> type:
    """A dataclass with ``node``'s keys, types, defaults and frozenness; ``children`` (a name
    → a dataclass) are its sub-nodes, and the node's ``order`` (if any) orders its fields."""
    children = children or {}
    fields = []
    for key in node.get("order") or node["keys"]:
        if key in children:
            fields.append((key, children[key], dataclasses.field(default_factory=children[key])))
        else:
            fields.append((key, *_leaf(node["keys"][key])))
    name = node["class"].rpartition(".")[2]
    return dataclasses.make_dataclass(name, fields, frozen=bool(node["frozen"]))


def typed_schema(catalog: dict[str, Any] | None = None) -> DictConfig:
    """The typed schema of ``catalog`` (default :func:`current`): the run's keys, one node per
    updater and problem, with their types, defaults and frozenness, struct-mode (an unknown
    key is an error). It mirrors :func:`lit_fedco.config.fields.schema` (tested). The committed
    catalog's is built once and shared: read it, or merge into a copy
    (:func:`lit_fedco.config.parser.merge` does)."""
    catalog = current() if catalog is None else catalog
    return _committed_schema() if catalog is load() else _build(catalog)


@cache
def _committed_schema() -> DictConfig:
    return _build(load())


def _build(catalog: dict[str, Any]) -> DictConfig:
    nodes = catalog["nodes"]
    children = {k: _dataclass(nodes[k]) for k in catalog["fields"] if k in nodes}
    cfg = OmegaConf.structured(_dataclass({**catalog["run"], "order": catalog["fields"]}, children))
    OmegaConf.set_struct(cfg, False)
    for name, node in nodes.items():
        if node["kind"] in ("updater", "problem"):
            sub = OmegaConf.structured(_dataclass(node))
            OmegaConf.set_readonly(sub, False)  # frozen dataclasses come in read-only
            cfg[name] = sub
    OmegaConf.set_struct(cfg, True)
    return cfg


def names(kind: str, catalog: dict[str, Any] | None = None) -> list[str]:
    """The names of the catalog's nodes of ``kind`` (``updater`` or ``problem``), sorted."""
    catalog = current() if catalog is None else catalog
    return sorted(k for k, v in catalog["nodes"].items() if v["kind"] == kind)
