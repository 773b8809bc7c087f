"""The checks the command line makes before torch is imported (:func:`check_values`): each
value the catalog can check, the repeated updaters and seeds, then each entry of ``variants`` as
far as its items alone tell."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from lit_fedco.config import catalog
from lit_fedco.config.values import check_one, check_repeats, value_at
from lit_fedco.config.variants import screen_variants


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
    check_repeats(cfg)
    if "variants" in cfg:
        screen_variants(cfg, checks)  # each variant's items, before each is built
