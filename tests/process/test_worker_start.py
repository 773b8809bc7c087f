"""A ``jobs`` worker started as ``python -m lit_fedco.worker`` (not forked) loads torch and the
run path while it waits for its first task, so that its start-up overlaps the launcher's checks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_an_idle_worker_has_loaded_torch_before_its_first_task():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen([sys.executable, "-m", "lit_fedco.worker"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env)  # fmt: skip
    try:
        deadline, loaded = time.monotonic() + 60, False
        while not loaded and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.5)
            maps = Path(f"/proc/{worker.pid}/maps").read_text()
            loaded = "libtorch" in maps
        assert loaded, "no task given, and torch was not loaded"
        assert worker.poll() is None  # still waiting for a task
    finally:
        assert worker.stdin is not None
        worker.stdin.close()  # no task: the worker ends
        assert worker.wait(timeout=60) == 0
