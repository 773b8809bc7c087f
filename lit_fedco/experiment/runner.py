"""Runs a recipe whose command line :mod:`lit_fedco.cli` parsed and loaded: config → checks →
run folder → Fabric → one sub-run per (variant, updater, seed) → table (:func:`run_recipe`).

The run gets a folder of its own (:mod:`lit_fedco.experiment.rundir`), its sub-runs checkpoint as
they go (:mod:`lit_fedco.experiment.session`), and ``resume=auto run_name=NAME`` continues a run
that was stopped or killed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lit_fedco.config.load import variant_configs
from lit_fedco.config.parser import CommandLine
from lit_fedco.core.errors import ConfigError, refuse
from lit_fedco.experiment.assemble import Assembly, composition_notes, run_executor, trains
from lit_fedco.experiment.checks import check_run
from lit_fedco.experiment.fabric import make_fabric
from lit_fedco.experiment.plan import Plan, RunSpec, plan_finished, plan_run
from lit_fedco.experiment.pool import check_jobs, run_pool
from lit_fedco.experiment.records import (
    branch_start,
    check_same_run,
    record_start,
    recorded,
    tuning_record,
)
from lit_fedco.experiment.role import Role, role_of
from lit_fedco.experiment.rundir import (
    RUN_DIR_ENV,
    RUN_OWNER_ENV,
    check_writable,
    contents,
    new_run_dir,
)
from lit_fedco.experiment.session import Stopped, WriteFailed, run_sub
from lit_fedco.experiment.starts import starting_point
from lit_fedco.experiment.subruns import sub_runs
from lit_fedco.experiment.tuning import label_suffix
from lit_fedco.process import faults
from lit_fedco.process.cpu_memory import keep_freed_memory
from lit_fedco.process.stops import stop_on_signals
from lit_fedco.process.workers import usable_cores
from lit_fedco.report.paired import against_best, as_records, format_tests
from lit_fedco.report.table import TABLE_COLUMNS, UNTESTED, format_table
from lit_fedco.report.tracking import log_figures
from lit_fedco.store.files import lock_run, write_json, write_text

__all__ = ["TABLE_COLUMNS", "format_table", "process_threads", "run_recipe"]


def run_recipe(
    recipe: str,
    cmd: CommandLine,
    cfg: DictConfig,
    columns: list[tuple[str, str]] | None = None,
    callbacks: list[Any] | None = None,
    evaluated_on: str = "validation",
) -> list[Any]:
    """Check, plan and run each (variant, seed, updater) of a recipe, then print the table and
    save it with the results in the run folder.

    In steps:

    1. this process's part in the run (:func:`~lit_fedco.experiment.role.role_of`), once;
    2. the configs: one per variant, each with its executor chosen and recorded;
    3. the checks this process owes: the whole run's, its own sub-run's, or none;
    4. the run folder and the plan: created or found, locked, what each sub-run resumes;
    5. with ``jobs=N``, the pool runs the sub-runs not complete (:mod:`.pool`);
    6. this process's sub-runs on Fabric, then the table, the results and the figures.

    Bad input ends the process with exit code 2 and a one-line message, before anything is
    written. SIGTERM or SIGINT stop the run after the current round with a checkpoint (exit
    code 128 + the signal). ``columns``, ``callbacks`` and ``evaluated_on`` are
    :func:`lit_fedco.cli.run`'s (the data ``evaluated_on`` names is in the table's title, the
    results and the figures' labels).
    """
    held: list[Any] = []  # the locks on the run folder, released however the run ends
    try:
        try:
            role = role_of(cfg, recipe)  # 1
            spec = _spec(recipe, cmd, cfg, Assembly())  # 2
            _check(role, spec)  # 3
            run_dir, plan = _place(role, spec, held)  # 4
        except ConfigError as err:
            refuse(err)
        if role.pool:  # 5
            run_pool(spec, cmd, plan, run_dir)
            plan = _finished(run_dir, spec)
        return _execute(_Run(spec, plan, run_dir, columns, evaluated_on), callbacks)  # 6
    finally:
        for lock in held:
            lock.release()


def _spec(recipe: str, cmd: CommandLine, cfg: DictConfig, built: Assembly) -> RunSpec:
    """The run: one (variant, config) per variant (or just ``cfg``), each with
    ``executor=auto``'s choice made and recorded, and its seeds."""
    configs = variant_configs(cmd, cfg)
    for c in [cfg, *(c for _, c in configs)]:
        c.executor = run_executor(c)
    return RunSpec(recipe, cfg, configs, list(cfg.seeds) or [cfg.seed], built)


