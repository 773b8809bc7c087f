"""Assembling a run from its resolved config: Fabric, data, updater and problem, schedule, and
every check that can fail on user input (:func:`check_run`, before any process starts or file
is written)."""

from __future__ import annotations

import json
import os
import socket
import statistics
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf

from lit_fedco.config.load import node_params, problem_name
from lit_fedco.config.values import check_repeats
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.models import (
    BATCH_STATISTICS_MODELS,
    MODEL_BUFFERS,
    MODEL_KEYS,
    build_model,
    call,
    draws_randomly,
    is_model_ref,
    model_state,
    running_stats,
)
from lit_fedco.core.server_opt import ServerOptConfig
from lit_fedco.data import FederatedData, make_federated
from lit_fedco.engine.executors import choose_executor, make_executor
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.loop import LoopConfig
from lit_fedco.engine.schedule import ACCELERATORS, DTYPES
from lit_fedco.engine.store import owned_by
from lit_fedco.experiment import checkpoint as ckpt
from lit_fedco.experiment.jobs import per_core_limit
from lit_fedco.experiment.pretrain import check as check_pretrain
from lit_fedco.experiment.pretrain import (
    check_shapes,
    enabled,
    load_params,
    pretrain_config,
    set_params,
)
from lit_fedco.problems import Classification, Problem, ProblemParams, get_problem
from lit_fedco.report.tracking import check_tracking, check_wandb_server
from lit_fedco.updaters.base import (
    CompositionalUpdater,
    available_updaters,
    declares_compositions,
    get_updater,
    trained_composition,
)

STRATEGIES = ("auto", "ddp")
"""The strategies the loop runs on: it shards clients over processes itself and never wraps the
model, so only plain processes with a process group (``ddp``; ``auto``: ``ddp`` for more than
one process) make sense."""


def fabric_settings(cfg: DictConfig) -> dict[str, Any]:
    """The arguments of ``Fabric`` for the config's accelerator, devices, nodes and strategy."""
    strategy = cfg.strategy
    if strategy == "auto" and cfg.devices * cfg.num_nodes > 1:
        strategy = "ddp"  # processes started by Fabric; gloo on CPU, NCCL on GPUs
    return dict(
        accelerator=cfg.accelerator, devices=cfg.devices, num_nodes=cfg.num_nodes, strategy=strategy
    )


def make_fabric(cfg: DictConfig, callbacks: list[Any] | None = None) -> Fabric:
    """A launched Fabric for the config's accelerator, devices, nodes and strategy.

    ``callbacks`` are objects with any of the loop's hooks (``on_round_start(loop, cohort)``,
    ``on_round_end(loop, logs)``, ``on_eval_end(loop, metrics)``), called through
    ``fabric.call`` on every process."""
    fabric = Fabric(**fabric_settings(cfg), callbacks=callbacks)
    fabric.launch()
    return fabric


