"""Problems: everything about a task that depends on its data (the documentation's hooks
reference: an objective holds the mathematics, a problem says which objective each
composition gets).

An :class:`~lit_fedco.objectives.Objective` is the mathematics an updater differentiates. A
:class:`Problem` is the task around it, chosen by the config key ``objective`` (or an updater's
``default_problem``), with its parameters as a frozen dataclass under its name:

- which objective each updater gets (:meth:`Problem.objectives`, keyed by composition), and
  the model's output size;
- how minibatches are drawn (:meth:`Problem.sampler`: positives in every batch, few-shot
  tasks) and which conditional samples are added to them (:meth:`Problem.augment`);
- how clients are evaluated: outputs (:meth:`Problem.eval_outputs`), extra metrics, and the
  adaptation each client makes before it is scored (personalised FL).

:class:`Classification` is the plain task: empirical risk, per-client accuracy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.ranges import Bound, check_bounds
from lit_fedco.data import BatchSampler, FederatedData
from lit_fedco.objectives.base import Batch, Objective, Params


@dataclass(frozen=True)
class ProblemParams:
    """Parameters of a :class:`Problem` (its config node, under the problem's name)."""

    def __post_init__(self) -> None:
        self.validate()

    bounds: ClassVar[dict[str, Bound]] = {}
    """The numeric range of each key (:class:`~lit_fedco.core.ranges.Bound`), checked when the
    dataclass is built and, for the problems lit_fedco ships, before torch is imported."""

    def validate(self) -> None:
        """Check the :attr:`bounds`; raise :class:`ConfigError` naming the key. Extend in
        subclasses with checks a range cannot say (``self.require``)."""
        check_bounds(self)

    def require(self, field: str, ok: bool, expected: str, example: str) -> None:
        """Raise a :class:`ConfigError` for ``field`` unless ``ok``."""
        if not ok:
            raise ConfigError.bad_value(field, getattr(self, field), expected, example)


class Problem:
    """A task: the objectives it offers, one per composition, and what depends on its data.

    Different updaters train different objectives of the same task (FCSG the conditional AP
    surrogate, FedAvg cross-entropy, CODA+ the min-max AUC loss) and are evaluated the same
    way. An updater gets the first composition of its ``compositions`` that the problem offers
    (:meth:`objective_for`).

    Args:
        params: an instance of :attr:`params_cls`.
        data: the federated data (e.g. for the positive ratio).
    """

    name: ClassVar[str] = ""
    params_cls: ClassVar[type[ProblemParams]] = ProblemParams
    offers: ClassVar[tuple[str, ...]] = ("erm",)
    """The compositions :meth:`objectives` offers, in its order; the first is the problem's own
    (the one its recipe is about), which the table and ``--help`` name next to what each
    updater trains (read without building a model; ``tests/updaters/test_updaters.py`` checks
    it)."""
    eval_adapt_steps: int = 0
    """Adaptation steps each client takes on its own support rows before it is evaluated
    (:meth:`adapt_for_eval`); 0: every client is evaluated with the shared model."""
    eval_support: int = 0
    """Rows of a client's training data in its fixed evaluation support batch (0: the run's
    batch size)."""

    def __init__(self, params: ProblemParams, data: FederatedData) -> None:
        self.params = params
        self.data = data

    # ------------------------------------------------------------------ objectives
    def num_outputs(self) -> int:
        """The model's output size; the number of classes by default."""
        return self.data.num_classes

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        """The objectives of this task keyed by composition (``"conditional"``, ``"erm"``...)."""
        return {"erm": Objective(model)}

    @classmethod
    def known_offers(cls) -> tuple[str, ...] | None:
        """:attr:`offers`, where it was declared for this class's :meth:`objectives` (by the
        class that defines them or a subclass of it); None for a problem that overrides
        :meth:`objectives` without declaring what they offer."""
        declared = next(c for c in cls.__mro__ if "offers" in c.__dict__)
        defined = next(c for c in cls.__mro__ if "objectives" in c.__dict__)
        return cls.offers if issubclass(declared, defined) else None

    def objective_for(self, compositions: tuple[str, ...], model: nn.Module) -> Objective:
        """The objective for an updater accepting ``compositions`` (in its order of preference)."""
        offered = self.objectives(model)
        known = self.known_offers()
        if known is not None and tuple(offered) != known:
            raise TypeError(
                f"{type(self).__qualname__}.offers is {known}, but its objectives() offer "
                f"{tuple(offered)}: make them agree"
            )
        for comp in compositions:
            if comp in offered:
                return offered[comp]
        raise ConfigError(
            f"objective={self.name or 'none'} offers {sorted(offered)}, but the updater needs one "
            f"of {list(compositions)}; run it with another objective or drop it from updaters"
        )

    # ------------------------------------------------------------------ minibatches
    def sampler(self, objective: Objective, data: FederatedData, seed: int) -> BatchSampler:
        """How ``objective``'s minibatches are drawn from ``data``: plain per-client minibatches
        seeded by (seed, client, round) by default."""
        return BatchSampler(data, seed)

    def draws_conditional(self, objective: Objective) -> bool:
        """Whether :meth:`augment` adds conditional samples to ``objective``'s batches (the
        loop then passes each client's generator)."""
        return False

    def augment(
        self, objective: Objective, batch: Batch, generators: list[torch.Generator]
    ) -> Batch:
        """Add samples drawn conditionally on the batch (FCSG's η | ξ), outside vmap.

        ``batch`` holds every client of this process stacked (``[n, b, ...]``); generator i is
        client i's for this round, seeded by (seed, client, round), so the draws do not depend
        on how clients are spread over processes. Identity by default.
        """
        return batch

    # ------------------------------------------------------------------ evaluation
    def eval_outputs(
        self,
        objective: Objective,
        params: Params,
        data: tuple[Tensor, Tensor],
        rows: Tensor,
        owner: Tensor,
        chunk: int,
        seed: int,
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``(logits, targets, client)`` chunks for the evaluation of rows ``rows`` of
        ``data = (x_all, y_all)`` (``owner``: the client of each row). By default the model's
        prediction on each row; the few-shot task adapts on sampled support sets first."""
        x_all, y_all = data
        for i in range(0, len(rows), chunk):
            r = rows[i : i + chunk]
            yield objective.predict(params, x_all[r]), y_all[r], owner[i : i + chunk]

    def adapt_for_eval(self, objective: Objective, params: Params, support: Batch) -> Params:
        """One client's parameters for evaluation after adapting on its ``support`` batch;
        ``params`` unchanged by default (see :attr:`eval_adapt_steps`)."""
        return params

    def eval_classes(self) -> int:
        """Columns of the logits :meth:`eval_outputs` yields (the data's classes by default;
        N for N-way tasks)."""
        return self.data.num_classes

    def eval_metrics(self) -> dict[str, Metric]:
        """Metrics evaluated beside per-client accuracy, logged as ``<split>/<name>``; each is
        updated with ``(logits, targets, client)`` and computes a scalar. None by default."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Logged with the run's config."""
        return {"problem": self.name, **dataclasses.asdict(self.params)}


class Classification(Problem):
    """The plain task when a run names no problem: empirical risk, per-client accuracy."""

    name = "classification"


_PROBLEMS: dict[str, type[Problem]] = {}


def register_problem(name: str):  # type: ignore[no-untyped-def]
    """Class decorator that registers a :class:`Problem` under ``name`` (config ``objective``)."""

    def deco(cls: type[Problem]) -> type[Problem]:
        if name in _PROBLEMS and _PROBLEMS[name] is not cls:
            raise ConfigError(f"problem name {name!r} is already registered; choose another")
        cls.name = name
        _PROBLEMS[name] = cls
        return cls

    return deco


def get_problem(name: str) -> type[Problem]:
    """The problem registered under ``name``."""
    if name not in _PROBLEMS:
        raise ConfigError.bad_value(
            "objective", name, f"one of {sorted(_PROBLEMS)} (or empty)", "invariant_logreg"
        )
    return _PROBLEMS[name]


def available_problems() -> list[str]:
    """Names of all registered problems."""
    return sorted(_PROBLEMS)
