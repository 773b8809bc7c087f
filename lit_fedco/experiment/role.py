"""Which part of a run this process plays, decided once from the config and the environment
(:func:`role_of`), before any check or file.

A run of a recipe may be one process or many; each of them is one of:

- the **whole run** in this process (the common case);
- a **pool launcher** (``jobs=N``): it runs the sub-runs in ``N`` workers, then the table;
- **one sub-run** (``sub_run=INDEX``, by hand, from a job array, or in a ``jobs`` worker);
- a **process Fabric started** (``devices=N``): its launcher checked the run and named the
  folder (:data:`~lit_fedco.experiment.rundir.RUN_DIR_ENV`);
- a **rank of an outside launcher** (``torchrun``, ``srun``, ``NODE_RANK`` per node): each
  checks the run; rank 0 creates the folder, the others are given it by ``run_name``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from lit_fedco.experiment.fabric import launch_rank
from lit_fedco.experiment.rundir import RUN_DIR_ENV, check_child
from lit_fedco.experiment.subruns import SubRunSpec
from lit_fedco.process.workers import WORKER_ENV


@dataclass(frozen=True)
class Role:
    """This process's part in the run.

    Attributes:
        given: the run folder whoever started this process named (a process Fabric started, a
            rank other than 0 of an outside launcher), else None: this process places it.
        rank: the global rank an outside launcher gave this process, else None.
        checked: whoever started this process checked the whole run already (Fabric's
            launcher, a ``jobs`` launcher), so this one checks nothing.
        sub_run: the one sub-run this process runs (``sub_run=INDEX``), or -1.
        pool: how many ``jobs`` workers this process launches (0: none; it runs its
            sub-runs itself).
    """

    given: str | None
    rank: int | None
    checked: bool
    sub_run: int
    pool: int

    def checks(
        self, configs: list[tuple[str, DictConfig]], chosen: list[SubRunSpec]
    ) -> list[tuple[str, DictConfig]]:
        """The (variant, config) pairs this process checks: every variant's, one sub-run's
        (with its own updater only), or none."""
        if self.checked:
            return []
        if self.sub_run >= 0:
            (spec,) = chosen
            mine = spec.cfg.copy()
            mine.updaters = [spec.updater]
            return [(spec.variant, mine)]
        return configs


def role_of(cfg: DictConfig, recipe: str) -> Role:
    """Decide this process's :class:`Role` from the config and the environment.

    Raises:
        ConfigError: :data:`~lit_fedco.experiment.rundir.RUN_DIR_ENV` set by hand or inherited,
            not by the run that started this process.
    """
    child = os.environ.get(RUN_DIR_ENV) or None  # a process Fabric started
    if child:
        check_child(child)  # set by the launcher of this process, not inherited or by hand
    rank = launch_rank(cfg) if not child else None
    # not rank 0 of an outside launcher: rank 0 creates and writes the run folder, this one reads it
    given = str(Path(cfg.out_dir) / recipe / cfg.run_name) if rank else child
    return Role(
        given=given,
        rank=rank,
        checked=bool(child) or os.environ.get(WORKER_ENV) == "1",
        sub_run=int(cfg.sub_run),
        pool=int(cfg.jobs) if cfg.jobs > 1 and not given else 0,
    )