def check_fabric(cfg: DictConfig) -> None:
    """The Fabric settings, checked without starting anything: known names, a device of the
    kind asked for and enough of them, a multi-node environment for ``num_nodes > 1``, a usable
    ``MASTER_PORT``; then ``Fabric`` itself is built (not launched) and whatever it refuses is
    reported as a :class:`ConfigError` too.

    Raises:
        ConfigError: naming the key (``accelerator``, ``devices``, ``num_nodes``,
            ``strategy``, ``dtype`` or ``MASTER_PORT``).
    """
    for key in ("devices", "num_nodes"):
        if cfg[key] < 1:
            raise ConfigError.bad_value(key, cfg[key], "an int >= 1", "1")
    acc = cfg.accelerator
    if acc not in ACCELERATORS:
        raise ConfigError.bad_value("accelerator", acc, f"one of {ACCELERATORS}", "cpu")
    if cfg.strategy not in STRATEGIES:
        raise ConfigError.bad_value(
            "strategy", cfg.strategy, f"one of {STRATEGIES} (the loop shards the clients over "
            "processes itself; the model is never wrapped)", "auto",
        )  # fmt: skip
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    kind = "cuda" if cuda and acc in ("cuda", "gpu", "auto") else "cpu"
    kind = "mps" if mps and kind == "cpu" and acc in ("mps", "gpu", "auto") else kind
    if acc != "auto" and kind == "cpu" and acc != "cpu":
        probes = {"cuda": "torch.cuda.is_available()", "mps": "torch.backends.mps.is_available()"}
        why = " and ".join(v for k, v in probes.items() if acc in (k, "gpu"))
        raise ConfigError(
            f"accelerator: got {acc!r}, but torch sees no {'GPU' if acc == 'gpu' else acc.upper()}"
            f" device here ({why}: False); set accelerator=cpu (or auto), or run where such a "
            "device is visible",
            key="accelerator",
        )
    count = {"cuda": torch.cuda.device_count(), "mps": 1}.get(kind)
    if count is not None and cfg.devices > count:
        raise ConfigError.bad_value(
            "devices", cfg.devices, f"at most the {count} {kind.upper()} device(s) visible here "
            "(CUDA_VISIBLE_DEVICES)", str(count),
        )  # fmt: skip
    if kind == "mps" and cfg.dtype == "float64":
        raise ConfigError.bad_value("dtype", cfg.dtype, "float32 on MPS (no float64)", "float32")
    if cfg.num_nodes > 1 and not _multi_node_environment():
        raise ConfigError.bad_value(
            "num_nodes", cfg.num_nodes, "1 outside a multi-node environment (SLURM, torchrun, "
            "LSF, MPI, or NODE_RANK and MASTER_ADDR set on every node)", "1",
        )  # fmt: skip
    if cfg.devices * cfg.num_nodes > 1:
        _check_master_port(cfg.num_nodes == 1)
    try:
        Fabric(**fabric_settings(cfg))  # builds the connector and strategy; launches nothing
    except Exception as err:
        settings = ", ".join(f"{k}={v}" for k, v in fabric_settings(cfg).items())
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"accelerator: Lightning Fabric refuses {settings} ({first}); "
            "change these keys, e.g. accelerator=cpu devices=1 strategy=auto",
            key="accelerator",
        ) from None


def _multi_node_environment() -> bool:
    from lightning.fabric.plugins import environments as envs

    # the environments Fabric detects by itself (Kubeflow's must be passed in: not here)
    kinds = (envs.SLURMEnvironment, envs.TorchElasticEnvironment, envs.LSFEnvironment,
             envs.MPIEnvironment)  # fmt: skip
    return any(k.detect() for k in kinds) or {"NODE_RANK", "MASTER_ADDR"} <= set(os.environ)


def launch_rank(cfg: DictConfig) -> int | None:
    """This process's global rank when a launcher outside lit_fedco started it as one process
    of several (``torchrun``, ``srun``, or ``NODE_RANK`` per node), else None: then this process
    is the run's only one, or Fabric starts the others itself.

    Every such process runs the checks; rank 0 creates and writes the run folder, the others
    read it (``run_name`` names it for all of them)."""
    if cfg.devices * cfg.num_nodes == 1:
        return None
    from lightning.fabric.plugins import environments as envs

    for kind in (envs.TorchElasticEnvironment, envs.SLURMEnvironment):
        if kind.detect():
            return int(kind().global_rank())
    if cfg.num_nodes > 1 and os.environ.get("NODE_RANK", "").isdigit():
        return int(os.environ["NODE_RANK"]) * cfg.devices  # Fabric starts this node's others
    return None


def _check_master_port(local: bool) -> None:
    """``MASTER_PORT``, when set: a port number, and on one node one that is free."""
    value = os.environ.get("MASTER_PORT")
    if value is None:
        return
    if not value.strip().isdigit() or not 1 <= int(value) <= 65535:
        raise ConfigError.bad_value("MASTER_PORT", value, "a TCP port in [1, 65535]", "29500")
    if local:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore
            try:
                sock.bind(("", int(value)))
            except OSError as err:
                raise ConfigError(
                    f"MASTER_PORT: got {value!r}, but the port cannot be used here "
                    f"({err.strerror or err}; another run?); unset MASTER_PORT to let Fabric "
                    "pick a free one, or choose another",
                    key="MASTER_PORT",
                ) from None


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
        server_opt=ServerOptConfig(**OmegaConf.to_container(cfg.server_opt, resolve=True)),  # type: ignore[arg-type]
    )


