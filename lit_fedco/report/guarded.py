"""A run's figures drawn where their failure cannot touch the run: in a forked child.

The figures come after a run's results are written; they are extra. Drawing them can still
end a process in ways no ``except`` catches: OpenBLAS aborting under a memory limit
(``ulimit -v``), a crash in a plotting library, Ctrl-C. :func:`guarded` draws them in a child
process, so that whatever happens there the run keeps its exit code and says, in one line,
``figures not made: <reason>; the results are complete in <dir>``. Ctrl-C (or SIGTERM) while
they are drawn ends the run with that line and exit code 128 + the signal, as a run stopped
earlier does. Where this process cannot fork (macOS, Windows) they are drawn here, and an
exception or Ctrl-C is told the same way.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lit_fedco.process import faults

EMPTY: dict[str, Any] = {"files": [], "plotted": {}, "labels": {}}
"""What :func:`guarded` returns for figures not made."""


def guarded(draw: Callable[[], dict[str, Any]], run_dir: Path) -> dict[str, Any]:
    """``draw()``'s result, or :data:`EMPTY` after one line on stderr if it failed.

    Raises:
        SystemExit: 128 + the signal, after the line, when SIGINT or SIGTERM stopped it.
    """
    from lit_fedco.process.forking import can_fork

    try:
        if not can_fork():
            return draw()
        return _in_child(draw)
    except _Stopped as stop:
        _say(f"stopped by {stop.name}", run_dir)
        raise SystemExit(128 + stop.signum) from None
    except KeyboardInterrupt:
        _say("stopped by SIGINT", run_dir)
        raise SystemExit(128 + signal.SIGINT) from None
    except _ChildFailed as err:
        _say(str(err), run_dir)
        return dict(EMPTY)
    except Exception as err:  # in this process (no fork), or told by the child
        _say(f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}", run_dir)
        return dict(EMPTY)


def _say(reason: str, run_dir: Path) -> None:
    print(f"lit_fedco: figures not made: {reason}; the results are complete in {run_dir}",
          file=sys.stderr, flush=True)  # fmt: skip


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


class _ChildFailed(Exception):
    """The drawing child failed: its exception, or how it ended."""


def _in_child(draw: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``draw()`` in a forked child; its result comes back through a pipe, its stderr through a
    file (copied here when it succeeds, its last line the reason when it does not).

    Raises:
        _ChildFailed: the child raised, aborted or was killed.
        _Stopped: SIGTERM stopped this process while it waited (SIGINT: KeyboardInterrupt).
    """
    from lit_fedco.process.forking import fork

    read, write = os.pipe()
    with tempfile.TemporaryFile() as errors:
        pid = fork()
        if pid == 0:  # never returns
            os.close(read)
            _child(draw, write, errors.fileno())
        os.close(write)
        try:
            blob = _wait(pid, read)
        except BaseException:
            _end(pid)
            raise
        finally:
            os.close(read)
        errors.seek(0)
        said = errors.read().decode(errors="replace")
    code, outcome = blob
    if code == "ok":
        sys.stderr.write(said)  # the warnings it printed, as if drawn here
        return outcome  # type: ignore[no-any-return]
    last = [line for line in said.splitlines() if line.strip()]
    raise _ChildFailed(outcome + (f" ({last[-1].strip()[:200]})" if last else ""))


def _child(draw: Callable[[], dict[str, Any]], write: int, errors: int) -> None:
    """The drawing child: Ctrl-C and SIGTERM end it without a word (its parent tells them),
    its stderr goes to ``errors``, its result or error to ``write``; ends with ``os._exit``."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(errors, 2)
        faults.point("figures")
        try:
            outcome: tuple[str, Any] = ("ok", draw())
        except BaseException as err:  # told to the parent, which goes on
            outcome = ("error", f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}")
        with os.fdopen(write, "wb") as pipe:
            pickle.dump(outcome, pipe)
        code = 0
    finally:
        os._exit(code)


def _wait(pid: int, read: int) -> tuple[str, Any]:
    """The child's result, read to its end, and the child reaped.

    Raises:
        _ChildFailed: it ended without a result (aborted, killed, out of memory).
        _Stopped: SIGTERM arrived here while waiting.
    """
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:  # set outside Python: put back the default
        previous = signal.SIG_DFL

    def stop(signum: int, _frame: Any) -> None:
        raise _Stopped(signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        chunks = []
        while chunk := os.read(read, 1 << 16):
            chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if chunks:
        return pickle.loads(b"".join(chunks))  # type: ignore[no-any-return]
    if os.WIFSIGNALED(status):
        why = f"the drawing process was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        why = f"the drawing process ended with exit code {os.waitstatus_to_exitcode(status)}"
    raise _ChildFailed(why)


def _end(pid: int) -> None:
    """Kill the drawing child and reap it (this process was stopped while it drew)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
