"""The run's configuration as typed dataclasses: the schema behind ``schema.json``.

Every key is typed by a dataclass: the run's :class:`RunConfig` (with its nodes ``data``,
``model``, ``failures``, ``server_opt``, each defined by the layer that reads it, and
``pretrain``, ``tune``) and, under their names, every registered updater's hyperparameters and
every registered problem's parameters (:func:`schema`). The catalog the command line reads
(:mod:`lit_fedco.config.catalog`) is generated from them; range checks run when the dataclasses
are built (:func:`lit_fedco.config.load.node_params`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from lit_fedco.core.server_opt import ServerOptConfig
from lit_fedco.core.user_models import ModelConfig
from lit_fedco.data.config import DataConfig
from lit_fedco.engine.failures import Failures
from lit_fedco.problems import available_problems, get_problem
from lit_fedco.updaters.base import available_updaters, get_updater


@dataclass
class TuneConfig:
    """Tuning each method before the comparison, as the papers did: every grid value runs on
    the tuning seeds with validation rows held out of the training split, the best value per
    updater by ``metric`` is chosen, and the comparison then runs on ``seeds`` with it
    (:mod:`lit_fedco.experiment.tuning`).

    Attributes:
        grid: ``KEY=V1,V2,...`` per hyperparameter, ``KEY`` under an updater's node
            (``["fedavg.lr=0.001,0.01,0.1", "comfedl.lr=0.01,0.1"]``); an updater with several
            keys tries every combination. Empty: no tuning.
        metric: the final metric to select by (``val/acc_avg``, ``val/acc_worst``,
            ``val/objective``, ``val/auprc``...).
        mode: ``max`` or ``min`` of ``metric`` (its mean over the tuning seeds); a diverged
            value is never chosen.
        seeds: the tuning seeds, apart from the comparison's ``seeds``.
        rounds: rounds of each tuning run; 0: the run's ``rounds``.
        heldout: the data selected on (``data.heldout`` of the tuning runs): ``train`` (a
            slice of the training split; the comparison's test split is never seen) or
            ``test`` (for data without a training split to slice: ``invariant_logreg``'s
            fresh samples, few-shot tasks).
        chosen: set by the tuning phase, not by hand: the values chosen, ``KEY=VALUE``.
    """

    grid: list[str] = field(default_factory=list)
    metric: str = "val/acc_avg"
    mode: str = "max"
    seeds: list[int] = field(default_factory=lambda: [100])
    rounds: int = 0
    heldout: str = "train"
    chosen: list[str] = field(default_factory=list)


@dataclass
class PretrainConfig:
    """A pre-training phase (:mod:`lit_fedco.experiment.pretrain`), run once per seed before the
    methods; every method of that seed starts from its final model.

    Attributes:
        rounds: communication rounds of the pre-training; 0: none (every method starts from
            its own seeded initialisation, or from ``init_from``).
        updater: the updater that pre-trains, on the run's problem: ``fedavg`` trains the
            problem's ``erm`` objective (cross-entropy; on ``auprc`` the logistic loss of the
            score). Its other hyperparameters come from its own config node.
        lr: the pre-training's step size (it replaces ``<updater>.lr`` for the pre-training
            only).
    """

    rounds: int = 0
    updater: str = "fedavg"
    lr: float = 0.05


@dataclass
class RunConfig:
    """A recipe's run: schedule, execution, tracking. Symbols as in the papers (S, I, m, b, E).

    Attributes:
        updaters: the algorithms to run, in order (``updater=NAME`` runs just one).
        seed: seeds model init, cohorts and minibatches; ``seeds`` runs several.
        seeds: run every updater once per seed and report mean ± std (overrides ``seed``).
        rounds: S, the communication rounds.
        local_steps: I, the local steps per round (an updater's own ``local_steps``, when set,
            wins).
        cohort: m, the clients sampled per round.
        batch_size: b, the minibatch size per client and local step.
        eval_every: E, evaluate every E rounds (and after the last round).
        executor: ``auto`` (``sequential`` for ResNet-20 on the CPU, ``vectorized``
            otherwise, as measured; the run's ``config.yaml`` records the choice),
            ``vectorized`` (vmap over clients) or ``sequential`` (a loop).
        chunk_size: clients per vmap call (0: all of a rank's cohort at once).
        executor_reason: set by ``executor=auto``, not by hand: why it chose the executor
            (recorded in ``config.yaml``).
        fast_steps: run an updater's fast forms of its step where it has them (FedAvg's and
            SCAFFOLD's stacked and in-place steps); false: every step through ``client_step``,
            with the same numbers (to check a method's fast form, or to time without it).
        dtype: ``float32`` or ``float64``.
        accelerator / devices / num_nodes / strategy: passed to ``lightning.fabric.Fabric``.
        shard_data: with several processes, each holds only the training and validation rows
            of the clients it owns (client k on process k mod N) instead of all of them, and
            runs the cohort clients it owns (a random cohort can then split unevenly between
            processes). The same numbers up to the order of floating-point sums, as with any
            number of processes; no effect on one process.
        tracking: any of ``wandb``, ``csv``; ``[none]`` logs nothing.
        out_dir: runs go to ``<out_dir>/<recipe>/<run_name>/`` (config, metrics, W&B runs,
            checkpoints, results; :mod:`lit_fedco.experiment.rundir`).
        run_name: the run's folder name; empty: the start time (``20261124-093000``).
        project: the W&B project.
        progress: show a progress bar.
        threads: torch's intra-op CPU threads per process; 0: the cores shared out among the
            run's processes on this machine (at most torch's default), recorded in each
            sub-run's ``status.json``. Small models run fastest with 1: their operations are
            too small to split, and idle threads spinning on a shared machine slow every step.
        checkpoint_every: write a checkpoint every this many rounds (and after the last round,
            and on SIGTERM / SIGINT); 0: only then.
        checkpoint_keep: checkpoints kept per (updater, seed), the newest.
        resume: ``auto`` (continue the run ``run_name`` from its newest valid checkpoints) or a
            checkpoint file (one updater, one seed); empty: a new run.
        jobs: run the sub-runs (one per variant, seed and updater) this many at a time, each
            in a process of its own with ``threads`` (default: the cores shared out); the
            same numbers, one table. Their output goes to ``<run>/logs/``.
        sub_run: run only the sub-run with this index (``--list-sub-runs`` lists them) in the
            run ``run_name``, beside others (a SLURM job array, a W&B sweep agent); the run's
            table comes from ``resume=auto`` once all are complete. -1: all of them.
        objective: a registered problem (``client_dro``, ``sample_dro``, ``pfl``,
            ``invariant_logreg``, ``auprc``, ``maml``, ``fairness``) whose objectives every
            updater trains, with its parameters under its name; empty: each updater's default
            problem (``client_dro`` for ComFedL, ``sample_dro`` for the FedDRO family, ``pfl``
            for the MAML methods) or plain empirical risk.
        plugins: modules of your own to import before the run (``plugins=[my_lab.methods]``):
            the updaters and problems they register can then be named; ``updater=module:Class``
            adds its module here itself.
        variants: run everything once per entry, each a space-separated list of
            ``key=value`` overrides applied after the command line (e.g.
            ``"invariant_logreg.m=100"``); empty: one run of the config as it is.
        failures: simulated client failures (:class:`~lit_fedco.engine.failures.Failures`):
            ``failures.drop=p`` (a sampled client drops out before uploading) and
            ``failures.partial=p`` (a client completes only some of its local steps).
        server_opt: a server optimizer for every updater that has none of its own
            (:class:`~lit_fedco.core.server_opt.ServerOptConfig`): ``server_opt.name=adam``
            (or ``sgd``, ``momentum``, ``adagrad``, ``yogi``, a ``torch.optim`` class) with
            ``server_opt.lr`` (η) etc.; the round's change of the model is its pseudo-gradient
            (Reddi et al. 2021). Empty name: none.
        init_from: a lit_fedco checkpoint (``.ckpt``: any sub-run's, or a pre-training's
            ``pretrained.ckpt``) whose model parameters (the server's ``x``) every method, and
            the pre-training, start from; empty: the model's seeded initialisation.
        pretrain: a pre-training phase run once per seed before the methods
            (:class:`PretrainConfig`; ``pretrain.rounds=0``: none).
        tune: tune each method's hyperparameters over a grid on held-out training data, then
            compare with the chosen values (:class:`TuneConfig`; empty ``tune.grid``: none).
    """

    updaters: list[str] = field(default_factory=lambda: ["fedavg"])
    seed: int = 0
    seeds: list[int] = field(default_factory=list)
    rounds: int = 100
    local_steps: int = 5
    cohort: int = 10
    batch_size: int = 16
    eval_every: int = 10
    executor: str = "auto"
    chunk_size: int = 0
    fast_steps: bool = True
    executor_reason: str = ""
    dtype: str = "float32"
    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    shard_data: bool = False
    tracking: list[str] = field(default_factory=lambda: ["wandb", "csv"])
    out_dir: str = "runs"
    project: str = "lit_fedco"
    progress: bool = True
    threads: int = 0
    run_name: str = ""
    checkpoint_every: int = 10
    checkpoint_keep: int = 3
    resume: str = ""
    jobs: int = 1
    sub_run: int = -1
    objective: str = ""
    plugins: list[str] = field(default_factory=list)
    variants: list[str] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    failures: Failures = field(default_factory=Failures)
    server_opt: ServerOptConfig = field(default_factory=ServerOptConfig)
    init_from: str = ""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


def schema() -> DictConfig:
    """The full typed schema: :class:`RunConfig` plus one node per registered updater."""
    cfg = OmegaConf.structured(RunConfig)
    OmegaConf.set_struct(cfg, False)
    for name in available_updaters():
        node = OmegaConf.structured(get_updater(name).hparams_cls)
        OmegaConf.set_readonly(node, False)  # frozen dataclasses come in read-only
        cfg[name] = node
    for name in available_problems():  # each problem's parameters under its name
        node = OmegaConf.structured(get_problem(name).params_cls)
        OmegaConf.set_readonly(node, False)
        cfg[name] = node
    OmegaConf.set_struct(cfg, True)
    return cfg
