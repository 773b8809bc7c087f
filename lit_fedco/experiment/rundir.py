"""Where a run's files go, and how a run picks up after a crash.

Every invocation of a recipe writes into a folder of its own, never into another's::

    <out_dir>/<recipe>/<run_name>/          run_name: run_name=..., or the start time
        config.yaml                         the resolved config as it first ran
        resumes.jsonl                       one line per resume: round, what changed
        results.json, table.txt             the final metrics and the printed table
        wandb/                              W&B runs (offline without credentials)
        <updater>-seed<s>/                  one folder per (variant, updater, seed)
            partition.json                  clients, sizes and class mix
            metrics.jsonl, metrics.csv      every round's logs (the CSV rebuilt from the JSONL)
            status.json                     running / complete / diverged, final metrics, W&B id
            checkpoints/round-NNNNNNN.ckpt  the last few checkpoints

The folder is created exclusively (two runs started in the same second get ``...-2``), so
concurrent runs never share files. A run resumed with ``resume=auto`` continues in its folder:
rounds it had already logged are not logged again (a resumed run repeats them bit for bit).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from lit_fedco.core.errors import ConfigError
from lit_fedco.experiment.checkpoint import atomic_write
from lit_fedco.process import faults

RUN_DIR_ENV = "LIT_FEDCO_RUN_DIR"
"""Set by the launching process so that the processes Fabric starts share its run folder."""
RUN_OWNER_ENV = "LIT_FEDCO_RUN_OWNER"
"""The pid of the run that set :data:`RUN_DIR_ENV` for the processes it starts: a process
that finds the folder without being one of them (a run started inside a run, or the
variable set by hand) is refused (:func:`check_child`)."""


def check_child(run_dir: str) -> None:
    """This process was started by the run that set :data:`RUN_DIR_ENV` (its parent is the
    pid in :data:`RUN_OWNER_ENV`); from now on it gets SIGTERM when that run ends, however it
    ends (``kill -9`` included), instead of waiting on as an orphan.

    Raises:
        ConfigError: naming the variable and how to go on.
    """
    owner = os.environ.get(RUN_OWNER_ENV, "")
    if owner != str(os.getppid()):
        raise ConfigError(
            f"{RUN_DIR_ENV}: got {run_dir!r}, but this process was not started by the run that "
            f"set it ({RUN_OWNER_ENV}={owner or 'unset'}, parent {os.getppid()}); unset "
            f"{RUN_DIR_ENV} (lit_fedco sets it only for the processes a run starts)",
            key=RUN_DIR_ENV,
        )
    from lit_fedco.process.workers import end_with_launcher

    end_with_launcher(int(owner))  # a process Fabric started ends with the run that started it


# ---------------------------------------------------------------------- the run folder
def check_writable(out_dir: Path, recipe: str = "") -> None:
    """Fail before anything is written if ``out_dir`` (and its ``recipe`` folder) cannot hold
    a run: a file in the way, a symbolic-link loop, or a folder (or its nearest existing
    ancestor) that is not writable.

    Raises:
        ConfigError: naming ``out_dir``.
    """
    try:
        path = (out_dir / recipe).resolve(strict=False)
    except (OSError, RuntimeError) as err:  # a symbolic-link loop
        raise ConfigError.bad_value(
            "out_dir", str(out_dir), f"a folder that resolves ({err})", "runs"
        ) from None
    probe = path
    while not probe.exists():
        if probe.is_symlink():  # a link to nowhere, or into a loop
            raise ConfigError.bad_value(
                "out_dir", str(out_dir), f"a folder, but {probe} is a broken link", "runs"
            )
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError.bad_value(
            "out_dir", str(out_dir), f"a folder, but {probe} is a file", "runs"
        )
    try:  # a real probe: permissions, read-only filesystems and a full disk all show here
        _probe_write(probe)
    except OSError as err:
        raise ConfigError.bad_value(
            "out_dir", str(out_dir), f"a writable folder ({probe}: {err.strerror or err})", "runs"
        ) from None


PROBE_BYTES = 4096
"""What :func:`check_writable` writes: a block's worth, since an empty folder or file needs no
room on a full disk (a full tmpfs takes both)."""


def _probe_write(folder: Path) -> None:
    """Create, fill with :data:`PROBE_BYTES` and remove a hidden file in ``folder``.

    Raises:
        OSError: the folder cannot take it (permissions, read-only, full).
    """
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".lit_fedco-probe-") as probe:
        probe.write(b"\0" * PROBE_BYTES)
        probe.flush()


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds (part of) a run: anything but hidden files. A folder holding
    nothing else is the wreck of a start interrupted before ``config.yaml`` was written (or a
    lock): a new run, or ``resume=auto``, takes it over."""
    return path.is_dir() and any(not p.name.startswith(".") for p in path.iterdir())


