"""Fail points: where a test may kill the process, for real, at a chosen moment.

``LIT_FEDCO_KILL_AT=NAME`` (or ``NAME:N``, the N-th time, from 1) makes the process send itself
``SIGKILL`` when it reaches the fail point ``NAME``: nothing is cleaned up, exactly as when a
machine dies or a scheduler kills a job. ``NAME:N:SIGNAL`` sends that signal instead
(``figures:1:SIGSTOP`` holds the process there, for a test to signal it at that moment). The
points sit at the boundaries of a run's phases (:data:`POINTS`). Without the variable a fail
point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "LIT_FEDCO_KILL_AT"
POINTS = (
    "run_folder_created",  # the run's folder exists, config.yaml is not written yet
    "checkpoint_written",  # a checkpoint's temporary file is written, not yet renamed
    "metrics_line_half",  # half of a metrics.jsonl line is written and flushed
    "evaluation",  # the clients are being evaluated
    "before_results",  # every sub-run ended; results.json and table.txt are not written
)
"""The fail points, in the order a run reaches them."""
CHILD_POINTS = (
    "figures",  # the results are written; the child process that draws the figures started
)
"""Fail points in a child process the run outlives: a kill there ends the child only."""
_seen: dict[str, int] = {}


def armed(name: str) -> bool:
    """Whether :data:`ENV` names the fail point ``name`` (a write may then split itself so that
    the kill lands in its middle)."""
    return os.environ.get(ENV, "").partition(":")[0] == name


def point(name: str) -> None:
    """Die here (``SIGKILL``) if :data:`ENV` names this point and this is its time."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    target, _, rest = wanted.partition(":")
    if target != name:
        return
    nth, _, how = rest.partition(":")
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == int(nth or 1):
        os.kill(os.getpid(), signal.Signals[how] if how else signal.SIGKILL)
