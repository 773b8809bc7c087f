"""Paper-style figures of finished runs, drawn from what the runs recorded (no W&B needed).

``python -m lit_fedco.report.plot RUN_DIR [RUN_DIR ...] [--out DIR]`` re-draws one run, or overlays
several (two variants, our run next to another seed set), and writes a Markdown summary table.
Every recipe run calls :func:`draw_run` on its own folder when it ends, so its figures sit in
``<run_dir>/figures/`` as PNG and PDF:

- ``curves``: the recipe's headline metrics (its table's first columns: average and
  worst-client validation accuracy, or worst-class accuracy, AP, test accuracy) against rounds,
  the mean over seeds with a ±1 std band;
- ``communication``: the same against floats communicated per client;
- ``clients``: each method's final per-client validation (or, where the recipe's held-out data
  is a test set, test) accuracy, one point per client and seed; only for runs whose headline
  metrics are accuracies (a ranking loss's accuracy at score 0 says nothing: ``fcsg_auprc``);
- ``weights``: the DRO client weights over rounds, for the methods that have them.

One colour and line style per method, the same in every figure (curves that coincide stay
visible); the papers' method names; the legend under the panels, where it covers no data. A
series of at most :data:`FEW_POINTS` evaluated points (a short run: ``rounds=10`` evaluates
once, after the last round) is drawn with markers, and a single point's ±std as an error bar;
single points at the same x are spread a little sideways. Where a run pre-trained
(``pretrain``), every method starts from the pre-training's model, so its curve is drawn after
the pre-training's: its rounds and floats are counted from the start of the pre-training, with
a dotted line where the methods start. This module reads JSON and imports matplotlib only, so
it is quick and draws nothing while a run trains.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

NAMES = {
    "comfedl": "ComFedL", "comfedl_maml": "ComFedL-MAML", "comfedl_damaml": "ComFedL-DAMAML",
    "fedavg": "FedAvg", "drfl": "DRFL", "qfedavg": "q-FedAvg", "fedmaml": "FedMAML (Per-FedAvg)",
    "tr_maml": "TR-MAML", "ditto": "Ditto", "feddro": "FedDRO", "ds_feddro": "DS-FedDRO",
    "fedavg_co": "FedAvg-CO (II)", "fedavg_co_i": "FedAvg-CO (I)", "mbsgd": "MBSGD",
    "fcsg": "FCSG", "fcsg_m": "FCSG-M",
    "acc_fcsg_m": "Acc-FCSG-M", "local_scgd": "Local-SCGD", "local_scgdm": "Local-SCGDM",
    "coda_plus": "CODA+", "fastdro": "FastDRO", "pdsgd": "PDSGD", "gcivr": "GCIVR",
    "fedavgm": "FedAvgM", "fedadam": "FedAdam", "fedyogi": "FedYogi", "scaffold": "SCAFFOLD",
    "pretrain": "pre-training",
}  # fmt: skip
"""The papers' names of the registered updaters (others are shown as registered)."""
COMM = "comm/total_floats_per_client"
LABELS = {
    "train/objective": "DRO objective Φ (training data)",
    "val/acc_avg": "average client accuracy (validation)",
    "val/acc_worst": "worst-client accuracy (validation)",
    "val/class_acc_worst": "worst-class accuracy (validation)",
    "val/ap": "average precision (test)",
}
"""Axis labels of the headline metrics (others: the table's column label)."""
DEFAULT_COLUMNS = [["val/acc_avg", "val avg acc"], ["val/acc_worst", "val worst acc"]]
FEW_POINTS = 5
"""A series with at most this many evaluated points is drawn with markers: a line through one
point is invisible, and through two or three it hides where the evaluations were."""
PRETRAIN = "pretrain"
"""The pre-training's label in a run's record (:mod:`lit_fedco.experiment.pretrain`)."""
STYLES = ("-", "--", ":", "-.")
"""Line styles by method, with the colour: methods whose curves coincide (FCSG, FCSG-M and
Acc-FCSG-M at β = 0.9) stay visible, a dashed or dotted line over a solid one."""


