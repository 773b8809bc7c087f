"""The vectorized and the sequential executor give the same numbers (float64, rtol 1e-10)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_fedco.core.errors import ConfigError
from lit_fedco.engine.executors import (
    SEQUENTIAL_ON_CPU,
    choose_executor,
    make_executor,
)
from tests.helpers import assert_executors_agree, flat_server, make_loop

TOL = 1e-10  # float64; the two differ only in the order of batched floating-point sums


@pytest.mark.parametrize(
    "name,hparams,problem",
    [
        ("fedavg", {"lr": 0.1}, None),
        ("comfedl", {"lr": 0.05}, {"gamma": 0.5, "form": "stable"}),
        ("comfedl", {"lr": 0.005}, {"gamma": 1.0, "form": "literal"}),
    ],
)
def test_vectorized_equals_sequential(name, hparams, problem):
    assert_executors_agree(name, hparams, problem=problem)


def test_chunked_vectorized_equals_unchunked():
    a = make_loop("comfedl", {"lr": 0.05}, executor="vectorized")
    a.run()
    b = make_loop("comfedl", {"lr": 0.05}, executor="vectorized")
    b.executor.chunk_size = 3  # 4 cohort clients → chunks of 3 and 1
    b.run()
    np.testing.assert_allclose(flat_server(a), flat_server(b), rtol=TOL, atol=TOL)


def test_step_synced_entries_agree_between_executors():
    """FedDRO averages y after every step: under both executors every client waits for the
    others at each step, so their numbers agree."""
    assert_executors_agree("feddro", {"lr": 0.05})


@pytest.mark.parametrize(
    "model,accelerator,expected",
    [
        ("resnet20", "cpu", "sequential"),
        ("cnn", "cpu", "vectorized"),
        ("conv4", "cpu", "vectorized"),
        ("logreg", "cpu", "vectorized"),
        ("mlp", "cpu", "vectorized"),
        ("resnet20", "gpu", "vectorized"),
        ("resnet20", "cuda", "vectorized"),
    ],
)
def test_auto_picks_the_executor_measured_faster(model, accelerator, expected):
    assert choose_executor("auto", model, accelerator) == expected
    for name in ("vectorized", "sequential"):  # a named executor is never overridden
        assert choose_executor(name, model, accelerator) == name


def test_auto_on_an_auto_accelerator_follows_the_visible_device():
    expected = "vectorized" if torch.cuda.is_available() else "sequential"
    assert choose_executor("auto", "resnet20", "auto") == expected
    assert choose_executor("auto", "conv4", "auto") == "vectorized"


def test_every_model_auto_runs_sequentially_is_a_known_model():
    from lit_fedco.core.models import build_model

    for name in SEQUENTIAL_ON_CPU:
        assert build_model(name, (3, 32, 32), 10, 0) is not None


def test_an_unknown_executor_names_the_choices():
    with pytest.raises(ConfigError, match=r"executor.*'loop'.*auto.*sequential.*vectorized"):
        make_executor("loop")


def test_auto_runs_sequentially_where_an_updater_cannot_be_vmapped_on_the_model():
    """ComFedL-(DA)MAML and FedMAML take a vjp of a gradient through conv4's batch-statistics
    batch norm, which vmap refuses: ``auto`` runs them sequentially there, on any device."""
    from lit_fedco.updaters import get_updater

    for name in ("comfedl_maml", "comfedl_damaml", "fedmaml"):
        cls = get_updater(name)
        for accelerator in ("cpu", "gpu"):
            assert choose_executor("auto", "conv4", accelerator, [cls]) == "sequential"
        assert choose_executor("auto", "mlp", "cpu", [cls]) == "vectorized"  # no batch norm
    for name in ("fcsg", "fedavg", "tr_maml", "ditto"):  # grad of grad: vmappable on conv4
        assert choose_executor("auto", "conv4", "cpu", [get_updater(name)]) == "vectorized"
    mixed = [get_updater("fedavg"), get_updater("fedmaml")]
    assert choose_executor("auto", "conv4", "cpu", mixed) == "sequential"  # one run, one choice
    assert choose_executor("vectorized", "conv4", "cpu", mixed) == "vectorized"  # as asked