def run_executor(cfg: DictConfig) -> str:
    """The executor the run uses: ``executor=auto`` resolved for its model and device
    (:func:`~lit_fedco.engine.executors.choose_executor`; a researcher's model by
    :func:`auto_for_model`), the reason written to ``cfg.executor_reason`` (recorded in
    ``config.yaml``)."""
    names = list(cfg.updaters)
    if enabled(cfg):
        names.append(cfg.pretrain.updater)
    updaters = [get_updater(n) for n in names if n in available_updaters()]
    if cfg.executor == "auto" and is_model_ref(cfg.model.name):
        choice, reason = auto_for_model(cfg, updaters)
        cfg.executor_reason = reason
        return choice
    choice = choose_executor(cfg.executor, cfg.model.name, cfg.accelerator, updaters)
    if cfg.executor == "auto":
        cfg.executor_reason = f"{choice} as measured for model.name={cfg.model.name} on its device"
    return choice


def model_keys(cfg: DictConfig) -> dict[str, Any]:
    """The ``model.*`` keys a researcher's model's ``Params`` declares (every key but the
    built-in ``name``, ``hidden`` and ``buffers``)."""
    values = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(values, dict)
    return {str(k): v for k, v in values.items() if k not in MODEL_KEYS}


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
    model = build_model(
        cfg.model.name, tuple(data.x_train.shape[1:]), data.num_classes, cfg.seed,
        cfg.model.hidden, model_keys(cfg),
    )  # fmt: skip
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


SEED_LIMIT = 2**32
"""Seeds are below 2^32: each names random streams through numpy's 32-bit seed words."""
EMBEDDED_SOURCES = frozenset({"digits", "digits_st", "invariant_logreg"})
"""``data.name`` values that read no folder (``data.data_dir`` set with them is refused)."""
NAME_MAX = 200
"""The longest ``run_name`` (bytes): a folder name, with room for the filesystem's 255."""


def check_run_name(name: str) -> None:
    """``run_name`` is a folder name: printable, no ``/``, not hidden, at most :data:`NAME_MAX`
    bytes.

    Raises:
        ConfigError: naming the key and what was wrong.
    """
    shown = name if len(name) <= 60 else name[:59] + "…"
    why = ""
    if "/" in name or name in (".", ".."):
        why = "a folder name, no '/'"
    elif name.startswith("."):
        why = "a folder name that does not start with '.' (hidden folders are lit_fedco's own)"
    elif not name.isprintable():
        why = "printable characters (no newline, tab or control character)"
    elif len(name.encode()) > NAME_MAX:
        why = f"at most {NAME_MAX} bytes, got {len(name.encode())}"
    if why:
        raise ConfigError(f"run_name: got {shown!r}, expected {why}; set e.g. run_name=lr01",
                          key="run_name")  # fmt: skip


def check_vmappable(cfg: DictConfig) -> None:
    """``executor=vectorized`` names an executor its updaters can run: one declaring the run's
    model in its ``unvmappable_models`` cannot (``auto`` would run it sequentially).

    Raises:
        ConfigError: naming the updater and the model.
    """
    if cfg.executor != "vectorized":
        return
    for name in [*cfg.updaters, *([cfg.pretrain.updater] if enabled(cfg) else [])]:
        if name in available_updaters() and cfg.model.name in get_updater(name).unvmappable_models:
            raise ConfigError(
                f"executor: got 'vectorized', but {name} cannot run under vmap on "
                f"model.name={cfg.model.name} (its unvmappable_models); set executor=sequential "
                "or executor=auto",
                key="executor",
            )


def check_batch_size(batch_size: int, rows: int) -> None:
    """``batch_size`` is at most the ``rows`` every client trains on together: a client's
    minibatch is drawn from its own rows, and a larger one only allocates (a billion rows
    asked for tens of GB before anything ran).

    Raises:
        ConfigError: naming the bound.
    """
    if batch_size > rows:
        raise ConfigError.bad_value(
            "batch_size", batch_size, f"an int in [1, {rows}] (the training rows of all the "
            "clients together; each minibatch is drawn from one client's rows)", "32",
        )  # fmt: skip


