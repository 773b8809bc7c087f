"""Run configuration: dataclass defaults ← recipe defaults ← YAML preset ← ``key=value``.

Every key is typed by a dataclass (the run's :class:`RunConfig` and, under the updater's name,
each registered updater's hyperparameter dataclass), so unknown keys and values of the wrong
type are rejected with a message that names the key. Range checks run when the dataclasses are
built (:func:`updater_hparams`, :class:`~lit_fedco.engine.loop.FederatedLoop`).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lit_fedco.config.messages import check_flat_lists, example, friendly
from lit_fedco.core.errors import ConfigError
from lit_fedco.engine.failures import Failures
from lit_fedco.problems import ProblemParams, available_problems, get_problem
from lit_fedco.updaters.base import Hparams, available_updaters, get_updater

PRESET_DIR = Path(__file__).resolve().parents[2] / "recipes"
"""Where bare preset names are looked up (the repository's ``recipes/``)."""


@dataclass
class DataConfig:
    """The data set and its federated split (``lit_fedco.data``).

    Attributes:
        name: ``digits`` (embedded, scikit-learn), ``mnist`` or ``fashion_mnist`` (local files),
            a step-imbalanced ``digits_st``, ``cifar10_st``, ``cifar100_st``, or ``adult``
            (UCI Adult, embedded; targets carry the protected group, ``protected``).
        data_dir: folder with the IDX files for mnist / fashion_mnist, or with
            ``cifar-10-batches-py/`` / ``cifar-100-python/`` for CIFAR, or with
            ``adult.data[.gz]`` and ``adult.test[.gz]`` for adult (empty: the embedded copy).
        partition: ``quantity`` (ComFedL: one big client, K−1 small ones), ``iid``,
            ``dirichlet`` or ``dominant_class`` (``*_st`` and ``adult``: ``iid`` or
            ``dirichlet``).
        num_clients: K.
        big: training samples of the big client (quantity split; the paper: 5000).
        small: training samples of each small client (the paper: 20).
        small_classes: classes each small client draws from (0: all; label imbalance).
        alpha: Dirichlet concentration (dirichlet split).
        rho: fraction of a client's data from its dominant class (dominant_class split).
        val_per_client: validation samples per client, drawn with its class proportions
            (class-balanced for the step-imbalanced ``*_st`` sources).
        imbalance_ratio: ρ ≥ 1 of the step-imbalanced sources ``digits_st``, ``cifar10_st``,
            ``cifar100_st`` (``lit_fedco.data.cifar``): the last half of the classes keep
            1/ρ of their training images; ignored by the other sources.
        val_mode: ``client`` (``val_per_client`` samples drawn with the client's class
            proportions) or ``all`` (the whole held-out set, unchanged, split evenly).
        binary: relabel classes [0, C/2) as 0 (negative) and [C/2, C) as 1 (FCSG §5.3).
        drop_positive: fraction of training positives removed (binary; FCSG §5.3: 0.8).
        dim: d, features of the synthetic ``invariant_logreg`` source (FCSG §5.1: 10).
        sigma1: σ₁, the scale of a ~ N(0, σ₁² I) in ``invariant_logreg``.
        train_per_client: outer samples ξ = (a, b) per client in ``invariant_logreg``.
        rotations: few-shot sources (partition ``classes``): copies of each class rotated by
            multiples of 90° count as new classes (MAML's Omniglot augmentation).
        classes_per_client: partition ``classes``: classes each client draws its tasks from
            (0: a disjoint share of the training classes).
        heldout_classes: partition ``classes`` on ``digits``: base classes kept for the
            evaluation tasks (Omniglot uses its 1028/172/423 split).
        protected: ``adult``'s protected attribute, ``sex`` (2 groups) or ``race`` (5).
    """

    name: str = "digits"
    data_dir: str = ""
    partition: str = "quantity"
    num_clients: int = 10
    big: int = 1000
    small: int = 20
    small_classes: int = 0
    alpha: float = 0.5
    rho: float = 0.28
    val_per_client: int = 100
    imbalance_ratio: float = 10.0
    val_mode: str = "client"
    binary: bool = False
    drop_positive: float = 0.0
    dim: int = 10
    sigma1: float = 1.0
    train_per_client: int = 5000
    rotations: int = 1
    classes_per_client: int = 0
    heldout_classes: int = 3
    protected: str = "sex"


@dataclass
class ModelConfig:
    """The network (``lit_fedco.core.models``).

    Attributes:
        name: ``logreg`` (multinomial logistic regression), ``mlp`` (tanh, ``hidden``),
            ``resnet20``, ``linear`` (a score without bias), ``cnn`` (a small CNN, ``hidden``
            units) or ``conv4`` (MAML's four-layer CNN, ``hidden`` filters).
        hidden: hidden units (``mlp``, ``cnn``) or filters (``conv4``).
    """

    name: str = "logreg"
    hidden: int = 64


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
    """A recipe's run: schedule, execution, tracking. Symbols as in ``ALGORITHMS.md``.

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
        dtype: ``float32`` or ``float64``.
        accelerator / devices / num_nodes / strategy: passed to ``lightning.fabric.Fabric``.
        tracking: any of ``wandb``, ``csv``; ``[none]`` logs nothing.
        out_dir: runs go to ``<out_dir>/<recipe>/<run_name>/`` (config, metrics, W&B runs,
            checkpoints, results; :mod:`lit_fedco.experiment.rundir`).
        run_name: the run's folder name; empty: the start time (``20261124-093000``).
        project: the W&B project.
        progress: show a progress bar.
        threads: torch's intra-op CPU threads per process (0: torch's default). Small models
            run fastest with 1: their operations are too small to split, and idle threads
            spinning on a shared machine slow every step.
        checkpoint_every: write a checkpoint every this many rounds (and after the last round,
            and on SIGTERM / SIGINT); 0: only then.
        checkpoint_keep: checkpoints kept per (updater, seed), the newest.
        resume: ``auto`` (continue the run ``run_name`` from its newest valid checkpoints) or a
            checkpoint file (one updater, one seed); empty: a new run.
        objective: a registered problem (``client_dro``, ``sample_dro``, ``pfl``,
            ``invariant_logreg``, ``auprc``, ``maml``, ``fairness``) whose objectives every
            updater trains, with its parameters under its name; empty: each updater's default
            problem (``client_dro`` for ComFedL, ``sample_dro`` for the FedDRO family, ``pfl``
            for the MAML methods) or plain empirical risk.
        variants: run everything once per entry, each a space-separated list of
            ``key=value`` overrides applied after the command line (e.g.
            ``"invariant_logreg.m=100"``); empty: one run of the config as it is.
        failures: simulated client failures (:class:`~lit_fedco.engine.failures.Failures`):
            ``failures.drop=p`` (a sampled client drops out before uploading) and
            ``failures.partial=p`` (a client completes only some of its local steps).
        init_from: a lit_fedco checkpoint (``.ckpt``: any sub-run's, or a pre-training's
            ``pretrained.ckpt``) whose model parameters (the server's ``x``) every method, and
            the pre-training, start from; empty: the model's seeded initialisation.
        pretrain: a pre-training phase run once per seed before the methods
            (:class:`PretrainConfig`; ``pretrain.rounds=0``: none).
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
    dtype: str = "float32"
    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    tracking: list[str] = field(default_factory=lambda: ["wandb", "csv"])
    out_dir: str = "runs"
    project: str = "lit_fedco"
    progress: bool = True
    threads: int = 0
    run_name: str = ""
    checkpoint_every: int = 10
    checkpoint_keep: int = 3
    resume: str = ""
    objective: str = ""
    variants: list[str] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    failures: Failures = field(default_factory=Failures)
    init_from: str = ""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)


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


def resolve_preset(preset: str) -> Path:
    """A preset given as a path, or as a bare name looked up in the repository's ``recipes/``."""
    for cand in (Path(preset), PRESET_DIR / preset, PRESET_DIR / f"{preset}.yaml"):
        if cand.is_file():
            return cand
    names = sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) if PRESET_DIR.is_dir() else []
    raise ConfigError(
        f"preset: got {preset!r}, no such file (looked in the current folder and {PRESET_DIR}); "
        f"available presets: {', '.join(names) or 'none'}"
    )


