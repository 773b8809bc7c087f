"""Loading a run's configuration: the parsed command line (:mod:`lit_fedco.config.parser`)
merged into the catalog's typed schema (:mod:`lit_fedco.config.catalog`: the committed
``schema.json`` and the nodes of updaters registered at run time), the variants of a sweep, and
the typed, range-checked dataclass of one node.

:func:`load` imports no torch unless the command line names a module of the user's own; the
same function serves ``--help``, the up-front checks and the run.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lit_fedco.config import catalog
from lit_fedco.config.messages import as_plain
from lit_fedco.config.parser import CommandLine, known_names, merge, parse
from lit_fedco.config.plugins import import_plugins
from lit_fedco.core.errors import ConfigError


def load(cmd: CommandLine) -> DictConfig:
    """The config a parsed command line runs with (its plugins already imported:
    :func:`~lit_fedco.config.plugins.import_plugins`).

    Raises:
        ConfigError: an unknown key, a value of the wrong type, an unresolvable
            interpolation, an unknown updater or problem name.
    """
    cat = catalog.current()
    cfg = merge(catalog.typed_schema(cat), cmd.layers)
    known_names(cfg, catalog.names("updater", cat), catalog.names("problem", cat))
    return cfg


def load_config(argv: list[str], defaults: dict[str, Any] | None = None) -> DictConfig:
    """The config of a command line: :func:`~lit_fedco.config.parser.parse`, the plugins it
    names imported, :func:`load` (for scripts and tests; recipes go through
    :func:`lit_fedco.cli.run`)."""
    return load(import_plugins(parse(argv, defaults)))


RUN_LEVEL = (
    "seed", "seeds", "run_name", "resume", "out_dir", "devices", "num_nodes", "accelerator",
    "strategy", "threads", "plugins", "variants", "jobs", "sub_run", "shard_data", "tune",
)  # fmt: skip
"""Keys of the whole run, which a variant cannot change: every variant runs with the run's seeds,
in its folder, on its processes (a variant may change anything a sub-run reads: its updaters,
schedule, data, model, hyperparameters, executor, tracking)."""


def variant_configs(cmd: CommandLine, cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """``(variant, config)`` per entry of ``cfg.variants``, its overrides applied after the
    command line; ``[("", cfg)]`` without variants.

    Raises:
        ConfigError: a variant that does not split into ``key=value`` items or holds a bad one
            (the message says which variant).
    """
    out = []
    for i, variant in enumerate(cfg.variants):
        where = f"variants[{i}] {variant!r}"
        extra = split_variant(i, variant)
        try:
            vcfg = load(import_plugins(cmd.with_items(extra, f"variant {i}")))
        except ConfigError as err:
            raise err.within(where) from None
        for key in RUN_LEVEL:
            if vcfg[key] != cfg[key]:
                raise run_level_error(i, key, as_plain(vcfg[key]))
        out.append((variant, vcfg))
    seen: dict[str, int] = {}
    names = [v for v, _ in out]
    for i, (_, vcfg) in enumerate(out):  # once every variant has passed on its own
        check_distinct(seen, names, i, OmegaConf.to_container(vcfg, resolve=True))
    return out or [("", cfg)]


def split_variant(i: int, variant: str) -> list[str]:
    """The ``key=value`` items of ``variants[i]``.

    Raises:
        ConfigError: its quotes do not close.
    """
    try:
        return shlex.split(variant)
    except ValueError as err:
        raise ConfigError(
            f"variants[{i}]: got {variant!r}, which does not split into key=value items "
            f"({err}); close its quotes, e.g. variants=['rounds=50 seed=1']",
            key="variants",
        ) from None


def run_level_error(i: int, key: str, value: Any) -> ConfigError:
    """The refusal of ``variants[i]`` setting ``key`` (one of :data:`RUN_LEVEL`) to ``value``."""
    return ConfigError(
        f"variants[{i}]: sets {key}={value!r}, a key of the whole run (every variant runs with "
        f"the run's {key}); set it outside variants, or run the variants as runs of their own",
        key="variants",
    )


def check_distinct(seen: dict[str, int], variants: list[str], i: int, config: Any) -> None:
    """``variants[i]``, which runs ``config``, runs no config an earlier variant runs (a repeated
    one would be counted as more seeds); ``seen`` maps each earlier config to its variant.

    Raises:
        ConfigError: naming the two variants.
    """
    j = seen.setdefault(json.dumps(config, sort_keys=True, default=str), i)
    if j != i:
        raise ConfigError(
            f"variants: got variants[{j}] {variants[j]!r} and variants[{i}] {variants[i]!r}, "
            "which run the same config, expected distinct variants (a repeated variant repeats "
            "the same runs); drop one of them",
            key="variants",
        )


def node_params(cfg: DictConfig, name: str) -> Any:
    """The typed, range-checked dataclass of config node ``name``: an updater's
    hyperparameters or a problem's parameters.

    Raises:
        ConfigError: a value out of range, its key under ``name`` (``client_dro.gamma``).
    """
    from lit_fedco.problems import available_problems, get_problem
    from lit_fedco.updaters import available_updaters, get_updater

    cls: type[Any]
    if name in available_updaters():
        cls = get_updater(name).hparams_cls
    elif name in available_problems():
        cls = get_problem(name).params_cls
    else:
        raise ConfigError(f"{name}: not a registered updater or problem")
    values = OmegaConf.to_container(cfg[name], resolve=True)
    assert isinstance(values, dict)
    try:
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})
    except ConfigError as err:
        raise err.under(name) from None


def problem_name(cfg: DictConfig, updater: str) -> str:
    """The problem updater ``updater`` trains on: the run's ``objective`` or, when it names
    none, the updater's default problem (empty: plain empirical risk)."""
    from lit_fedco.updaters import get_updater

    return str(cfg.objective) or get_updater(updater).default_problem
