"""The range checks of :mod:`lit_fedco.core.ranges`: each bound accepted, each value past it
refused in its exact line, and the module importable without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import ClassVar

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


@pytest.mark.parametrize(
    ("bound", "inside", "outside"),
    [
        (ranges.Bound("a float > 0", "1", gt=0), [1e-9, 5], [0, -1.0]),
        (ranges.Bound("an int >= 1", "1", ge=1), [1, 7], [0, -3]),
        (ranges.Bound("a float in (0, 1]", "1", gt=0, le=1), [0.5, 1.0], [0.0, 1.01]),
        (ranges.Bound("a float in [0, 1)", "0", ge=0, lt=1), [0, 0.99], [-0.01, 1]),
    ],
)
def test_a_bound_holds_inside_its_limits_only(bound, inside, outside):
    assert all(bound.holds(v) for v in inside)
    assert not any(bound.holds(v) for v in outside)
    assert not bound.holds("abc") and not bound.holds(None)  # not a number: outside
    assert bound.holds(True) == bound.holds(1) and bound.holds(False) == bound.holds(0)


def test_a_bound_refuses_in_the_line_of_a_bad_value_and_travels_as_a_catalog_check():
    bound = ranges.Bound("a float > 0 (γ)", "0.5", gt=0)
    assert _message(bound.check, "gamma", -2.0) == (
        "gamma: got -2.0, expected a float > 0 (γ); set e.g. gamma=0.5"
    )
    assert bound.as_check() == {"expected": "a float > 0 (γ)", "example": "0.5", "gt": 0}
    assert ranges.Bound(**bound.as_check()) == bound


def test_a_subclass_adds_to_its_bases_bounds_and_replaces_one():
    class Base:
        bounds: ClassVar[dict[str, ranges.Bound]] = {
            "a": ranges.Bound("an int >= 0", "0", ge=0),
            "b": ranges.Bound("x", "1", gt=0),
        }

    class Child(Base):
        bounds: ClassVar[dict[str, ranges.Bound]] = {
            "b": ranges.Bound("an int >= 5", "5", ge=5),
            "c": ranges.Bound("y", "1", lt=2),
        }

    declared = ranges.declared_bounds(Child)
    assert list(declared) == ["a", "b", "c"] and declared["b"].ge == 5

    class Params(Child):
        def __init__(self, a: int, b: int, c: int) -> None:
            self.a, self.b, self.c = a, b, c

    ranges.check_bounds(Params(0, 5, 1))
    assert _message(ranges.check_bounds, Params(0, 4, 1)).startswith(
        "b: got 4, expected an int >= 5"
    )
    assert _message(ranges.check_bounds, Params(-1, 4, 3)).startswith("a: got -1")  # bases' first


def test_a_field_named_bounds_declares_nothing():
    """A parameter dataclass of one's own may have a field called ``bounds`` (a tuple, say):
    it is not taken for declared ranges."""
    from dataclasses import dataclass

    from lit_fedco.updaters.hparams import Hparams

    @dataclass(frozen=True)
    class WithBounds(Hparams):
        bounds: tuple = (0.0, 1.0)  # type: ignore[assignment]

    assert WithBounds().bounds == (0.0, 1.0)
    assert list(ranges.declared_bounds(WithBounds)) == ["lr", "local_steps"]
    assert _message(lambda: WithBounds(lr=0)).startswith("lr: got 0")
