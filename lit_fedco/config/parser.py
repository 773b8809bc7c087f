"""The command line and its presets, parsed once and without torch.

``python -m lit_fedco.recipes.<name> [preset=NAME] [key=value ...] [--help | --help-all]``:

- ``key=value`` items (``--key=value`` too; ``key=`` sets the empty string); ``updater=NAME``
  is short for ``updaters=[NAME]``;
- ``preset=NAME`` reads a YAML preset: a file, or a name shipped with lit_fedco (the
  repository's ``recipes/`` folder, installed as the package ``lit_fedco.presets`` and found
  through :mod:`importlib.resources`, so an installed wheel has them too); a preset may name
  another under ``extends:``, which it overrides;
- an updater named ``module:Class`` (``updater=my_lab.methods:Scaffold``), and every module in
  ``plugins=[...]``, is a researcher's own: :mod:`lit_fedco.config.plugins` imports it before
  the config is typed.

:func:`parse` gives the layers to merge (the recipe's defaults, the presets, one layer per
command-line item) in a :class:`CommandLine`; :func:`merge` merges them into a schema one
at a time, so that an error names its key and where it came from. ``--help``, the checks and
the run all go through these two functions.

Imports: the standard library, PyYAML and OmegaConf; never torch.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.resources
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lit_fedco.config import catalog
from lit_fedco.config.messages import as_plain, example, friendly, shorten
from lit_fedco.core.errors import ConfigError

HELP_FLAGS = ("-h", "--help", "help", "--help-all", "--list-sub-runs")
"""Arguments that ask for help (``--help-all``: every key; ``--list-sub-runs``: the run's
sub-runs, for ``sub_run=INDEX``)."""
PRESETS_PACKAGE = "lit_fedco.presets"
"""The package the shipped presets are installed as (the repository's ``recipes/`` folder)."""
_RUN_LINE = re.compile(r"^#\s*Run:\s+python -m lit_fedco\.recipes\.(\w+)\b")
_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
KEY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
"""A config key: names of letters, digits and ``_``, joined by dots (``data.name``)."""


def flat_keys(values: dict[Any, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"dotted.key": value}``, the way the command line names keys."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(flat_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@dataclass
class CommandLine:
    """A parsed command line.

    Attributes:
        argv: the arguments as given (without the help flags).
        defaults: the recipe's defaults.
        layers: ``(source, mapping)`` to merge in order: the recipe's defaults, each preset
            (the ones it extends first), then one per command-line item.
        help: ``""``, ``"help"`` (``--help``), ``"all"`` (``--help-all``) or ``"sub-runs"``
            (``--list-sub-runs``).
    """

    argv: list[str]
    defaults: dict[str, Any]
    layers: list[tuple[str, Any]] = field(default_factory=list)
    help: str = ""

    def plugin_refs(self) -> list[str]:
        """Every module (``plugins``) and ``module:Class`` updater the layers name, in order."""
        out: list[str] = []
        for _, layer in self.layers:
            values = as_plain(layer)
            if not isinstance(values, dict):
                continue
            for key in ("plugins", "updaters"):
                items = values.get(key)
                if isinstance(items, list):
                    out += [str(v) for v in items if key == "plugins" or is_ref(v)]
        return list(dict.fromkeys(out))

    def with_items(self, extra: list[str], source: str) -> CommandLine:
        """This command line with ``extra`` items after its own (a variant's overrides)."""
        more = parse(extra, None, source)
        return dataclasses.replace(self, argv=[*self.argv, *extra],
                                   layers=[*self.layers, *more.layers])  # fmt: skip


def is_ref(value: Any) -> bool:
    """Whether ``value`` names a class in a module: ``package.module:Class``."""
    return isinstance(value, str) and _REF.match(value) is not None


# ---------------------------------------------------------------------- presets
def preset_dir() -> Path | None:
    """Where the shipped presets are: the package :data:`PRESETS_PACKAGE` (installed from
    the repository's ``recipes/``, or that folder itself in an editable install), else a
    source checkout's ``recipes/`` when lit_fedco runs from one uninstalled; None if neither."""
    try:
        found = Path(str(importlib.resources.files(PRESETS_PACKAGE)))
    except (ModuleNotFoundError, TypeError):
        found = Path(__file__).resolve().parents[2] / "recipes"  # an uninstalled checkout
    return found if found.is_dir() else None


def find_preset(preset: str) -> Path:
    """A preset given as a path, or as the name of a shipped one (``name`` or ``name.yaml``).

    Raises:
        ConfigError: no such file; the message lists the shipped presets.
    """
    shipped = preset_dir()
    candidates = [Path(preset)]
    if shipped is not None and "/" not in preset:
        candidates += [shipped / preset, shipped / f"{preset}.yaml"]
    for cand in candidates:
        if cand.is_file():
            return cand
    names = sorted(p.stem for p in shipped.glob("*.yaml")) if shipped is not None else []
    shown = preset if len(preset) <= 80 else preset[:77] + "..."
    raise ConfigError(
        f"preset: got {shown!r}, no such file (looked in the current folder and lit_fedco's "
        f"presets); available presets: {', '.join(names) or 'none'}",
        key="preset",
    )


def preset_layers(preset: str, _seen: tuple[Path, ...] = ()) -> list[tuple[str, Any]]:
    """The layers of a preset, base first: a preset may name another under ``extends`` (a
    grid preset extends the setting it sweeps), whose values it overrides.

    Raises:
        ConfigError: a missing or unreadable preset, a malformed ``extends``, or a cycle.
    """
    path = find_preset(preset).resolve()
    if path in _seen:
        chain = " -> ".join(p.stem for p in (*_seen, path))
        raise ConfigError(f"preset: {path.name} extends itself ({chain}); break the cycle")
    try:
        layer = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError, OSError, ValueError, UnicodeDecodeError) as err:
        first = str(getattr(err, "problem", None) or err or type(err).__name__).splitlines()[0]
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"preset: {path} is not a readable YAML mapping ({first[:120]}{where}); fix the "
            "file (lists take [a, b] with the brackets closed) or choose another preset"
        ) from None
    if not isinstance(layer, DictConfig):
        raise ConfigError(
            f"preset: {path} must hold a mapping of keys (rounds: 50), got "
            f"{type(OmegaConf.to_container(layer)).__name__}; write one key: value per line"
        )
    if not layer:
        raise ConfigError(
            f"preset: {path} is empty, expected a mapping of keys (rounds: 50); fill it in, "
            "or leave out preset= to run the recipe's defaults"
        )
    odd = [str(k) for k in layer if not KEY.match(str(k))]
    if odd:
        raise ConfigError(
            f"preset: {path} is not a lit_fedco preset: {shorten(odd[0])!r} is not a config "
            "key (names of letters, digits and _, joined by dots, e.g. rounds: 50)",
            key="preset",
        )
    base = layer.pop("extends", None)
    if base is None:
        return [(f"preset {path}", layer)]
    if not isinstance(base, str) or not base:
        raise ConfigError(
            f"extends: got {base!r} in preset {path}, expected the name of another preset "
            "(e.g. extends: comfedl_dro_mnist)"
        )
    return [*preset_layers(base, (*_seen, path)), (f"preset {path}", layer)]


