"""A long ``variants`` list checked in a fraction of a second, before torch is imported.

:func:`lit_fedco.config.load.variant_configs` builds each variant's whole config (tens of
milliseconds each), and the run checks each one after torch is imported, so a mistake in the
last of 1,000 variants was refused only after minutes. :func:`screen_variants` reads each
variant's items on their own, each distinct item once: quotes that do not close, an item that
is not ``key=value``, an unknown key or a value of the wrong type, a key of the whole run
(:data:`~lit_fedco.config.load.RUN_LEVEL`), an unknown or repeated updater, a value outside the
catalog's enumerations and ranges, and a variant that repeats an earlier one item for item.
Each is refused in the words of the full check. What it cannot tell from the items alone (an
interpolation, a range a node's dataclass checks, data that cannot be built) is left to the full
check.

Imports: the standard library and OmegaConf; never torch.
"""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lit_fedco.config import catalog
from lit_fedco.config.load import RUN_LEVEL, check_distinct, run_level_error, split_variant
from lit_fedco.config.messages import as_plain
from lit_fedco.config.parser import KEY, flat_keys, known_names, merge, parse
from lit_fedco.config.values import check_one, check_repeats
from lit_fedco.core.errors import ConfigError

try:  # the loader OmegaConf reads command-line values with (a private module: may move)
    from omegaconf._yaml import get_yaml_loader
except ImportError:  # pragma: no cover - then every item is read by the parser
    get_yaml_loader = None  # type: ignore[assignment]


class _Items:
    """Each distinct item of the variants parsed and typed once: ``{"key": value}``."""

    def __init__(self) -> None:
        self.cat = catalog.current()  # with the nodes of updaters registered at run time
        self.typed = catalog.typed_schema(self.cat)
        self.scratch: DictConfig = copy.deepcopy(self.typed)  # takes each item, to type it
        self.done: dict[str, dict[str, Any]] = {}

    def values(self, item: str, i: int) -> dict[str, Any]:
        """The flat ``{key: value}`` item ``item`` of ``variants[i]`` sets.

        Raises:
            ConfigError: not ``key=value``, an unknown key, a value of the wrong type.
        """
        if item not in self.done:
            source = f"variant {i}"
            simple = _simple(item)  # else a preset, updater=, an odd item: read by the parser
            layers = [simple] if simple else [lay for _, lay in parse([item], None, source).layers]
            out: dict[str, Any] = {}
            for layer in layers:
                raw = as_plain(layer)
                flat = flat_keys(raw) if isinstance(raw, dict) else {}
                self._type(flat, layer, source)
                out.update(flat)
            self.done[item] = out
        return self.done[item]

    def _type(self, flat: dict[str, Any], layer: Any, source: str) -> None:
        """Each value set in the scratch schema (its type checked there), and a single value
        read back as the schema typed it (``1`` for a float key is ``1.0``, as the full check
        sees it); where that fails, ``layer`` merged into a fresh schema for the full check's
        message."""
        try:
            with warnings.catch_warnings():  # an int for a float: converted, as merge does
                warnings.simplefilter("ignore", FutureWarning)
                for key, value in flat.items():
                    *path, last = key.split(".")
                    node: Any = self.scratch
                    for part in path:
                        node = node[part]
                    node[last] = value
                    if not isinstance(value, dict | list):
                        flat[key] = node[last]
        except (OmegaConfBaseException, TypeError, ValueError, KeyError):
            self.scratch = copy.deepcopy(self.typed)
            merge(self.typed, [(source, layer)])  # raises the full check's ConfigError


def _simple(item: str) -> dict[str, Any] | None:
    """``key=value`` read as :func:`~lit_fedco.config.parser.parse` reads it (a YAML value,
    the empty string for nothing), as ``{"a": {"b": value}}``; None for anything else."""
    key, eq, value = item.partition("=")
    if not eq or not KEY.match(key) or key in ("preset", "updater") or not value.isprintable():
        return None
    if "${" in value or not value.strip() or get_yaml_loader is None:
        return None
    try:
        parsed = yaml.load(value, Loader=get_yaml_loader())
    except yaml.YAMLError:
        return None
    out: dict[str, Any] = {}
    node = out
    *path, last = key.split(".")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = parsed
    return out


def screen_variants(cfg: DictConfig, checks: dict[str, Any]) -> None:
    """Every entry of ``cfg.variants`` as far as its items alone tell (see the module).

    Args:
        cfg: the run's loaded config (its command line, without the variants applied).
        checks: the catalog's value checks (:func:`lit_fedco.config.early.check_values`).

    Raises:
        ConfigError: the first refusal, saying which variant.
    """
    variants = [str(v) for v in cfg.variants]
    if not variants:
        return
    items = _Items()
    seen: dict[str, int] = {}
    for i, variant in enumerate(variants):
        where = f"variants[{i}] {variant!r}"
        extra = split_variant(i, variant)
        set_here: dict[str, Any] = {}
        try:
            if len({e.partition("=")[0].lstrip("-") for e in extra}) < len(extra):
                parse(extra, None, f"variant {i}")  # a key given twice: its own message
            for item in extra:
                set_here.update(items.values(item, i))
            _names(cfg, set_here, items.cat)
        except ConfigError as err:
            raise err.within(where) from None
        _run_level(cfg, i, set_here)
        _values(set_here, checks, variant)
        check_distinct(seen, variants, i, set_here)


def _names(cfg: DictConfig, values: dict[str, Any], cat: dict[str, Any]) -> None:
    """The updaters and objective a variant names are registered, no updater twice."""
    if "updaters" not in values and "objective" not in values:
        return
    updaters = values.get("updaters", list(cfg.updaters))
    if any(":" in str(u) for u in updaters):  # a module of one's own: imported by the full check
        return
    both = SimpleNamespace(updaters=updaters, objective=values.get("objective", cfg.objective))
    known_names(both, catalog.names("updater", cat), catalog.names("problem", cat))  # type: ignore[arg-type]
    check_repeats(SimpleNamespace(updaters=updaters, seeds=list(cfg.seeds)))


def _run_level(cfg: DictConfig, i: int, values: dict[str, Any]) -> None:
    """A variant changes no key of the whole run."""
    for key, value in values.items():
        if key.split(".")[0] not in RUN_LEVEL or "${" in str(value):
            continue
        if as_plain(OmegaConf.select(cfg, key)) != value:
            raise run_level_error(i, key, value)


def _values(values: dict[str, Any], checks: dict[str, Any], variant: str) -> None:
    """The catalog's enumerations and ranges on the values a variant sets."""
    for key, value in values.items():
        if key in checks and value is not None and "${" not in str(value):
            try:
                check_one(key, value, checks[key])
            except ConfigError as err:
                raise err.within(f"variant {variant!r}") from None
