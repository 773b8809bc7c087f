"""Run configuration: dataclass defaults ← recipe defaults ← YAML preset ← ``key=value``.

Every key is typed by a dataclass (the run's :class:`RunConfig` and, under the updater's name,
each registered updater's hyperparameter dataclass), so unknown keys and values of the wrong
type are rejected with a message that names the key. Range checks run when the dataclasses are
built (:func:`updater_hparams`, :class:`~lit_fedco.loop.FederatedLoop`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from lit_fedco.errors import ConfigError
from lit_fedco.failures import Failures
from lit_fedco.problems import ProblemParams, available_problems, get_problem
from lit_fedco.updaters.base import Hparams, available_updaters, get_updater

PRESET_DIR = Path(__file__).resolve().parent.parent / "recipes"
"""Where bare preset names are looked up (the repository's ``recipes/``)."""


@dataclass
class DataConfig:
    """The data set and its federated split (``lit_fedco.data``).

    Attributes:
        name: ``digits`` (embedded, scikit-learn), ``mnist`` or ``fashion_mnist`` (local files),
            or a step-imbalanced ``digits_st``, ``cifar10_st``, ``cifar100_st``.
        data_dir: folder with the IDX files for mnist / fashion_mnist, or with
            ``cifar-10-batches-py/`` / ``cifar-100-python/`` for CIFAR.
        partition: ``quantity`` (ComFedL: one big client, K−1 small ones), ``iid``,
            ``dirichlet`` or ``dominant_class``.
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


@dataclass
class ModelConfig:
    """The network: ``logreg`` (multinomial logistic regression), ``mlp`` (tanh, ``hidden``),
    ``resnet20``, ``linear`` (a score without bias), ``cnn`` (a small CNN, ``hidden`` units) or
    ``conv4`` (MAML's four-layer CNN, ``hidden`` filters)."""

    name: str = "logreg"
    hidden: int = 64


@dataclass
class RunConfig:
    """A recipe's run: schedule, execution, tracking. Symbols as in ``ALGORITHMS.md``.

    Attributes:
        updaters: the algorithms to run, in order (``updater=NAME`` runs just one).
        seed: seeds model init, cohorts and minibatches; ``seeds`` runs several.
        seeds: run every updater once per seed and report mean ± std (overrides ``seed``).
        rounds: S. local_steps: I. cohort: m. batch_size: b. eval_every: E.
        executor: ``vectorized`` (vmap over clients) or ``sequential`` (a loop).
        chunk_size: clients per vmap call (0: all of a rank's cohort at once).
        dtype: ``float32`` or ``float64``.
        accelerator / devices / num_nodes / strategy: passed to ``lightning.fabric.Fabric``.
        tracking: any of ``wandb``, ``csv``; ``[none]`` logs nothing.
        out_dir: runs go to ``<out_dir>/<recipe>/<run_name>/`` (config, metrics, W&B runs,
            checkpoints, results; :mod:`lit_fedco.rundir`).
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
            ``invariant_logreg``, ``auprc``, ``maml``) whose objectives every updater trains,
            with its parameters under its name; empty: each updater's default problem
            (``client_dro`` for ComFedL, ``sample_dro`` for the FedDRO family, ``pfl`` for the
            MAML methods) or plain empirical risk.
        variants: run everything once per entry, each a space-separated list of
            ``key=value`` overrides applied after the command line (e.g.
            ``"invariant_logreg.m=100"``); empty: one run of the config as it is.
        failures: simulated client failures (:class:`~lit_fedco.failures.Failures`):
            ``failures.drop=p`` (a sampled client drops out before uploading) and
            ``failures.partial=p`` (a client completes only some of its local steps).
    """

    updaters: list[str] = field(default_factory=lambda: ["fedavg"])
    seed: int = 0
    seeds: list[int] = field(default_factory=list)
    rounds: int = 100
    local_steps: int = 5
    cohort: int = 10
    batch_size: int = 16
    eval_every: int = 10
    executor: str = "vectorized"
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


def _friendly(err: OmegaConfBaseException, source: str) -> ConfigError:
    key = getattr(err, "full_key", None) or "?"
    if isinstance(err, ConfigKeyError):
        parent, _, leaf = str(key).rpartition(".")
        node: Any = schema()
        for part in parent.split(".") if parent else []:
            node = node[part] if isinstance(node, DictConfig) and part in node else None
        valid = [str(k) for k in node] if isinstance(node, DictConfig) else []
        close = difflib.get_close_matches(leaf, valid, n=1)
        hint = f"did you mean {(parent + '.' if parent else '') + close[0]!r}? " if close else ""
        return ConfigError(
            f"{key}: unknown config key (from {source}); {hint}"
            f"valid keys{' under ' + parent if parent else ''}: {', '.join(valid)}",
            key=str(key),
        )
    if isinstance(err, ValidationError):
        first = str(getattr(err, "msg", err)).splitlines()[0]
        m = re.search(r"converted to (\w+)", first)
        expected = f"a value of type {m.group(1).lower()}" if m else first
        return ConfigError(
            f"{key}: got {getattr(err, 'value', None)!r} (from {source}), expected {expected}",
            key=str(key),
        )
    return ConfigError(f"{key}: {str(err).splitlines()[0]} (from {source})", key=str(key))


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
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"preset: {path} is not a readable YAML mapping ({first})") from None
    if not isinstance(layer, DictConfig):
        raise ConfigError(f"preset: {path} must hold a mapping of keys, got a list")
    base = layer.pop("extends", None)
    if base is None:
        return [(f"preset {path}", layer)]
    if not isinstance(base, str) or not base:
        raise ConfigError(
            f"extends: got {base!r} in preset {path}, expected the name of another preset "
            "(e.g. extends: comfedl_dro_mnist)"
        )
    return [*preset_layers(base, (*_seen, path)), (f"preset {path}", layer)]


def load_config(argv: list[str], defaults: dict[str, Any] | None = None) -> DictConfig:
    """Merge schema ← recipe ``defaults`` ← ``preset=...`` (and the presets it ``extends``) ←
    the other ``key=value`` items.

    ``updater=NAME`` is shorthand for ``updaters=[NAME]``.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, a malformed argument.
    """
    cfg = schema()
    layers: list[tuple[str, Any]] = []
    if defaults:
        layers.append(("the recipe's defaults", defaults))
    dotlist: list[str] = []
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(
                f"command line: got {arg!r}, expected key=value (e.g. rounds=50 or "
                "preset=comfedl_dro_mnist); list-valued keys take [a,b]"
            )
        key, value = arg.split("=", 1)
        key = key.lstrip("-")
        if key == "preset":
            layers.extend(preset_layers(value))
        elif key == "updater":
            dotlist.append(f"updaters=[{value}]")
        else:
            dotlist.append(f"{key}={value}")
    layers.append(("the command line", OmegaConf.from_dotlist(dotlist)))
    for source, layer in layers:
        try:
            merged = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as err:
            raise _friendly(err, source) from None
        assert isinstance(merged, DictConfig)
        cfg = merged
    for name in cfg.updaters:
        get_updater(name)  # unknown updater names fail here, with the list of valid ones
    if cfg.objective:
        get_problem(cfg.objective)
    return cfg  # type: ignore[return-value]


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