def new_run_dir(out_dir: Path, recipe: str, run_name: str, fix: str = "") -> Path:
    """Create the run's folder exclusively: ``run_name``, or the start time with a suffix if
    another run started in the same second. A ``run_name`` folder that holds no run (a start
    interrupted before it wrote anything) is taken over.

    Raises:
        ConfigError: ``run_name`` names a run that exists; ``fix`` says what to do instead
            (default: resume it, or choose another name).
    """
    base = out_dir / recipe
    base.mkdir(parents=True, exist_ok=True)
    if run_name:
        path = base / run_name
        try:
            path.mkdir()
        except FileExistsError:
            if holds_run(path):
                fix = fix or "continue it with resume=auto, or choose another run_name"
                raise ConfigError(f"run_name: got {run_name!r}, but {path} already holds a run; "
                                  f"{fix}", key="run_name") from None  # fmt: skip
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1, 1000):
        path = base / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ConfigError(f"out_dir: cannot create a run folder under {base}", key="out_dir")


def existing_run_dir(out_dir: Path, recipe: str, run_name: str) -> Path:
    """The folder of the named run (``resume=auto``).

    Raises:
        ConfigError: no run_name, or no such run.
    """
    if not run_name:
        raise ConfigError(
            "resume: got 'auto' without run_name; name the run to continue, e.g. "
            f"resume=auto run_name=<a folder of {out_dir / recipe}>",
            key="resume",
        )
    path = out_dir / recipe / run_name
    sub_runs = path.is_dir() and any(
        (p / "status.json").is_file() or (p / "checkpoints").is_dir() for p in path.iterdir()
    )
    # a run; one whose config.yaml was removed (its checkpoints still verify what resumes); or
    # the wreck of a start interrupted before it wrote anything, which starts anew
    looks = path.is_dir() and ((path / "config.yaml").is_file() or sub_runs or not holds_run(path))
    if not looks:
        runs = sorted(p.name for p in (out_dir / recipe).glob("*") if (p / "config.yaml").is_file())
        raise ConfigError(
            f"run_name: got {run_name!r}, but {path} holds no run to resume; runs there: "
            f"{', '.join(runs[-5:]) or 'none'}",
            key="run_name",
        )
    return path


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


