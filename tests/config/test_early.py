"""The ranges :func:`lit_fedco.config.early.check_ranges` refuses before torch is imported are
refused by the full checks (the loop's schedule, the failures, the run's and the pool's checks)
in the same line: both paths run on each bad value and their lines are compared, so a path that
stops calling :mod:`lit_fedco.core.ranges` (or calls it on another value) fails here."""

from __future__ import annotations

import importlib

import pytest
from omegaconf import OmegaConf

from lit_fedco.config.early import check_ranges
from lit_fedco.config.load import load
from lit_fedco.config.parser import parse
from lit_fedco.core.errors import ConfigError
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.schedule import LoopConfig
from lit_fedco.experiment.checks import check_outputs, check_settings
from lit_fedco.experiment.pool import check_jobs

DEFAULTS = importlib.import_module("lit_fedco.recipes.comfedl_dro").DEFAULTS


def _cfg(*argv: str):
    return load(parse(list(argv), DEFAULTS))


def _message(call) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    return str(err.value)


@pytest.mark.parametrize(
    ("argv", "full"),
    [
        (["cohort=0"], lambda c: LoopConfig(cohort=c.cohort).validate(c.data.num_clients)),
        (["cohort=50"], lambda c: LoopConfig(cohort=c.cohort).validate(c.data.num_clients)),
        (["data.num_clients=5"], lambda c: LoopConfig(cohort=c.cohort).validate(5)),
        (["threads=-1"], check_outputs),
        (["threads=100000"], check_outputs),
        (["jobs=0"], lambda c: check_jobs(c, 1)),
        (["failures.drop=1.5"], lambda c: Failures(**OmegaConf.to_container(c.failures))),
        (["failures.partial=-0.5"], lambda c: Failures(**OmegaConf.to_container(c.failures))),
        (["failures.drop=1"], check_settings),
    ],
)
def test_an_early_refusal_is_the_full_checks_line(argv, full):
    cfg = _cfg(*argv)
    assert _message(lambda: check_ranges(cfg)) == _message(lambda: full(cfg))


def test_the_defaults_pass():
    check_ranges(_cfg())
