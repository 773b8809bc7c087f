"""The range checks of :mod:`lit_fedco.core.ranges`: each bound accepted, each value past it
refused in its exact line, and the module importable without torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lit_fedco.core import ranges
from lit_fedco.core.errors import ConfigError

MOST = 4 * (os.cpu_count() or 1)


def _message(call, *args) -> str:
    with pytest.raises(ConfigError) as err:
        call(*args)
    return str(err.value)


def test_the_limit_is_four_jobs_per_core():
    assert ranges.per_core_limit() == MOST


@pytest.mark.parametrize(
    ("call", "args"),
    [
        (ranges.check_cohort, (1, 10)),
        (ranges.check_cohort, (10, 10)),
        (ranges.check_threads, (0,)),
        (ranges.check_threads, (MOST,)),
        (ranges.check_jobs, (1,)),
        (ranges.check_jobs, (MOST,)),
        (ranges.check_fraction, ("failures.drop", 0)),
        (ranges.check_fraction, ("failures.drop", 1.0)),
        (ranges.check_fraction, ("failures.partial", 0.5)),
        (ranges.check_drop, (0.99,)),
        (ranges.check_drop, (0.0,)),
    ],
)
def test_each_bound_is_accepted(call, args):
    call(*args)


def test_cohort_outside_one_to_k_is_refused():
    line = (
        "cohort: got {}, expected an int in [1, 10] (K = 10; with another data.num_clients, "
        "set cohort too); set e.g. cohort=10"
    )
    assert _message(ranges.check_cohort, 0, 10) == line.format(0)
    assert _message(ranges.check_cohort, 11, 10) == line.format(11)


def test_threads_and_jobs_past_the_cores_are_refused():
    assert _message(ranges.check_threads, MOST + 1) == (
        f"threads: got {MOST + 1}, expected an int in [0, {MOST}] (0: the cores shared out; "
        f"at most 4 per CPU core, {os.cpu_count()} here); set e.g. threads=1"
    )
    assert _message(ranges.check_threads, -1).startswith("threads: got -1, expected an int in [0")
    assert _message(ranges.check_jobs, 0) == (
        f"jobs: got 0, expected an int in [1, {MOST}]; set e.g. jobs=2"
    )
    assert _message(ranges.check_jobs, MOST + 1).startswith(f"jobs: got {MOST + 1}, expected")


@pytest.mark.parametrize("value", [-0.5, 1.5, True, "0.1", None])
def test_a_fraction_outside_zero_to_one_or_not_a_number_is_refused(value):
    assert _message(ranges.check_fraction, "failures.partial", value) == (
        f"failures.partial: got {value!r}, expected a float in [0, 1]; set e.g. "
        "failures.partial=0.1"
    )


@pytest.mark.parametrize("drop", [1, 1.0])
def test_dropping_every_client_is_refused_as_a_float(drop):
    assert _message(ranges.check_drop, drop) == (
        "failures.drop: got 1.0, expected a float in [0, 1) (at 1 every client drops out of "
        "every round and nothing is trained); set e.g. failures.drop=0.2"
    )


def test_the_module_imports_no_torch():
    code = "import sys, lit_fedco.core.ranges; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
