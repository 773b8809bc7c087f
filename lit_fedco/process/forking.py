"""Forking this process: where it may be done, and doing it without duplicated output or
Python's warning about threads.

Two parts of lit_fedco fork: ``jobs=N`` forks its workers right after the imports
(:class:`lit_fedco.process.workers.Forked`), and the run's figures are drawn by forked children
(:func:`lit_fedco.report.plot.draw`). Both go through :func:`fork`.
"""

from __future__ import annotations

import os
import sys
import warnings


def can_fork() -> bool:
    """Whether this process may fork children that run lit_fedco's code (Linux; macOS's system
    libraries do not survive a fork, and Windows has none)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def fork() -> int:
    """``os.fork()``, after flushing this process's standard output and error (else the child
    would write again what the parent had buffered), without Python 3.12's
    ``DeprecationWarning`` that the process has threads: BLAS's idle pool, and at the figures
    W&B's threads. The children lit_fedco forks take none of those threads' locks: a worker
    forked before any torch operation, a figures' child that only draws and ends with
    ``os._exit``."""
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "This process .* multi-threaded", DeprecationWarning)
        return os.fork()
