"""The value checks the catalog can make before torch is imported: a name outside an enumeration
(``model.name=cnnn``, ``data.partition=dirichlett``, ``executor=vectorised``), a number outside
its range (``rounds=0``, ``comfedl.lr=-1``), an updater or seed given twice. Each refusal is the
one line the later, full check gives (same key, value, expectation and example), in a fraction
of a second.

The enumerations are not copied here: :func:`lit_fedco.config.schema.value_checks` reads them
from the modules that define them (``MODELS``, the data names, the executors, ...) into the
committed catalog's ``checks``, so a name added there is accepted here once the catalog is
regenerated (``tests/config/test_schema.py`` fails while it is stale).

Imports: the standard library and OmegaConf; never torch.
"""

from __future__ import annotations

import difflib
from typing import Any

from omegaconf import DictConfig

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.ranges import Bound

LIMITS = {"gt", "ge", "lt", "le"}
"""The keys of a range check (:class:`~lit_fedco.core.ranges.Bound`'s limits)."""


def value_at(cfg: DictConfig, dotted: str) -> Any:
    """The value at a dotted key of ``cfg``, or None where a node on the way is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if part not in node:
            return None
        node = node[part]
    return node


def check_one(key: str, value: Any, check: dict[str, Any]) -> None:
    """One of the catalog's ``checks`` on the value of ``key``.

    Raises:
        ConfigError: a name outside the enumeration (with the near miss, if any), a number
            outside the range.
    """
    if "one_of" in check:
        refs = check.get("refs", False) and ":" in str(value)  # MODULE:NAME, checked later
        if not refs and str(value) not in check["one_of"]:
            close = difflib.get_close_matches(str(value), check["one_of"], n=1)
            example = close[0] if close else check["example"]  # the near miss, if any
            raise ConfigError.bad_value(key, value, check["expected"], example)
    elif LIMITS & set(check):
        Bound(**check).check(key, value)


def check_repeats(cfg: Any) -> None:
    """At least one updater, and no updater or seed twice (a repeat would repeat a run).

    Raises:
        ConfigError: naming ``updaters`` or ``seeds``, with the list without its repeats.
    """
    names = [str(n) for n in cfg.updaters]
    if not names or len(set(names)) != len(names):
        fix = f"[{','.join(dict.fromkeys(names)) or 'fedavg'}]"
        raise ConfigError.bad_value(
            "updaters", names, "at least one updater, each once (nothing to run otherwise; a "
            "repeated one would repeat the same run)", fix,
        )  # fmt: skip
    seeds = list(cfg.seeds)
    if len(set(seeds)) != len(seeds):
        raise ConfigError.bad_value(
            "seeds", seeds, "distinct seeds (a repeated seed repeats the same run)", "[0,1,2]"
        )
