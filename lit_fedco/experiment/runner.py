"""Runs a recipe: config → checks → run folder → Fabric → one sub-run per (variant, updater,
seed) → table.

Recipes (``lit_fedco/recipes/<name>.py``) are thin: they pass their defaults to
:func:`main`. Every input error ends the process with exit code 2 and one line, before any
process starts or file is written; then the run gets a folder of its own
(:mod:`lit_fedco.experiment.rundir`), its sub-runs checkpoint as they go
(:mod:`lit_fedco.experiment.session`), and ``resume=auto run_name=NAME`` continues a run that was
stopped or killed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lit_fedco.config.load import variant_configs
from lit_fedco.config.parser import CommandLine, flat_keys
from lit_fedco.core import faults
from lit_fedco.core.errors import ConfigError
from lit_fedco.experiment import checkpoint as ckpt
from lit_fedco.experiment import pretrain
from lit_fedco.experiment.assemble import (
    RESUMABLE_CHANGES,
    Assembly,
    check_run,
    composition_notes,
    launch_rank,
    make_fabric,
    run_executor,
    trains,
)
from lit_fedco.experiment.cpu_memory import keep_freed_memory
from lit_fedco.experiment.jobs import (
    WORKER_ENV,
    Task,
    per_core_limit,
    program_script,
    run_tasks,
    usable_cores,
)
from lit_fedco.experiment.rundir import (
    RUN_DIR_ENV,
    RUN_OWNER_ENV,
    History,
    check_child,
    check_entries,
    check_writable,
    contents,
    existing_run_dir,
    holds_run,
    lock_run,
    new_run_dir,
    read_json,
    sweep,
    write_json,
    write_text,
)
from lit_fedco.experiment.session import (
    Stopped,
    WriteFailed,
    identity_of,
    requested_signal,
    run_sub,
    stop_on_signals,
    verify,
)
from lit_fedco.experiment.subruns import SubRunSpec, pretrain_folder, pretrain_runs, sub_runs
from lit_fedco.experiment.tuning import TUNE_FILE, TUNE_SUFFIX, label_suffix
from lit_fedco.report.paired import against_best, as_records, format_tests
from lit_fedco.report.tracking import log_figures, share_wandb_service

TABLE_COLUMNS = [
    ("val/acc_avg", "val avg acc"),
    ("val/acc_worst", "val worst acc"),
    ("train/acc_avg", "train avg acc"),
    ("train/acc_worst", "train worst acc"),
    ("comm/total_floats_per_client", "floats/client"),
]

UNTESTED = ("comm/", "time")
"""Table columns without a paired test: what a method costs, not what it reaches."""


@dataclass
class Plan:
    """What a run will do, decided before any process starts.

    Attributes:
        run_dir: the run folder (None: to be created).
        resume: per sub-run folder name, the checkpoint it continues from.
        done: per sub-run folder name, the final metrics of a sub-run already complete.
        notes: lines to print (checkpoints skipped as corrupted, sub-runs complete).
        branch: a branch from an older checkpoint (``resume=PATH``), else empty.
    """

    run_dir: Path | None = None
    resume: dict[str, Path] = field(default_factory=dict)
    done: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    after_jobs: bool = False
    """A ``jobs=N`` run whose sub-runs its workers ran: its start is recorded already and
    what is left is the table."""
    branch: dict[str, Any] = field(default_factory=dict)
    """For ``resume=PATH`` of an earlier checkpoint, or of a complete run: the sub-run's
    folder name, the checkpoint, its round and the run it came from; it runs as a new run."""


def _chosen(
    cfg: DictConfig, configs: list[tuple[str, DictConfig]], seeds: list[int]
) -> list[SubRunSpec]:
    """The sub-runs this process runs: all of them, or ``sub_run=INDEX``'s."""
    return [s for s in sub_runs(configs, seeds) if cfg.sub_run < 0 or s.number == cfg.sub_run]


def plan_run(
    recipe: str,
    cfg: DictConfig,
    configs: list[tuple[str, DictConfig]],
    seeds: list[int],
    built: Assembly,
) -> Plan:
    """Where the run goes and what it resumes; every resume problem is found here.

    Raises:
        ConfigError: an unwritable output location, a run name in use, no run to resume, or a
            checkpoint that does not verify or belongs to another run.
    """
    out_dir = Path(cfg.out_dir)
    check_writable(out_dir, recipe)
    plan = Plan()
    if not cfg.resume and cfg.sub_run < 0:
        if cfg.run_name and holds_run(out_dir / recipe / cfg.run_name):
            raise ConfigError(
                f"run_name: got {cfg.run_name!r}, but {out_dir / recipe / cfg.run_name} already "
                "holds a run; continue it with resume=auto, or choose another run_name",
                key="run_name",
            )
        return plan
    if cfg.resume in ("auto", ""):  # a sub-run (sub_run=INDEX) always continues what it has
        plan.run_dir = existing_run_dir(out_dir, recipe, cfg.run_name)
        if not holds_run(plan.run_dir) and cfg.sub_run < 0:
            plan.notes.append(f"run {cfg.run_name} never got past its start (no config.yaml, no "
                              "sub-run): starting it now")  # fmt: skip
        return plan_existing(plan, recipe, cfg, configs, seeds, built)
    return _plan_path(plan, recipe, cfg, configs, seeds, built)


