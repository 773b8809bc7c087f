"""The configuration without torch: the committed catalog ``schema.json`` (every key's type,
default and description; :mod:`lit_fedco.config.schema` writes it), the typed schema rebuilt from
it, the presets, and the checks a command line gets before anything heavy is imported.

:func:`check` merges the same layers as :func:`lit_fedco.config.load.load_config` (the recipe's
defaults, the preset and the presets it extends, the command line) into a schema of the same
shape, built from dataclasses generated from the catalog. A key the schema does not have fails
there with the message the full check gives; anything else it cannot judge exactly (a
malformed argument, a preset that does not load, a value of the wrong type) is left to the
full check, which runs next in any case.

Imports: the standard library, PyYAML (through OmegaConf) and OmegaConf; never torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from lit_fedco.config.messages import unknown_key_error
from lit_fedco.core.errors import ConfigError

SCHEMA_FILE = Path(__file__).resolve().parent / "schema.json"
PRESET_DIR = Path(__file__).resolve().parents[2] / "recipes"
"""Where bare preset names are looked up (as :data:`lit_fedco.config.load.PRESET_DIR`)."""

TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "list[str]": list[str],
    "list[int]": list[int],
    "list[float]": list[float],
}

_RUN_LINE = re.compile(r"^#\s*Run:\s+python -m lit_fedco\.recipes\.(\w+)\b")


@cache
def load() -> dict[str, Any]:
    """The committed catalog (:data:`SCHEMA_FILE`); built from the dataclasses (importing
    torch) if the file is missing."""
    if not SCHEMA_FILE.is_file():
        from lit_fedco.config.schema import build

        return build()
    catalog: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
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


def current() -> dict[str, Any]:
    """The catalog with the nodes of :func:`runtime_extras` described from their classes."""
    extras = runtime_extras()
    if not extras:
        return load()
    from lit_fedco.config import schema
    from lit_fedco.updaters import available_updaters

    updaters = set(available_updaters())
    nodes = dict(load()["nodes"])
    for name in extras:
        build = schema.updater_entry if name in updaters else schema.problem_entry
        nodes[name] = build(name, strict=False)
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


@cache
def _classes() -> tuple[type, tuple[tuple[str, type], ...]]:
    """The run's dataclass, and (name, dataclass) of every updater and problem node."""
    catalog = load()
    nodes = catalog["nodes"]
    children = {k: _dataclass(nodes[k]) for k in catalog["fields"] if k in nodes}
    run = _dataclass({**catalog["run"], "order": catalog["fields"]}, children)
    sections = tuple(
        (k, _dataclass(v)) for k, v in nodes.items() if v["kind"] in ("updater", "problem")
    )
    return run, sections


def typed_schema() -> DictConfig:
    """The schema of :func:`lit_fedco.config.load.schema`, rebuilt from the catalog: the same
    nodes, types, defaults and flags, so that merges fail (or not) the same way."""
    run, sections = _classes()
    cfg = OmegaConf.structured(run)
    OmegaConf.set_struct(cfg, False)
    for name, cls in sections:
        node = OmegaConf.structured(cls)
        OmegaConf.set_readonly(node, False)  # frozen dataclasses come in read-only
        cfg[name] = node
    OmegaConf.set_struct(cfg, True)
    return cfg


# ---------------------------------------------------------------------- checks
def unknown_key(err: ConfigKeyError, source: str) -> ConfigError:
    """The full check's message for a key the schema does not have
    (``lit_fedco.config.load._friendly``): the key, where it came from, the closest valid key and
    the valid keys of its node."""
    return unknown_key_error(str(getattr(err, "full_key", None) or "?"), source, typed_schema())


def _resolve_preset(preset: str) -> Path | None:
    for cand in (Path(preset), PRESET_DIR / preset, PRESET_DIR / f"{preset}.yaml"):
        if cand.is_file():
            return cand
    return None


def _preset_layers(preset: str, seen: tuple[Path, ...] = ()) -> list[tuple[str, Any]] | None:
    """The layers of a preset as :func:`lit_fedco.config.load.preset_layers` reads them; None for
    a preset that it would refuse (the full check words that)."""
    found = _resolve_preset(preset)
    if found is None or found.resolve() in seen:
        return None
    path = found.resolve()
    try:
        layer = OmegaConf.load(path)
    except Exception:
        return None
    if not isinstance(layer, DictConfig):
        return None
    base = layer.pop("extends", None)
    if base is None:
        return [(f"preset {path}", layer)]
    if not isinstance(base, str) or not base:
        return None
    below = _preset_layers(base, (*seen, path))
    return None if below is None else [*below, (f"preset {path}", layer)]


def _plain(values: Any) -> bool:
    """No interpolation and no list inside a list or of mappings anywhere in ``values``: the
    full check resolves and flattens nothing that could fail before it checks names."""
    if isinstance(values, dict):
        return all(_plain(v) for v in values.values())
    if isinstance(values, list):
        return all(not isinstance(v, list | dict) and _plain(v) for v in values)
    return not (isinstance(values, str) and "${" in values)