def check_run(cfg: DictConfig, built: Assembly | None = None) -> None:
    """Every check that can fail on user input, before any process starts or file is written.
    The data and updaters it builds (for the run's first seed) are kept in ``built``."""
    built = built or Assembly()
    for name in cfg.updaters:
        node_params(cfg, name)
    if cfg.dtype not in DTYPES:
        raise ConfigError.bad_value("dtype", cfg.dtype, f"one of {sorted(DTYPES)}", "float32")
    make_executor(run_executor(cfg), cfg.chunk_size)
    check_vmappable(cfg)
    if cfg.model.buffers not in MODEL_BUFFERS:
        raise ConfigError.bad_value(
            "model.buffers", cfg.model.buffers, f"one of {MODEL_BUFFERS}", "local"
        )
    if cfg.failures.drop == 1:
        raise ConfigError.bad_value(
            "failures.drop", cfg.failures.drop, "a float in [0, 1) (at 1 every client drops out "
            "of every round and nothing is trained)", "0.2",
        )  # fmt: skip
    if "wandb" in check_tracking(list(cfg.tracking), cfg.project):
        check_wandb_server()  # online: the server answers, or offline with a warning
    check_repeats(cfg)
    seeds = list(cfg.seeds)
    if cfg.seed < 0:
        raise ConfigError.bad_value("seed", cfg.seed, "an int >= 0 (numpy's seeds)", "0")
    if any(s < 0 for s in seeds):
        raise ConfigError.bad_value("seeds", seeds, "ints >= 0 (numpy's seeds)", "[0,1,2]")
    for key, values in (("seed", [cfg.seed]), ("seeds", seeds)):
        if any(s >= SEED_LIMIT for s in values):
            raise ConfigError.bad_value(
                key, values[0] if key == "seed" else values, "ints in [0, 2^32) (a seed names "
                "the run's random streams with numpy's 32-bit words)",
                "[0,1,2]" if key == "seeds" else "0",
            )  # fmt: skip
    if cfg.resume not in ("", "auto") and (len(cfg.updaters) != 1 or len(seeds) > 1):
        raise ConfigError.bad_value(
            "resume", cfg.resume, "a single updater and seed with a checkpoint file (or "
            "resume=auto for a whole run)", "auto run_name=NAME",
        )  # fmt: skip
    if not cfg.out_dir.strip():
        raise ConfigError.bad_value("out_dir", cfg.out_dir, "a folder for the runs", "runs")
    if not cfg.out_dir.isprintable():  # a preset's "x\ny": the command line refuses it too
        raise ConfigError.bad_value(
            "out_dir", cfg.out_dir, "a folder name on one line (no newline, tab or control "
            "character)", "runs",
        )  # fmt: skip
    check_run_name(cfg.run_name)
    if cfg.checkpoint_every < 0:
        raise ConfigError.bad_value(
            "checkpoint_every", cfg.checkpoint_every, "an int >= 0 (0: only at the end)", "10"
        )
    if cfg.checkpoint_keep < 1:
        raise ConfigError.bad_value("checkpoint_keep", cfg.checkpoint_keep, "an int >= 1", "3")
    most = per_core_limit()
    if not 0 <= cfg.threads <= most:
        raise ConfigError.bad_value(
            "threads", cfg.threads, f"an int in [0, {most}] (0: the cores shared out; at most 4 "
            f"per CPU core, {os.cpu_count()} here)", "1",
        )  # fmt: skip
    if cfg.data.data_dir and cfg.data.name in EMBEDDED_SOURCES:
        raise ConfigError(
            f"data.data_dir: got {cfg.data.data_dir!r}, but data.name={cfg.data.name} is "
            "embedded and reads no folder; drop data.data_dir, or set data.name to a data set "
            "read from it (mnist, fashion_mnist, cifar10_st, adult, ...)",
            key="data.data_dir",
        )
    if cfg.data.drop_positive and not cfg.data.binary:  # it would be ignored, silently
        raise ConfigError(
            f"data.drop_positive: got {cfg.data.drop_positive}, but data.binary=false: it removes "
            "positives of binary data only; set data.binary=true with it, or leave it out",
            key="data.drop_positive",
        )
    check_fabric(cfg)
    first = (seeds or [cfg.seed])[0]
    data = built.data(cfg, first)  # missing files, impossible splits
    loop_config(cfg, first).validate(data.num_clients, cfg.devices * cfg.num_nodes)
    check_batch_size(cfg.batch_size, int(data.sizes("train").sum()))
    # model sizes, and an objective of the problem for each updater
    pairs = [built.updater(cfg, name, first) for name in cfg.updaters]
    for upd, problem in pairs:  # its minibatch sampler on every client (AUPRC: positives)
        problem.sampler(upd.objective, data, first)
    updaters = [upd for upd, _ in pairs]
    for name, upd in zip(cfg.updaters, updaters, strict=True):
        check_model_state(cfg, name, upd)
    check_pretrain(cfg)
    if enabled(cfg):  # the pre-training's updater, objective and schedule
        pcfg = pretrain_config(cfg)
        try:
            built.updater(pcfg, cfg.pretrain.updater, first)
        except ConfigError as err:
            raise ConfigError(
                f"pretrain.updater: got {cfg.pretrain.updater!r}, which cannot pre-train this "
                f"run's model ({err}); choose another, e.g. pretrain.updater=fedavg",
                key="pretrain.updater",
            ) from None
        loop_config(pcfg, first).validate(data.num_clients, cfg.devices * cfg.num_nodes)
    if cfg.init_from:  # a readable checkpoint of this run's model
        check_shapes(load_params(cfg.init_from), updaters[0].params(), cfg.init_from, cfg)