def display(method: str) -> str:
    """``"fcsg_m [invariant_logreg.m=1 data.rho=0.5]"`` → ``"FCSG-M [m=1, rho=0.5]"``: the
    paper's name, the variant kept with each key's last part."""
    base, _, rest = method.partition(" ")
    if rest.startswith("["):
        items = rest.strip("[]").split()
        rest = "[" + ", ".join(i.split("=", 1)[0].split(".")[-1] + "=" + i.split("=", 1)[-1]
                               for i in items) + "]"  # fmt: skip
    return f"{NAMES.get(base, base)} {rest}".strip()


# ---------------------------------------------------------------------- reading runs
def load_run(run_dir: Path) -> dict[str, Any]:
    """A finished run's record: ``results.json`` (final metrics, table columns, evaluated
    history per method and seed, final per-client accuracies) and its name."""
    path = Path(run_dir) / "results.json"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(
            f"lit_fedco.report.plot: {path} is not a finished run's results ({err})"
        ) from None
    rec["name"] = Path(run_dir).name
    rec.setdefault("columns", DEFAULT_COLUMNS)
    rec.setdefault("evaluated_on", "validation")  # runs recorded before it was
    rec.setdefault("history", {})
    rec.setdefault("per_client", {})
    return rec


def headline(columns: list[list[str]]) -> list[tuple[str, str]]:
    """The metrics the figures draw: the table's first two non-communication, non-time
    columns."""
    keys = [(k, label) for k, label in columns if not k.startswith("comm/") and k != "time_s"]
    return keys[:2]


def series(runs: list[dict[str, Any]]) -> dict[str, list[list[dict[str, float]]]]:
    """Evaluated rows per method (``method`` or ``method (run)`` when overlaying), per seed."""
    out: dict[str, list[list[dict[str, float]]]] = {}
    for rec in runs:
        for method, seeds in rec["history"].items():
            label = method if len(runs) == 1 else f"{method} ({rec['name']})"
            out[label] = seeds
    return out


