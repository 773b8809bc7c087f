"""A run's sub-runs: one per (variant, seed, updater), in the order they run, each with an
index and a folder of its own; and the pre-trainings their methods start from. Torch-free, so
that ``--list-sub-runs`` answers at once.

The index is what ``sub_run=INDEX`` runs alone (a process of a ``jobs=N`` run, an element of a
SLURM job array, a W&B sweep agent's run); ``resume=auto`` of the whole run afterwards finds
every sub-run complete and writes the one table, results and figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from omegaconf import DictConfig


class SubRunSpec(NamedTuple):
    """One sub-run of a run."""

    number: int
    variant_index: int
    variant: str
    cfg: DictConfig
    updater: str
    seed: int
    folder: str


def pretrains(cfg: DictConfig) -> bool:
    """Whether the run (a variant's config) pre-trains before its methods."""
    return int(cfg.pretrain.rounds) > 0


def pretrain_folder(index: int, variant: str, seed: int) -> str:
    """The pre-training's sub-run folder, named like the methods' (``pretrain-seed0``)."""
    return f"pretrain-seed{seed}" if not variant else f"v{index}-pretrain-seed{seed}"


def sub_runs(configs: list[tuple[str, DictConfig]], seeds: list[int]) -> Iterator[SubRunSpec]:
    """Every sub-run, in the order they run: variant by variant, seed by seed (the methods of a
    seed share its data and its pre-training), updater by updater."""
    k = 0
    for i, (variant, vcfg) in enumerate(configs):
        for seed in seeds:
            for name in vcfg.updaters:
                folder = f"{name}-seed{seed}" if not variant else f"v{i}-{name}-seed{seed}"
                yield SubRunSpec(k, i, variant, vcfg, str(name), seed, folder)
                k += 1


def pretrain_runs(
    configs: list[tuple[str, DictConfig]], seeds: list[int]
) -> Iterator[tuple[DictConfig, int, str]]:
    """``(variant's config, seed, folder)`` of every pre-training."""
    for i, (variant, vcfg) in enumerate(configs):
        if pretrains(vcfg):
            for seed in seeds:
                yield vcfg, seed, pretrain_folder(i, variant, seed)


def listing(configs: list[tuple[str, DictConfig]], seeds: list[int], first: int = 0) -> str:
    """The ``--list-sub-runs`` table: index (from ``first``), folder, updater, seed, variant."""
    rows = [("index", "folder", "updater", "seed", "variant")]
    for s in sub_runs(configs, seeds):
        rows.append((str(first + s.number), s.folder, s.updater, str(s.seed), s.variant or "-"))
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    extra = [f for *_, f in pretrain_runs(configs, seeds)]
    if extra:
        lines.append(f"(each method of a seed starts from its pre-training, run once by the first "
                     f"of them to need it: {', '.join(extra)})")  # fmt: skip
    return "\n".join(lines)
