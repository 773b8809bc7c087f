"""Typed data specs: conversion from the runner's namespace, defaults, and the same one-line
ConfigErrors as before, raised before any file is read."""

from __future__ import annotations

import dataclasses
import importlib
import re
from types import SimpleNamespace

import pytest

from lit_fedco.core.errors import ConfigError
from lit_fedco.data import data_spec, make_federated
from lit_fedco.data.config import DataConfig
from lit_fedco.data.specs import (
    AdultSpec,
    InvariantLogRegSpec,
    PartitionedSpec,
    StepImbalancedSpec,
    TaskSpec,
)

RECIPES = {
    "comfedl_dro": PartitionedSpec,
    "comfedl_maml": PartitionedSpec,
    "ds_feddro": StepImbalancedSpec,
    "fcsg_auprc": PartitionedSpec,
    "fcsg_invariant": InvariantLogRegSpec,
    "fcsg_maml": TaskSpec,
    "feddro": StepImbalancedSpec,  # ds_feddro's data
}


def config(**kw) -> SimpleNamespace:
    """What the runner passes: every DataConfig key plus the seed."""
    return SimpleNamespace(**{**dataclasses.asdict(DataConfig()), **kw, "seed": 0})


@pytest.mark.parametrize("recipe,cls", sorted(RECIPES.items()))
def test_every_recipe_default_becomes_its_builders_spec(recipe, cls):
    defaults = importlib.import_module(f"lit_fedco.recipes.{recipe}").DEFAULTS
    spec = data_spec(config(**defaults.get("data", {})))
    assert type(spec) is cls
    for f in dataclasses.fields(spec):
        if f.name == "params":  # a data function's parameters: None for the built-in sources
            assert spec.params is None
            continue
        want = defaults.get("data", {}).get(f.name, getattr(DataConfig(), f.name, 0))
        assert getattr(spec, f.name) == want, f.name


@pytest.mark.parametrize(
    "cls", [PartitionedSpec, StepImbalancedSpec, InvariantLogRegSpec, TaskSpec, AdultSpec]
)
def test_a_specs_fields_are_the_data_keys_that_data_config_describes(cls):
    """A spec's docstring leaves its keys to DataConfig's: each field but the seed (and a data
    function's params) is a data.* key, with DataConfig's default where the spec has one."""
    keys = {f.name: f.default for f in dataclasses.fields(DataConfig)}
    for f in dataclasses.fields(cls):
        if f.name in ("seed", "params"):
            assert f"{f.name}:" in (cls.__doc__ or ""), f"{cls.__name__}.{f.name}"
            continue
        assert f.name in keys, f"{cls.__name__}.{f.name} is no DataConfig key"
        if f.default is not dataclasses.MISSING:
            assert f.default == keys[f.name], f"{cls.__name__}.{f.name}"


def test_of_reads_only_its_keys_and_fills_optional_ones():
    ns = SimpleNamespace(
        name="digits", data_dir="", partition="iid", num_clients=4, big=1, small=1,
        small_classes=0, alpha=0.5, rho=0.28, val_per_client=10, seed=3, unrelated="x",
    )  # fmt: skip
    spec = PartitionedSpec.of(ns)
    assert spec.seed == 3 and spec.val_mode == "client" and not spec.binary
    assert spec.drop_positive == 0.0 and not hasattr(spec, "unrelated")
    assert PartitionedSpec.of(spec) is spec and data_spec(spec) is spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 4  # type: ignore[misc]
    del ns.alpha, ns.seed
    with pytest.raises(TypeError, match="no alpha, seed"):
        PartitionedSpec.of(ns)


def test_step_imbalanced_ratio_is_a_float_with_the_old_default():
    ns = SimpleNamespace(
        name="digits_st", data_dir="", partition="iid", num_clients=4, alpha=0.5,
        val_per_client=20, seed=0,
    )  # fmt: skip
    assert StepImbalancedSpec.of(ns).imbalance_ratio == 10.0
    ns.imbalance_ratio = 4
    spec = StepImbalancedSpec.of(ns)
    assert isinstance(spec.imbalance_ratio, float) and spec.imbalance_ratio == 4.0
    assert make_federated(spec).stats["imbalance_ratio"] == 4.0


def message(key: str, value: object, expected: str, example: str) -> str:
    return re.escape(f"{key}: got {value!r}, expected {expected}; set e.g. {key}={example}")


PARTITIONS = (
    "one of ('quantity', 'iid', 'dirichlet', 'dominant_class', 'shards', 'size_skew', 'natural')"
)
BAD = [
    ({"partition": "bogus"}, message("data.partition", "bogus", PARTITIONS, "quantity")),
    ({"val_per_client": 0}, message("data.val_per_client", 0, "an int >= 1", "100")),
    ({"val_mode": "x"}, message("data.val_mode", "x", "one of ('client', 'all', 'own')", "all")),
    (
        {"binary": True, "drop_positive": 1.0},
        message("data.drop_positive", 1.0, "a float in [0, 1)", "0.8"),
    ),
    (
        {"name": "mnist_st"},
        message(
            "data.name",
            "mnist_st",
            "one of ('digits_st', 'cifar10_st', 'cifar100_st')",
            "digits_st",
        ),
    ),
    (
        {"name": "cifar10_st", "imbalance_ratio": 0.5},  # data_dir is empty: not read
        message("data.imbalance_ratio", 0.5, "a float >= 1 (n_majority / n_minority)", "100"),
    ),
    (
        {"name": "digits_st", "partition": "quantity"},
        message("data.partition", "quantity", "one of ('iid', 'dirichlet') for digits_st", "iid"),
    ),
    ({"name": "invariant_logreg", "dim": 0}, message("data.dim", 0, "an int >= 1", "16")),
    (
        {"name": "invariant_logreg", "sigma1": 0.0},
        message("data.sigma1", 0.0, "a float > 0", "1.0"),
    ),
    (
        {"name": "mnist", "partition": "classes"},
        message(
            "data.name", "mnist", "one of ('digits', 'omniglot') with partition=classes", "digits"
        ),
    ),
    (
        {"partition": "classes", "heldout_classes": 0},
        message("data.heldout_classes", 0, "an int in [1, 9]", "3"),
    ),
    (
        {"name": "omniglot", "partition": "classes", "rotations": 5},
        message("data.rotations", 5, "1, 2, 3 or 4", "4"),
    ),
    (
        {"partition": "classes", "num_clients": 0},
        message("data.num_clients", 0, "an int >= 1", "16"),
    ),
]


@pytest.mark.parametrize("overrides,match", BAD)
def test_bad_values_raise_the_same_config_errors_before_reading_files(overrides, match):
    with pytest.raises(ConfigError, match=f"^{match}$"):
        data_spec(config(**overrides))
    with pytest.raises(ConfigError, match=f"^{match}$"):
        make_federated(config(**overrides))
