"""A ``jobs=N`` launcher stopped while one of its workers is suspended (``kill -STOP``, a job
scheduler's suspend): the launcher's SIGTERM still ends the run (the worker gets SIGCONT with
it, checkpoints and stops), and ``resume=auto`` completes it with the numbers of an
uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.experiment.test_jobs import finish, numbers, recipe
from tests.helpers import REPO

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def test_sigterm_ends_a_jobs_run_whose_worker_is_suspended(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    args = ["run_name=susp", "jobs=2", "seeds=[0]"]
    proc = subprocess.Popen(recipe(tmp_path, *args), cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    run_dir = tmp_path / "comfedl_dro" / "susp"
    deadline = time.monotonic() + 120
    while len({p.parent.parent for p in run_dir.glob("*/checkpoints/round-*.ckpt")}) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.02)  # both sub-runs past their first checkpoint
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGSTOP)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        code, _, err = finish(proc, timeout=120)
    finally:
        for pid in workers:  # never leave a suspended process behind
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGCONT)
    assert code == 128 + signal.SIGTERM, err
    assert "continue with:" in err and "Traceback" not in err, err
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists() and _alive(pid)]
    reference = tmp_path / "ref"
    code, _, err = finish(subprocess.Popen(recipe(reference, "run_name=ref", "seeds=[0]"),
                                           cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE))  # fmt: skip
    assert code == 0, err
    code, _, err = finish(subprocess.Popen(recipe(tmp_path, *args, "resume=auto"), cwd=REPO,
                                           env=env, text=True, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE))  # fmt: skip
    assert code == 0, err
    assert numbers(run_dir) == numbers(reference / "comfedl_dro" / "ref")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"