def presets(recipe: str | None = None) -> list[tuple[str, str]]:
    """``(name, summary)`` of every shipped preset whose header's ``Run:`` line runs
    ``recipe`` (every preset when None), by name."""
    shipped = preset_dir()
    out = []
    for path in sorted(shipped.glob("*.yaml")) if shipped is not None else []:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        header = list(itertools.takewhile(lambda line: line.startswith("#"), lines))
        runs = {m.group(1) for line in header if (m := _RUN_LINE.match(line))}
        if recipe is not None and recipe not in runs:
            continue
        text = itertools.takewhile(lambda line: not _RUN_LINE.match(line), header)
        out.append((path.stem, summary(" ".join(line.lstrip("#").strip() for line in text))))
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


# ---------------------------------------------------------------------- the command line
def _item(key: str, value: str) -> DictConfig:
    """One ``key=value`` of the command line as a config; an empty value is the empty string."""
    try:
        return OmegaConf.from_dotlist([f"{key}={value}" if value.strip() else f"{key}=''"])
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as err:
        first = str(getattr(err, "problem", None) or err).splitlines()[0]
        fix = example(key, catalog.typed_schema(catalog.load()))
        raise ConfigError(
            f"{key}: got {shorten(value)!r} (from the command line), which does not parse "
            f"({first}); expected a value, or a list with its brackets closed; set e.g. {fix}",
            key=key,
        ) from None


