"""Runs a recipe: config → Fabric → data → one FederatedLoop per (updater, seed) → table.

Recipes (``lit_fedco/recipes/<name>.py``) are thin: they pass their defaults to
:func:`main`. Everything a run needs is built here from the resolved config.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from lit_fedco.config import load_config, problem_name, problem_params, updater_hparams
from lit_fedco.data import FederatedData, format_partition_stats, make_federated
from lit_fedco.errors import ConfigError
from lit_fedco.executors import make_executor
from lit_fedco.failures import Failures
from lit_fedco.loop import FederatedLoop, LoopConfig
from lit_fedco.models import build_model
from lit_fedco.problems import Classification, Problem, ProblemParams, get_problem
from lit_fedco.tracking import check_tracking, finalize_loggers, make_loggers
from lit_fedco.updaters.base import CompositionalUpdater, get_updater

DTYPES = {"float32": torch.float32, "float64": torch.float64}

TABLE_COLUMNS = [
    ("val/acc_avg", "val avg acc"),
    ("val/acc_worst", "val worst acc"),
    ("train/acc_avg", "train avg acc"),
    ("train/acc_worst", "train worst acc"),
    ("comm/total_floats_per_client", "floats/client"),
]


class Diverged(FloatingPointError):
    """The training loss became NaN or infinite (the same round on every process)."""

    def __init__(self, round_idx: int, message: str) -> None:
        super().__init__(message)
        self.round = round_idx


def make_fabric(cfg: DictConfig, callbacks: list[Any] | None = None) -> Fabric:
    """A launched Fabric for the config's accelerator, devices, nodes and strategy.

    ``callbacks`` are objects with any of the loop's hooks (``on_round_start(loop, cohort)``,
    ``on_round_end(loop, logs)``, ``on_eval_end(loop, metrics)``), called through
    ``fabric.call`` on every process."""
    strategy = cfg.strategy
    if strategy == "auto" and cfg.devices * cfg.num_nodes > 1:
        strategy = "ddp"  # processes started by Fabric; gloo on CPU, NCCL on GPUs
    fabric = Fabric(
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        strategy=strategy,
        callbacks=callbacks,
    )
    fabric.launch()
    return fabric


def build_data(cfg: DictConfig, seed: int) -> FederatedData:
    """The federated data set of the config (partition seeded by ``seed``)."""
    d = cfg.data
    return make_federated(SimpleNamespace(**OmegaConf.to_container(d), seed=seed))  # type: ignore[arg-type]


def loop_config(cfg: DictConfig, seed: int) -> LoopConfig:
    """The loop's schedule from the run config."""
    return LoopConfig(
        rounds=cfg.rounds,
        local_steps=cfg.local_steps,
        cohort=cfg.cohort,
        batch_size=cfg.batch_size,
        eval_every=cfg.eval_every,
        seed=seed,
        progress=cfg.progress,
        failures=Failures(drop=cfg.failures.drop, partial=cfg.failures.partial),
    )


def check_run(cfg: DictConfig) -> None:
    """Every check that can fail on user input, before any process starts or file is written."""
    for name in cfg.updaters:
        updater_hparams(cfg, name)
    if cfg.dtype not in DTYPES:
        raise ConfigError.bad_value("dtype", cfg.dtype, f"one of {sorted(DTYPES)}", "float32")
    make_executor(cfg.executor, cfg.chunk_size)
    check_tracking(list(cfg.tracking))
    if cfg.resume and (len(cfg.updaters) != 1 or len(cfg.seeds) > 1):
        raise ConfigError.bad_value(
            "resume", cfg.resume, "a single updater and seed with it", "... updater=comfedl"
        )
    if cfg.threads < 0:
        raise ConfigError.bad_value("threads", cfg.threads, "an int >= 0 (0: torch's default)", "1")
    if cfg.devices < 1 or cfg.num_nodes < 1:
        raise ConfigError.bad_value("devices", cfg.devices, "an int >= 1", "2")
    data = build_data(cfg, cfg.seed)  # missing files, impossible splits
    loop_config(cfg, cfg.seed).validate(data.num_clients, cfg.devices * cfg.num_nodes)
    for name in cfg.updaters:  # model sizes, and an objective of the problem for each updater
        build_updater(cfg, name, data, 0)


