"""The worker pool beneath ``jobs=N`` (:mod:`lit_fedco.experiment.pool` builds its tasks from a
run's sub-runs): N worker processes, each on its own core(s), each given one task at a time.

Workers are forked from the launching process once it has imported torch (:class:`Forked`,
on Linux), else started as ``python -m lit_fedco.worker``, each importing torch once. A task is
a recipe's command line (``sub_run=INDEX resume=auto jobs=1``), its output going to a log file.
A worker that dies (``kill -9``, out of memory) is replaced and its task reported as failed; a
stop (SIGTERM, SIGINT) reaches every busy worker, with SIGCONT for one that was suspended.
A worker ends with its launcher (:func:`end_with_launcher`).

A worker (:mod:`lit_fedco.process.serving`) reads one JSON line per task and answers one
JSON line on a pipe of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

from lit_fedco.process.forking import fork

Serve = Callable[[IO[str], IO[str]], None]
"""A forked worker's loop, given its tasks' input and its answers' channel
(:func:`lit_fedco.process.serving.serve`)."""

WORKER = [sys.executable, "-m", "lit_fedco.worker"]
"""How a worker process is started."""

LAUNCHER_ENV = "LIT_FEDCO_LAUNCHER_PID"
"""The launcher's process id, in the environment of a worker started as ``python -m
lit_fedco.worker`` (:func:`end_with_launcher`)."""

SHARED_ENV = ("WANDB_SERVICE",)
"""Environment variables a task carries from the launcher to its worker: the W&B service the
launcher started for the run, which every worker's W&B runs then use
(:func:`lit_fedco.report.tracking.share_wandb_service`)."""

WORKER_ENV = "LIT_FEDCO_JOBS_WORKER"
"""Set ("1") in a worker's environment: its tasks come from a launcher that checked the whole run
before handing any out, so a sub-run it runs skips the checks of its input (every updater's
parameters, the data, the model: :func:`lit_fedco.experiment.checks.check_run`)."""


@dataclass
class Task:
    """One sub-run for a worker."""

    index: int
    folder: str
    argv: list[str]
    log: Path
    started: float = 0.0
    kind: str = ""
    """What its length depends on (its variant and updater; not its seed): the tasks of a kind
    take about as long as each other."""


@dataclass
class Worker:
    """A worker process and the task it runs (None: idle)."""

    proc: subprocess.Popen[str] | Forked
    task: Task | None = None
    done: list[tuple[Task, int]] = field(default_factory=list)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _start(env: dict[str, str]) -> Worker:
    proc = subprocess.Popen(WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, bufsize=1)  # fmt: skip
    return Worker(proc)


class Forked:
    """A worker forked from this process, with the part of :class:`subprocess.Popen`'s interface
    :func:`run_tasks` uses (``stdin``, ``stdout``, ``pid``, ``poll``, ``wait``, ``send_signal``,
    ``kill``).

    Only before this process has run any torch operation (:func:`prestart`, right after the
    imports; :func:`lit_fedco.cli.run` forks only where nothing but lit_fedco's code ran): a
    child forked after torch's intra-op thread pool started hangs in its first parallel
    operation (GNU OpenMP keeps the pool's state, not its threads). Then the child starts with
    torch, Lightning and the recipe imported: milliseconds, where a fresh interpreter spends
    seconds importing (on a 2-core machine, two workers importing beside the launcher took 7 s).
    """

    def __init__(self, serve: Serve) -> None:
        launcher = os.getpid()
        task_r, task_w = os.pipe()
        answer_r, answer_w = os.pipe()
        pid = fork()
        if pid == 0:  # the worker; it never returns into the launcher's code
            os.close(task_w)
            os.close(answer_r)
            _serve_forked(task_r, answer_w, serve, launcher)
        os.close(task_r)
        os.close(answer_w)
        self.pid = pid
        self.returncode: int | None = None
        self.stdin: IO[str] | None = os.fdopen(task_w, "w", buffering=1)
        self.stdout: IO[str] | None = os.fdopen(answer_r, "r")
        _ENDS[:] = [end for end in _ENDS if not end.closed] + [self.stdin, self.stdout]

    def poll(self) -> int | None:
        """The exit code (a negative signal number for a killed worker) once it ended."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end, as :meth:`subprocess.Popen.wait` (``TimeoutExpired`` past it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(WORKER, timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_ENDS: list[IO[str]] = []
"""This process's ends of the pipes of the workers it forked: a worker forked later closes them
(holding another worker's input open, it would keep that worker from ever ending)."""


def _serve_forked(task_r: int, answer_w: int, serve: Serve, launcher: int) -> NoReturn:
    """A forked worker's life: the launcher's other workers' pipes closed (else their input
    would never end), then ``serve`` on its pipes until its input ends or its launcher does
    (:func:`end_with_launcher`); it ends with :func:`exit_now`, never unwinding into the
    launcher's code."""
    code = 1
    try:
        end_with_launcher(launcher)
        for end in _ENDS:
            if not end.closed:
                with contextlib.suppress(OSError):
                    os.close(end.fileno())
        os.environ.pop("LIT_FEDCO_RUN_DIR", None)
        os.environ[WORKER_ENV] = "1"
        with os.fdopen(task_r, "r") as inp, os.fdopen(answer_w, "w", buffering=1) as channel:
            serve(inp, channel)
        code = 0
    except BaseException:  # whatever happens, the child must not go on
        import traceback

        traceback.print_exc()
    finally:
        exit_now(code)


def end_with_launcher(launcher: int) -> None:
    """Linux: this worker gets SIGTERM when its launcher (process ``launcher``) ends, however it
    ends (``kill -9`` included), so that its sub-run stops after the round with a checkpoint, as
    at any stop, and releases its lock — instead of running on unseen, holding the sub-run
    that ``resume=auto`` would continue. Elsewhere a worker ends when its input closes, after
    its sub-run."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        args = (ctypes.c_ulong(int(signal.SIGTERM)), *[ctypes.c_ulong(0)] * 3)
        if libc.prctl(ctypes.c_int(1), *args) != 0:  # 1: PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != launcher:  # it ended before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


def exit_now(code: int) -> NoReturn:
    """End this process now: its exit functions (:mod:`atexit`) run and its output is flushed,
    as at any end, but the interpreter's teardown of every module is skipped (about a second
    once torch, torchvision and torchmetrics are imported, on a 2-core machine)."""
    import atexit

    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def program_is_a_recipe() -> bool:
    """Whether this program is one of lit_fedco's recipes (``python -m lit_fedco.recipes.NAME``):
    then it holds no code of the user's (a script of one's own may register updaters and compute
    with torch when it runs, whatever recipe name it passes)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return str(getattr(spec, "name", "") or "").startswith("lit_fedco.recipes.")