def plan_existing(
    plan: Plan,
    recipe: str,
    cfg: DictConfig,
    configs: list[tuple[str, DictConfig]],
    seeds: list[int],
    built: Assembly,
) -> Plan:
    """What each sub-run of ``plan.run_dir`` (or just ``sub_run``'s) continues from, or its
    final metrics when it is complete."""
    assert plan.run_dir is not None
    check_entries(plan.run_dir, [spec.folder for spec in _chosen(cfg, configs, seeds)] + [
        folder for *_, folder in pretrain_runs(configs, seeds)])  # fmt: skip
    for _, _, vcfg, seed, folder in pretrain_runs(configs, seeds) if cfg.sub_run < 0 else []:
        _plan_pretrain(plan, recipe, vcfg, seed, plan.run_dir / folder, built)
    for spec in _chosen(cfg, configs, seeds):
        _plan_sub(plan, recipe, spec.cfg, spec.updater, spec.seed, plan.run_dir / spec.folder,
                  built)  # fmt: skip
    total = len(list(sub_runs(configs, seeds))) + len(list(pretrain_runs(configs, seeds)))
    if cfg.sub_run < 0 and plan.done and not plan.resume and len(plan.done) == total:
        plan.notes.append(f"run {plan.run_dir.name} is already complete: nothing to run")
    return plan


def _plan_finished(run_dir: Path, configs: list[tuple[str, DictConfig]], seeds: list[int]) -> Plan:
    """The plan of a ``jobs=N`` run whose workers have just completed every sub-run: each one's
    final metrics, as its ``status.json`` records them (its checkpoints were verified by the
    worker that resumed it)."""
    plan = Plan(run_dir=run_dir, after_jobs=True)
    folders = [s.folder for s in sub_runs(configs, seeds)]
    folders += [f for *_, f in pretrain_runs(configs, seeds)]
    for folder in folders:
        status = read_json(run_dir / folder / "status.json") or {}
        if status.get("state") not in ("complete", "diverged") or not status.get("final"):
            raise ConfigError(
                f"resume: {run_dir / folder} did not complete ({status.get('state', 'no status')})"
                f"; continue the run with resume=auto run_name={run_dir.name}",
                key="resume",
            )
        plan.done[folder] = status["final"]
    return plan


def _plan_path(
    plan: Plan,
    recipe: str,
    cfg: DictConfig,
    configs: list[tuple[str, DictConfig]],
    seeds: list[int],
    built: Assembly,
) -> Plan:
    """``resume=PATH``: the newest checkpoint of a sub-run that has not ended continues in its
    run; any other (an earlier one, or one of a complete run) starts a new run from it, and the
    run it came from is left as it is."""
    path = Path(cfg.resume)
    found = ckpt.load(path)  # unreadable, truncated, corrupted: refused here
    ((_, _, _, vcfg, name, seed, folder),) = list(sub_runs(configs, seeds))
    data = built.data(vcfg, seed)
    params = built.updater(vcfg, name, seed)[0].params()
    verify(found, identity_of(recipe, vcfg, name, seed, data, params), path)
    at = int(found["loop"]["round"])
    if at >= vcfg.rounds:
        raise ConfigError(
            f"resume: {path} is at round {at}, the end of a {vcfg.rounds}-round run; there is "
            f"nothing left to run (set rounds={at + 1} or more to continue from it)",
            key="resume",
        )
    sub_dir = path.resolve().parent.parent
    run = sub_dir.parent
    ours = sub_dir.name == folder and (run / "config.yaml").is_file()
    newest = ckpt.newest_valid(sub_dir / "checkpoints") if ours else None
    ended = (read_json(sub_dir / "status.json") or {}).get("state") == "complete"
    if ours and newest is not None and newest[0].resolve() == path.resolve() and not ended:
        plan.run_dir = run  # the newest checkpoint of a sub-run that stopped: continue it
        for _, _, _, pseed, pfolder in pretrain_runs(configs, seeds):  # its pre-training
            _plan_pretrain(plan, recipe, vcfg, pseed, plan.run_dir / pfolder, built)
    else:
        what = "a complete run" if ended else "an earlier checkpoint of its run"
        plan.branch = {"folder": folder, "checkpoint": str(path), "round": at,
                       "run": str(run) if ours else None,
                       "history": str(sub_dir / "metrics.jsonl") if ours else None}  # fmt: skip
        source = f" {run.name}" if ours else ""
        plan.notes.append(f"resume: {path} is round {at} of {what}{source}; it continues as a "
                          "new run (the run it came from is left as it is)")  # fmt: skip
    plan.resume[folder] = path
    return plan


