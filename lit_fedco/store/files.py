"""The files of a run folder, written so that they survive: atomic writes, JSON read back
defensively, the folder's lock, and a check that nothing in the folder is a link or a stranger.

Writing is atomic on any filesystem (:func:`atomic_write`): a temporary file in the destination
folder, ``fsync``, ``os.replace``, ``fsync`` of the folder. A crash, a full disk or ``kill -9``
at any moment leaves either the old file or the new one; a temporary file a kill left behind
starts with ``.`` and is swept (:func:`sweep`). A run folder is held by one run at a time
(:func:`lock_run`), through a ``flock`` the kernel releases however the holder ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from lit_fedco.core.errors import ConfigError
from lit_fedco.process import faults


def atomic_write(path: Path, payload: bytes, fail_point: str = "") -> None:
    """Write ``payload`` to ``path`` atomically (temporary file in the same folder, fsync,
    ``os.replace``, fsync of the folder). On any error the temporary file is removed and the
    previous ``path``, if any, is untouched; the error propagates."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        if fail_point:
            faults.point(fail_point)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


LOCK = ".lock"
"""The lock file of a run folder (:func:`lock_run`)."""


class RunLock:
    """A run folder held by this process (:func:`lock_run`); :meth:`release` lets it go."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def release(self) -> None:
        """Let the folder go (closing the descriptor drops the ``flock``)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_run(
    run_dir: Path, *, shared: bool = False, wait: bool = False, name: str = LOCK
) -> RunLock:
    """Hold ``run_dir`` for this process: an exclusive ``flock`` on its :data:`LOCK` file, which
    records who holds it, until :meth:`RunLock.release`. The kernel releases it when the
    process ends, however it ends (``kill -9`` included), so a stale lock never blocks a
    resume.

    A whole run holds its folder exclusively. The processes of a ``jobs=N`` run and single
    sub-runs (``sub_run=INDEX``) hold it ``shared`` (they run side by side, never beside a
    whole run), and each its sub-run's own lock file (``name``) exclusively; ``wait`` blocks
    until the lock is free (a pre-training another sub-run is running) instead of refusing.

    Raises:
        ConfigError: another process holds the folder (its pid, host and start time named).
    """
    import fcntl
    import socket

    path = run_dir / name
    try:  # never through a link, never a folder or FIFO in its place
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as err:
        raise ConfigError(
            f"run_name: cannot open the lock file {path} ({err.strerror or err}; a folder or "
            "link in its place?); move it out of the run folder, then run again",
            key="run_name",
        ) from None
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        fcntl.flock(fd, mode if wait else mode | fcntl.LOCK_NB)
    except OSError:
        holder = read_json(path) or {}
        os.close(fd)
        who = f"process {holder.get('pid', '?')} on {holder.get('host', '?')}"
        what = run_dir if name == LOCK else f"{run_dir} ({name.removeprefix('.lock-')})"
        raise ConfigError(
            f"run_name: {what} is in use by {who} (since {holder.get('since', '?')}); wait "
            f"for it to end, or stop it (kill {holder.get('pid', 'PID')}), then run again",
            key="run_name",
        ) from None
    if not shared:  # who holds it (shared holders leave the launcher's record)
        mine = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
        try:
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(mine) + "\n").encode())
        except OSError as err:  # a disk that filled since the probe: the folder is left empty
            os.close(fd)
            raise ConfigError(
                f"out_dir: cannot write the lock file {path} ({err.strerror or err}); make room "
                "on that disk or choose another out_dir, then run again",
                key="out_dir",
            ) from None
    return RunLock(fd)


def sweep(folder: Path) -> None:
    """Remove the temporary files that atomic writes of a killed process left in ``folder``
    and below (``.NAME.tmpPID``; never this process's own)."""
    mine = f".tmp{os.getpid()}"
    for tmp in folder.rglob(".*.tmp*"):
        if tmp.is_file() and not tmp.name.endswith(mine):
            tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """Write a text file atomically."""
    atomic_write(path, text.encode())


def write_json(path: Path, value: Any) -> None:
    """Write a JSON file atomically."""
    write_text(path, json.dumps(value, indent=1) + "\n")


def read_json(path: Path) -> Any:
    """A JSON object (a dict) from a file, or None if it is missing, unreadable or holds
    another kind of value (a damaged ``status.json`` holding ``[1]``)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


RUN_FILES = ("config.yaml", LOCK, "resumes.jsonl", "results.json", "table.txt")
"""The files lit_fedco writes at the top of a run folder."""
SUB_FILES = ("status.json", "metrics.jsonl", "metrics.csv", "partition.json")
"""The files it writes in each sub-run's folder (beside ``checkpoints/``)."""


def check_entries(run_dir: Path, subs: list[str]) -> None:
    """The run folder, the files lit_fedco writes in it and the folders ``subs`` of its
    sub-runs are what it wrote: folders and regular files, none a symbolic link (a write
    through one would land outside the run). Missing ones are fine.

    Raises:
        ConfigError: naming the first entry that is not, and how to go on.
    """
    import stat

    wanted: list[tuple[Path, bool]] = [(run_dir, True)]
    wanted += [(run_dir / name, False) for name in RUN_FILES]
    for sub in subs:
        wanted.append((run_dir / sub, True))
        wanted += [(run_dir / sub / name, False) for name in SUB_FILES]
        wanted.append((run_dir / sub / "checkpoints", True))
        with contextlib.suppress(OSError):  # each checkpoint a file (one is written over)
            ckpts = sorted((run_dir / sub / "checkpoints").glob("round-*"))
            wanted += [(p, False) for p in ckpts if not p.name.endswith(".tmp")]
    for path, folder in wanted:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as err:
            kind = f"unreadable ({err.strerror or err})"
        else:
            if stat.S_ISLNK(mode):
                kind = "a symbolic link"
            elif folder == stat.S_ISDIR(mode) and (folder or stat.S_ISREG(mode)):
                continue
            else:
                kind = "a folder" if stat.S_ISDIR(mode) else "a file" if folder else (
                    "not a regular file (a FIFO, socket or device)")  # fmt: skip
        what = "folder" if folder else "file"
        raise ConfigError(
            f"run_name: {path} is {kind}, expected the {what} lit_fedco writes there; move it "
            "out of the run folder (or choose another run_name), then run again",
            key="run_name",
        )
