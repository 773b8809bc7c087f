"""The range checks made twice on a run's settings: before torch is imported
(:func:`lit_fedco.config.early.check_ranges`) and by the full checks (the loop's schedule, the
failures, the run's and the pool's checks), each written once here so both refuse a value in
the same line.

Hyperparameters and problem parameters declare their numeric ranges as :class:`Bound` values
(an ``Hparams`` or ``ProblemParams`` subclass's ``bounds``): their dataclass checks them when it
is built (:func:`check_bounds`), and the catalog carries them
(:func:`lit_fedco.config.schema.value_checks`) so that the command line refuses the same value
in the same words before torch is imported.

Imports: the standard library and :mod:`lit_fedco.core.errors`; never torch.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from lit_fedco.core.errors import ConfigError


@dataclass(frozen=True)
class Bound:
    """The range of a numeric config key: each limit given holds (``gt``: value > gt, ``ge``:
    value >= ge, ``lt``: value < lt, ``le``: value <= le).

    Attributes:
        expected: what the refusal says is expected (``"a float > 0 (γ)"``).
        example: a valid value, for the refusal's ``set e.g.`` (``"0.5"``).
        gt / ge / lt / le: the limits; None: that side is open.
    """

    expected: str
    example: str
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is a number within the limits (a bool counts as 0 or 1, as in a
        comparison; anything else that is not a number is outside)."""
        if not isinstance(value, int | float):
            return False
        return not (
            (self.gt is not None and not value > self.gt)
            or (self.ge is not None and not value >= self.ge)
            or (self.lt is not None and not value < self.lt)
            or (self.le is not None and not value <= self.le)
        )

    def check(self, key: str, value: Any) -> None:
        """Refuse ``value`` of ``key`` unless it :meth:`holds`.

        Raises:
            ConfigError: ``key: got VALUE, expected EXPECTED; set e.g. key=EXAMPLE``.
        """
        if not self.holds(value):
            raise ConfigError.bad_value(key, value, self.expected, self.example)

    def as_check(self) -> dict[str, Any]:
        """The bound as a catalog check (the limits given, ``expected`` and ``example``)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def declared_bounds(cls: type) -> dict[str, Bound]:
    """The :class:`Bound` of each key a parameter dataclass declares in ``bounds``, its bases'
    first (a subclass's bound of a key replaces its base's)."""
    out: dict[str, Bound] = {}
    for klass in reversed(cls.__mro__):
        declared = vars(klass).get("bounds")
        if isinstance(declared, dict):  # not a field of a plug-in's own that is named bounds
            out.update(declared)
    return out


def check_bounds(params: Any) -> None:
    """Every declared bound of dataclass instance ``params`` (:func:`declared_bounds`).

    Raises:
        ConfigError: the first key out of its range, named as the dataclass's field.
    """
    for key, bound in declared_bounds(type(params)).items():
        bound.check(key, getattr(params, key))


def per_core_limit() -> int:
    """The most ``jobs`` (and ``threads``) a run may ask for: 4 per CPU core of this machine."""
    return 4 * (os.cpu_count() or 1)


def check_cohort(cohort: int, k: int) -> None:
    """``cohort`` (m, the clients sampled a round) in [1, K].

    Args:
        cohort: the value of ``cohort``.
        k: K, the clients the data are split into (``data.num_clients``).

    Raises:
        ConfigError: naming ``cohort``.
    """
    if not 1 <= cohort <= k:
        raise ConfigError.bad_value(
            "cohort", cohort, f"an int in [1, {k}] (K = {k}; with another data.num_clients, set "
            "cohort too)", str(k),
        )  # fmt: skip


def check_threads(threads: int) -> None:
    """``threads`` in [0, :func:`per_core_limit`] (0: the cores shared out).

    Raises:
        ConfigError: naming ``threads``.
    """
    most = per_core_limit()
    if not 0 <= threads <= most:
        raise ConfigError.bad_value(
            "threads", threads, f"an int in [0, {most}] (0: the cores shared out; at most 4 per "
            f"CPU core, {os.cpu_count()} here)", "1",
        )  # fmt: skip


def check_jobs(jobs: int) -> None:
    """``jobs`` in [1, :func:`per_core_limit`].

    Raises:
        ConfigError: naming ``jobs``.
    """
    most = per_core_limit()
    if not 1 <= jobs <= most:
        raise ConfigError.bad_value("jobs", jobs, f"an int in [1, {most}]", "2")


def check_fraction(key: str, value: object) -> None:
    """A probability (``failures.drop``, ``failures.partial``): a number in [0, 1], not a bool.

    Args:
        key: the dotted key, as the message names it.
        value: its value.

    Raises:
        ConfigError: naming ``key``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError.bad_value(key, value, "a float in [0, 1]", "0.1")


def check_drop(drop: float) -> None:
    """``failures.drop`` below 1 for a run (at 1 nothing would be trained).

    Raises:
        ConfigError: naming ``failures.drop``.
    """
    if drop == 1:
        raise ConfigError.bad_value(
            "failures.drop", float(drop), "a float in [0, 1) (at 1 every client drops out of "
            "every round and nothing is trained)", "0.2",
        )  # fmt: skip