def _starting_point(
    recipe: str,
    i: int,
    variant: str,
    vcfg: DictConfig,
    seed: int,
    plan: Plan,
    run_dir: Path,
    fabric: Any,
    record: Any,
    built: Assembly,
) -> dict[str, Any] | None:
    """``{"params", "from"}`` every method of (variant ``i``, ``seed``) starts from, or None
    (each its seeded initialisation). With ``pretrain.rounds > 0`` the pre-training runs as a
    sub-run of its own (resumed, or read back when complete) and its row is recorded.

    Raises:
        SystemExit: the pre-training diverged (exit code 1): no method can start from it.
    """
    base = None
    if vcfg.init_from:
        base = {"params": pretrain.load_params(vcfg.init_from), "from": str(vcfg.init_from)}
    if not pretrain.enabled(vcfg):
        return base
    folder = pretrain_folder(i, variant, seed)
    args = (recipe, vcfg, variant, seed, plan, run_dir, folder, fabric, record, built, base)
    if vcfg.sub_run >= 0:  # beside other sub-runs: the first to need it runs it, the others wait
        guard = lock_run(run_dir, wait=True, name=f".lock-{folder}")
        try:
            if folder not in plan.done:
                _plan_pretrain(plan, recipe, vcfg, seed, run_dir / folder, built)
            return _pretrained(*args)
        finally:
            guard.release()
    return _pretrained(*args)


def _pretrained(
    recipe: str,
    vcfg: DictConfig,
    variant: str,
    seed: int,
    plan: Plan,
    run_dir: Path,
    folder: str,
    fabric: Any,
    record: Any,
    built: Assembly,
    base: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The pre-training of ``folder``: read back when complete, else run (or resumed)."""
    saved = run_dir / folder / pretrain.PRETRAINED
    name = str(vcfg.pretrain.updater)
    rank0 = fabric.global_rank == 0
    loop = None
    if folder in plan.done:
        final = plan.done[folder]
        if rank0 and not plan.after_jobs:
            print(f"lit_fedco: {folder} is already complete; its model is {saved}")
    else:
        pcfg = pretrain.pretrain_config(vcfg)
        final, loop = run_sub(fabric, pcfg, name, seed, recipe, run_dir / folder,
                              plan.resume.get(folder), False, base, built)  # fmt: skip
    if "diverged_round" in final:
        if rank0:
            print(
                f"lit_fedco: the pre-training ({name}, {folder}) diverged in round "
                f"{int(final['diverged_round'])}; no method can start from it: lower "
                f"pretrain.lr (got {vcfg.pretrain.lr})",
                file=sys.stderr,
            )
        raise SystemExit(1)
    if loop is None:
        if not saved.is_file():  # removed since: the last checkpoint holds the same model
            saved = ckpt.listing(run_dir / folder / "checkpoints")[-1]
        params = pretrain.load_params(saved)
    else:
        model = loop.server[loop.updater.model_key]
        params = {k: v.detach().clone() for k, v in model.items()}
        last = run_dir / folder / "checkpoints" / ckpt.name_of(loop.round)
        if rank0 and last.is_file():  # the final checkpoint, under a name init_from= takes
            ckpt.atomic_write(saved, last.read_bytes())
        elif rank0:
            why = f"no checkpoint of round {loop.round}"
            print(f"lit_fedco: cannot write {saved} ({why}); the methods start from the "
                  "pre-trained model all the same", file=sys.stderr)  # fmt: skip
    label = f"pretrain [{variant}]" if variant else "pretrain"
    record(label, final, folder, trains(pretrain.pretrain_config(vcfg), name)["composition"])
    return {"params": params, "from": f"{folder}/{pretrain.PRETRAINED}"}


def _already_done(found: dict[str, Any], cfg: DictConfig) -> bool:
    return int(found["loop"]["round"]) >= cfg.rounds


def _plan_pretrain(
    plan: Plan, recipe: str, vcfg: DictConfig, seed: int, folder: Path, built: Assembly
) -> None:
    """:func:`_plan_sub` for the pre-training of (a variant's config ``vcfg``, ``seed``)."""
    pcfg = pretrain.pretrain_config(vcfg)
    _plan_sub(plan, recipe, pcfg, str(vcfg.pretrain.updater), seed, folder, built)


def _plan_sub(
    plan: Plan, recipe: str, cfg: DictConfig, name: str, seed: int, folder: Path, built: Assembly
) -> None:
    status = read_json(folder / "status.json") or {}
    if status.get("state") == "diverged" and status.get("final"):
        plan.done[folder.name] = status["final"]  # a result: resuming would diverge again
        return
    newest = ckpt.newest_valid(folder / "checkpoints")
    if newest is None:
        listed = ckpt.listing(folder / "checkpoints")
        if listed:  # every checkpoint fails: refuse rather than restart from round 0 unasked
            reason = ""
            try:
                ckpt.load(listed[-1])
            except ckpt.CheckpointError as err:
                reason = str(err).removeprefix("resume: ")
            raise ConfigError(
                f"resume: every checkpoint of {folder.name} fails its check (the newest: "
                f"{reason}); move {folder / 'checkpoints'} away to run {folder.name} again from "
                "round 0",
                key="resume",
            )
        return  # nothing to resume: the sub-run starts from round 0
    path, found, skipped = newest
    plan.notes += [f"skipped: {reason}" for reason in skipped]
    at = int(found["loop"]["round"])
    if at > cfg.rounds:
        raise ConfigError(
            f"rounds: got {cfg.rounds}, but {folder.name} has run {at} rounds already (its newest "
            f"checkpoint); a run is not shortened: set rounds={at} or more to continue it, or "
            "start a new run from an earlier checkpoint with resume=PATH",
            key="rounds",
        )
    data = built.data(cfg, seed)
    params = built.updater(cfg, name, seed)[0].params()
    verify(found, identity_of(recipe, cfg, name, seed, data, params), path)
    if _already_done(found, cfg) and status.get("final"):
        plan.done[folder.name] = status["final"]
    else:
        plan.resume[folder.name] = path


def format_table(
    rows: list[tuple[str, list[dict[str, float]]]],
    columns: list[tuple[str, str]] | None = None,
    trained: dict[str, str] | None = None,
) -> str:
    """A plain-text table: one row per updater, mean ± std over seeds.

    ``columns`` are (metric key, label) pairs; :data:`TABLE_COLUMNS` by default. ``trained``
    (row label → composition) adds the column ``trains`` after the updater's name: what
    each row's method was trained on (``erm``: the empirical risk; ``local``,
    ``distributed``, ``conditional``...: the problem's compositional objectives).
    """
    columns = TABLE_COLUMNS if columns is None else columns
    head = ["updater", *(["trains"] if trained else []), *[label for _, label in columns], "seeds"]
    lines = []
    for name, results in rows:
        cells = [name, *([trained.get(name, "-")] if trained else [])]
        diverged = [int(r["diverged_round"]) for r in results if "diverged_round" in r]
        for key, _ in columns:
            vals = torch.tensor([r[key] for r in results if key in r], dtype=torch.float64)
            if diverged and not key.startswith("comm/"):
                cells.append(
                    f"diverged@{','.join(map(str, diverged))}"
                    if not len(vals)
                    else f"{vals.mean():.4f} ({len(diverged)} diverged)"
                )
            elif len(vals) == 0:
                cells.append("-")
            elif key.startswith("comm/"):
                cells.append(f"{vals.mean():,.0f}")
            elif len(vals) == 1:
                cells.append(f"{vals.item():.4f}")
            else:
                cells.append(f"{vals.mean():.4f} ± {vals.std():.4f}")
        cells.append(str(len(results)))
        lines.append(cells)
    widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*["-" * w for w in widths])]
    out += [fmt.format(*r) for r in lines]
    return "\n".join(out)