def _check(role: Role, spec: RunSpec) -> None:
    """The checks this process owes, and a note for each method that trains another objective
    than the run's (never silently).

    Raises:
        ConfigError: the first check that fails, naming its key (and variant).
    """
    cfg = spec.cfg
    check_jobs(cfg, len(list(sub_runs(spec.configs, spec.seeds))))
    checks = role.checks(spec.configs, spec.chosen())
    for variant, c in checks:
        try:
            check_run(c, spec.built)
        except ConfigError as err:
            raise err.within(f"variant {variant!r}") if variant else err from None
    for line in dict.fromkeys(n for _, c in checks for n in composition_notes(c)):
        print(f"lit_fedco: note: {line}", file=sys.stderr)
    if role.rank is not None and not cfg.run_name:
        raise ConfigError.bad_value(
            "run_name", "", "a name every process of the run is given (torchrun, srun and "
            "each node start their own processes; they share the run folder)", "nodes1",
        )  # fmt: skip


def _place(role: Role, spec: RunSpec, held: list[Any]) -> tuple[Path, Plan]:
    """The run folder (created, found, or given) with the locks this process holds on it
    (appended to ``held``), and the plan. The processes Fabric starts read the same files and
    come to the same plan.

    Raises:
        ConfigError: from the plan, the lock, or a sub-run joining a run of another command line.
    """
    recipe, cfg = spec.recipe, spec.cfg
    out_dir = Path(cfg.out_dir)
    run_dir = out_dir / recipe / cfg.run_name
    if cfg.sub_run >= 0 and not role.given:  # one sub-run, beside others of the same run
        check_writable(out_dir, recipe)
        run_dir.mkdir(parents=True, exist_ok=True)
        held.append(lock_run(run_dir, shared=True))
        check_same_run(cfg, run_dir)  # before its own lock file: a refusal writes nothing
        own = spec.chosen()[0].folder
        held.append(lock_run(run_dir, name=f".lock-{own}"))
    plan = plan_run(spec) if not role.given or cfg.resume else Plan()
    if role.given:
        run_dir = Path(role.given)
    elif cfg.sub_run < 0:
        fix = "a run started from a checkpoint of another goes to a new folder: choose another "
        fix += "run_name, or leave it out"
        run_dir = plan.run_dir or new_run_dir(out_dir, recipe, cfg.run_name,
                                              fix if plan.branch else "")  # fmt: skip
        # until the run ends; another process is refused here (jobs=N: its workers share it)
        held.append(lock_run(run_dir, shared=cfg.jobs > 1))
        faults.point("run_folder_created")
    return run_dir, plan


def _finished(run_dir: Path, spec: RunSpec) -> Plan:
    """The plan after a pool ran every sub-run; exit code 1 where one did not complete."""
    try:
        return plan_finished(run_dir, spec)
    except ConfigError as err:
        print(f"lit_fedco: {err}", file=sys.stderr)
        raise SystemExit(1) from None