def preset_layers(preset: str, _seen: tuple[Path, ...] = ()) -> list[tuple[str, Any]]:
    """The layers of a preset, base first: a preset may name another under ``extends`` (a
    grid preset extends the setting it sweeps), whose values it overrides.

    Raises:
        ConfigError: a missing preset, a malformed ``extends``, or a cycle of them.
    """
    path = resolve_preset(preset).resolve()
    if path in _seen:
        chain = " -> ".join(p.stem for p in (*_seen, path))
        raise ConfigError(f"preset: {path.name} extends itself ({chain}); break the cycle")
    try:
        layer = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError, OSError, ValueError) as err:
        first = str(getattr(err, "problem", None) or err or type(err).__name__).splitlines()[0]
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"preset: {path} is not a readable YAML mapping ({first}{where}); fix the file "
            "(lists take [a, b] with the brackets closed) or choose another preset"
        ) from None
    if not isinstance(layer, DictConfig):
        raise ConfigError(
            f"preset: {path} must hold a mapping of keys (rounds: 50), got a list; "
            "write one key: value per line"
        )
    if not layer:
        raise ConfigError(
            f"preset: {path} is empty, expected a mapping of keys (rounds: 50); fill it in, "
            "or leave out preset= to run the recipe's defaults"
        )
    base = layer.pop("extends", None)
    if base is None:
        return [(f"preset {path}", layer)]
    if not isinstance(base, str) or not base:
        raise ConfigError(
            f"extends: got {base!r} in preset {path}, expected the name of another preset "
            "(e.g. extends: comfedl_dro_mnist)"
        )
    return [*preset_layers(base, (*_seen, path)), (f"preset {path}", layer)]


