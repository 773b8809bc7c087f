"""The run's table: one row per method, mean ± std over seeds, and the columns it shows."""

from __future__ import annotations

import torch

TABLE_COLUMNS = [
    ("val/acc_avg", "val avg acc"),
    ("val/acc_worst", "val worst acc"),
    ("train/acc_avg", "train avg acc"),
    ("train/acc_worst", "train worst acc"),
    ("comm/total_floats_per_client", "floats/client"),
]

UNTESTED = ("comm/", "time")
"""Table columns without a paired test: what a method costs, not what it reaches."""


def format_table(
    rows: list[tuple[str, list[dict[str, float]]]],
    columns: list[tuple[str, str]] | None = None,
    trained: dict[str, str] | None = None,
) -> str:
    """A plain-text table: one row per updater, mean ± std over seeds.

    ``columns`` are (metric key, label) pairs; :data:`TABLE_COLUMNS` by default. ``trained``
    (row label → composition) adds the column ``trains`` after the updater's name: what
    each row's method was trained on (``erm``: the empirical risk; ``local``,
    ``distributed``, ``conditional``...: the problem's compositional objectives).
    """
    columns = TABLE_COLUMNS if columns is None else columns
    head = ["updater", *(["trains"] if trained else []), *[label for _, label in columns], "seeds"]
    lines = []
    for name, results in rows:
        cells = [name, *([trained.get(name, "-")] if trained else [])]
        diverged = [int(r["diverged_round"]) for r in results if "diverged_round" in r]
        for key, _ in columns:
            vals = torch.tensor([r[key] for r in results if key in r], dtype=torch.float64)
            if diverged and not key.startswith("comm/"):
                cells.append(
                    f"diverged@{','.join(map(str, diverged))}"
                    if not len(vals)
                    else f"{vals.mean():.4f} ({len(diverged)} diverged)"
                )
            elif len(vals) == 0:
                cells.append("-")
            elif key.startswith("comm/"):
                cells.append(f"{vals.mean():,.0f}")
            elif len(vals) == 1:
                cells.append(f"{vals.item():.4f}")
            else:
                cells.append(f"{vals.mean():.4f} ± {vals.std():.4f}")
        cells.append(str(len(results)))
        lines.append(cells)
    widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*["-" * w for w in widths])]
    out += [fmt.format(*r) for r in lines]
    return "\n".join(out)