def run_recipe(
    recipe: str,
    cmd: CommandLine,
    cfg: DictConfig,
    columns: list[tuple[str, str]] | None = None,
    callbacks: list[Any] | None = None,
    evaluated_on: str = "validation",
) -> list[Any]:
    """Run a recipe whose command line was parsed and loaded (:func:`lit_fedco.cli.run`, the
    entry point, calls it): check, plan, run each (variant, seed, updater), print the table and
    save it with the results in the run folder.

    Bad input ends the process with exit code 2 and a one-line message, before anything is
    written. SIGTERM or SIGINT stop the run after the current round with a checkpoint (exit
    code 128 + the signal). ``columns`` are the table's (metric key, label) pairs
    (:data:`TABLE_COLUMNS` by default); ``callbacks`` receive the loop's hooks
    (:func:`~lit_fedco.experiment.assemble.make_fabric`); ``evaluated_on`` names the data the
    ``val/`` metrics are measured on ("validation", or "test" for a recipe whose held-out data
    is a test set), in the table's title, the results and the figures' labels.
    """
    child = os.environ.get(RUN_DIR_ENV)  # a process Fabric started: the launcher checked it all
    rank = launch_rank(cfg) if not child else None  # one of several an outside launcher started
    built = Assembly()
    held: list[Any] = []
    try:
        if child:
            check_child(child)  # set by the launcher of this process, not inherited or by hand
        configs = variant_configs(cmd, cfg)  # one per variant, or just cfg
        for c in [cfg, *(c for _, c in configs)]:  # executor=auto: the choice is recorded
            c.executor = run_executor(c)
        seeds = list(cfg.seeds) or [cfg.seed]
        check_jobs(cfg, len(list(sub_runs(configs, seeds))))
        checks = configs
        chosen = _chosen(cfg, configs, seeds)
        if child or os.environ.get(WORKER_ENV) == "1":  # its launcher checked the whole run
            checks = []
        elif cfg.sub_run >= 0:  # one sub-run: its own updater
            (spec,) = chosen
            mine = spec.cfg.copy()
            mine.updaters = [spec.updater]
            checks = [(spec.variant, mine)]
        for variant, c in checks:
            try:
                check_run(c, built)
            except ConfigError as err:
                raise err.within(f"variant {variant!r}") if variant else err from None
        for line in dict.fromkeys(n for _, c in checks for n in composition_notes(c)):
            print(f"lit_fedco: note: {line}", file=sys.stderr)  # not silently another objective
        if rank is not None and not cfg.run_name:
            raise ConfigError.bad_value(
                "run_name", "", "a name every process of the run is given (torchrun, srun and "
                "each node start their own processes; they share the run folder)", "nodes1",
            )  # fmt: skip
        if rank:  # not rank 0: rank 0 creates and writes the run folder, this one reads it
            child = str(Path(cfg.out_dir) / recipe / cfg.run_name)
        if cfg.sub_run >= 0 and not child:  # one sub-run, beside others of the same run
            check_writable(Path(cfg.out_dir), recipe)
            run_dir = Path(cfg.out_dir) / recipe / cfg.run_name
            run_dir.mkdir(parents=True, exist_ok=True)
            held.append(lock_run(run_dir, shared=True))
            _check_same_run(cfg, run_dir)  # before its own lock file: a refusal writes nothing
            held.append(lock_run(run_dir, name=f".lock-{chosen[0].folder}"))
        # the processes Fabric starts read the same files and come to the same plan
        plan = plan_run(recipe, cfg, configs, seeds, built) if not child or cfg.resume else Plan()
        fix = "a run started from a checkpoint of another goes to a new folder: choose another "
        fix += "run_name, or leave it out"
        if child:
            run_dir = Path(child)
        elif cfg.sub_run < 0:
            run_dir = plan.run_dir or new_run_dir(Path(cfg.out_dir), recipe, cfg.run_name,
                                                  fix if plan.branch else "")  # fmt: skip
            # until the run ends; another process is refused here (jobs=N: its workers share it)
            held.append(lock_run(run_dir, shared=cfg.jobs > 1))
            faults.point("run_folder_created")
    except ConfigError as err:
        for lock in held:
            lock.release()
        print(f"lit_fedco: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        if cfg.jobs > 1 and not child:
            _run_jobs(recipe, cmd, cfg, configs, seeds, plan, run_dir)
            try:
                plan = _plan_finished(run_dir, configs, seeds)
            except ConfigError as err:
                print(f"lit_fedco: {err}", file=sys.stderr)
                raise SystemExit(1) from None
        return _execute(recipe, cfg, configs, seeds, plan, run_dir, callbacks, columns,
                        evaluated_on, built, child)  # fmt: skip
    finally:
        for lock in held:
            lock.release()


def _execute(
    recipe: str,
    cfg: DictConfig,
    configs: list[tuple[str, DictConfig]],
    seeds: list[int],
    plan: Plan,
    run_dir: Path,
    callbacks: list[Any] | None,
    columns: list[tuple[str, str]] | None,
    evaluated_on: str,
    built: Assembly,
    child: str | None,
) -> list[Any]:
    """This process's sub-runs on Fabric, then (a whole run) the table and the results."""
    os.environ.setdefault("WANDB_SILENT", "true")
    keep_freed_memory()  # a round's large temporaries reuse warm heap pages (cpu_memory.py)
    os.environ[RUN_DIR_ENV] = str(run_dir)
    os.environ.setdefault(RUN_OWNER_ENV, str(os.getpid()))  # the processes Fabric starts: ours
    try:
        fabric = make_fabric(cfg, callbacks)
        torch.set_num_threads(process_threads(cfg))  # recorded in each sub-run's status.json
        if cfg.shard_data:  # each process keeps the rows of the clients it owns
            built.shard(fabric.global_rank, fabric.world_size)
        rows = _run(recipe, cfg, configs, seeds, plan, run_dir, fabric, columns, evaluated_on,
                    built)  # fmt: skip
        _shut_down(fabric)
        return rows
    finally:
        if not child:
            os.environ.pop(RUN_DIR_ENV, None)
            os.environ.pop(RUN_OWNER_ENV, None)


def process_threads(cfg: DictConfig) -> int:
    """The intra-op threads of this process: ``threads``, or for 0 the CPU cores this process
    may use shared out among the processes of the run on this machine (``devices`` per node,
    or the launcher's ``LOCAL_WORLD_SIZE``), at most torch's own default — one process of a
    2-core machine: 2; each of two: 1."""
    if cfg.threads > 0:
        return int(cfg.threads)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or max(1, int(cfg.devices))
    return max(1, min(torch.get_num_threads(), usable_cores() // local))


def check_jobs(cfg: DictConfig, count: int) -> None:
    """``jobs`` and ``sub_run`` against the run: a sub-run that exists, in a named run; jobs
    that each get a core, on one process each.

    Raises:
        ConfigError: naming the key.
    """
    most = per_core_limit()
    if not 1 <= cfg.jobs <= most:
        raise ConfigError.bad_value("jobs", cfg.jobs, f"an int in [1, {most}]", "2")
    if cfg.jobs > 1 and cfg.devices * cfg.num_nodes > 1:
        raise ConfigError.bad_value(
            "jobs", cfg.jobs, "1 with devices or num_nodes > 1 (a sub-run runs on one process "
            "per job; use one or the other)", "1",
        )  # fmt: skip
    if not -1 <= cfg.sub_run < count:
        raise ConfigError.bad_value(
            "sub_run", cfg.sub_run, f"an index in [0, {count - 1}] (--list-sub-runs lists them) "
            "or -1 (all)", "0",
        )  # fmt: skip
    if cfg.sub_run >= 0 and not cfg.run_name:
        raise ConfigError.bad_value(
            "run_name", "", "the name of the run the sub-run belongs to (every sub-run of a run "
            "writes into its folder)", "grid1",
        )  # fmt: skip
    if cfg.sub_run >= 0 and cfg.jobs > 1:  # it would launch the whole run beside itself
        raise ConfigError.bad_value(
            "jobs", cfg.jobs, f"1 with sub_run={cfg.sub_run} (a single sub-run runs in one "
            "process; jobs=N runs a whole run, N sub-runs at a time)", "1",
        )  # fmt: skip
    if (cfg.sub_run >= 0 or cfg.jobs > 1) and cfg.resume not in ("", "auto"):
        raise ConfigError.bad_value(
            "resume", cfg.resume, "'' or auto with sub_run or jobs (resume=PATH runs one "
            "checkpoint in one process)", "auto",
        )  # fmt: skip


def _whole_run(cfg: DictConfig) -> dict[str, Any]:
    """The run's config as its ``config.yaml`` records it, whichever sub-run writes it."""
    whole = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(whole, dict)
    whole.update(sub_run=-1, jobs=1, resume="")
    return {str(k): v for k, v in whole.items()}


_READ: dict[tuple[str, int, int, int], dict[str, Any] | None] = {}
"""Run configs read (:func:`_run_config`), by path and file identity: a ``jobs=N`` worker checks
each of its sub-runs against the same ``config.yaml``."""


def _run_config(path: Path) -> dict[str, Any] | None:
    """A run's ``config.yaml`` as dotted keys; None where there is none or it is unreadable (the
    checkpoints still verify what each sub-run resumes). Read once while the file is unchanged."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path.resolve()), st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _READ:
        try:
            before = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception:
            before = None
        _READ.clear()  # one run at a time
        _READ[key] = flat_keys(before) if isinstance(before, dict) else None
    return _READ[key]


def _check_same_run(cfg: DictConfig, run_dir: Path) -> None:
    """A sub-run joins a run only with the run's own command line (how it executes aside).

    Raises:
        ConfigError: naming the first key that differs from the run's ``config.yaml``.
    """
    theirs = _run_config(run_dir / "config.yaml")
    if theirs is None:
        return
    # where the run lives is the folder itself: a run named by its start time has run_name ''
    # in config.yaml and its sub-runs the name; out_dir may be spelt relative or absolute
    free = {*RESUMABLE_CHANGES, "resume", "run_name", "out_dir"}
    mine = flat_keys(_whole_run(cfg))
    for key in sorted(set(theirs) | set(mine)):
        if key.split(".")[0] in free or theirs.get(key) == mine.get(key):
            continue
        raise ConfigError(
            f"sub_run: run {run_dir.name} was started with {key}={theirs.get(key)!r}, this "
            f"sub-run has {key}={mine.get(key)!r}; give every sub-run of a run the same command "
            "line (only sub_run, threads and how it executes may differ)",
            key="sub_run",
        )


def _run_jobs(
    recipe: str,
    cmd: CommandLine,
    cfg: DictConfig,
    configs: list[tuple[str, DictConfig]],
    seeds: list[int],
    plan: Plan,
    run_dir: Path,
) -> None:
    """The sub-runs not complete yet, ``jobs`` at a time in worker processes
    (:mod:`lit_fedco.experiment.jobs`), a line as each ends.

    Raises:
        SystemExit: a sub-run failed (exit code 1, after the others ended; each one named with
            how to continue it alone) or the run was stopped (128 + the signal).
    """
    _record_start(cfg, plan, run_dir)
    drop = ("jobs", "sub_run", "resume", "run_name", "out_dir", "progress", "threads")
    argv = [a for a in cmd.argv if a.partition("=")[0].lstrip("-") not in drop]
    threads = cfg.threads or max(1, usable_cores() // cfg.jobs)
    common = [f"out_dir={cfg.out_dir}", f"run_name={run_dir.name}", "resume=auto", "jobs=1",
              "progress=false", f"threads={threads}"]  # fmt: skip
    specs = [s for s in sub_runs(configs, seeds) if s.folder not in plan.done]
    tasks = [Task(s.number, s.folder, [*argv, *common, f"sub_run={s.number}"],
                  run_dir / "logs" / f"sub_run-{s.number}.txt", kind=f"{s.variant_index}:"
                  f"{s.updater}") for s in specs]  # fmt: skip
    main_path = program_script()  # a fresh worker runs it for the script's own updaters
    if tasks:  # else every sub-run is complete (a resumed run): its table follows
        print(f"lit_fedco: {len(tasks)} sub-runs, {cfg.jobs} at a time ({threads} thread(s) "
              f"each); their output goes to {run_dir / 'logs'}", flush=True)  # fmt: skip

    def report(task: Task, code: int, finished: int, total: int) -> None:
        took = time.perf_counter() - task.started
        how = f"exit code {code}" if code >= 0 else "its process died"
        state = "complete" if code == 0 else f"failed ({how}; log {task.log})"
        stopped = code < 0 and requested_signal()
        if code in (128 + signal.SIGTERM, 128 + signal.SIGINT) or stopped:
            state = "stopped"
        print(f"lit_fedco: [{finished}/{total}] {task.folder}: {state} ({took:.1f} s)", flush=True)

    if tasks:
        share_wandb_service(list(cfg.tracking))  # one W&B service for the launcher and workers
    with stop_on_signals():
        codes = run_tasks(tasks, cfg.jobs, recipe, cmd.defaults, main_path, report,
                          stop=requested_signal)  # fmt: skip
        signum = requested_signal()
    again = f"run_name={run_dir.name} out_dir={cfg.out_dir} resume=auto"
    if signum or len(codes) < len(tasks):
        print(f"lit_fedco: stopped; continue with: {again} jobs={cfg.jobs}", file=sys.stderr)
        raise SystemExit(128 + (signum or signal.SIGTERM))
    failed = [t for t in tasks if codes.get(t.index, 1) != 0]
    for t in failed:
        print(f"lit_fedco: sub-run {t.index} ({t.folder}) failed (see {t.log}); continue it "
              f"alone with: sub_run={t.index} {again}", file=sys.stderr)  # fmt: skip
    if failed:
        print(f"lit_fedco: then the table: {again}", file=sys.stderr)
        raise SystemExit(1)


def _run(
    recipe: str,
    cfg: DictConfig,
    configs: list[tuple[str, DictConfig]],
    seeds: list[int],
    plan: Plan,
    run_dir: Path,
    fabric: Any,
    columns: list[tuple[str, str]] | None,
    evaluated_on: str,
    built: Assembly,
) -> list[Any]:
    """Every sub-run of a planned run, then the table, the results and the folder's listing."""
    rank0 = fabric.global_rank == 0
    chosen = _chosen(cfg, configs, seeds)
    if rank0 and not plan.after_jobs:
        try:
            _record_start(cfg, plan, run_dir, chosen[0].folder if cfg.sub_run >= 0 else "")
        except OSError as err:
            print(f"lit_fedco: cannot write the run's config in {run_dir} ({err.strerror or err}); "
                  "nothing has run: make room and run again", file=sys.stderr)  # fmt: skip
            raise SystemExit(1) from None
        for line in plan.notes:
            print(f"lit_fedco: {line}", file=sys.stderr)
    rows: dict[str, list[dict[str, float]]] = {}
    folders: dict[str, list[str]] = {}
    starts: dict[tuple[int, int], dict[str, Any] | None] = {}

    trained: dict[str, str] = {}  # label → the composition it trains (the table's column)

    def record(label: str, final: dict[str, float], folder: str, composition: str) -> None:
        rows.setdefault(label, []).append(final)
        folders.setdefault(label, []).append(folder)
        trained[label] = composition

    def start_of(i: int, variant: str, vcfg: DictConfig, seed: int) -> dict[str, Any] | None:
        """The shared starting point of the methods of (variant, seed), made once: the
        pre-training's final model (run now, or read back), or ``init_from``'s."""
        if (i, seed) not in starts:
            starts[i, seed] = _starting_point(
                recipe, i, variant, vcfg, seed, plan, run_dir, fabric, record, built
            )
        return starts[i, seed]

    with stop_on_signals():
        try:
            for _, i, variant, vcfg, name, seed, folder in chosen:
                init = start_of(i, variant, vcfg, seed)  # a pre-training runs before its methods
                if folder in plan.done:
                    final = plan.done[folder]
                    if rank0 and not plan.after_jobs:
                        print(f"lit_fedco: {folder} is already complete; its results are kept")
                else:
                    announce = name == vcfg.updaters[0]  # once per data set
                    branch = _branch_start(plan, folder, run_dir) if rank0 else {}
                    final, _ = run_sub(fabric, vcfg, name, seed, recipe, run_dir / folder,
                                       plan.resume.get(folder), announce, init, built,
                                       branch)  # fmt: skip
                label = (f"{name} [{variant}]" if variant else name) + label_suffix(vcfg, name)
                record(label, final, folder, trains(vcfg, name)["composition"])
        except Stopped as stop:
            if rank0:
                where = f"; checkpoint {stop.saved}" if stop.saved else ""
                print(
                    f"lit_fedco: {stop}{where}; continue with: resume=auto "
                    f"run_name={run_dir.name} out_dir={cfg.out_dir}",
                    file=sys.stderr,
                )
            raise SystemExit(128 + stop.signum) from None
        except WriteFailed as err:
            if rank0:
                again = f"resume=auto run_name={run_dir.name} out_dir={cfg.out_dir}"
                print(f"lit_fedco: {err}; make room and continue with: {again}", file=sys.stderr)
            raise SystemExit(1) from None
    table_rows = list(rows.items())
    if cfg.sub_run >= 0:
        if rank0:
            spec = chosen[0]
            print(f"lit_fedco: sub-run {spec.number} ({spec.folder}) of {run_dir} is complete; "
                  f"once every sub-run is, resume=auto run_name={run_dir.name} "
                  f"out_dir={cfg.out_dir} writes the run's table, results and figures")  # fmt: skip
        return table_rows
    if rank0:
        table = format_table(table_rows, columns, trained)
        title = f"{recipe}: final metrics per method ({evaluated_on}, mean over clients)"
        used = columns or TABLE_COLUMNS
        tests = against_best(table_rows, [k for k, _ in used if not k.startswith(UNTESTED)])
        if tests:  # ≥ 2 methods over ≥ 2 seeds: each against the best, seed by seed
            table += "\n\n" + format_tests(tests, dict(used))
        results = {
            "recipe": recipe,
            "config": OmegaConf.to_container(cfg, resolve=True),
            "columns": [list(c) for c in (columns or TABLE_COLUMNS)],
            "evaluated_on": evaluated_on,
            "trains": trained,
            "results": rows,
            **_recorded(run_dir, folders),
            **({"branched_from": plan.branch} if plan.branch else {}),
            **_tuning(cfg, run_dir),
            "paired_tests": as_records(tests),
        }
        faults.point("before_results")
        try:  # written before the table is printed
            write_json(run_dir / "results.json", results)
            write_text(run_dir / "table.txt", f"{title}\n{table}\n")
        except OSError as err:  # atomic writes: no earlier file is damaged
            why = err.strerror or err
            print(f"\n{title}\n{table}")
            print(f"lit_fedco: cannot write the results to {run_dir} ({why}); the table is "
                  "above and the checkpoints hold the run", file=sys.stderr)  # fmt: skip
            raise SystemExit(1) from None
        print(f"\n{title}\n{table}")
        _figures(cfg, run_dir, recipe)
        print(f"\n{contents(run_dir)}")
    return table_rows


def _tuning(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """``{"tuning": ...}``: a tuned run's choice and every grid point's scores (its tuning
    run's ``tune.json``); nothing for a run that was not tuned."""
    if not list(cfg.tune.chosen):
        return {}
    record = read_json(run_dir.with_name(run_dir.name + TUNE_SUFFIX) / TUNE_FILE)
    return {"tuning": record or {"chosen": list(cfg.tune.chosen)}}


def _branch_start(plan: Plan, folder: str, run_dir: Path) -> dict[str, Any]:
    """For the sub-run a branch starts (``resume=PATH`` of an earlier checkpoint): its record
    up to the checkpoint's round, copied from the run it came from, and the note for its
    ``status.json``; nothing for any other sub-run."""
    if plan.branch.get("folder") != folder:
        return {}
    source = plan.branch.get("history")
    if source and not (run_dir / folder / "metrics.jsonl").exists():
        rows = [
            r for r in History.read_file(Path(source)) if int(r["round"]) <= plan.branch["round"]
        ]
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
        write_text(run_dir / folder / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return {"branched_from": {k: plan.branch[k] for k in ("checkpoint", "round", "run")}}


def _record_start(cfg: DictConfig, plan: Plan, run_dir: Path, own: str = "") -> None:
    """``config.yaml`` for a new run; one line of ``resumes.jsonl`` for a resumed one, with
    what changed (rounds, and how it executes). A single sub-run (``sub_run``, in folder
    ``own``) writes the run's ``config.yaml`` if no other has, and nothing else."""
    first = run_dir / "config.yaml"
    if cfg.sub_run >= 0:  # beside other sub-runs: the run's config, written by the first
        sweep(run_dir / own)  # never the other sub-runs' files
        if not first.exists():
            write_text(first, OmegaConf.to_yaml(OmegaConf.create(_whole_run(cfg))))
        return
    sweep(run_dir)  # temporary files a killed run's atomic writes left behind
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if not first.exists():
        if cfg.resume and holds_run(run_dir):
            print(f"lit_fedco: {first} was missing; written again from this command line (the "
                  "checkpoints verify what resumes)", file=sys.stderr)  # fmt: skip
        write_text(first, OmegaConf.to_yaml(OmegaConf.create(resolved)))
        return
    try:
        before = OmegaConf.to_container(OmegaConf.load(first), resolve=True)
    except Exception as err:  # not YAML, not text, an interpolation that does not resolve
        before = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:100]}"
    assert isinstance(resolved, dict)
    if not isinstance(before, dict):
        why = before if isinstance(before, str) else f"a {type(before).__name__}, not a mapping"
        print(f"lit_fedco: {first} is damaged ({why}); written again from this command line "
              "(the checkpoints verify what resumes)", file=sys.stderr)  # fmt: skip
        write_text(first, OmegaConf.to_yaml(OmegaConf.create(resolved)))
        before = resolved
    changed = {k: [before.get(k), resolved.get(k)] for k in RESUMABLE_CHANGES
               if before.get(k) != resolved.get(k)}  # fmt: skip
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "resume": cfg.resume, "changed": changed,
            "from": {k: str(v) for k, v in plan.resume.items()}}  # fmt: skip
    with open(run_dir / "resumes.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    if changed:
        print(f"lit_fedco: resuming {run_dir.name} with " + ", ".join(
            f"{k}: {a} -> {b}" for k, (a, b) in changed.items()))  # fmt: skip


def _recorded(run_dir: Path, folders: dict[str, list[str]]) -> dict[str, Any]:
    """Every evaluated round's metrics per method and seed (``history``), and every client's
    final validation accuracy (``per_client``), read back from the sub-runs' records."""
    history: dict[str, list[list[dict[str, float]]]] = {}
    per_client: dict[str, list[list[float] | None]] = {}
    for label, subs in folders.items():
        for sub in subs:
            rows = History.read_file(run_dir / sub / "metrics.jsonl")
            history.setdefault(label, []).append([r for r in rows if "val/acc_avg" in r])
            status = read_json(run_dir / sub / "status.json") or {}
            per_client.setdefault(label, []).append(status.get("per_client"))
    return {"history": history, "per_client": per_client}


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


def _shut_down(fabric: Any) -> None:
    """With several processes: wait until rank 0 has written the results and figures, then
    close the process group on every rank, so that no process exits with the collectives'
    threads still running (which aborts it)."""
    if fabric.world_size > 1:
        fabric.barrier()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
