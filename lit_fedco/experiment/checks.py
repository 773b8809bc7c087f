"""Every check that can fail on user input (:func:`check_run`), run before any process starts
or file is written: the settings one by one, then what only building the run shows."""

from __future__ import annotations

from omegaconf import DictConfig

from lit_fedco.config.load import node_params
from lit_fedco.config.values import check_repeats
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.models import MODEL_BUFFERS, draws_randomly, running_stats
from lit_fedco.core.ranges import check_drop, check_threads
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.schedule import DTYPES
from lit_fedco.experiment.assemble import Assembly, loop_config, run_executor
from lit_fedco.experiment.fabric import check_fabric
from lit_fedco.experiment.pretrain import check as check_pretrain
from lit_fedco.experiment.pretrain import check_shapes, load_params, pretrain_config
from lit_fedco.experiment.subruns import pretrains
from lit_fedco.report.tracking import check_tracking, check_wandb_server
from lit_fedco.updaters.base import CompositionalUpdater, available_updaters, get_updater

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
    for name in [*cfg.updaters, *([cfg.pretrain.updater] if pretrains(cfg) else [])]:
        if name in available_updaters() and cfg.model.name in get_updater(name).unvmappable_models:
            raise ConfigError(
                f"executor: got 'vectorized', but {name} cannot run under vmap on "
                f"model.name={cfg.model.name} (its unvmappable_models); set executor=sequential "
                "or executor=auto",
                key="executor",
            )


def check_run(cfg: DictConfig, built: Assembly | None = None) -> None:
    """The settings one by one, then what only building the run shows (the data, its split,
    the updaters' models and objectives, the pre-training, ``init_from``); the data and
    updaters it builds (for the run's first seed) are kept in ``built``.

    Raises:
        ConfigError: the first check that fails, naming its key.
    """
    check_settings(cfg)
    check_outputs(cfg)
    check_data_settings(cfg)
    check_fabric(cfg)
    check_built(cfg, built or Assembly())


def check_settings(cfg: DictConfig) -> None:
    """The updaters' parameters, the dtype, the executor, the model's buffers, failures,
    tracking, repeated updaters or seeds, and the seeds' range.

    Raises:
        ConfigError: naming the key.
    """
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
    check_drop(cfg.failures.drop)
    if "wandb" in check_tracking(list(cfg.tracking), cfg.project):
        check_wandb_server()  # online: the server answers, or offline with a warning
    check_repeats(cfg)
    check_seeds(cfg)


def check_seeds(cfg: DictConfig) -> None:
    """``seed`` and ``seeds``: ints in [0, 2^32); ``resume=PATH`` with one updater and seed.

    Raises:
        ConfigError: naming the key.
    """
    seeds = list(cfg.seeds)
    if cfg.seed < 0:
        raise ConfigError.bad_value("seed", cfg.seed, "an int >= 0 (numpy's seeds)", "0")
    if any(s < 0 for s in seeds):
        raise ConfigError.bad_value("seeds", seeds, "ints >= 0 (numpy's seeds)", "[0,1,2]")
    below = "ints in [0, 2^32) (a seed names the run's random streams with numpy's 32-bit words)"
    if cfg.seed >= SEED_LIMIT:
        raise ConfigError.bad_value("seed", cfg.seed, below, "0")
    if any(s >= SEED_LIMIT for s in seeds):
        raise ConfigError.bad_value("seeds", seeds, below, "[0,1,2]")
    if cfg.resume not in ("", "auto") and (len(cfg.updaters) != 1 or len(seeds) > 1):
        raise ConfigError.bad_value(
            "resume", cfg.resume, "a single updater and seed with a checkpoint file (or "
            "resume=auto for a whole run)", "auto run_name=NAME",
        )  # fmt: skip


def check_outputs(cfg: DictConfig) -> None:
    """Where the run goes and how it writes: ``out_dir``, ``run_name``, the checkpoints'
    cadence and count, ``threads``.

    Raises:
        ConfigError: naming the key.
    """
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
    check_threads(cfg.threads)


def check_data_settings(cfg: DictConfig) -> None:
    """Data keys that contradict each other: a folder for embedded data, ``drop_positive``
    on data that is not binary.

    Raises:
        ConfigError: naming the key.
    """
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


def check_built(cfg: DictConfig, built: Assembly) -> None:
    """What only building the run (first seed) shows: missing files, impossible splits, a
    schedule the clients cannot fill, a batch larger than the data, an updater the problem or
    model cannot take, the pre-training's updater and schedule, ``init_from``'s shapes.

    Raises:
        ConfigError: naming the key.
    """
    first = (list(cfg.seeds) or [cfg.seed])[0]
    data = built.data(cfg, first)  # missing files, impossible splits
    loop_config(cfg, first).validate(data.num_clients, cfg.devices * cfg.num_nodes)
    # a batch of at most every client's rows: a larger one only allocates (a billion rows asked
    # for tens of GB before anything ran)
    rows = int(data.sizes("train").sum())
    if cfg.batch_size > rows:
        raise ConfigError.bad_value(
            "batch_size", cfg.batch_size, f"an int in [1, {rows}] (the training rows of all the "
            "clients together; each minibatch is drawn from one client's rows)", "32",
        )  # fmt: skip
    # model sizes, and an objective of the problem for each updater
    pairs = [built.updater(cfg, name, first) for name in cfg.updaters]
    for upd, problem in pairs:  # its minibatch sampler on every client (AUPRC: positives)
        problem.sampler(upd.objective, data, first)
    for name, (upd, _) in zip(cfg.updaters, pairs, strict=True):
        check_model_state(cfg, name, upd)
    check_pretrain(cfg)
    if pretrains(cfg):  # the pre-training's updater, objective and schedule
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
        check_shapes(load_params(cfg.init_from), pairs[0][0].params(), cfg.init_from, cfg)


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