def starts(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Where each series starts on the figures' x axes: ``{label: {"round": r, COMM: f}}``.

    A run that pre-trained starts every method from the pre-training's final model, so its
    methods start where the pre-training ended: its rounds (``config.pretrain.rounds``, else
    the pre-training's last evaluated round, which is its last round) and its floats per client
    (its last evaluated row's, seed 0). The pre-training itself, and every series of a run
    without one, start at 0.
    """
    out: dict[str, dict[str, float]] = {}
    for rec in runs:
        pre = [s for s in rec["history"].get(PRETRAIN, []) if s]
        offset = {"round": 0.0, COMM: 0.0}
        if pre:
            last = pre[0][-1]
            rounds = (rec.get("config") or {}).get("pretrain", {}).get("rounds") or last["round"]
            offset = {"round": float(rounds), COMM: float(last.get(COMM, 0.0))}
        for method in rec["history"]:
            label = method if len(runs) == 1 else f"{method} ({rec['name']})"
            out[label] = {"round": 0.0, COMM: 0.0} if method == PRETRAIN else offset
    return out


def mean_std(seeds: list[list[dict[str, float]]], x: str, y: str) -> tuple[list, list, list]:
    """x, mean and std over seeds of metric ``y`` at the evaluated rounds all seeds share (x is
    the first seed's value of ``x`` there)."""
    common = set.intersection(*[{int(r["round"]) for r in s if y in r} for s in seeds])
    rounds = sorted(common)
    by_seed = [{int(r["round"]): r for r in s} for s in seeds]
    xs = [by_seed[0][r][x] if x != "round" else r for r in rounds]
    ys = [[b[r][y] for b in by_seed] for r in rounds]
    mean = [statistics.fmean(v) for v in ys]
    std = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in ys]
    return xs, mean, std


# ---------------------------------------------------------------------- drawing
def colours(methods: list[str]) -> dict[str, Any]:
    """One colour per method, by order of appearance (tab10, then tab20)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(methods) <= 10 else "tab20"]
    return {m: cmap(i % cmap.N) for i, m in enumerate(methods)}


def _figure(ncols: int, width: float = 5.0):  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 3.8), squeeze=False)
    return fig, list(axes[0])


def _series(ax: Any, xs: list, mean: list, std: list, colour: Any, label: str, i: int) -> None:
    """Method ``i``'s mean with its ±std band; markers where it has few points, and the band of
    a single point as an error bar (a band over one x is invisible). Solid lines are drawn
    under broken ones (:data:`STYLES`)."""
    few = len(xs) <= FEW_POINTS
    style = STYLES[i % len(STYLES)]
    ax.plot(xs, mean, color=colour, label=label, lw=1.6, ls=style, marker="o" if few else None,
            ms=4, zorder=2 + 0.1 * STYLES.index(style))  # fmt: skip
    if len(xs) == 1:
        if std[0] > 0:
            ax.errorbar(xs, mean, yerr=std, fmt="none", ecolor=colour, elinewidth=1, capsize=3)
        return
    lo = [a - b for a, b in zip(mean, std, strict=True)]
    hi = [a + b for a, b in zip(mean, std, strict=True)]
    ax.fill_between(xs, lo, hi, color=colour, alpha=0.18, lw=0)


def _dodge(xss: list[list[float]]) -> list[float]:
    """Sideways shifts for single-point series whose x is within 1.5 % of the axis of another
    one's (the same round, or nearly the same floats): each such group is spread evenly around
    its middle, 1.5 % of the axis apart and over 10 % at most, in the order of their x, so that
    their markers and error bars do not hide each other. Longer series stay where they are."""
    span = max((max(xs) for xs in xss if xs), default=0.0) or 1.0
    near = 0.015 * span
    single = sorted((xs[0], j) for j, xs in enumerate(xss) if len(xs) == 1)
    groups: list[list[tuple[float, int]]] = []
    for x, j in single:
        if groups and x - groups[-1][-1][0] < near:
            groups[-1].append((x, j))
        else:
            groups.append([(x, j)])
    out = [0.0] * len(xss)
    for group in groups:
        if len(group) < 2:
            continue
        middle = statistics.fmean(x for x, _ in group)
        step = span * min(0.015, 0.1 / (len(group) - 1))
        for k, (x, j) in enumerate(group):
            out[j] = middle + (k - (len(group) - 1) / 2) * step - x
    return out


def _from_zero(ax: Any, integer: bool) -> None:
    """The x axis from 0 (where training starts) to 4 % past the last point (a marker at the
    edge would be cut in half), with whole-number ticks for rounds."""
    from matplotlib.ticker import MaxNLocator

    last = ax.dataLim.x1
    ax.set_xlim(0, 1.04 * last if math.isfinite(last) and last > 0 else None)
    if integer:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))


def _legend_below(fig: Any, axes: list[Any]) -> int:
    """One legend for all panels, under them (it covers no data); returns its rows."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if not entries:  # every method diverged: nothing drawn
        return 0
    ncol = len(entries) if len(entries) <= 4 else 3
    fig.legend(list(entries.values()), list(entries), loc="lower center", ncol=ncol,
               fontsize=8, frameon=False)  # fmt: skip
    rows = math.ceil(len(entries) / ncol)
    fig.set_size_inches(fig.get_size_inches()[0], fig.get_size_inches()[1] + 0.22 * rows)
    return rows


def _seeds_note(data: dict[str, list[list[dict[str, float]]]]) -> str:
    """``mean ± std over 3 seeds``, or ``1 seed`` (no band then)."""
    counts = {len([s for s in seeds if s]) for seeds in data.values()} - {0}
    if counts == {1}:
        return "1 seed"
    return f"mean ± std over {counts.pop()} seeds" if len(counts) == 1 else "mean ± std over seeds"


def _save(fig: Any, out: Path, name: str, legend_rows: int = 0) -> list[Path]:
    import matplotlib.pyplot as plt

    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, 0.22 * legend_rows / height, 1, 1))
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path, options in ((paths[0], {"dpi": 150}), (paths[1], {})):
        tmp = path.with_name(f".{path.name}.tmp")
        fig.savefig(tmp, format=path.suffix[1:], **options)
        os.replace(tmp, path)  # whole, and never written through a link in its place
    plt.close(fig)
    return paths


Plotted = dict[str, dict[str, dict[str, list[float]]]]
"""What a figure plotted: ``{panel: {series: {"x": [...], "y": [...]}}}``."""
Drawing = tuple[list[Path], Plotted]
"""A figure's files and what it plotted."""


def draw(
    runs: list[dict[str, Any]], out: Path, title: str = "", processes: int = 1
) -> dict[str, Any]:
    """Draw the figures of ``runs`` into ``out``; returns the files and what each plotted.
    ``processes`` > 1 (a ``jobs=N`` run's end, on Linux): the figures are drawn that many at a
    time, in processes forked for them (the same files).

    Returns:
        ``{"files": [...], "plotted": {figure: {method: {"x": [...], "y": [...]}}},
        "labels": {figure: y label}}`` — the series as drawn (the mean over seeds; x where it
        belongs, before single points sharing an x are spread sideways, :func:`_dodge`), for
        tests and tables, and the ``clients`` figure's axis label (it names the data the first
        run evaluated on: validation, or test).
    """
    out.mkdir(parents=True, exist_ok=True)
    data = series(runs)
    methods = list(data)
    colour = colours(methods)
    start = starts(runs)
    since = " (incl. pre-training)" if start and max(v["round"] for v in start.values()) else ""
    label = f"final {runs[0].get('evaluated_on', 'validation')} accuracy per client"
    metrics = headline(runs[0]["columns"])
    args = (data, methods, colour, metrics, start, out, title)
    figures: list[Callable[[], Drawing]] = [
        lambda: _lines(*args, "curves", "round", "communication round" + since),
        lambda: _lines(*args, "communication", COMM, "floats communicated per client" + since),
    ]
    if any("acc" in key for key, _ in metrics):
        figures.append(lambda: _clients(runs, methods, colour, out, title, label))
    figures.append(lambda: _weights(data, methods, colour, out, title, start))
    files: list[Path] = []
    plotted: Plotted = {}
    for drawn_files, drawn in _in_processes(figures, processes):
        files += drawn_files
        plotted.update(drawn)
    return {"files": files, "plotted": plotted, "labels": {"clients": label}}


def _in_processes(figures: list[Callable[[], Drawing]], processes: int) -> list[Drawing]:
    """Each figure drawn, in order: here, or with ``processes`` > 1 (Linux) that many at a time —
    this process draws its share while forked children draw theirs (a child reports back through
    a pipe; a figure whose child failed is drawn here again, so that its error is this
    process's)."""
    import os
    import pickle

    from lit_fedco.process.forking import can_fork, fork

    groups = min(processes, len(figures))
    if groups <= 1 or not can_fork():
        return [draw_one() for draw_one in figures]
    children: dict[int, tuple[int, int]] = {}  # group -> (pid, read end)
    for g in range(1, groups):
        read, write = os.pipe()
        pid = fork()
        if pid == 0:  # draw this group's figures, hand them back, end (never return)
            os.close(read)
            code = 1
            try:
                done = {i: figures[i]() for i in range(g, len(figures), groups)}
                with os.fdopen(write, "wb") as pipe:
                    pickle.dump(done, pipe)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        children[g] = (pid, read)
    results: dict[int, Drawing] = {i: figures[i]() for i in range(0, len(figures), groups)}
    for pid, read in children.values():
        with os.fdopen(read, "rb") as pipe:
            blob = pipe.read()
        os.waitpid(pid, 0)
        if blob:
            results.update(pickle.loads(blob))
    for i, draw_one in enumerate(figures):  # a child that failed: drawn here
        if i not in results:
            results[i] = draw_one()
    return [results[i] for i in range(len(figures))]


def _lines(data, methods, colour, metrics, start, out, title, name, x, xlabel) -> Drawing:  # type: ignore[no-untyped-def]
    """``curves`` (``x``: rounds) or ``communication`` (``x``: floats per client): one panel per
    headline metric, the mean over seeds with a ±1 std band."""
    plotted: Plotted = {}
    fig, axes = _figure(len(metrics))
    for ax, (key, label) in zip(axes, metrics, strict=True):
        drawn = []
        for i, m in enumerate(methods):
            seeds = [s for s in data[m] if s and any(key in r for r in s)]
            if not seeds or (x != "round" and not all(x in r for s in seeds for r in s)):
                continue
            xs, mean, std = mean_std(seeds, x, key)
            xs = [v + start[m][x] for v in xs]
            drawn.append((i, m, xs, mean, std))
            plotted.setdefault(f"{name}:{key}", {})[m] = {"x": xs, "y": mean}
        shifts = _dodge([xs for _, _, xs, _, _ in drawn])
        for (i, m, xs, mean, std), dx in zip(drawn, shifts, strict=True):
            _series(ax, [v + dx for v in xs], mean, std, colour[m], display(m), i)
        for i, at in enumerate(sorted({v[x] for v in start.values()} - {0.0})):
            note = "methods start (pre-trained model)" if i == 0 else None
            ax.axvline(at, color="grey", ls=":", lw=1, label=note)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(LABELS.get(key, label))
        ax.grid(alpha=0.3)
        _from_zero(ax, integer=x == "round")
        if x == COMM:  # 20M, not 2 with "1e7" in a corner the axis label may cover
            from matplotlib.ticker import EngFormatter

            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    rows = _legend_below(fig, axes)
    if title:
        fig.suptitle(f"{title}  ({_seeds_note(data)})", fontsize=10)
    return _save(fig, out, name, legend_rows=rows), plotted


def _clients(runs, methods, colour, out, title, ylabel) -> Drawing:  # type: ignore[no-untyped-def]
    """``clients``: each method's final accuracy per client, one point per client and seed."""
    plotted: Plotted = {}
    per = {}
    for rec in runs:
        for method, seeds in rec["per_client"].items():
            label = method if len(runs) == 1 else f"{method} ({rec['name']})"
            per[label] = [a for s in seeds for a in (s or []) if not math.isnan(a)]
    per = {m: v for m, v in per.items() if v}
    if not per:
        return [], plotted
    fig, (ax,) = _figure(1, width=min(12.0, max(5.0, 1.1 * len(per))))
    for i, m in enumerate(methods):
        if m not in per:
            continue
        v = per[m]
        jitter = [i + 0.25 * ((j * 0.618) % 1 - 0.5) for j in range(len(v))]
        ax.scatter(jitter, v, s=12, color=colour[m], alpha=0.75)
        ax.hlines(statistics.fmean(v), i - 0.3, i + 0.3, color=colour[m], lw=2)
        plotted.setdefault("clients", {})[m] = {"x": [float(i)] * len(v), "y": v}
    tilt = 25 if len(methods) <= 8 else 45  # many methods in at most 12 inches: steeper labels
    ax.set_xticks(range(len(methods)), [display(m) for m in methods], rotation=tilt, ha="right")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    if title:
        ax.set_title(f"{title}: every client and seed (bar: mean)", fontsize=10)
    return _save(fig, out, "clients"), plotted


def _weights(data, methods, colour, out, title, start) -> Drawing:  # type: ignore[no-untyped-def]
    """``weights``: the DRO client weights over rounds (seed 0), for the methods with them."""
    plotted: Plotted = {}
    have = [m for m in methods if any("dro/weight_client0" in r for s in data[m] for r in s)]
    if not have:
        return [], plotted
    fig, axes = _figure(len(have))
    for ax, m in zip(axes, have, strict=True):
        rows = [r for r in data[m][0] if "dro/weight_client0" in r]
        k = sum(1 for key in rows[0] if key.startswith("dro/weight_client"))
        xs = [r["round"] + start[m]["round"] for r in rows]
        marker = "o" if len(rows) <= FEW_POINTS else None
        for c in range(k):
            ys = [r[f"dro/weight_client{c}"] for r in rows]
            ax.plot(xs, ys, lw=1.2, alpha=0.85, label=f"client {c}", marker=marker, ms=3)
            plotted.setdefault(f"weights:{m}", {})[f"client{c}"] = {"x": xs, "y": ys}
        ax.axhline(1 / k, color="grey", ls="--", lw=1, label="uniform 1/K")
        ax.set_title(f"{display(m)}: client weights (seed 0)", fontsize=10, color=colour[m])
        ax.set_xlabel("communication round")
        _from_zero(ax, integer=True)
        ax.set_ylabel("client weight λ_k")
        ax.grid(alpha=0.3)
        if k <= 12:
            ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, out, "weights"), plotted