def parse(
    argv: list[str], defaults: dict[str, Any] | None = None, source: str = "the command line"
) -> CommandLine:
    """The layers of a command line (and of its presets), in merge order.

    Raises:
        ConfigError: an item that is not ``key=value``, a value that does not parse, a preset
            that is missing or malformed.
    """
    flags = [a for a in argv if a in HELP_FLAGS]
    rest = [a for a in argv if a not in HELP_FLAGS]
    layers: list[tuple[str, Any]] = []
    if defaults:
        layers.append(("the recipe's defaults", defaults))
    items: list[tuple[str, Any]] = []
    given: dict[str, str] = {}  # key -> its item, to refuse a key given twice
    for arg in rest:
        key, eq, value = arg.partition("=")
        key = key[2:] if key.startswith("--") else key
        if not eq or not key:
            raise ConfigError(
                f"command line: got {shorten(arg, 80)!r}, expected key=value (e.g. rounds=50 or "
                "preset=comfedl_dro_mnist); list-valued keys take [a,b]"
            )
        if not KEY.match(key):
            raise ConfigError(
                f"command line: got {shorten(arg, 80)!r}, whose key {shorten(key)!r} is not a "
                "config key (names of letters, digits and _, joined by dots); e.g. rounds=5 or "
                "data.name=mnist",
                key=key,
            )
        if not value.isprintable():
            raise ConfigError(
                f"{key}: got {shorten(value)!r}, expected a value on one line (no newline, tab or "
                "control character)",
                key=key,
            )
        name = "updaters" if key == "updater" else key
        if name in given:
            raise ConfigError(
                f"{name}: given twice ({shorten(given[name])!r}, then {shorten(arg)!r}); give "
                "it once",
                key=name,
            )
        given[name] = arg
        if key == "preset":
            layers.extend(preset_layers(value))
        else:
            items.append((source, _item(name, f"[{value}]" if key == "updater" else value)))
    help_kind = "all" if "--help-all" in flags else ("help" if flags else "")
    if "--list-sub-runs" in flags:
        help_kind = "sub-runs"
    return CommandLine(list(rest), dict(defaults or {}), [*layers, *items], help_kind)


def merge(schema: DictConfig, layers: list[tuple[str, Any]]) -> DictConfig:
    """``schema`` ← every layer, one at a time (an error names its key and its source), then
    interpolations resolved and lists checked to hold single values.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, an interpolation that does not
            resolve, a nested list.
    """
    cfg = copy.deepcopy(schema)  # then each layer merged in place (``OmegaConf.merge`` copies)
    try:
        for _, layer in layers:
            cfg.merge_with(layer)
    except (OmegaConfBaseException, TypeError, ValueError):
        # merged again, each merge on a copy, so that the failing layer's error is told
        # against the config the layers before it made, left whole
        cfg = schema
        for source, layer in layers:
            try:
                cfg = cast(DictConfig, OmegaConf.merge(cfg, layer))
            except (OmegaConfBaseException, TypeError, ValueError) as err:
                raise friendly(err, source, layer, cfg) from None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        key = str(getattr(err, "full_key", None) or "?")
        first = str(getattr(err, "msg", None) or err).splitlines()[0]
        raise ConfigError(
            f"{key}: got {_raw(cfg, key)!r}, expected a value or an interpolation that resolves "
            f"({first}); set e.g. {example(key, cfg)}",
            key=key,
        ) from None
    check_leaves(cfg)
    return cfg


INT64 = 2**63
"""Integers must fit torch's int64 (a round counter, a seed, a size)."""


def check_leaves(cfg: DictConfig) -> None:
    """Every list in ``cfg`` holds single values (OmegaConf lets ``seeds=[[1]]`` through), then
    every float is finite and every int fits in 64 bits.

    Raises:
        ConfigError: naming the key, its value and an example
            (``comfedl.lr: got inf, expected a finite number``).
    """
    values = flat_keys(as_plain(cfg))
    for key, v in values.items():
        if isinstance(v, list) and any(isinstance(x, dict | list) for x in v):
            raise ConfigError(
                f"{key}: got {v!r}, expected a list of single values (no nested lists or "
                f"mappings); set e.g. {example(key, cfg)}",
                key=key,
            )
    for key, v in values.items():
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, float) and not math.isfinite(x):
                fix = example(key, catalog.typed_schema())
                raise ConfigError(f"{key}: got {x}, expected a finite number; set e.g. {fix}",
                                  key=key)  # fmt: skip
            if isinstance(x, int) and not isinstance(x, bool) and not -INT64 <= x < INT64:
                raise ConfigError(
                    f"{key}: got {shorten(str(x))}, expected an int of at most 64 bits (below "
                    f"{INT64:.2e})",
                    key=key,
                )


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value at ``key`` as written, interpolations unresolved."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    try:
        for part in filter(None, re.split(r"\.|\[(\d+)\]", key)):
            node = node[int(part)] if isinstance(node, list) else node[part]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return node


def known_names(cfg: DictConfig, updaters: list[str], problems: list[str]) -> None:
    """Every updater and the objective are registered names.

    Raises:
        ConfigError: naming the closest valid name and how to bring one's own.
    """
    import difflib

    for name in [str(n) for n in cfg.updaters]:
        if name not in updaters:
            close = difflib.get_close_matches(name, updaters, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"updater: got {name!r}, expected one of {updaters}; {hint}an updater of your "
                "own: updater=my_module:MyUpdater (or plugins=[my_module])",
                key="updaters",
            )
    objective = str(cfg.objective)
    if objective and objective not in problems:
        raise ConfigError.bad_value(
            "objective", objective, f"one of {problems} (or empty)", "invariant_logreg"
        )
