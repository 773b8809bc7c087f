"""The checks the command line makes before torch is imported (:func:`check_values`): each
value the catalog can check, the ranges that depend on another key or on this machine
(``cohort`` against ``data.num_clients``, ``threads`` and ``jobs`` against the CPU cores), the
repeated updaters and seeds, then each entry of ``variants`` as far as its items alone tell."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

from lit_fedco.config import catalog
from lit_fedco.config.values import check_one, check_repeats, value_at
from lit_fedco.config.variants import screen_variants
from lit_fedco.core.errors import ConfigError
from lit_fedco.process.workers import per_core_limit


def check_values(cfg: DictConfig, cat: dict[str, Any] | None = None) -> None:
    """Every check of the catalog's ``checks`` on ``cfg``, then the repeated updaters and
    seeds, then each entry of ``variants`` as far as its items alone tell
    (:func:`lit_fedco.config.variants.screen_variants`).

    Raises:
        ConfigError: the first value refused, as the full check words it.
    """
    checks: dict[str, Any] = (cat or catalog.load()).get("checks", {})
    for key, check in checks.items():
        value = value_at(cfg, key)
        if value is not None:
            check_one(key, value, check)
    check_ranges(cfg)
    check_repeats(cfg)
    if "variants" in cfg:
        screen_variants(cfg, checks)  # each variant's items, before each is built


def check_ranges(cfg: DictConfig) -> None:
    """``cohort`` in [1, K] (K = ``data.num_clients``, the clients every data set is split
    into), ``threads`` in [0, 4 per core], ``jobs`` in [1, 4 per core], ``failures.drop`` and
    ``failures.partial`` in [0, 1], worded as the full checks word them.

    Raises:
        ConfigError: naming the key.
    """
    k, cohort = value_at(cfg, "data.num_clients"), value_at(cfg, "cohort")
    if isinstance(k, int) and isinstance(cohort, int) and k >= 1 and not 1 <= cohort <= k:
        raise ConfigError.bad_value(
            "cohort", cohort, f"an int in [1, {k}] (K = {k}; with another data.num_clients, set "
            "cohort too)", str(k),
        )  # fmt: skip
    most = per_core_limit()
    threads, jobs = value_at(cfg, "threads"), value_at(cfg, "jobs")
    if isinstance(threads, int) and not 0 <= threads <= most:
        raise ConfigError.bad_value(
            "threads", threads, f"an int in [0, {most}] (0: the cores shared out; at most 4 per "
            f"CPU core, {os.cpu_count()} here)", "1",
        )  # fmt: skip
    if isinstance(jobs, int) and not 1 <= jobs <= most:
        raise ConfigError.bad_value("jobs", jobs, f"an int in [1, {most}]", "2")
    for key in ("failures.drop", "failures.partial"):  # engine.failures.Failures' range
        value = value_at(cfg, key)
        if isinstance(value, float | int) and not 0 <= value <= 1:
            raise ConfigError.bad_value(key, value, "a float in [0, 1]", "0.1")
    if value_at(cfg, "failures.drop") == 1:  # the run's own check (experiment.checks)
        raise ConfigError.bad_value(
            "failures.drop", 1.0, "a float in [0, 1) (at 1 every client drops out of every "
            "round and nothing is trained)", "0.2",
        )  # fmt: skip
