"""Assembling a run from its resolved config: Fabric, data, updater and problem, schedule, and
every check that can fail on user input (:func:`check_run`, before any process starts or file
is written)."""

from __future__ import annotations

import statistics
from types import SimpleNamespace
from typing import Any

import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf

from lit_fedco.config import problem_name, problem_params, updater_hparams
from lit_fedco.data import FederatedData, make_federated
from lit_fedco.errors import ConfigError
from lit_fedco.executors import make_executor
from lit_fedco.failures import Failures
from lit_fedco.loop import LoopConfig
from lit_fedco.models import build_model
from lit_fedco.problems import Classification, Problem, ProblemParams, get_problem
from lit_fedco.tracking import check_tracking
from lit_fedco.updaters.base import CompositionalUpdater, get_updater

DTYPES = {"float32": torch.float32, "float64": torch.float64}


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
    seeds = list(cfg.seeds)
    if len(set(seeds)) != len(seeds):
        raise ConfigError.bad_value(
            "seeds", seeds, "distinct seeds (a repeated seed repeats the same run)", "[0,1,2]"
        )
    if cfg.resume not in ("", "auto") and (len(cfg.updaters) != 1 or len(seeds) > 1):
        raise ConfigError.bad_value(
            "resume", cfg.resume, "a single updater and seed with a checkpoint file (or "
            "resume=auto for a whole run)", "auto run_name=NAME",
        )  # fmt: skip
    if "/" in cfg.run_name or cfg.run_name in (".", ".."):
        raise ConfigError.bad_value("run_name", cfg.run_name, "a folder name, no '/'", "lr01")
    if cfg.checkpoint_every < 0:
        raise ConfigError.bad_value(
            "checkpoint_every", cfg.checkpoint_every, "an int >= 0 (0: only at the end)", "10"
        )
    if cfg.checkpoint_keep < 1:
        raise ConfigError.bad_value("checkpoint_keep", cfg.checkpoint_keep, "an int >= 1", "3")
    if cfg.threads < 0:
        raise ConfigError.bad_value("threads", cfg.threads, "an int >= 0 (0: torch's default)", "1")
    if cfg.devices < 1 or cfg.num_nodes < 1:
        raise ConfigError.bad_value("devices", cfg.devices, "an int >= 1", "2")
    data = build_data(cfg, cfg.seed)  # missing files, impossible splits
    loop_config(cfg, cfg.seed).validate(data.num_clients, cfg.devices * cfg.num_nodes)
    for name in cfg.updaters:  # model sizes, and an objective of the problem for each updater
        build_updater(cfg, name, data, 0)


RESUMABLE_CHANGES = (
    "rounds", "eval_every", "checkpoint_every", "checkpoint_keep", "progress", "tracking",
    "threads", "executor", "chunk_size", "devices", "num_nodes", "accelerator", "strategy",
)  # fmt: skip
"""Keys a resumed run may change: the schedule's length and how the run executes."""


def relevant_config(cfg: DictConfig, name: str, seed: int) -> dict[str, Any]:
    """What decides the numbers of updater ``name`` with ``seed`` (the rest of the config only
    says what else runs beside it): a checkpoint must match it to be resumed."""
    pname = problem_name(cfg, name)
    keep = (
        "local_steps",
        "cohort",
        "batch_size",
        "dtype",
        "data",
        "model",
        "objective",
        "failures",
    )
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    out: dict[str, Any] = {k: resolved[k] for k in keep}
    out.update(updater=name, seed=seed, hparams=OmegaConf.to_container(cfg[name], resolve=True))
    if pname:
        out["problem"] = {"name": pname, **OmegaConf.to_container(cfg[pname], resolve=True)}  # type: ignore[dict-item]
    return out


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
