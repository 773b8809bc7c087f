"""How OmegaConf's errors become one-line :class:`~lit_fedco.core.errors.ConfigError` messages that
name the key, the value (and where it came from), what was expected and an example to set."""

from __future__ import annotations

import difflib
import re
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from lit_fedco.core.errors import ConfigError

EXAMPLES = {
    "seeds": "[0,1,2]", "updaters": "[fedavg]", "tracking": "[wandb,csv]",
    "variants": "['rounds=50']", "resume": "auto", "run_name": "lr01",
    "objective": "client_dro", "data.data_dir": "DIR",
}  # fmt: skip
"""Examples for the keys whose default makes a poor one (empty)."""


def shorten(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters (with ``…``), for a message that echoes input."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def as_plain(value: Any) -> Any:
    """``value`` as plain lists and dicts where it is an OmegaConf container (interpolations
    left as written), else itself."""
    return OmegaConf.to_container(value) if isinstance(value, DictConfig | ListConfig) else value


def example(key: str, cfg: DictConfig) -> str:
    """A ``key=VALUE`` to suggest in a message: :data:`EXAMPLES`, else the value in ``cfg``
    (for a group of keys, its first key; for a list element, the whole list)."""
    base = re.sub(r"\[\d+\]$", "", key)
    if base in EXAMPLES:
        return f"{base}={EXAMPLES[base]}"
    value = OmegaConf.select(cfg, base, default=None, throw_on_resolution_failure=False)
    if isinstance(value, DictConfig) and len(value):
        first = str(next(iter(value)))
        return example(f"{base}.{first}", cfg)
    if isinstance(value, ListConfig):
        return f"{base}=[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, bool):
        return f"{base}={str(value).lower()}"
    empty = value in (None, "") or isinstance(value, DictConfig)
    return f"{base}=" + ("VALUE" if empty else str(value))


def _expected(msg: str) -> str:
    """What OmegaConf's validation message says was expected, in words."""
    if m := re.search(r"converted to (\w+)", msg):
        kind = m.group(1).lower()
        return "a value of type " + {"integer": "int", "string": "str"}.get(kind, kind)
    if "valid bool" in msg:
        return "a value of type bool (true or false)"
    if "ListConfig" in msg and "not a ListConfig" in msg:
        return "a list in brackets"
    if "Cannot convert" in msg:
        return "a single value, not a list or mapping"
    if m := re.search(r"Incompatible value 'None' for field of type '(\w+)'", msg):
        return f"a value of type {m.group(1)} (not empty or null)"
    if re.search(r"Cannot assign \w+ to Dict|to a DictConfig|is not a subclass of", msg):
        return "a group of keys, not a single value"
    return msg


def _misplaced(layer: Any, cfg: DictConfig, prefix: str = "") -> tuple[str, Any, str] | None:
    """The first key of ``layer`` whose value is of another kind than the schema's node there
    (a single value for a group of keys, a mapping for a list), with what was expected: the
    errors OmegaConf raises for these name no key."""
    if not isinstance(layer, DictConfig | dict):
        return None
    for k, v in layer.items():
        path = f"{prefix}{k!s}"
        node = OmegaConf.select(cfg, path, default=None, throw_on_resolution_failure=False)
        mapping = isinstance(v, DictConfig | dict)
        if isinstance(node, DictConfig) and not mapping:
            return path, v, "a group of keys, not a single value"
        if isinstance(node, ListConfig) and mapping:
            return path, v, "a list in brackets"
        if isinstance(node, DictConfig) and (found := _misplaced(v, cfg, f"{path}.")):
            return found
    return None


def _node_key_hint(leaf: str, cfg: DictConfig) -> str:
    """``did you mean 'fedavg.lr'? ...``: the run's updaters (else any node) that have key
    ``leaf``, for a node's key given without its node; empty if none has it."""
    owners = [str(k) for k, v in cfg.items_ex(resolve=False) if isinstance(v, DictConfig)
              and leaf in v]  # fmt: skip
    try:
        run = [str(u) for u in cfg.updaters if str(u) in owners]
    except Exception:  # an unresolvable updaters list: reported on its own
        run = []
    mine = run or owners
    if not mine:
        return ""
    shown = ", ".join(f"{o}.{leaf}" for o in mine[:6]) + (", ..." if len(mine) > 6 else "")
    what = "each updater of this run has its own" if run else "keys of their nodes"
    return f"did you mean {mine[0] + '.' + leaf!r}? ({what}: {shown}) "


def unknown_key_error(key: str, source: str, cfg: DictConfig) -> ConfigError:
    """``key`` is not in ``cfg`` (it came from ``source``): the error names the closest valid
    key and the valid keys of its node. Shared by the full check and the torch-free one
    (:mod:`lit_fedco.config.catalog`), so that both word it alike."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None, throw_on_resolution_failure=False)
    valid = [str(k) for k in node] if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(leaf, valid, n=1)
    hint = f"did you mean {(parent + '.' if parent else '') + close[0]!r}? " if close else ""
    if not close and not parent:  # a key of a node given at the top: lr for fedavg.lr
        hint = _node_key_hint(leaf, cfg)
    key = shorten(key)  # input echoed back: a file read as a preset, a pasted line
    return ConfigError(
        f"{key}: unknown config key (from {source}); {hint}"
        f"valid keys{' under ' + parent if parent else ''}: {', '.join(valid)}",
        key=key,
    )


def friendly(err: Exception, source: str, layer: Any, cfg: DictConfig) -> ConfigError:
    """The one-line error for ``err``, raised merging ``layer`` (from ``source``, e.g. "the
    command line") into ``cfg``: an unknown key with the closest valid one, or a value of the
    wrong type with what was expected and an example."""
    key = getattr(err, "full_key", None)
    if isinstance(err, ConfigKeyError):
        return unknown_key_error(str(key or "?"), source, cfg)
    value = getattr(err, "value", None)
    msg = str(getattr(err, "msg", None) or err or type(err).__name__).splitlines()[0]
    expected = _expected(msg)
    if not key and (found := _misplaced(layer, cfg)):
        key, value, expected = found
    key, value = str(key or "?"), as_plain(value)
    return ConfigError(
        f"{key}: got {value!r} (from {source}), expected {expected}; set e.g. {example(key, cfg)}",
        key=key,
    )