@dataclass
class _Run:
    """A planned run, as this process runs it, and what its sub-runs have given so far."""

    spec: RunSpec
    plan: Plan
    run_dir: Path
    columns: list[tuple[str, str]] | None
    evaluated_on: str
    rows: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    folders: dict[str, list[str]] = field(default_factory=dict)
    trained: dict[str, str] = field(default_factory=dict)
    """Row label → the composition it trains (the table's ``trains`` column)."""
    starts: dict[tuple[int, int], dict[str, Any] | None] = field(default_factory=dict)

    def record(self, label: str, final: dict[str, float], folder: str, composition: str) -> None:
        """One sub-run's final metrics under its row's label."""
        self.rows.setdefault(label, []).append(final)
        self.folders.setdefault(label, []).append(folder)
        self.trained[label] = composition

    def start_of(self, i: int, variant: str, vcfg: DictConfig, seed: int, fabric: Any) -> Any:
        """The shared starting point of the methods of (variant ``i``, seed), made once: the
        pre-training's final model (run now, or read back), or ``init_from``'s."""
        if (i, seed) not in self.starts:
            self.starts[i, seed] = starting_point(
                self.spec.recipe, i, variant, vcfg, seed, self.plan, self.run_dir, fabric,
                self.record, self.spec.built,
            )  # fmt: skip
        return self.starts[i, seed]

    def again(self) -> str:
        """The arguments that continue this run."""
        return f"resume=auto run_name={self.run_dir.name} out_dir={self.spec.cfg.out_dir}"


def _execute(run: _Run, callbacks: list[Any] | None) -> list[Any]:
    """This process's sub-runs on Fabric, then (a whole run) the table and the results."""
    os.environ.setdefault("WANDB_SILENT", "true")
    keep_freed_memory()  # a round's large temporaries reuse warm heap pages (cpu_memory.py)
    os.environ[RUN_DIR_ENV] = str(run.run_dir)
    os.environ.setdefault(RUN_OWNER_ENV, str(os.getpid()))  # the processes Fabric starts: ours
    try:  # they copy the environment as they start; no other process gets it (issue 33.8)
        fabric = make_fabric(run.spec.cfg, callbacks)
    finally:  # a recipe an updater or a plugin starts is a run of its own, not part of this one
        os.environ.pop(RUN_DIR_ENV, None)
        os.environ.pop(RUN_OWNER_ENV, None)
    torch.set_num_threads(process_threads(run.spec.cfg))  # recorded in each sub-run's status
    if run.spec.cfg.shard_data:  # each process keeps the rows of the clients it owns
        run.spec.built.shard(fabric.global_rank, fabric.world_size)
    rows = _run(run, fabric)
    # several processes: once rank 0 has written the results and figures, each closes the
    # process group (one that exits with the collectives' threads still running aborts)
    if fabric.world_size > 1:
        fabric.barrier()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return rows