def _parse_item(key: str, value: str) -> DictConfig:
    """One ``key=value`` of the command line as a config; an empty value is the empty string."""
    try:
        return OmegaConf.from_dotlist([f"{key}={value}" if value.strip() else f"{key}=''"])
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as err:
        first = str(getattr(err, "problem", None) or err).splitlines()[0]
        fix = example(key, schema())
        raise ConfigError(
            f"{key}: got {value!r} (from the command line), which does not parse ({first}); "
            f"expected a value, or a list with its brackets closed; set e.g. {fix}",
            key=key,
        ) from None


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value at ``key`` as written, interpolations unresolved."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    try:
        for part in filter(None, re.split(r"\.|\[(\d+)\]", key)):
            node = node[int(part)] if isinstance(node, list) else node[part]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return node


def load_config(argv: list[str], defaults: dict[str, Any] | None = None) -> DictConfig:
    """Merge schema ← recipe ``defaults`` ← ``preset=...`` (and the presets it ``extends``) ←
    the other ``key=value`` items, then resolve interpolations.

    ``updater=NAME`` is shorthand for ``updaters=[NAME]``; ``key=`` sets the empty string.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, a malformed argument.
    """
    cfg = schema()
    layers: list[tuple[str, Any]] = []
    if defaults:
        layers.append(("the recipe's defaults", defaults))
    items: list[tuple[str, Any]] = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        key = key.lstrip("-")
        if not eq or not key:
            raise ConfigError(
                f"command line: got {arg!r}, expected key=value (e.g. rounds=50 or "
                "preset=comfedl_dro_mnist); list-valued keys take [a,b]"
            )
        if key == "preset":
            layers.extend(preset_layers(value))
        elif key == "updater":
            items.append(("the command line", _parse_item("updaters", f"[{value}]")))
        else:
            items.append(("the command line", _parse_item(key, value)))
    for source, layer in [*layers, *items]:  # one item at a time: errors name its key
        try:
            merged = OmegaConf.merge(cfg, layer)
        except (OmegaConfBaseException, TypeError, ValueError) as err:
            raise friendly(err, source, layer, cfg) from None
        assert isinstance(merged, DictConfig)
        cfg = merged
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        key = str(getattr(err, "full_key", None) or "?")
        first = str(getattr(err, "msg", None) or err).splitlines()[0]
        raise ConfigError(
            f"{key}: got {_raw(cfg, key)!r}, expected a value or an interpolation that resolves "
            f"({first}); set e.g. {example(key, schema())}",
            key=key,
        ) from None
    check_flat_lists(cfg)
    for name in cfg.updaters:
        get_updater(name)  # unknown updater names fail here, with the list of valid ones
    if cfg.objective:
        get_problem(cfg.objective)
    return cfg  # type: ignore[return-value]


def variant_configs(
    argv: list[str], defaults: dict[str, Any] | None, cfg: DictConfig
) -> list[tuple[str, DictConfig]]:
    """``(variant, config)`` per entry of ``cfg.variants``, its overrides applied after
    ``argv``; ``[("", cfg)]`` without variants.

    Raises:
        ConfigError: a variant that does not split into ``key=value`` items or holds a bad one
            (the message says which variant).
    """
    out = []
    for i, variant in enumerate(cfg.variants):
        try:
            extra = shlex.split(variant)
        except ValueError as err:
            raise ConfigError(
                f"variants[{i}]: got {variant!r}, which does not split into key=value items "
                f"({err}); close its quotes, e.g. variants=['rounds=50 seed=1']",
                key="variants",
            ) from None
        try:
            out.append((variant, load_config([*argv, *extra], defaults)))
        except ConfigError as err:
            raise err.within(f"variants[{i}] {variant!r}") from None
    return out or [("", cfg)]


def updater_hparams(cfg: DictConfig, name: str) -> Hparams:
    """Build (and range-check) the hyperparameter dataclass of updater ``name``."""
    cls = get_updater(name).hparams_cls
    values = OmegaConf.to_container(cfg[name], resolve=True)
    assert isinstance(values, dict)
    try:
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})
    except ConfigError as err:
        raise err.under(name) from None


def problem_name(cfg: DictConfig, updater: str) -> str:
    """The problem updater ``updater`` trains on: the run's ``objective`` or, when it names
    none, the updater's default problem (empty: plain empirical risk)."""
    return str(cfg.objective) or get_updater(updater).default_problem


def problem_params(cfg: DictConfig, name: str) -> ProblemParams:
    """Build (and range-check) the parameters of problem ``name`` from its config node."""
    cls = get_problem(name).params_cls
    values = OmegaConf.to_container(cfg[name], resolve=True)
    assert isinstance(values, dict)
    try:
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})
    except ConfigError as err:
        raise err.under(name) from None