def program_script() -> str | None:
    """The file a fresh worker runs (as another module) to have the program's own updaters and
    problems: the program's script, or None for one of lit_fedco's recipes (or no file)."""
    if program_is_a_recipe():
        return None
    return getattr(sys.modules.get("__main__"), "__file__", None)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LIT_FEDCO_RUN_DIR"}
    return {**env, WORKER_ENV: "1", LAUNCHER_ENV: str(os.getpid())}


_POOL: list[Worker] = []
"""Workers started early (:func:`prestart`), waiting for their first task."""


def prestart(count: int, fork: Serve | None = None) -> None:
    """Start ``count`` workers now, so that their start-up overlaps the launcher's own checks;
    :func:`run_tasks` uses them. ``fork``: fork them from this process (:class:`Forked`, each
    serving its tasks with ``fork``; only before this process runs a torch operation); else
    each starts as a fresh interpreter, importing torch (a few seconds). A worker that gets no
    task ends when the launcher does (its input closes)."""
    for _ in range(count - len(_POOL)):
        _POOL.append(Worker(Forked(fork)) if fork is not None else _start(_env()))


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
    it (they checkpoint and stop, as a run does) and no new task starts; a worker suspended
    (SIGSTOP) gets SIGCONT with it, and again whenever it is found suspended while the run
    stops, so that it acts on the signal.

    Returns:
        The exit code of every task that ran (-9 for one whose worker died).
    """
    env = _env()
    base = {"recipe": recipe, "defaults": defaults, "main": main_path,
            "env": {k: os.environ[k] for k in SHARED_ENV if k in os.environ}}  # fmt: skip
    todo = list(tasks)
    codes: dict[int, int] = {}
    took: dict[str, list[float]] = {}  # the seconds of each finished task, by kind
    workers = _workers(min(jobs, len(tasks)), env)
    stopping = 0
    try:
        while any(w.task is not None for w in workers) or (todo and not stopping):
            if not stopping and (stopping := stop()):  # before any new task is handed out
                _signal_busy(workers, stopping)
            elif stopping:
                _continue_suspended(workers)  # suspended again since: it must act on the stop
            if not stopping:
                _hand_out(workers, todo, took, base)
            found = _next_answer([w for w in workers if w.task is not None])
            if found is not None:
                task, code, died = _collect(found, codes, took)
                report(task, code, len(codes), len(tasks))
                found.task = None
                if died:  # the worker died with its task: a fresh one takes its place
                    found.proc.wait()
                    workers[workers.index(found)] = _start(env)
    finally:
        _end(workers, bool(stopping) or len(codes) < len(tasks))
    return codes


def _workers(count: int, env: dict[str, str]) -> list[Worker]:
    """``count`` workers: those :func:`prestart` started first, fresh ones for the rest; the
    started ones not needed are let go (their input closes)."""
    workers = [_POOL.pop(0) if _POOL else _start(env) for _ in range(count)]
    while _POOL:
        spare = _POOL.pop()
        if spare.proc.stdin is not None:
            spare.proc.stdin.close()
    return workers


def _signal_busy(workers: list[Worker], signum: int) -> None:
    """``signum`` to every busy worker, and SIGCONT so that a suspended one acts on it."""
    for w in workers:
        if w.task is not None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signum)
                w.proc.send_signal(signal.SIGCONT)


def _continue_suspended(workers: list[Worker]) -> None:
    """SIGCONT to every busy worker that is suspended (state ``T`` in ``/proc``; nothing where
    there is no ``/proc``)."""
    for w in workers:
        if w.task is not None and _state(w.proc.pid) == b"T":
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGCONT)


def _state(pid: int) -> bytes:
    """The state letter of process ``pid`` (``T``: stopped by a signal), or ``b""``."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b""


