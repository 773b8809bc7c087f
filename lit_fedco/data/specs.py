"""Typed, validated data specs: one frozen dataclass per builder, holding the keys it reads.

The run's ``data`` config node (:class:`lit_fedco.data.config.DataConfig`) holds and describes
the keys of every data set; each builder reads only some of them. A spec names exactly those, so
a builder cannot read a key it does not declare, a missing key fails when the spec is made (not
halfway through building), and every range check runs before any file is read — the first error
a user sees is the one-line :class:`~lit_fedco.core.errors.ConfigError`, not a traceback from
deep inside a reader. A spec's field is the ``data.*`` key of its name; its docstring documents
only what ``DataConfig`` does not say (the seed's use, a narrower range, the paper's values).

:meth:`DataSpecBase.of` converts any object with the attributes (``DataConfig`` plus ``seed``,
a ``SimpleNamespace``) into a spec, so callers keep passing what they have always passed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass
from typing import Any, TypeVar

from lit_fedco.core.errors import ConfigError
from lit_fedco.data import partition as P
from lit_fedco.data.names import VAL_MODES, is_function_ref

ST_SOURCES = ("digits_st", "cifar10_st", "cifar100_st")
"""Step-imbalanced sources (:class:`StepImbalancedSpec`)."""
ST_PARTITIONS = ("iid", "dirichlet")
"""Splits of a step-imbalanced pool."""
TASK_SOURCES = ("digits", "omniglot")
"""Sources of few-shot task data (``partition=classes``, :class:`TaskSpec`)."""
HELDOUT = ("test", "train")
"""Where the held-out (validation) rows come from: the source's test split, or a slice of its
training split (``data.heldout=train``: data to tune on that the test split never sees)."""


def _check_heldout(value: str) -> None:
    if value not in HELDOUT:
        raise ConfigError.bad_value("data.heldout", value, "'test' or 'train'", "train")


ADULT_PARTITIONS = ("iid", "dirichlet")
"""Splits of the Adult training rows (:class:`AdultSpec`)."""
ADULT_PROTECTED = ("sex", "race")
"""Protected attributes of ``adult`` (``data.protected``)."""

S = TypeVar("S", bound="DataSpecBase")


def _at_least_one(key: str, value: int, example: str) -> None:
    if value < 1:
        raise ConfigError.bad_value(key, value, "an int >= 1", example)


@dataclass(frozen=True)
class DataSpecBase:
    """The conversion every spec shares."""

    @classmethod
    def of(cls: type[S], spec: object) -> S:
        """``spec`` itself if it is already a ``cls``, else a ``cls`` from its attributes.

        Attributes the spec does not declare are ignored (a ``DataConfig`` holds the keys of
        every data set); a field with a default may be absent.

        Raises:
            TypeError: ``spec`` lacks a field that has no default.
            ConfigError: a value out of range (the spec's ``__post_init__``).
        """
        if isinstance(spec, cls):
            return spec
        values, missing = {}, []
        for f in dataclasses.fields(cls):
            if hasattr(spec, f.name):
                values[f.name] = getattr(spec, f.name)
            elif f.default is MISSING:
                missing.append(f.name)
        if missing:
            raise TypeError(
                f"{cls.__name__}: the data spec has no {', '.join(missing)}; pass a "
                "DataConfig-like object with these attributes (and seed)"
            )
        return cls(**values)


@dataclass(frozen=True)
class PartitionedSpec(DataSpecBase):
    """A real source (``digits``, ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``), a
    reader of one's own files (``npz``, ``imagefolder``, ``hf_disk``, ``text``;
    :mod:`lit_fedco.data.readers`) or a data function of one's own (``module:function``;
    :mod:`lit_fedco.data.user`), split over the clients by a partitioner
    (:mod:`lit_fedco.data.partition`). Its other fields: the ``data.*`` keys of their names
    (:class:`~lit_fedco.data.config.DataConfig`).

    Attributes:
        seed: the run's seed; the partition's generator is named (seed, 12345).
        params: a data function's parameters (its ``Params`` dataclass, built from the
            ``data.<field>`` keys), None for every other source.
    """

    name: str
    data_dir: str
    partition: str
    num_clients: int
    big: int
    small: int
    small_classes: int
    alpha: float
    rho: float
    val_per_client: int
    seed: int
    val_mode: str = "client"
    binary: bool = False
    drop_positive: float = 0.0
    shards_per_client: int = 2
    size_sigma: float = 1.0
    image_size: int = 0
    seq_len: int = 80
    seq_stride: int = 1
    feature_column: str = "image"
    label_column: str = "label"
    group_column: str = ""
    params: Any = None
    heldout: str = "test"

    def __post_init__(self) -> None:
        _check_heldout(self.heldout)
        if self.partition not in P.PARTITIONS:
            raise ConfigError.bad_value(
                "data.partition", self.partition, f"one of {P.PARTITIONS}", "quantity"
            )
        _at_least_one("data.val_per_client", self.val_per_client, "100")
        if self.val_mode not in VAL_MODES:
            raise ConfigError.bad_value("data.val_mode", self.val_mode, f"one of {VAL_MODES}",
                                        "all")  # fmt: skip
        if self.val_mode == "own" and self.partition != "natural":
            raise ConfigError(
                f"data.val_mode: got 'own', which needs data.partition=natural (a client per "
                f"group id, evaluated on its group's test rows), got data.partition="
                f"{self.partition}; set data.partition=natural or data.val_mode=client",
                key="data.val_mode",
            )
        if self.image_size < 0:
            raise ConfigError.bad_value(
                "data.image_size", self.image_size, "an int >= 0 (0: the size as read)", "28"
            )
        _at_least_one("data.seq_len", self.seq_len, "80")
        _at_least_one("data.seq_stride", self.seq_stride, "1")
        if self.binary and not 0.0 <= self.drop_positive < 1.0:
            raise ConfigError.bad_value(
                "data.drop_positive", self.drop_positive, "a float in [0, 1)", "0.8"
            )


@dataclass(frozen=True)
class StepImbalancedSpec(DataSpecBase):
    """A step-imbalanced source (``digits_st``, ``cifar10_st``, ``cifar100_st``; FedDRO §6). Its
    other fields: the ``data.*`` keys of their names (:class:`~lit_fedco.data.config.DataConfig`).

    Attributes:
        name: one of :data:`ST_SOURCES`.
        partition: ``iid`` (the paper's equal split) or ``dirichlet``.
        seed: the run's seed; the imbalance and the split are drawn from (seed, 12345).
    """

    name: str
    data_dir: str
    partition: str
    num_clients: int
    alpha: float
    val_per_client: int
    seed: int
    imbalance_ratio: float = 10.0
    heldout: str = "test"

    def __post_init__(self) -> None:
        _check_heldout(self.heldout)
        # The builder has always read the ratio as a float (it is recorded in the stats).
        object.__setattr__(self, "imbalance_ratio", float(self.imbalance_ratio))
        if self.name not in ST_SOURCES:
            raise ConfigError.bad_value("data.name", self.name, f"one of {ST_SOURCES}", "digits_st")
        if not self.imbalance_ratio >= 1:
            raise ConfigError.bad_value(
                "data.imbalance_ratio",
                self.imbalance_ratio,
                "a float >= 1 (n_majority / n_minority)",
                "100",
            )
        if self.partition not in ST_PARTITIONS:
            raise ConfigError.bad_value(
                "data.partition",
                self.partition,
                f"one of {ST_PARTITIONS} for {self.name}",
                "iid",
            )
        _at_least_one("data.val_per_client", self.val_per_client, "100")


@dataclass(frozen=True)
class InvariantLogRegSpec(DataSpecBase):
    """The synthetic invariant logistic regression data (``invariant_logreg``, FCSG §5.1). Its
    other fields: the ``data.*`` keys of their names (:class:`~lit_fedco.data.config.DataConfig`).

    Attributes:
        num_clients: K (the paper: 16).
        val_per_client: test samples per client (the paper: 16 · 3125 = 50000 in all).
        seed: the run's seed; x* and every sample are drawn from (seed, 0x1A7).
    """

    num_clients: int
    dim: int
    sigma1: float
    train_per_client: int
    val_per_client: int
    seed: int

    def __post_init__(self) -> None:
        _at_least_one("data.num_clients", self.num_clients, "16")
        _at_least_one("data.dim", self.dim, "16")
        _at_least_one("data.train_per_client", self.train_per_client, "16")
        _at_least_one("data.val_per_client", self.val_per_client, "16")
        if not self.sigma1 > 0:
            raise ConfigError.bad_value("data.sigma1", self.sigma1, "a float > 0", "1.0")


@dataclass(frozen=True)
class TaskSpec(DataSpecBase):
    """Few-shot task data (``partition=classes`` on ``digits`` or ``omniglot``, FCSG §5.2). Its
    other fields: the ``data.*`` keys of their names (:class:`~lit_fedco.data.config.DataConfig`).

    Attributes:
        name: one of :data:`TASK_SOURCES`.
        data_dir: the Omniglot folder (unused by ``digits``).
        seed: the run's seed; classes are dealt by a generator named (seed, 12345).
    """

    name: str
    data_dir: str
    num_clients: int
    rotations: int
    classes_per_client: int
    heldout_classes: int
    seed: int

    def __post_init__(self) -> None:
        if self.name not in TASK_SOURCES:
            raise ConfigError.bad_value(
                "data.name", self.name, f"one of {TASK_SOURCES} with partition=classes", "digits"
            )
        if self.name == "digits" and not 1 <= self.heldout_classes <= 9:
            raise ConfigError.bad_value(
                "data.heldout_classes", self.heldout_classes, "an int in [1, 9]", "3"
            )
        if self.rotations not in (1, 2, 3, 4):
            raise ConfigError.bad_value("data.rotations", self.rotations, "1, 2, 3 or 4", "4")
        _at_least_one("data.num_clients", self.num_clients, "16")


@dataclass(frozen=True)
class AdultSpec(DataSpecBase):
    """UCI Adult (``adult``; FedDRO §6, fairness), read by :mod:`lit_fedco.data.adult`. Its
    other fields: the ``data.*`` keys of their names (:class:`~lit_fedco.data.config.DataConfig`).

    Attributes:
        partition: ``iid`` (the paper's equal split) or ``dirichlet``.
        num_clients: K (the paper: 8).
        seed: the run's seed; the split is drawn from (seed, 12345).
        protected: its group id is the targets' second column.
    """

    data_dir: str
    partition: str
    num_clients: int
    alpha: float
    seed: int
    protected: str = "sex"

    def __post_init__(self) -> None:
        if self.partition not in ADULT_PARTITIONS:
            raise ConfigError.bad_value(
                "data.partition", self.partition, f"one of {ADULT_PARTITIONS} for adult", "iid"
            )
        if self.protected not in ADULT_PROTECTED:
            raise ConfigError.bad_value(
                "data.protected", self.protected, f"one of {ADULT_PROTECTED}", "sex"
            )
        _at_least_one("data.num_clients", self.num_clients, "8")


DataSpec = PartitionedSpec | StepImbalancedSpec | InvariantLogRegSpec | TaskSpec | AdultSpec
"""Every typed data spec."""


def _function_spec(spec: object, name: str) -> PartitionedSpec:
    """The spec of a data function ``module:function``: imported, its parameters built from
    ``spec``'s ``data.<field>`` attributes (their defaults where absent)."""
    from lit_fedco.data.user import function_params, resolve_function

    fn = resolve_function(name)
    own = {f.name for f in dataclasses.fields(PartitionedSpec)}
    params = function_params(fn, name, spec, own)
    return dataclasses.replace(PartitionedSpec.of(spec), params=params)


def data_spec(spec: object) -> DataSpec:
    """The typed, validated spec of the data set that a ``DataConfig``-like ``spec`` describes.

    Which one is decided by ``name`` and ``partition`` (the order matters: a ``*_st`` source is
    step-imbalanced whatever its ``partition``):

    - ``name`` ending in ``_st`` → :class:`StepImbalancedSpec`;
    - ``name == "invariant_logreg"`` → :class:`InvariantLogRegSpec`;
    - ``name == "adult"`` → :class:`AdultSpec`;
    - ``partition == "classes"`` → :class:`TaskSpec`;
    - otherwise → :class:`PartitionedSpec` (for a data function ``module:function``, its
      module imported and its parameters built).

    Cheap (it reads no file), so a runner can check the data config before starting any
    process.

    Args:
        spec: any object with the ``data`` config's attributes plus ``seed``, or a typed spec
            (returned as it is).

    Raises:
        ConfigError: a value out of range. TypeError: a missing attribute.
    """
    if isinstance(
        spec, PartitionedSpec | StepImbalancedSpec | InvariantLogRegSpec | TaskSpec | AdultSpec
    ):
        return spec
    name = getattr(spec, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"data spec: expected an object with a str attribute name, got {spec!r}")
    heldout = getattr(spec, "heldout", "test")
    kind = "few-shot" if getattr(spec, "partition", None) == "classes" else name
    if heldout != "test" and (name in ("invariant_logreg", "adult") or kind == "few-shot"):
        raise ConfigError.bad_value(
            "data.heldout",
            heldout,
            f"'test' for {kind} data (only partitioned and *_st sources "
            "hold out a slice of their training split; tuning on these: tune.heldout=test)",
            "test",
        )
    if name.endswith("_st"):
        return StepImbalancedSpec.of(spec)
    if name == "invariant_logreg":  # FCSG §5.1, synthetic
        return InvariantLogRegSpec.of(spec)
    if name == "adult":  # FedDRO §6, fairness
        return AdultSpec.of(spec)
    if getattr(spec, "partition", None) == "classes":  # few-shot tasks from a client's classes
        return TaskSpec.of(spec)
    if is_function_ref(name):
        return _function_spec(spec, name)
    return PartitionedSpec.of(spec)
