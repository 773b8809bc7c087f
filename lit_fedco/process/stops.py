"""Stop requests: SIGTERM and SIGINT ask a run to stop after the round it is in (it saves a
checkpoint first), and a process whose write failed asks the same (:data:`WRITE_FAILED`).

A request is only recorded here; the run reads it after each round
(:func:`lit_fedco.experiment.session.stop_requested` agrees on it over the processes). Nothing
here imports torch, so that a ``jobs`` worker can take requests before a run is imported
(:mod:`lit_fedco.process.serving`).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_REQUESTED: list[int] = []
"""This process's stop requests, the first first (cleared when :func:`stop_on_signals` ends)."""


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGINT ask the run to stop after the current round (the
    sub-run saves a checkpoint and raises :class:`~lit_fedco.experiment.session.Stopped`)
    instead of killing it mid-write."""
    if not hasattr(signal, "SIGTERM"):
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def request(signum: int, frame: Any) -> None:
        _REQUESTED.append(signum)

    try:
        for s in previous:
            signal.signal(s, request)
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _REQUESTED.clear()


SIGNALS = 66
"""Signal numbers a stop request can carry (0: none; Linux's are 1–64), and
:data:`WRITE_FAILED`."""
WRITE_FAILED = 65
"""The stop request of a process whose write failed (not a signal)."""


def requested_signal() -> int:
    """The signal this process was asked to stop by (SIGTERM, SIGINT), or 0."""
    return next((c for c in _REQUESTED if c != WRITE_FAILED), 0)


def request_stop(code: int) -> None:
    """Ask every process to stop after the round they are in (a signal number, or
    :data:`WRITE_FAILED`)."""
    _REQUESTED.append(code)


def first_request() -> int:
    """This process's first stop request (a signal number or :data:`WRITE_FAILED`), or 0."""
    return _REQUESTED[0] if _REQUESTED else 0