def build_updater(
    cfg: DictConfig, name: str, data: FederatedData, seed: int
) -> tuple[CompositionalUpdater, Problem]:
    """Updater ``name`` with a model seeded by ``seed``, and the problem it runs on.

    The run's problem (``cfg.objective``, or the updater's default problem; plain
    :class:`~lit_fedco.problems.Classification` when neither names one) decides the model's
    output size and gives the updater the objective of the first of its compositions the
    problem offers (FCSG the conditional objective, FedAvg the problem's empirical risk).
    """
    cls = get_updater(name)
    pname = problem_name(cfg, name)
    problem = (
        get_problem(pname)(problem_params(cfg, pname), data)
        if pname
        else Classification(ProblemParams(), data)
    )
    model = build_model(
        cfg.model.name, tuple(data.x_train.shape[1:]), problem.num_outputs(), seed,
        cfg.model.hidden,
    )  # fmt: skip
    objective = problem.objective_for(cls.compositions, model)
    return cls(updater_hparams(cfg, name), model, objective), problem


def partition_summary(stats: dict[str, Any]) -> dict[str, Any]:
    """What the run logs of its partition (:meth:`FederatedData.partition_stats`): K, C, the
    totals and min / median / max of the per-client sizes and numbers of classes — a few
    numbers whatever K, where the per-client lists would be K × C."""

    def spread(values: list[int]) -> dict[str, float]:
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    held = [sum(1 for n in row if n) for row in stats["train_class_counts"]]
    return {
        "name": stats["name"],
        "num_clients": stats["num_clients"],
        "num_classes": stats["num_classes"],
        "train_total": sum(stats["train_sizes"]),
        "val_total": sum(stats["val_sizes"]),
        "train_per_client": spread(stats["train_sizes"]),
        "val_per_client": spread(stats["val_sizes"]),
        "classes_per_client": spread(held),
    }


