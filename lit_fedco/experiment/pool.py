"""``jobs=N``: a whole run as a pool of ``N`` worker processes over its sub-runs, each worker
running one sub-run at a time exactly as ``sub_run=INDEX`` would (forked after the imports:
:mod:`lit_fedco.process.workers`), a line as each ends; then the launcher writes the table."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from lit_fedco.config.parser import CommandLine
from lit_fedco.core import ranges
from lit_fedco.core.errors import ConfigError
from lit_fedco.experiment.plan import Plan, RunSpec
from lit_fedco.experiment.records import record_start
from lit_fedco.experiment.subruns import sub_runs
from lit_fedco.process.stops import requested_signal, stop_on_signals
from lit_fedco.process.workers import Task, program_script, run_tasks, usable_cores
from lit_fedco.report.tracking import share_wandb_service

DROPPED = ("jobs", "sub_run", "resume", "run_name", "out_dir", "progress", "threads")
"""Keys of the launcher's command line that each worker's sub-run sets for itself."""


def check_jobs(cfg: DictConfig, count: int) -> None:
    """``jobs`` and ``sub_run`` against the run: a sub-run that exists, in a named run; jobs
    that each get a core, on one process each.

    Raises:
        ConfigError: naming the key.
    """
    ranges.check_jobs(cfg.jobs)
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


def run_pool(spec: RunSpec, cmd: CommandLine, plan: Plan, run_dir: Path) -> None:
    """The sub-runs not complete yet, ``jobs`` at a time in worker processes, a line as each
    ends.

    Raises:
        SystemExit: a sub-run failed (exit code 1, after the others ended; each one named with
            how to continue it alone) or the run was stopped (128 + the signal).
    """
    cfg = spec.cfg
    record_start(cfg, plan, run_dir)
    threads = cfg.threads or max(1, usable_cores() // cfg.jobs)
    tasks = pool_tasks(spec, cmd, plan, run_dir, threads)
    main_path = program_script()  # a fresh worker runs it for the script's own updaters
    if tasks:  # else every sub-run is complete (a resumed run): its table follows
        print(f"lit_fedco: {len(tasks)} sub-runs, {cfg.jobs} at a time ({threads} thread(s) "
              f"each); their output goes to {run_dir / 'logs'}", flush=True)  # fmt: skip
        share_wandb_service(list(cfg.tracking))  # one W&B service for the launcher and workers
    with stop_on_signals():
        codes = run_tasks(tasks, cfg.jobs, spec.recipe, cmd.defaults, main_path, _report,
                          stop=requested_signal)  # fmt: skip
        signum = requested_signal()
    _outcome(cfg, run_dir, tasks, codes, signum)


def pool_tasks(
    spec: RunSpec, cmd: CommandLine, plan: Plan, run_dir: Path, threads: int
) -> list[Task]:
    """One task per sub-run not complete yet: the launcher's command line as ``sub_run=INDEX``
    of this run, resumed where it stopped, its output in ``logs/sub_run-INDEX.txt``."""
    cfg = spec.cfg
    argv = [a for a in cmd.argv if a.partition("=")[0].lstrip("-") not in DROPPED]
    common = [f"out_dir={cfg.out_dir}", f"run_name={run_dir.name}", "resume=auto", "jobs=1",
              "progress=false", f"threads={threads}"]  # fmt: skip
    specs = [s for s in sub_runs(spec.configs, spec.seeds) if s.folder not in plan.done]
    return [Task(s.number, s.folder, [*argv, *common, f"sub_run={s.number}"],
                 run_dir / "logs" / f"sub_run-{s.number}.txt", kind=f"{s.variant_index}:"
                 f"{s.updater}") for s in specs]  # fmt: skip


def _report(task: Task, code: int, finished: int, total: int) -> None:
    """The line printed as a worker's sub-run ends: complete, stopped or failed (with its log)."""
    took = time.perf_counter() - task.started
    how = f"exit code {code}" if code >= 0 else "its process died"
    state = "complete" if code == 0 else f"failed ({how}; log {task.log})"
    stopped = code < 0 and requested_signal()
    if code in (128 + signal.SIGTERM, 128 + signal.SIGINT) or stopped:
        state = "stopped"
    print(f"lit_fedco: [{finished}/{total}] {task.folder}: {state} ({took:.1f} s)", flush=True)


def _outcome(
    cfg: DictConfig, run_dir: Path, tasks: list[Task], codes: dict[int, int], signum: int
) -> None:
    """Stopped: exit 128 + the signal; a sub-run failed: each named with how to continue it
    alone, exit 1; else return (the table follows)."""
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