def _hand_out(
    workers: list[Worker], todo: list[Task], took: dict[str, list[float]], base: dict[str, Any]
) -> None:
    """A task to every idle worker while there are tasks, the longest kind first."""
    for w in workers:
        if w.task is None and todo:
            w.task = todo.pop(_longest(todo, took))
            w.task.started = time.perf_counter()
            message = {**base, "argv": w.task.argv, "log": str(w.task.log)}
            assert w.proc.stdin is not None
            w.proc.stdin.write(json.dumps(message) + "\n")
            w.proc.stdin.flush()


def _collect(
    w: Worker, codes: dict[int, int], took: dict[str, list[float]]
) -> tuple[Task, int, bool]:
    """The answer of worker ``w``: its task, the task's exit code (-9 when the worker died
    instead of answering; recorded in ``codes``, its time in ``took``) and whether it died."""
    assert w.task is not None
    answer = w.proc.stdout.readline() if w.proc.stdout is not None else ""
    code = int(json.loads(answer)["code"]) if answer else -9
    codes[w.task.index] = code
    took.setdefault(w.task.kind, []).append(time.perf_counter() - w.task.started)
    return w.task, code, not answer


def _end(workers: list[Worker], stopped: bool) -> None:
    """Close every worker's input (an idle one ends); after a stop, give each busy one a minute
    to write its checkpoint and end, then kill it."""
    for w in workers:
        with contextlib.suppress(OSError):
            if w.proc.stdin is not None:
                w.proc.stdin.close()
    for w in workers if stopped else []:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=60)  # a stopping worker writes its checkpoint first
        if w.proc.poll() is None:
            w.proc.kill()


def _longest(todo: list[Task], took: dict[str, list[float]]) -> int:
    """The task to hand out next: the first whose kind has not finished yet (in the run's
    order), else the one whose kind took longest — the longest first, so that the workers end
    together on short ones rather than one of them running a long one alone at the end."""
    mean = {kind: sum(seconds) / len(seconds) for kind, seconds in took.items() if seconds}
    return max(range(len(todo)), key=lambda i: (mean.get(todo[i].kind, float("inf")), -i))


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
