"""The checks the command line makes before torch is imported (:func:`check_values`): each
value the catalog can check, the ranges that depend on another key or on this machine
(``cohort`` against ``data.num_clients``, ``threads`` and ``jobs`` against the CPU cores), the
repeated updaters and seeds, then each entry of ``variants`` as far as its items alone tell."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from lit_fedco.config import catalog
from lit_fedco.config.values import check_one, check_repeats, value_at
from lit_fedco.config.variants import screen_variants
from lit_fedco.core import ranges


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
    ``failures.partial`` in [0, 1] and ``failures.drop`` below 1: the full checks' own
    functions (:mod:`lit_fedco.core.ranges`), on the values present.

    Raises:
        ConfigError: naming the key.
    """
    k, cohort = value_at(cfg, "data.num_clients"), value_at(cfg, "cohort")
    if isinstance(k, int) and isinstance(cohort, int) and k >= 1:  # k < 1: the catalog's check
        ranges.check_cohort(cohort, k)
    if (threads := value_at(cfg, "threads")) is not None:
        ranges.check_threads(threads)
    if (jobs := value_at(cfg, "jobs")) is not None:
        ranges.check_jobs(jobs)
    for key in ("failures.drop", "failures.partial"):
        if (value := value_at(cfg, key)) is not None:
            ranges.check_fraction(key, value)
    if (drop := value_at(cfg, "failures.drop")) is not None:
        ranges.check_drop(drop)
