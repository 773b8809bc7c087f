"""Tuning each method before the comparison (``tune.grid``), as the papers did: a grid of
values per updater, run on tuning seeds with validation rows held out of the training split,
the best value per updater by a named metric, then the comparison on the run's ``seeds``.

The tuning phase is an ordinary run of its own, ``<run_name>-tune`` beside the comparison's
folder, with one variant per (updater, grid point) (``updaters=[fedavg] fedavg.lr=0.01``), so
that it runs, checkpoints and resumes like any run: ``jobs=N`` runs its sub-runs side by side,
``resume=auto`` continues a killed tuning phase, and ``sub_run=INDEX`` counts the tuning's
sub-runs first, then the comparison's (``--list-sub-runs`` lists both). The choice is a pure
function of the tuning run's ``status.json`` files, so every process that reads them comes to
the same one; it is written to ``tune.json`` in the tuning folder, passed to the comparison
as overrides (its ``config.yaml`` records them under ``tune.chosen`` too) and shown in its
table's labels and ``results.json``.

A hand-written grid rather than Optuna's ``GridSampler``: the run folders already store every
trial, resume and run trials in parallel; a sampler would only enumerate the same product
(and ``import optuna`` 4.x adds 0.44 s before a run starts, measured with
``python -X importtime``).

Torch-free.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from lit_fedco.config import catalog
from lit_fedco.core.errors import ConfigError, refuse
from lit_fedco.experiment.rundir import RUN_DIR_ENV

TUNE_SUFFIX = "-tune"
"""The tuning run's folder is the comparison's name with this suffix."""
TUNE_FILE = "tune.json"
"""The choice, written in the tuning run's folder."""
MODES = ("max", "min")


@dataclass(frozen=True)
class Point:
    """One (updater, grid point) of the tuning: a variant of the tuning run."""

    updater: str
    values: tuple[tuple[str, Any], ...]

    @property
    def variant(self) -> str:
        """The variant's overrides: the updater alone, with this point's values."""
        items = " ".join(f"{k}={_text(v)}" for k, v in self.values)
        return f"updaters=[{self.updater}] {items}"


def _text(value: Any) -> str:
    """A value as the command line reads it back (YAML)."""
    if isinstance(value, float):
        return repr(value)
    return str(value) if isinstance(value, int | str) else yaml.safe_dump(value).strip()


def parse_grid(cfg: DictConfig) -> dict[str, list[tuple[str, list[Any]]]]:
    """``tune.grid`` as ``{updater: [(key, values), ...]}``, in the run's updater order.

    Raises:
        ConfigError: an entry that is not ``KEY=V1,V2,...``, a key not under one of the run's
            updaters, a key given twice, an empty value list, a bad ``tune.mode`` or empty
            ``tune.seeds``.
    """
    tune = cfg.tune
    if tune.mode not in MODES:
        raise ConfigError.bad_value("tune.mode", tune.mode, "'max' or 'min'", "min")
    if not list(tune.seeds):
        raise ConfigError.bad_value("tune.seeds", [], "one seed or more", "[100,101]")
    if int(tune.rounds) < 0:
        raise ConfigError.bad_value("tune.rounds", tune.rounds, "an int >= 0", "50")
    if overlap := sorted(set(tune.seeds) & set(cfg.seeds or [cfg.seed])):
        raise ConfigError(
            f"tune.seeds: {overlap} are also the comparison's seeds; tune on other seeds "
            "(e.g. tune.seeds=[100]), so that the comparison runs on fresh ones",
            key="tune.seeds",
        )
    if list(cfg.variants):
        raise ConfigError(
            "tune.grid: the tuning runs its grid as the variants of a run of its own, and this "
            "run has variants too; run each variant as a run of its own (variants=[] KEY=VALUE)",
            key="tune.grid",
        )
    updaters = [str(u) for u in cfg.updaters]
    known = catalog.names("updater")
    grid: dict[str, list[tuple[str, list[Any]]]] = {}
    seen: set[str] = set()
    for entry in tune.grid:
        key, eq, raw = str(entry).partition("=")
        key = key.strip()
        name = key.split(".", 1)[0]
        if not eq or "." not in key or not raw.strip():
            raise ConfigError.bad_value(
                "tune.grid",
                str(entry),
                "KEY=V1,V2,... with KEY under an updater",
                "fedavg.lr=0.01,0.1",
            )
        if name in known and name not in updaters:
            continue  # a preset's grid for an updater this run leaves out (updater=NAME)
        if name not in updaters:
            raise ConfigError(
                f"tune.grid: {key} is not under one of the run's updaters {updaters}; name a key "
                f"of an updater it runs, e.g. {updaters[0]}.lr=0.01,0.1",
                key="tune.grid",
            )
        if key in seen:
            raise ConfigError(f"tune.grid: {key} is given twice; give it once", key="tune.grid")
        seen.add(key)
        values = [yaml.safe_load(v) for v in raw.split(",")]
        grid.setdefault(name, []).append((key, values))
    return {u: grid[u] for u in updaters if u in grid}