def contents(run_dir: Path) -> str:
    """The run folder's files, two levels deep, for the end-of-run message."""
    lines = [f"run folder: {run_dir}"]
    for p in sorted(run_dir.iterdir()):
        if p.is_dir():
            inner = sorted(q.name for q in p.iterdir() if not q.name.startswith("."))
            shown = ", ".join(inner[:6]) + (
                f", ... ({len(inner)} entries)" if len(inner) > 6 else ""
            )
            lines.append(f"  {p.name}/  {shown}")
        elif not p.name.startswith("."):
            lines.append(f"  {p.name}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- one sub-run
SET_ASIDE = "metrics.set_aside.jsonl"
"""Where :class:`History` moves the rows of ``metrics.jsonl`` that do not fit the checkpoint
it resumes from (kept for a look, never read back)."""


def _listed(values: list[Any], most: int = 5) -> str:
    """``1, 2, 3, 4, 5, ... (50000 in all)``: a list of any length in a short line."""
    shown = ", ".join(map(str, values[:most]))
    return shown if len(values) <= most else f"{shown}, ... ({len(values)} in all)"


class History:
    """Every round's logs of one (updater, seed): ``metrics.jsonl``, one line per round,
    appended and flushed as it happens; ``metrics.csv`` written from it when the sub-run ends
    or stops (so that a round costs the same at round 10 and round 10,000).

    History is never shortened silently. A line a kill cut short (the last one) is dropped
    and said so; a line in the middle that does not parse is dropped and said so, and the
    lines after it are kept. Rounds the file lacks before the round the sub-run resumes from
    (a truncated or deleted file) are named in :attr:`notes`. On resume, rounds already
    recorded are not written again (a resumed run repeats them bit for bit).

    Args:
        folder: the sub-run's folder.
        resumed: the round the sub-run continues from (0: it starts).
    """

    def __init__(self, folder: Path, resumed: int = 0) -> None:
        self.jsonl, self.csv = folder / "metrics.jsonl", folder / "metrics.csv"
        self.rows, dropped = self.read_lines(self.jsonl)
        self.notes: list[str] = []
        """What was dropped from, or is missing in, the record (to print)."""
        if dropped:
            self.notes.append(f"{self.jsonl}: line(s) {_listed(dropped)} cut short or unreadable, "
                              f"dropped; the other {len(self.rows)} rounds are kept")  # fmt: skip
        aside = self._fit(resumed)
        if aside:
            with open(folder / SET_ASIDE, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in aside))
            self.notes.append(
                f"{self.jsonl}: {len(aside)} row(s) that do not fit the checkpoint's round "
                f"{resumed} (rounds {_listed([r['round'] for r in aside])}: repeated, out of "
                f"order or beyond it) set aside in {SET_ASIDE} (never read back); the record "
                f"keeps the other {len(self.rows)}"
            )
        if dropped or aside:
            write_text(self.jsonl, "".join(json.dumps(r) + "\n" for r in self.rows))
        self.last_round = max((int(r["round"]) for r in self.rows), default=0)
        have = {int(r["round"]) for r in self.rows}
        lost = [r for r in range(1, resumed + 1) if r not in have]
        if lost:
            span = f"{lost[0]}" if len(lost) == 1 else f"{lost[0]}..{lost[-1]}"
            self.notes.append(
                f"{self.jsonl} lacks {len(lost)} of the rounds before the checkpoint's round "
                f"{resumed} (rounds {span}: the file was truncated or removed); the run goes on "
                "from the checkpoint, and those rounds stay missing from the record and figures"
            )
        self._file = open(self.jsonl, "a")  # noqa: SIM115 — kept open for the run

    def _fit(self, resumed: int) -> list[dict[str, Any]]:
        """Keep in :attr:`rows` the rounds 1..``resumed`` (each once, in order) and the rounds
        that follow it one by one (a run stopped after its checkpoint logged them; it logs
        them again, the same); return the other rows, which do not fit the checkpoint."""
        kept: list[dict[str, Any]] = []
        aside: list[dict[str, Any]] = []
        last = 0
        for row in self.rows:
            n = row["round"]
            if n <= last or (n > resumed and n != last + 1):
                aside.append(row)
            else:
                kept.append(row)
                last = n
        self.rows = kept
        return aside

    def read(self) -> list[dict[str, Any]]:
        """The complete lines of ``metrics.jsonl``."""
        return self.read_file(self.jsonl)

    @staticmethod
    def read_lines(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
        """The rows of a ``metrics.jsonl`` that parse (none if it is missing), and the numbers
        (from 1) of the lines that do not: a line cut short by a kill, or damaged."""
        rows, dropped = [], []
        if path.exists():
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                try:
                    row = json.loads(line)
                    n = row["round"]
                except (ValueError, TypeError, KeyError):
                    n = None
                if type(n) is not int or n < 1:  # a round is an int >= 1 (not 1e400, "3")
                    if line.strip():
                        dropped.append(i)
                    continue
                rows.append(row)
        return rows, dropped

    @staticmethod
    def read_file(path: Path) -> list[dict[str, Any]]:
        """The rows of a ``metrics.jsonl`` that parse (none if it is missing)."""
        return History.read_lines(path)[0]

    def append(self, round_idx: int, logs: dict[str, float]) -> None:
        """Record round ``round_idx`` unless it is recorded already.

        Raises:
            OSError: the line could not be written (the record keeps every earlier line).
        """
        if round_idx <= self.last_round:
            return
        row = {"round": round_idx, **logs}
        line = json.dumps(row) + "\n"
        if faults.armed("metrics_line_half"):  # a test kills the process in mid-line
            self._file.write(line[: len(line) // 2])
            self._file.flush()
            faults.point("metrics_line_half")
            line = line[len(line) // 2 :]
        self._file.write(line)
        self._file.flush()
        self.rows.append(row)
        self.last_round = round_idx

    def write_csv(self) -> None:
        """``metrics.csv``: one row per round, a column per key ever logged."""
        keys: dict[str, None] = {}
        for row in self.rows:
            keys.update(dict.fromkeys(row))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(keys))
        writer.writeheader()
        writer.writerows(sorted(self.rows, key=lambda r: int(r["round"])))
        write_text(self.csv, buf.getvalue())

    def close(self) -> None:
        """Close the JSONL file and write the CSV."""
        with contextlib.suppress(OSError):  # every line was flushed when it was written
            self._file.close()
        self.write_csv()
