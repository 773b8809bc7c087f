"""The worker side of ``jobs=N`` (:mod:`lit_fedco.process.workers` is the launcher's): a worker
runs one sub-run at a time, each the recipe's own command line through :func:`lit_fedco.cli.run`,
with everything it prints going to the sub-run's log.

It reads one JSON line per task (``recipe``, ``defaults``, ``argv``, ``log``, ``main``, ``env``:
variables set before the task runs, :data:`lit_fedco.process.workers.SHARED_ENV`) and answers
``{"code": EXIT_CODE}`` on a channel of its own. SIGTERM and SIGINT stop the sub-run in progress
after its round, with a checkpoint (as they stop any run); no later task starts. A worker is
either forked from the launcher (:class:`lit_fedco.process.workers.Forked`) or started as
``python -m lit_fedco.worker``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from lit_fedco.process.stops import request_stop

RunRecipe = Callable[[str, dict[str, Any], list[str]], Any]
"""How a task runs: :func:`lit_fedco.cli.run` (passed in: the entry point is a layer above)."""


def _import_main(path: str | None) -> None:
    """A script's own recipe registers its updaters when its file runs: run the file here under
    another name, so that its ``__main__`` part stays out."""
    if not path:
        return
    spec = importlib.util.spec_from_file_location("__lit_fedco_recipe__", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["__lit_fedco_recipe__"] = module
    spec.loader.exec_module(module)


_PENDING: list[int] = []
"""Stop requests (SIGTERM, SIGINT) this worker got outside a run's own handling."""


def _request(signum: int, frame: Any) -> None:
    """A stop request that came while no run handles signals (importing, planning, idle): the
    run in progress, if any, stops after its next round with a checkpoint; no other starts."""
    _PENDING.append(signum)
    request_stop(signum)


def serve(inp: IO[str], channel: IO[str], run: RunRecipe, main_imported: bool = False) -> None:
    """The worker loop: run each task's recipe command line (``run(recipe, defaults, argv)``:
    :func:`lit_fedco.cli.run`) with everything it writes (file descriptors 1 and 2 included)
    going to its log; answer on ``channel``. ``main_imported``: the recipe's script, if the run
    has one, already ran in this process (a worker forked from the launcher)."""
    imported = main_imported
    for line in inp:
        task = json.loads(line)
        os.environ.update(task.get("env") or {})  # the launcher's W&B service, say
        Path(task["log"]).parent.mkdir(parents=True, exist_ok=True)
        if _PENDING:  # asked to stop before this task began
            if not _answer(channel, 128 + _PENDING[0]):
                return
            continue
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
        if not _answer(channel, code):
            return


def _answer(channel: IO[str], code: int) -> bool:
    """Tell the launcher how a task ended; False where the launcher has gone (its end of the
    channel closed: it was killed): then no task follows, and the worker ends quietly."""
    try:
        channel.write(json.dumps({"code": code}) + "\n")
        channel.flush()
        return True
    except OSError:  # BrokenPipeError
        with contextlib.suppress(OSError):
            channel.close()
        return False


def handle_signals() -> None:
    """SIGTERM and SIGINT stop the sub-run in progress after its round; no later task starts."""
    import signal

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _request)
