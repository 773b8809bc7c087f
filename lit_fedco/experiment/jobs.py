"""``jobs=N``: a run's sub-runs N at a time, each in a process of its own on its own core(s).

The launching process checks the run, creates its folder and writes ``config.yaml``; then it
keeps N worker processes busy (``python -m lit_fedco.worker``, each importing torch once),
handing each one sub-run at a time: the recipe's own command line with
``sub_run=INDEX resume=auto jobs=1`` (:func:`lit_fedco.cli.run`), its output in
``<run>/logs/sub_run-INDEX.txt``. A worker that dies (``kill -9``, out of memory) is replaced and
its sub-run reported as failed: it resumes alone with ``sub_run=INDEX resume=auto``. When every
sub-run is complete, the launcher writes the one table, results and figures, exactly as
``jobs=1`` would (the same numbers: a sub-run is a function of its config and seed).

A worker (:mod:`lit_fedco.worker`) reads one JSON line per task on stdin and answers one JSON
line on stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER = [sys.executable, "-m", "lit_fedco.worker"]
"""How a worker process is started."""


@dataclass
class Task:
    """One sub-run for a worker."""

    index: int
    folder: str
    argv: list[str]
    log: Path
    started: float = 0.0


@dataclass
class Worker:
    """A worker process and the task it runs (None: idle)."""

    proc: subprocess.Popen[str]
    task: Task | None = None
    done: list[tuple[Task, int]] = field(default_factory=list)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def per_core_limit() -> int:
    """The most ``jobs`` (and ``threads``) a run may ask for: 4 per CPU core of this machine."""
    return 4 * (os.cpu_count() or 1)


def _start(env: dict[str, str]) -> Worker:
    proc = subprocess.Popen(WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, bufsize=1)  # fmt: skip
    return Worker(proc)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LIT_FEDCO_RUN_DIR"}


_POOL: list[Worker] = []
"""Workers started early (:func:`prestart`), waiting for their first task."""


def prestart(count: int) -> None:
    """Start ``count`` workers now, so that their start-up (importing torch, a few seconds)
    overlaps the launcher's own checks; :func:`run_tasks` uses them. A worker that gets no task
    ends when the launcher does (its input closes)."""
    _POOL.extend(_start(_env()) for _ in range(count - len(_POOL)))


def run_tasks(
    tasks: list[Task],
    jobs: int,
    recipe: str,
    defaults: dict[str, Any],
    main_path: str | None,
    report: Callable[[Task, int, int, int], None],
    stop: Callable[[], int] = lambda: 0,
) -> dict[int, int]:
    """Run ``tasks`` on ``jobs`` workers; ``report(task, code, finished, total)`` after each.
    ``stop()`` (polled every second) returning a signal number stops the run: the workers get
    it (they checkpoint and stop, as a run does), no new task starts.

    Returns:
        The exit code of every task that ran (-9 for one whose worker died).
    """
    env = _env()
    todo, codes = list(tasks), {}
    workers = [_POOL.pop(0) if _POOL else _start(env) for _ in range(min(jobs, len(tasks)))]
    while _POOL:  # started early, not needed
        spare = _POOL.pop()
        if spare.proc.stdin is not None:
            spare.proc.stdin.close()
    stopping = 0
    try:
        while any(w.task is not None for w in workers) or (todo and not stopping):
            for w in workers:
                if w.task is None and todo and not stopping:
                    w.task = todo.pop(0)
                    w.task.started = time.perf_counter()
                    message = {"recipe": recipe, "defaults": defaults, "argv": w.task.argv,
                               "log": str(w.task.log), "main": main_path}  # fmt: skip
                    assert w.proc.stdin is not None
                    w.proc.stdin.write(json.dumps(message) + "\n")
                    w.proc.stdin.flush()
            busy = [w for w in workers if w.task is not None]
            found = _next_answer(busy)
            if found is None:
                if not stopping and (stopping := stop()):
                    for other in busy:
                        other.proc.send_signal(stopping)
                continue
            w = found
            assert w.task is not None
            answer = w.proc.stdout.readline() if w.proc.stdout is not None else ""
            code = int(json.loads(answer)["code"]) if answer else -9
            codes[w.task.index] = code
            report(w.task, code, len(codes), len(tasks))
            w.task = None
            if not answer:  # the worker died with its task: a fresh one takes its place
                w.proc.wait()
                workers[workers.index(w)] = _start(env)
    finally:
        for w in workers:  # an idle worker ends when its input closes
            with contextlib.suppress(OSError):
                if w.proc.stdin is not None:
                    w.proc.stdin.close()
        for w in workers if stopping or len(codes) < len(tasks) else []:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=60)  # a stopping worker writes its checkpoint first
            if w.proc.poll() is None:
                w.proc.kill()
    return codes


def _next_answer(busy: list[Worker]) -> Worker | None:
    """The first busy worker with an answer (or an end of file) to read within a second."""
    import selectors

    sel = selectors.DefaultSelector()
    for w in busy:
        assert w.proc.stdout is not None
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
    try:
        ready = sel.select(timeout=1.0)
        return ready[0][0].data if ready else None
    finally:
        sel.close()