def check_model_state(cfg: DictConfig, name: str, upd: CompositionalUpdater) -> None:
    """A model with running statistics needs clients that hold the model (their statistics
    follow their own batches); a model that draws randomly (dropout) cannot run vectorized
    (``vmap`` refuses to draw random numbers, and each client is seeded on its own).

    Raises:
        ConfigError: naming ``model.name`` or ``executor``.
    """
    if running_stats(upd.model) and upd.model_key not in upd.client_state:
        raise ConfigError(
            f"model.name: {cfg.model.name} has batch norms with running statistics, which "
            f"{name} cannot train: its clients do not hold the model (their state is "
            f"{', '.join(upd.client_state)}); use a model without them (GroupNorm, or "
            "track_running_stats=False), or another updater",
            key="model.name",
        )
    if draws_randomly(upd.model) and cfg.executor == "vectorized":
        raise ConfigError(
            f"executor: got 'vectorized', but model.name={cfg.model.name} draws random numbers "
            "(dropout), which vmap cannot draw client by client; set executor=sequential or "
            "executor=auto",
            key="executor",
        )


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
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    out: dict[str, Any] = {k: resolved[k] for k in keep}
    # the starting point, when it is not the seeded initialisation (older checkpoints match)
    if cfg.init_from:
        out["init_from"] = resolved["init_from"]
    if enabled(cfg):
        out["pretrain"] = resolved["pretrain"]
    if cfg.server_opt.name:  # a server optimizer (older checkpoints have none)
        out["server_opt"] = resolved["server_opt"]
    out.update(updater=name, seed=seed, hparams=OmegaConf.to_container(cfg[name], resolve=True))
    if pname:
        out["problem"] = {"name": pname, **OmegaConf.to_container(cfg[pname], resolve=True)}  # type: ignore[dict-item]
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
    model = build_model(
        cfg.model.name, tuple(data.x_train.shape[1:]), problem.num_outputs(), seed,
        cfg.model.hidden, model_keys(cfg),
    )  # fmt: skip
    if init is not None:
        set_params(model, init)
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
    """One line for each updater of ``cfg`` that trains another composition than its
    problem's own without declaring its ``compositions`` (it takes the default's first
    offered, the empirical risk): the switch is said, not made silently."""
    notes = []
    for name in dict.fromkeys(cfg.updaters):
        if name not in available_updaters():
            continue
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