def process_threads(cfg: DictConfig) -> int:
    """The intra-op threads of this process: ``threads``, or for 0 the CPU cores this process
    may use shared out among the processes of the run on this machine (``devices`` per node,
    or the launcher's ``LOCAL_WORLD_SIZE``), at most torch's own default — one process of a
    2-core machine: 2; each of two: 1."""
    if cfg.threads > 0:
        return int(cfg.threads)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or max(1, int(cfg.devices))
    return max(1, min(torch.get_num_threads(), usable_cores() // local))


def _run(run: _Run, fabric: Any) -> list[Any]:
    """Every sub-run of a planned run, then the table, the results and the folder's listing."""
    rank0 = fabric.global_rank == 0
    cfg, run_dir = run.spec.cfg, run.run_dir
    mine = run.spec.chosen()
    if rank0 and not run.plan.after_jobs:
        try:
            record_start(cfg, run.plan, run_dir, mine[0].folder if cfg.sub_run >= 0 else "")
        except OSError as err:
            print(f"lit_fedco: cannot write the run's config in {run_dir} ({err.strerror or err}); "
                  "nothing has run: make room and run again", file=sys.stderr)  # fmt: skip
            raise SystemExit(1) from None
        for line in run.plan.notes:
            print(f"lit_fedco: {line}", file=sys.stderr)
    with stop_on_signals():
        try:
            _run_subs(run, fabric, rank0)
        except Stopped as stop:
            if rank0:
                where = f"; checkpoint {stop.saved}" if stop.saved else ""
                print(f"lit_fedco: {stop}{where}; continue with: {run.again()}", file=sys.stderr)
            raise SystemExit(128 + stop.signum) from None
        except WriteFailed as err:
            if rank0:
                print(f"lit_fedco: {err}; make room and continue with: {run.again()}",
                      file=sys.stderr)  # fmt: skip
            raise SystemExit(1) from None
    if rank0 and cfg.sub_run >= 0:
        spec = mine[0]
        print(f"lit_fedco: sub-run {spec.number} ({spec.folder}) of {run_dir} is complete; "
              f"once every sub-run is, {run.again()} writes the run's table, results and "
              "figures")  # fmt: skip
    elif rank0:
        _finish(run)
    return list(run.rows.items())


def _run_subs(run: _Run, fabric: Any, rank0: bool) -> None:
    """This process's sub-runs in order, each run (or resumed) or read back when complete, and
    recorded under its row's label; a pre-training runs before the methods that start from it."""
    plan = run.plan
    for _, i, variant, vcfg, name, seed, folder in run.spec.chosen():
        init = run.start_of(i, variant, vcfg, seed, fabric)
        if folder in plan.done:
            final = plan.done[folder]
            if rank0 and not plan.after_jobs:
                print(f"lit_fedco: {folder} is already complete; its results are kept")
        else:
            announce = name == vcfg.updaters[0]  # once per data set
            branch = branch_start(plan, folder, run.run_dir) if rank0 else {}
            final, _ = run_sub(fabric, vcfg, name, seed, run.spec.recipe, run.run_dir / folder,
                               plan.resume.get(folder), announce, init, run.spec.built,
                               branch)  # fmt: skip
        label = (f"{name} [{variant}]" if variant else name) + label_suffix(vcfg, name)
        run.record(label, final, folder, trains(vcfg, name)["composition"])


def _finish(run: _Run) -> None:
    """Rank 0 of a whole run: the results and the table written (before the table is printed),
    the table printed, the figures drawn and the folder's listing.

    Raises:
        SystemExit: the results could not be written (exit code 1; the table is printed and the
            checkpoints hold the run).
    """
    table_rows = list(run.rows.items())
    table = format_table(table_rows, run.columns, run.trained)
    title = f"{run.spec.recipe}: final metrics per method ({run.evaluated_on}, mean over clients)"
    used = run.columns or TABLE_COLUMNS
    tests = against_best(table_rows, [k for k, _ in used if not k.startswith(UNTESTED)])
    if tests:  # ≥ 2 methods over ≥ 2 seeds: each against the best, seed by seed
        table += "\n\n" + format_tests(tests, dict(used))
    results = {
        "recipe": run.spec.recipe,
        "config": OmegaConf.to_container(run.spec.cfg, resolve=True),
        "columns": [list(c) for c in used],
        "evaluated_on": run.evaluated_on,
        "trains": run.trained,
        "results": run.rows,
        **recorded(run.run_dir, run.folders),
        **({"branched_from": run.plan.branch} if run.plan.branch else {}),
        **tuning_record(run.spec.cfg, run.run_dir),
        "paired_tests": as_records(tests),
    }
    faults.point("before_results")
    try:
        write_json(run.run_dir / "results.json", results)
        write_text(run.run_dir / "table.txt", f"{title}\n{table}\n")
    except OSError as err:  # atomic writes: no earlier file is damaged
        print(f"\n{title}\n{table}")
        print(f"lit_fedco: cannot write the results to {run.run_dir} ({err.strerror or err}); "
              "the table is above and the checkpoints hold the run", file=sys.stderr)  # fmt: skip
        raise SystemExit(1) from None
    print(f"\n{title}\n{table}")
    _figures(run.spec.cfg, run.run_dir, run.spec.recipe)
    print(f"\n{contents(run.run_dir)}")


def _figures(cfg: DictConfig, run_dir: Path, recipe: str) -> None:
    """The run's figures (``figures/``), and to W&B as images when it tracks there. Drawn from
    the record after the run (``jobs`` of them at a time); a failure to draw is reported and
    does not fail the run."""
    from lit_fedco.report.plot import draw_run

    try:
        done = draw_run(run_dir, recipe, processes=int(cfg.jobs))
    except Exception as err:  # matplotlib missing a font, a backend problem: the run is fine
        print(f"lit_fedco: no figures ({type(err).__name__}: {err})", file=sys.stderr)
        return
    pngs = [p for p in done["files"] if p.suffix == ".png"]
    if pngs:
        log_figures(list(cfg.tracking), run_dir, f"{recipe}-figures", cfg.project, pngs)
