"""A sub-run's record of every round: ``metrics.jsonl``, appended and flushed as each round
ends, and ``metrics.csv`` written from it when the sub-run ends or stops (:class:`History`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path
from typing import Any

from lit_fedco.process import faults
from lit_fedco.store.files import write_text

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