def points(cfg: DictConfig) -> list[Point]:
    """Every (updater, grid point), updater by updater, in the grid's order."""
    out = []
    for updater, keys in parse_grid(cfg).items():
        for combo in itertools.product(*(values for _, values in keys)):
            out.append(Point(updater, tuple(zip([k for k, _ in keys], combo, strict=True))))
    return out


def _quote(text: str) -> str:
    return "'" + text.replace("'", "") + "'"


def select(cfg: DictConfig, tune_dir: Path, grid: list[Point]) -> dict[str, Any]:
    """The choice per updater among ``grid`` (the run's :func:`points`), from the tuning run's
    ``status.json`` files (a pure function of them), with every grid point's score; also
    written to ``tune.json``.

    Raises:
        ConfigError: a tuning sub-run that is not complete, or a metric no sub-run recorded.
    """
    from lit_fedco.store.files import read_json, write_json

    metric, sign = str(cfg.tune.metric), 1.0 if cfg.tune.mode == "max" else -1.0
    chosen: dict[str, Any] = {}
    for i, point in enumerate(grid):
        scores: list[float] = []
        for seed in cfg.tune.seeds:
            folder = tune_dir / f"v{i}-{point.updater}-seed{seed}"
            status = read_json(folder / "status.json") or {}
            final = status.get("final")
            if status.get("state") not in ("complete", "diverged") or not final:
                raise ConfigError(
                    f"tune: {folder} is not complete; continue the tuning with resume=auto "
                    f"run_name={tune_dir.name.removesuffix(TUNE_SUFFIX)}",
                    key="tune",
                )
            if "diverged_round" in final:
                scores.append(math.nan)
                continue
            if metric not in final:
                have = sorted(k for k in final if "/" in k)
                raise ConfigError.bad_value("tune.metric", metric, f"one of {have}", have[0])
            scores.append(float(final[metric]))
        mean = math.nan if any(math.isnan(s) for s in scores) else sum(scores) / len(scores)
        entry = chosen.setdefault(point.updater, {"grid": [], "best": None})
        entry["grid"].append({"values": dict(point.values), "scores": scores, "mean": mean})
        best = entry["best"]
        if not math.isnan(mean) and (best is None or sign * mean > sign * best["mean"]):
            entry["best"] = {"values": dict(point.values), "mean": mean}
    record = {
        "metric": metric,
        "mode": str(cfg.tune.mode),
        "seeds": [int(s) for s in cfg.tune.seeds],
        "heldout": str(cfg.tune.heldout),
        "run": str(tune_dir),
        "updaters": chosen,
    }
    write_json(tune_dir / TUNE_FILE, record)
    return record


def summary(record: dict[str, Any]) -> str:
    """The lines printed after the tuning: per updater the chosen values and every score."""
    where = "a slice of the training split" if record["heldout"] == "train" else "the test split"
    lines = [f"tuned by {record['metric']} ({record['mode']}, mean over tuning seeds "
             f"{record['seeds']}, on {where}):"]  # fmt: skip
    for name, entry in record["updaters"].items():
        grid = ", ".join(
            f"{'/'.join(_text(v) for v in g['values'].values())}: "
            + ("diverged" if math.isnan(g["mean"]) else f"{g['mean']:.4f}")
            for g in entry["grid"]
        )
        best = entry["best"]
        pick = (", ".join(f"{k}={_text(v)}" for k, v in best["values"].items())
                if best else "none (every value diverged; its own value kept)")  # fmt: skip
        lines.append(f"  {name}: {pick}  [{grid}]")
    return "\n".join(lines)


def label_suffix(cfg: DictConfig, updater: str) -> str:
    """`` (lr=0.01)``: the chosen values of ``updater`` for its table label; empty if none."""
    mine = [c.split(".", 1)[1] for c in cfg.tune.chosen if str(c).split(".", 1)[0] == updater]
    return f" ({', '.join(mine)})" if mine else ""


def run_tuned(
    recipe: str,
    defaults: dict[str, Any],
    argv: list[str],
    cmd: Any,
    cfg: DictConfig,
    launch: Callable[..., list[Any]],
    list_sub_runs: Callable[..., list[Any]],
    *,
    columns: list[tuple[str, str]] | None,
    callbacks: list[Any] | None,
    evaluated_on: str,
) -> list[Any]:
    """A tuned run (:func:`lit_fedco.cli.run` with ``tune.grid``): the tuning run, the choice,
    then the comparison with it; ``--list-sub-runs`` lists both phases' sub-runs, numbered
    through. ``launch`` runs a loaded config, ``list_sub_runs`` prints a listing.

    Returns:
        The comparison's table rows (the tuning's, for a tuning sub-run).
    """
    try:
        grid = points(cfg)
    except ConfigError as err:
        refuse(err)
    if not grid:  # every grid key is of an updater this run leaves out
        return launch(recipe, cmd, cfg, columns, callbacks, evaluated_on)
    phases = _Phases(recipe, defaults, argv, cfg, grid)
    tcmd, tcfg = phases.tuning()
    if cmd.help == "sub-runs":
        print(f"tuning run {phases.tune_name} (sub_run=0..{phases.n_tune - 1}):", flush=True)
        list_sub_runs(tcmd, tcfg)
        print(f"comparison run {phases.name}, with the values chosen (sub_run={phases.n_tune} "
              "on):", flush=True)  # fmt: skip
        return list_sub_runs(cmd, cfg, phases.n_tune)
    sub = int(cfg.sub_run)
    held = "validation held out of the training split"
    t_on = held if cfg.tune.heldout == "train" else f"{evaluated_on} (tuning)"
    if sub < phases.n_tune:  # the whole run, or one of the tuning's sub-runs
        rows = launch(recipe, tcmd, tcfg, columns, callbacks, t_on)
        os.environ.pop(RUN_DIR_ENV, None)  # the comparison gets a folder of its own
        if sub >= 0:
            return rows
    record, ccmd, ccfg = phases.comparison()
    if ccfg.sub_run < 0:
        print(f"\nlit_fedco: {summary(record)}\nlit_fedco: the comparison {phases.name} on seeds "
              f"{list(ccfg.seeds) or [ccfg.seed]} with these values\n", flush=True)  # fmt: skip
    return launch(recipe, ccmd, ccfg, columns, callbacks, evaluated_on, may_fork=False)