# ---------------------------------------------------------------------- summary
def summary(runs: list[dict[str, Any]]) -> str:
    """A Markdown table: final metrics per method, mean ± std over seeds."""
    cols = [c for c in runs[0]["columns"] if c[0] != "time_s"]
    head = "| method | " + " | ".join(label for _, label in cols) + " | seeds |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for rec in runs:
        for method, finals in rec["results"].items():
            label = display(method) + ("" if len(runs) == 1 else f" ({rec['name']})")
            cells = []
            for key, _ in cols:
                v = [f[key] for f in finals if key in f]
                if not v:
                    cells.append("-")
                elif key.startswith("comm/"):
                    cells.append(f"{statistics.fmean(v):,.0f}")
                elif len(v) > 1:
                    cells.append(f"{statistics.fmean(v):.4f} ± {statistics.stdev(v):.4f}")
                else:
                    cells.append(f"{v[0]:.4f}")
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {len(finals)} |")
    return "\n".join(lines) + "\n"


def draw_run(run_dir: Path, title: str = "", processes: int = 1) -> dict[str, Any]:
    """The figures of one finished run, into ``<run_dir>/figures/`` (``processes``: see
    :func:`draw`), drawn in a child process: a failure there, an abort included, is one line
    (``figures not made: ...``) and no files (:func:`lit_fedco.report.guarded.guarded`)."""
    from lit_fedco.report.guarded import guarded

    def drawn() -> dict[str, Any]:
        rec = load_run(run_dir)
        return draw([rec], Path(run_dir) / "figures", title or rec.get("recipe", ""), processes)

    return guarded(drawn, Path(run_dir))


def main(argv: list[str] | None = None) -> None:
    """``python -m lit_fedco.report.plot RUN_DIR [RUN_DIR ...] [--out DIR]``."""
    ap = argparse.ArgumentParser(
        prog="python -m lit_fedco.report.plot", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (<out_dir>/<recipe>/<run>)")
    ap.add_argument("--out", type=Path, help="where to write (default: the run's figures/, or "
                    "./figures-overlay for several runs)")  # fmt: skip
    ap.add_argument("--title", default="", help="figure title (default: the recipe)")
    args = ap.parse_args(argv)
    runs = [load_run(r) for r in args.runs]
    out = args.out or (args.runs[0] / "figures" if len(runs) == 1 else Path("figures-overlay"))
    done = draw(runs, out, args.title or runs[0].get("recipe", ""))
    (out / "summary.md").write_text(summary(runs))
    print("\n".join(str(p) for p in [*done["files"], out / "summary.md"]))


if __name__ == "__main__":
    main(sys.argv[1:])