def _check_names(cfg: DictConfig) -> None:
    """Unknown updater or problem names, worded as ``lit_fedco.updaters.base.get_updater`` and
    ``lit_fedco.problems.base.get_problem`` word them."""
    nodes = load()["nodes"]
    updaters = sorted(k for k, v in nodes.items() if v["kind"] == "updater")
    for name in [str(n) for n in cfg.updaters]:
        if name not in updaters:
            close = difflib.get_close_matches(name, updaters, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"updater: got {name!r}, expected one of {updaters}.{hint} "
                "Register new updaters with @lit_fedco.register('name')."
            )
    problems = sorted(k for k, v in nodes.items() if v["kind"] == "problem")
    objective = str(cfg.objective)
    if objective and objective not in problems:
        raise ConfigError.bad_value(
            "objective", objective, f"one of {problems} (or empty)", "invariant_logreg"
        )


def check(argv: list[str], defaults: dict[str, Any] | None = None) -> DictConfig | None:
    """The keys of a command line, its preset and the recipe's defaults against the catalog,
    merged as :func:`lit_fedco.config.load.load_config` merges them.

    Only what the full check is certain to report first is reported: an unknown key that is
    the input's only merge error (or the first in the recipe's defaults or a preset, which
    merge before the command line), then an unknown updater or problem name. Anything else (a
    malformed item, a preset that does not load, a value of the wrong type, two bad items whose
    order the full check may take differently, the keys of ``variants``) is left to the full
    check, which runs next in any case.

    Returns:
        The merged config; None where the full check must decide.

    Raises:
        ConfigError: worded as the full check words it.
    """
    layers: list[tuple[str, Any]] = []
    if defaults:
        layers.append(("the recipe's defaults", defaults))
    items: list[tuple[str, Any]] = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        key = key.lstrip("-")
        if not eq or not key or not value.strip():
            return None
        if key == "preset":
            found = _preset_layers(value)
            if found is None or not all(layer for _, layer in found):
                return None
            layers.extend(found)
            continue
        item = f"updaters=[{value}]" if key == "updater" else f"{key}={value}"
        try:
            items.append(("the command line", OmegaConf.from_dotlist([item])))
        except Exception:
            return None
    cfg = typed_schema()
    error: ConfigError | None = None
    for i, (source, layer) in enumerate([*layers, *items]):
        try:
            merged = OmegaConf.merge(cfg, layer)
        except ConfigKeyError as err:
            if error is not None:
                return None  # two bad items: which is first is the full check's to say
            error = unknown_key(err, source)
            if i < len(layers):
                raise error from None
            continue
        except Exception:
            return None
        assert isinstance(merged, DictConfig)
        cfg = merged
    if error is not None:
        raise error
    try:
        if not _plain(OmegaConf.to_container(cfg, resolve=False)):
            return None
        _check_names(cfg)
    except ConfigError:
        raise
    except Exception:
        return None
    return cfg


# ---------------------------------------------------------------------- presets
def presets(recipe: str | None = None) -> list[tuple[str, str]]:
    """``(name, summary)`` of every preset in :data:`PRESET_DIR` whose header's
    ``Run:`` line runs ``recipe`` (every preset when None), by name."""
    out = []
    for path in sorted(PRESET_DIR.glob("*.yaml")) if PRESET_DIR.is_dir() else []:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        header = []
        for line in lines:
            if not line.startswith("#"):
                break
            header.append(line)
        runs = {m.group(1) for line in header if (m := _RUN_LINE.match(line))}
        if recipe is not None and recipe not in runs:
            continue
        text = []
        for line in header:
            if _RUN_LINE.match(line):
                break
            text.append(line.lstrip("#").strip())
        out.append((path.stem, summary(" ".join(text))))
    return out


def _top_level(text: str) -> list[tuple[int, str]]:
    """(index, character) of the characters of ``text`` outside brackets."""
    out, depth = [], 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append((i, c))
    return out


def summary(text: str, limit: int = 140) -> str:
    """A preset's header comment shortened to what it runs: up to its first full stop or
    semicolon outside brackets; past ``limit`` characters without the bracketed asides, and
    cut after a comma."""
    for i, c in _top_level(text):
        if c == ";" or (c == "." and text[i + 1 : i + 2] in (" ", "")):
            text = text[:i]
            break
    text = text.rstrip(" .")
    if len(text) > limit:  # without the asides in parentheses
        while (m := re.search(r"\s*\([^()]*\)", text)) is not None:
            text = text[: m.start()] + text[m.end() :]
    if len(text) > limit:
        cut = max((i for i, c in _top_level(text[:limit]) if c == ","), default=limit)
        return text[:cut] + ", …"
    return text + "."