def run_one(
    fabric: Fabric, cfg: DictConfig, name: str, seed: int, recipe: str, announce: bool = False
) -> tuple[dict[str, float], FederatedLoop]:
    """Run updater ``name`` with ``seed``; returns its final metrics and the loop.

    ``announce``: print the partition's statistics first (once per data set of a recipe)."""
    dtype = DTYPES[cfg.dtype]
    data = build_data(cfg, seed)
    stats = data.partition_stats()
    if announce and fabric.global_rank == 0:
        print(format_partition_stats(stats), flush=True)
    updater, problem = build_updater(cfg, name, data, seed)
    loop_cfg = loop_config(cfg, seed)
    run_name = f"{recipe}-{name}-seed{seed}"
    out_dir = Path(cfg.out_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    # the resolved config as it ran, and what the updater says of itself under its own key
    logged = {
        **resolved,
        "seed": seed,
        "describe": updater.describe(),
        "partition": partition_summary(stats),
    }
    loggers = (
        make_loggers(list(cfg.tracking), out_dir, run_name, cfg.project, logged)
        if fabric.global_rank == 0
        else []
    )
    executor = make_executor(cfg.executor, cfg.chunk_size)
    loop = FederatedLoop(fabric, updater, data, loop_cfg, executor, dtype, problem)
    if cfg.resume:
        loop.load(cfg.resume)
    bar = tqdm(
        total=loop_cfg.rounds,
        initial=loop.round,
        desc=name,
        disable=not loop_cfg.progress or fabric.global_rank != 0,
        dynamic_ncols=True,
    )

    def on_round(logs: dict[str, float]) -> None:
        """Progress, logging and the divergence check after every round."""
        if "val/acc_avg" in logs:
            bar.set_postfix(avg=f"{logs['val/acc_avg']:.3f}", worst=f"{logs['val/acc_worst']:.3f}")
        if not math.isfinite(logs.get("train/loss", 0.0)):
            raise Diverged(
                loop.round,
                f"{name}: training loss became {logs['train/loss']} in round {loop.round}; "
                f"lower the step size ({name}.lr)",
            )
        for logger in loggers:
            logger.log_metrics(logs, step=loop.round)
        bar.update(1)

    start = time.perf_counter()
    try:
        final = loop.run(on_round)
    except Diverged as err:  # a result, not a crash: reported in the table, the rest go on
        if fabric.global_rank == 0:
            print(f"lit_fedco: {err}", file=sys.stderr)
        final = {"diverged_round": float(err.round)}
    finally:
        bar.close()
        finalize_loggers(loggers)
    final = {**final, "time_s": time.perf_counter() - start}
    if cfg.save_checkpoint:
        loop.save(out_dir / f"{run_name}.ckpt")
    return final, loop


def format_table(
    rows: list[tuple[str, list[dict[str, float]]]],
    columns: list[tuple[str, str]] | None = None,
) -> str:
    """A plain-text table: one row per updater, mean ± std over seeds.

    ``columns`` are (metric key, label) pairs; :data:`TABLE_COLUMNS` by default.
    """
    columns = TABLE_COLUMNS if columns is None else columns
    head = ["updater", *[label for _, label in columns], "seeds"]
    lines = []
    for name, results in rows:
        cells = [name]
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


def main(
    recipe: str,
    defaults: dict[str, Any],
    argv: list[str] | None = None,
    columns: list[tuple[str, str]] | None = None,
    callbacks: list[Any] | None = None,
) -> list[Any]:
    """Entry point of every recipe: parse, run each (updater, seed), print and save a table.

    Bad input ends the process with exit code 2 and a one-line message, before anything is
    written. ``columns`` are the table's (metric key, label) pairs (:data:`TABLE_COLUMNS` by
    default). ``callbacks`` receive the loop's hooks (see :func:`make_fabric`).
    """
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "help") for a in argv):
        print(f"usage: python -m lit_fedco.recipes.{recipe} [preset=NAME] [key=value ...]\n")
        print(OmegaConf.to_yaml(load_config([], defaults)))
        return []
    try:
        cfg = load_config(argv, defaults)
        # One config per entry of ``variants`` (its overrides applied last), or just cfg.
        configs = [(v, load_config([*argv, *shlex.split(v)], defaults)) for v in cfg.variants] or [
            ("", cfg)
        ]
        for _, c in configs:
            check_run(c)
    except ConfigError as err:
        print(f"lit_fedco: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    os.environ.setdefault("WANDB_SILENT", "true")
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    fabric = make_fabric(cfg, callbacks)
    seeds = list(cfg.seeds) or [cfg.seed]
    rows = []
    for i, (variant, vcfg) in enumerate(configs):
        tag = f"{recipe}-v{i}" if variant else recipe  # distinct run names per variant
        for j, name in enumerate(vcfg.updaters):
            results = []
            for seed in seeds:
                # the partition is printed once per data set: first updater, every seed
                final, _ = run_one(fabric, vcfg, name, seed, tag, announce=j == 0)
                results.append(final)
            rows.append((f"{name} [{variant}]" if variant else name, results))
    if fabric.global_rank == 0:
        table = format_table(rows, columns)
        print(f"\n{recipe}: final validation accuracy per client (avg = mean over clients)")
        print(table)
        out = Path(cfg.out_dir) / f"{recipe}-results.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "config": OmegaConf.to_container(cfg, resolve=True),
                    "results": {name: res for name, res in rows},
                },
                indent=1,
            )
        )
        print(f"results: {out}")
    return rows
