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
How each file is written, locked and read back is :mod:`lit_fedco.store`'s.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from lit_fedco.core.errors import ConfigError
from lit_fedco.process.workers import end_with_launcher

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
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".lit_fedco-probe-") as file:
            file.write(b"\0" * PROBE_BYTES)
            file.flush()
    except OSError as err:
        raise ConfigError.bad_value(
            "out_dir", str(out_dir), f"a writable folder ({probe}: {err.strerror or err})", "runs"
        ) from None


PROBE_BYTES = 4096
"""What :func:`check_writable` writes in a hidden file it removes: a block's worth, since an
empty folder or file needs no room on a full disk (a full tmpfs takes both)."""


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds (part of) a run: anything but hidden files. A folder holding
    nothing else is the wreck of a start interrupted before ``config.yaml`` was written (or a
    lock): a new run, or ``resume=auto``, takes it over."""
    return path.is_dir() and any(not p.name.startswith(".") for p in path.iterdir())


def taken(run_name: str, path: Path, fix: str = "") -> ConfigError:
    """The refusal of a new run named ``run_name`` whose folder ``path`` holds a run; ``fix``
    says what to do instead (default: resume it, or choose another name)."""
    fix = fix or "continue it with resume=auto, or choose another run_name"
    message = f"run_name: got {run_name!r}, but {path} already holds a run; {fix}"
    return ConfigError(message, key="run_name")


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
                raise taken(run_name, path, fix) from None
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


def contents(run_dir: Path) -> str:
    """The run folder's files, two levels deep, for the end-of-run message."""
    lines = [f"run folder: {run_dir}"]
    for p in sorted(run_dir.iterdir()):
        if p.is_dir():
            inner = sorted(q.name for q in p.iterdir() if not q.name.startswith("."))
            more = f", ... ({len(inner)} entries)" if len(inner) > 6 else ""
            lines.append(f"  {p.name}/  {', '.join(inner[:6])}{more}")
        elif not p.name.startswith("."):
            lines.append(f"  {p.name}")
    return "\n".join(lines)
