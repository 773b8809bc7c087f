"""Assembling a run from its resolved config: the data, each updater with its problem and
starting point, the loop's schedule, the executor, and what each method trains (the checks of
user input are in :mod:`lit_fedco.experiment.checks`; the processes in
:mod:`lit_fedco.experiment.fabric`)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import Container, DictConfig, OmegaConf

from lit_fedco.config.load import node_params, problem_name
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.models import (
    BATCH_STATISTICS_MODELS,
    MODEL_KEYS,
    build_model,
    call,
    is_model_ref,
    model_state,
    running_stats,
    set_model_state,
)
from lit_fedco.core.server_opt import ServerOptConfig
from lit_fedco.data import FederatedData, make_federated
from lit_fedco.engine.executors import choose_executor
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.loop import LoopConfig
from lit_fedco.engine.store import owned_by
from lit_fedco.experiment.subruns import pretrains
from lit_fedco.problems import Classification, Problem, ProblemParams, get_problem
from lit_fedco.store import checkpoint as ckpt
from lit_fedco.updaters.base import (
    CompositionalUpdater,
    available_updaters,
    declares_compositions,
    get_updater,
    trained_composition,
)


def build_data(cfg: DictConfig, seed: int) -> FederatedData:
    """The federated data set of the config (partition seeded by ``seed``)."""
    return make_federated(SimpleNamespace(**OmegaConf.to_container(cfg.data), seed=seed))  # type: ignore[arg-type]


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
        server_opt=ServerOptConfig(**OmegaConf.to_container(cfg.server_opt, resolve=True)),  # type: ignore[arg-type]
    )


def run_executor(cfg: DictConfig) -> str:
    """The executor the run uses: ``executor=auto`` resolved for its model and device
    (:func:`~lit_fedco.engine.executors.choose_executor`; a researcher's model by
    :func:`auto_for_model`), the reason written to ``cfg.executor_reason`` (recorded in
    ``config.yaml``)."""
    names = [*cfg.updaters, *([cfg.pretrain.updater] if pretrains(cfg) else [])]
    updaters = [get_updater(n) for n in names if n in available_updaters()]
    if cfg.executor == "auto" and is_model_ref(cfg.model.name):
        choice, reason = auto_for_model(cfg, updaters)
        cfg.executor_reason = reason
        return choice
    choice = choose_executor(cfg.executor, cfg.model.name, cfg.accelerator, updaters)
    if cfg.executor == "auto":
        cfg.executor_reason = f"{choice} as measured for model.name={cfg.model.name} on its device"
    return choice


def run_model(cfg: DictConfig, data: FederatedData, outputs: int, seed: int) -> torch.nn.Module:
    """The config's model for ``data``'s rows with ``outputs`` outputs, seeded by ``seed``; a
    researcher's model gets the ``model.*`` keys its ``Params`` declares (every key but the
    built-in ``name``, ``hidden`` and ``buffers``)."""
    values = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(values, dict)
    own = {str(k): v for k, v in values.items() if k not in MODEL_KEYS}
    shape = tuple(data.x_train.shape[1:])
    return build_model(cfg.model.name, shape, outputs, seed, cfg.model.hidden, own)


@dataclass(frozen=True)
class ModelProbe:
    """What :func:`probe_model` found of a researcher's model.

    Attributes:
        error: why a vmapped gradient of it raised; empty: it runs under ``vmap``.
        conv: it holds a convolution.
        norms: it holds a batch norm (with or without running statistics).
    """

    error: str
    conv: bool
    norms: bool


_PROBED: dict[str, ModelProbe] = {}


def probe_model(cfg: DictConfig) -> ModelProbe:
    """A vmapped gradient of the model's summed outputs for two clients of two rows each, in
    train mode (an LSTM or a dropout raise), once per (model, data) config. The model's own
    errors (its build, its output shape) are raised as they are."""
    key = json.dumps(
        [OmegaConf.to_container(cfg.model, resolve=True),
         OmegaConf.to_container(cfg.data, resolve=True), cfg.seed],
        sort_keys=True, default=str,
    )  # fmt: skip
    if key in _PROBED:
        return _PROBED[key]
    data = build_data(cfg, cfg.seed)
    model = run_model(cfg, data, data.num_classes, cfg.seed)
    two = {k: torch.stack([v, v]) for k, v in model_state(model).items()}
    x = torch.stack([data.x_train[:2], data.x_train[:2]])

    def total(p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        return call(model, p, v).float().sum()

    error = ""
    try:
        torch.func.vmap(torch.func.grad(total))(two, x)
    except Exception as err:
        error = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]}"
    modules = list(model.modules())
    found = ModelProbe(
        error,
        any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in modules),
        any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in modules),
    )
    _PROBED[key] = found
    return found


def auto_for_model(cfg: DictConfig, updaters: list[type[CompositionalUpdater]]) -> tuple[str, str]:
    """The executor ``auto`` takes for a researcher's model, and why (:func:`probe_model`):

    - ``sequential`` where it does not run under ``vmap`` (an LSTM, a dropout);
    - ``sequential`` for a model with batch norms under an updater that differentiates a
      step (ComFedL-MAML, Per-FedAvg: their ``unvmappable_models`` name lit_fedco's ``conv4``
      for the same reason): batch norm's double backward does not run under ``vmap``;
    - ``sequential`` on the CPU for a convolutional model (throughput benchmark, one thread: a
      BatchNorm CNN on MNIST 0.96× the plain loop client by client against 0.59× vectorized;
      lit_fedco's ``cnn`` 0.97× against 0.86×);
    - ``vectorized`` otherwise (fully connected models gain most from stacking clients:
      logistic regression 8× the plain loop at 100 clients).
    """
    probe = probe_model(cfg)
    on_cpu = cfg.accelerator == "cpu" or (
        cfg.accelerator == "auto" and not torch.cuda.is_available()
    )
    second = [u.name for u in updaters if u.unvmappable_models & BATCH_STATISTICS_MODELS]
    if probe.error:
        return "sequential", f"it does not run under vmap: {probe.error}"
    if probe.norms and second:
        return "sequential", f"{second[0]} differentiates through batch norms, not under vmap"
    if on_cpu and probe.conv:
        return "sequential", "a convolutional model runs faster client by client on the CPU"
    return "vectorized", "it runs under vmap"


class Assembly:
    """What a run builds from its configs, built once and shared by the checks, the plan and
    the sub-runs: the data of a (data config, seed) — the last one only, since sub-runs run
    seed by seed — and the updater and problem of each (config, updater, seed, start)."""

    def __init__(self) -> None:
        self._data: tuple[str, FederatedData] | None = None
        self._updaters: dict[str, tuple[CompositionalUpdater, Problem]] = {}
        self._shard: tuple[int, int] | None = None
        self.built = {"data": 0, "updaters": 0}
        """How many data sets and updaters were built (the tests read it)."""

    def shard(self, rank: int, world: int) -> None:
        """From now on keep only the rows of the clients process ``rank`` of ``world`` owns
        (``shard_data``: client k on process k mod ``world``): the data set in hand is cut
        down now, and the updaters and problems built on the whole are let go (rebuilt on the
        held rows when asked for: the same, since they read only what the held copy keeps of
        the whole)."""
        if world <= 1 or self._shard == (rank, world):
            return
        self._shard = (rank, world)
        self._updaters.clear()
        if self._data is not None:
            self._data = (self._data[0], self._held(self._data[1]))

    def _held(self, data: FederatedData) -> FederatedData:
        if self._shard is None:
            return data
        rank, world = self._shard
        return data.held_by(owned_by(rank, world, data.num_clients), ckpt.data_fingerprint(data))

    def data(self, cfg: DictConfig, seed: int) -> FederatedData:
        """:func:`build_data` of ``cfg`` and ``seed``, built once (of this process's clients
        only, after :meth:`shard`)."""
        key = json.dumps([OmegaConf.to_container(cfg.data, resolve=True), seed], sort_keys=True)
        if self._data is None or self._data[0] != key:
            self._data = None  # the previous data set can go before the next is built
            self._data = (key, self._held(build_data(cfg, seed)))
            self.built["data"] += 1
        return self._data[1]

    def updater(
        self, cfg: DictConfig, name: str, seed: int, init: dict[str, torch.Tensor] | None = None
    ) -> tuple[CompositionalUpdater, Problem]:
        """:func:`build_updater` of ``name`` with ``seed`` (and the starting point ``init``) on
        this config's data, built once."""
        data = self.data(cfg, seed)
        key = json.dumps([relevant_config(cfg, name, seed), id(init) if init else None],
                         sort_keys=True, default=str)  # fmt: skip
        if key not in self._updaters:
            self._updaters[key] = build_updater(cfg, name, data, seed, init)
            self.built["updaters"] += 1
        return self._updaters[key]


RESUMABLE_CHANGES = (
    "rounds", "eval_every", "checkpoint_every", "checkpoint_keep", "progress", "tracking",
    "threads", "executor", "chunk_size", "devices", "num_nodes", "accelerator", "strategy",
    "jobs", "sub_run", "shard_data", "executor_reason", "fast_steps",
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

    def resolved(key: str) -> Any:  # the key's value as plain containers, resolved
        value = cfg[key]
        return (
            OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value
        )

    out: dict[str, Any] = {k: resolved(k) for k in keep}  # not the whole config: its lists grow
    # the starting point, when it is not the seeded initialisation (older checkpoints match)
    if cfg.init_from:
        out["init_from"] = resolved("init_from")
    if pretrains(cfg):
        out["pretrain"] = resolved("pretrain")
    if cfg.server_opt.name:  # a server optimizer (older checkpoints have none)
        out["server_opt"] = resolved("server_opt")
    out.update(updater=name, seed=seed, hparams=resolved(name))
    if pname:
        out["problem"] = {"name": pname, **resolved(pname)}
    return out


def build_updater(
    cfg: DictConfig,
    name: str,
    data: FederatedData,
    seed: int,
    init: dict[str, torch.Tensor] | None = None,
) -> tuple[CompositionalUpdater, Problem]:
    """Updater ``name`` with a model seeded by ``seed`` (or with the parameters ``init``, the
    run's shared starting point: :mod:`lit_fedco.experiment.pretrain`), and the problem it runs on.

    The run's problem (``cfg.objective``, or the updater's default problem; plain
    :class:`~lit_fedco.problems.Classification` when neither names one) decides the model's
    output size and gives the updater the objective of the first of its compositions the
    problem offers (FCSG the conditional objective, FedAvg the problem's empirical risk).
    """
    cls = get_updater(name)
    pname = problem_name(cfg, name)
    problem = (
        get_problem(pname)(node_params(cfg, pname), data)
        if pname
        else Classification(ProblemParams(), data)
    )
    model = run_model(cfg, data, problem.num_outputs(), seed)
    if init is not None:
        set_model_state(model, init)  # copies, in their own dtype: the initial state is them
    try:
        objective = problem.objective_for(cls.compositions, model)
    except ConfigError as err:
        raise err.within(f"updater {name!r}") from None
    updater = cls(node_params(cfg, name), model, objective)
    if cfg.model.buffers == "local" and running_stats(model):
        updater.keep_running_stats_local()
    return updater, problem


def trains(cfg: DictConfig, name: str) -> dict[str, str]:
    """What updater ``name`` trains in run ``cfg``, read from the declarations (no model is
    built): ``composition`` (the first of its ``compositions`` its problem offers; ``"?"``
    for a problem that does not declare its ``offers``), ``problem`` (``cfg.objective``, the
    updater's default problem, or ``classification``) and ``own`` (the problem's own
    composition, the first it offers)."""
    cls = get_updater(name)
    pname = problem_name(cfg, name)
    offers = (get_problem(pname) if pname else Classification).known_offers()
    if offers is None:
        return {"composition": "?", "problem": pname, "own": "?"}
    found = trained_composition(cls, offers)
    return {"composition": found or "-", "problem": pname or "classification", "own": offers[0]}


def composition_notes(cfg: DictConfig) -> list[str]:
    """One line for each updater of ``cfg`` (a checked config: each is registered) that trains
    another composition than its problem's own without declaring its ``compositions`` (it takes
    the default's first offered, the empirical risk): the switch is said, not made silently."""
    notes = []
    for name in dict.fromkeys(cfg.updaters):
        got = trains(cfg, name)
        if got["own"] in ("?", got["composition"]) or declares_compositions(get_updater(name)):
            continue
        notes.append(
            f"{name} trains {got['composition']!r} (it declares no compositions and takes the "
            f"first objective={got['problem']} offers), not the problem's own {got['own']!r}; "
            f"declare compositions = ({got['own']!r},) in its class to train that one, or "
            f"compositions = ({got['composition']!r},) to say it is a baseline"
        )
    return notes


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
