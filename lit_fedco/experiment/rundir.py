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

RUN_DIR_ENV = "LIT_FEDCO_RUN_DIR"
"""Set by the launching process so that the processes Fabric starts share its run folder."""


# ---------------------------------------------------------------------- the run folder
def check_writable(out_dir: Path) -> None:
    """Fail before anything is written if ``out_dir`` cannot hold a run: a file in the way,
    or a folder (or its nearest existing ancestor) that is not writable.

    Raises:
        ConfigError: naming ``out_dir``.
    """
    path = out_dir.resolve()
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError.bad_value(
            "out_dir", str(out_dir), f"a folder, but {probe} is a file", "runs"
        )
    try:  # a real probe: permissions, read-only filesystems and a full disk all show here
        tempfile.TemporaryDirectory(dir=probe, prefix=".lit_fedco-probe-").cleanup()
    except OSError as err:
        raise ConfigError.bad_value(
            "out_dir", str(out_dir), f"a writable folder ({probe}: {err.strerror or err})", "runs"
        ) from None


def new_run_dir(out_dir: Path, recipe: str, run_name: str) -> Path:
    """Create the run's folder exclusively: ``run_name``, or the start time with a suffix if
    another run started in the same second.

    Raises:
        ConfigError: ``run_name`` names a run that exists (resume it, or choose another name).
    """
    base = out_dir / recipe
    base.mkdir(parents=True, exist_ok=True)
    if run_name:
        path = base / run_name
        try:
            path.mkdir()
        except FileExistsError:
            raise ConfigError(
                f"run_name: got {run_name!r}, but {path} already holds a run; continue it with "
                "resume=auto, or choose another run_name",
                key="run_name",
            ) from None
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
    if not (path / "config.yaml").is_file():
        runs = sorted(p.name for p in (out_dir / recipe).glob("*") if (p / "config.yaml").is_file())
        raise ConfigError(
            f"run_name: got {run_name!r}, but {path} holds no run to resume; runs there: "
            f"{', '.join(runs[-5:]) or 'none'}",
            key="run_name",
        )
    return path


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
    """A JSON file, or None if it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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
class History:
    """Every round's logs of one (updater, seed): ``metrics.jsonl``, one line per round,
    appended and flushed as it happens; ``metrics.csv`` rebuilt from it (atomically).

    A run killed mid-line leaves a partial last line: it is dropped when the file is read.
    On resume, rounds at or before the last one recorded are not written again.
    """

    def __init__(self, folder: Path) -> None:
        self.jsonl, self.csv = folder / "metrics.jsonl", folder / "metrics.csv"
        self.rows = self.read()
        self.last_round = max((int(r["round"]) for r in self.rows), default=0)
        if self.jsonl.exists():  # rewrite without a partial last line, then append
            write_text(self.jsonl, "".join(json.dumps(r) + "\n" for r in self.rows))
        self._file = open(self.jsonl, "a")  # noqa: SIM115 — kept open for the run

    def read(self) -> list[dict[str, Any]]:
        """The complete lines of ``metrics.jsonl``."""
        return self.read_file(self.jsonl)

    @staticmethod
    def read_file(path: Path) -> list[dict[str, Any]]:
        """The complete lines of a ``metrics.jsonl`` (none if it is missing)."""
        rows = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    break  # a line cut short by a kill: the rest is not trusted
        return rows

    def append(self, round_idx: int, logs: dict[str, float]) -> None:
        """Record round ``round_idx`` unless it is recorded already."""
        if round_idx <= self.last_round:
            return
        row = {"round": round_idx, **logs}
        self._file.write(json.dumps(row) + "\n")
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
        writer.writerows(self.rows)
        write_text(self.csv, buf.getvalue())

    def close(self) -> None:
        """Flush and close the JSONL file and write the CSV."""
        self._file.close()
        self.write_csv()
