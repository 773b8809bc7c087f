"""``jobs=N``: a run's sub-runs N at a time, each in a process of its own on its own core(s).

The launching process checks the run, creates its folder and writes ``config.yaml``; then it
keeps N worker processes busy (``python -m lit_fedco.experiment.jobs``, each importing torch
once), handing each one sub-run at a time: the recipe's own command line with
``sub_run=INDEX resume=auto jobs=1`` (:func:`lit_fedco.cli.run`), its output in
``<run>/logs/sub_run-INDEX.txt``. A worker that dies (``kill -9``, out of memory) is replaced and
its sub-run reported as failed: it resumes alone with ``sub_run=INDEX resume=auto``. When every
sub-run is complete, the launcher writes the one table, results and figures, exactly as
``jobs=1`` would (the same numbers: a sub-run is a function of its config and seed).

A worker speaks one JSON line per task on stdin and answers one JSON line on stdout.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

WORKER = [sys.executable, "-m", "lit_fedco.experiment.jobs"]
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


def _start(env: dict[str, str]) -> Worker:
    proc = subprocess.Popen(WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, bufsize=1)  # fmt: skip
    return Worker(proc)


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
    env = {k: v for k, v in os.environ.items() if k != "LIT_FEDCO_RUN_DIR"}
    todo, codes = list(tasks), {}
    workers = [_start(env) for _ in range(min(jobs, len(tasks)))]
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
        for w in workers:
            with contextlib.suppress(OSError):
                if w.proc.stdin is not None:
                    w.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=60)
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


def _import_main(path: str | None) -> None:
    """A script's own recipe registers its updaters when its file runs: run it here under
    another name (its ``if __name__ == "__main__":`` part stays out)."""
    if not path:
        return
    spec = importlib.util.spec_from_file_location("__lit_fedco_recipe__", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["__lit_fedco_recipe__"] = module
    spec.loader.exec_module(module)


def serve(inp: IO[str], channel: IO[str]) -> None:
    """The worker loop: run each task's recipe command line with everything it writes (file
    descriptors 1 and 2 included) going to its log; answer on ``channel``."""
    from lit_fedco.cli import run

    imported = False
    for line in inp:
        task = json.loads(line)
        Path(task["log"]).parent.mkdir(parents=True, exist_ok=True)
        code = 0
        with open(task["log"], "a", buffering=1) as log:
            sys.stdout.flush()
            sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                    if not imported:
                        _import_main(task.get("main"))
                        imported = True
                    run(task["recipe"], task["defaults"], task["argv"])
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            except Exception:  # reported in the log; the launcher says which sub-run failed
                import traceback

                traceback.print_exc(file=log)
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        channel.write(json.dumps({"code": code}) + "\n")
        channel.flush()


def main() -> None:
    """Serve tasks from stdin; answers go to a copy of the original stdout, so that nothing a
    recipe or a library prints can be mistaken for one."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    serve(sys.stdin, channel)


if __name__ == "__main__":`` part stays out)."""
    if not path:
        return
    spec = importlib.util.spec_from_file_location("__lit_fedco_recipe__", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["__lit_fedco_recipe__"] = module
    spec.loader.exec_module(module)


def serve(inp: IO[str], out: IO[str]) -> None:
    """The worker loop: run each task's recipe command line, its output in its log."""
    from lit_fedco.cli import run

    imported = False
    for line in inp:
        task = json.loads(line)
        Path(task["log"]).parent.mkdir(parents=True, exist_ok=True)
        code = 0
        with open(task["log"], "a", buffering=1) as log:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                try:
                    if not imported:
                        _import_main(task.get("main"))
                        imported = True
                    run(task["recipe"], task["defaults"], task["argv"])
                except SystemExit as stop:
                    code = stop.code if isinstance(stop.code, int) else 1
                except Exception:  # reported in the log; the launcher says which sub-run failed
                    import traceback

                    traceback.print_exc()
                    code = 1
        out.write(json.dumps({"code": code}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