class _Phases:
    """The two phases of a tuned run: their run names (a new run without ``run_name`` gets the
    start time) and folders, and each one's command line loaded (the run's own, with the phase's
    items winning). A problem is refused in one line (exit code 2)."""

    def __init__(
        self,
        recipe: str,
        defaults: dict[str, Any],
        argv: list[str],
        cfg: DictConfig,
        grid: list[Point],
    ):
        self.defaults, self.argv, self.cfg, self.grid = defaults, argv, cfg, grid
        self.n_tune = len(grid) * len(cfg.tune.seeds)  # the tuning run's sub-runs
        if not cfg.run_name and (cfg.resume or cfg.sub_run >= 0):  # which run to continue?
            what = "the run's name (a tuned run continues by name)"
            refuse(ConfigError.bad_value("run_name", "", what, "mnist-tuned"))
        self.name = str(cfg.run_name) or time.strftime("%Y%m%d-%H%M%S")
        self.tune_name = self.name + TUNE_SUFFIX
        self.tune_dir = Path(cfg.out_dir) / recipe / self.tune_name
        self.run_dir = self.tune_dir.with_name(self.name)

    def loaded(self, items: list[str]) -> tuple[Any, DictConfig]:
        """The run's command line with ``items`` appended, parsed and loaded: the run's own
        items for the keys they set are left out (a phase's own values win)."""
        from lit_fedco.config.load import load
        from lit_fedco.config.parser import parse
        from lit_fedco.config.plugins import import_plugins

        keys = {i.partition("=")[0] for i in items}
        if "updaters" in keys:
            keys.add("updater")
        argv = [a for a in self.argv if a.partition("=")[0].lstrip("-") not in keys]
        try:
            more = import_plugins(parse([*argv, *items], self.defaults))
            return more, load(more)
        except ConfigError as err:
            refuse(err)

    def tuning(self) -> tuple[Any, DictConfig]:
        """The tuning run's command line and config: a variant per grid point, on the tuning
        seeds, continued where it has started (one sub-run of it where ``sub_run`` is)."""
        cfg, sub = self.cfg, int(self.cfg.sub_run)
        resume = (bool(cfg.resume) or sub >= 0) and (self.tune_dir / "config.yaml").is_file()
        items = [
            "tune.grid=[]",
            "variants=[" + ",".join(_quote(p.variant) for p in self.grid) + "]",
            "seeds=[" + ",".join(str(s) for s in cfg.tune.seeds) + "]",
            f"run_name={self.tune_dir.name}",
            f"data.heldout={cfg.tune.heldout}",
            f"resume={'auto' if resume else ''}",
        ]
        if int(cfg.tune.rounds):
            items.append(f"rounds={int(cfg.tune.rounds)}")
        if 0 <= sub < self.n_tune:
            items.append(f"sub_run={sub}")
        return self.loaded(items)

    def comparison(self) -> tuple[dict[str, Any], Any, DictConfig]:
        """The tuning's choice, and the comparison run's command line and config with it:
        ``KEY=VALUE`` per chosen value (an updater whose every point diverged keeps its own)."""
        cfg, sub = self.cfg, int(self.cfg.sub_run)
        try:
            record = select(cfg, self.tune_dir, self.grid)
        except ConfigError as err:
            refuse(err)
        best = [e["best"] for e in record["updaters"].values() if e["best"] is not None]
        chosen = [f"{k}={_text(v)}" for b in best for k, v in b["values"].items()]
        items = [*chosen, "tune.chosen=[" + ",".join(_quote(c) for c in chosen) + "]",
                 f"run_name={self.name}"]  # fmt: skip
        if sub >= 0:
            items.append(f"sub_run={sub - self.n_tune}")
        else:
            resume = cfg.resume and (self.run_dir / "config.yaml").is_file()  # holds a run
            items.append(f"resume={'auto' if resume else ''}")
        return (record, *self.loaded(items))
