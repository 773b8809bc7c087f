"""Objectives: the functions an updater differentiates.

An objective is stateless and written for **one client** on explicit parameter dicts, so that
it can be vmapped over clients. A compositional objective exposes an inner map
``y = g(x; batch)`` and an outer function ``f(y; batch)``; ``value = f(g(x)) + h(x)``.
Where the composition lives (``ALGORITHMS.md``, "Problem families") is the class attribute
:attr:`Objective.composition`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from lit_fedco.errors import ConfigError
from lit_fedco.protocol import RoundContext

if TYPE_CHECKING:
    from torchmetrics import Metric

    from lit_fedco.data import BatchSampler, FederatedData

Batch = dict[str, Tensor]
"""One client's minibatch: ``{"x": inputs [b, ...], "y": targets [b]}``."""
Context = dict[str, Tensor]
"""Round-level values broadcast to every client (e.g. the log-space shift of the DRO weights)."""
Params = dict[str, Tensor]


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Per-sample cross-entropy (no reduction)."""
    return F.cross_entropy(logits, target, reduction="none")


class Objective:
    """Base class: plain empirical risk, ``g(x; B) = mean_i ℓ(x; ξ_i)`` (p = 1) and ``f(y) = y``.

    Args:
        model: the network, used only through :func:`torch.func.functional_call`.
        sample_loss: per-sample loss ``ℓ(logits, target) -> [b]``; cross-entropy by default.
    """

    composition: ClassVar[str] = "erm"
    """``"erm"``, ``"local"`` (ComFedL, FCSG), ``"distributed"`` (FedDRO) or ``"conditional"``."""
    inner_dim: ClassVar[int] = 1
    """p, the size of the inner value y (what FedDRO would communicate per step)."""
    outer_needs_batch: ClassVar[bool] = False
    """Whether ``outer`` reads a batch of its own (ComFedL's B̃); False for deterministic f."""
    has_augment: ClassVar[bool] = False
    """Whether :meth:`augment` draws conditional samples (the loop then passes generators)."""
    has_probe: ClassVar[bool] = False
    """Whether :meth:`probe` returns a value (the loop then runs it at the start of each round)."""
    eval_adapt_steps: int = 0
    """Adaptation steps each client takes on its own support rows before it is evaluated
    (personalised FL, :meth:`adapt_for_eval`); 0: every client is evaluated with the shared
    model."""
    eval_support: int = 0
    """Rows of a client's training data in its fixed evaluation support batch (0: the run's
    batch size)."""

    def __init__(
        self, model: nn.Module, sample_loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy
    ) -> None:
        self.model = model
        self.sample_loss = sample_loss

    def predict(self, params: Params, x: Tensor) -> Tensor:
        """The model's output for inputs ``x`` under parameters ``params``."""
        return functional_call(self.model, params, (x,))

    def losses(self, params: Params, batch: Batch) -> Tensor:
        """Per-sample losses ``ℓ(x; ξ_i)``, shape ``[b]``."""
        return self.sample_loss(self.predict(params, batch["x"]), batch["y"])

    def inner(self, params: Params, batch: Batch, ctx: Context) -> Any:
        """The inner map ``g(x; batch)``; here the mean loss."""
        return self.losses(params, batch).mean()

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """The outer function ``f(y)``; here the identity."""
        return y

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        """``f(g(x; B); B̃)`` on the step's batches (roles ``"inner"`` and, if used, ``"outer"``)."""
        y = self.inner(params, batches["inner"], ctx)
        return self.outer(y, batches.get("outer"), ctx)

    def augment(self, batch: Batch, generators: list[torch.Generator]) -> Batch:
        """Add samples drawn conditionally on the batch (FCSG's η | ξ), outside vmap.

        ``batch`` holds every client of this process stacked (``[n, b, ...]``); generator i is
        client i's for this round, seeded by (seed, client, round), so the draws do not depend
        on how clients are spread over processes. Identity by default.
        """
        return batch

    # Round-level hooks (see ComFedL's stable form). The default objective needs none.
    def probe(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """A per-client value at the broadcast point on the round's first batches (one per
        role), computed before the local steps; None: the objective needs none."""
        return None

    def round_context(self, probes: Tensor) -> RoundContext:
        """Round context from the cohort's probe values (a 1-D tensor, one per cohort client)."""
        return RoundContext()

    def client_weights(self, losses: Tensor) -> Tensor | None:
        """Implied client weights at per-client losses ``losses`` [K] (DRO objectives), or None."""
        return None

    # Data and evaluation hooks (FCSG's task and positive samplers, AP, MAML's adaptation).
    def make_sampler(self, data: FederatedData, seed: int) -> BatchSampler:
        """The minibatch sampler the loop draws with; plain per-client minibatches by default."""
        from lit_fedco.data import BatchSampler

        return BatchSampler(data, seed)

    def eval_outputs(
        self,
        params: Params,
        x_all: Tensor,
        y_all: Tensor,
        rows: Tensor,
        owner: Tensor,
        chunk: int,
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``(logits, targets, client)`` chunks for the evaluation of rows ``rows`` of
        ``x_all`` / ``y_all`` (``owner``: the client of each row). By default the model's
        prediction on each row; MAML adapts on sampled support sets first."""
        for i in range(0, len(rows), chunk):
            r = rows[i : i + chunk]
            yield self.predict(params, x_all[r]), y_all[r], owner[i : i + chunk]

    def adapt_for_eval(self, params: Params, support: Batch) -> Params:
        """One client's parameters for evaluation after adapting on its ``support`` batch;
        ``params`` unchanged by default (see :attr:`eval_adapt_steps`)."""
        return params

    def eval_classes(self, num_classes: int) -> int:
        """Columns of the logits :meth:`eval_outputs` yields (the data's classes by default;
        N for N-way tasks)."""
        return num_classes

    def eval_metrics(self) -> dict[str, Metric]:
        """Metrics evaluated beside per-client accuracy, logged as ``<split>/<name>``; each is
        updated with ``(logits, targets, client)`` and computes a scalar. None by default."""
        return {}

    def step_logs(self, y: Any, batches: dict[str, Batch], ctx: Context) -> dict[str, Tensor]:
        """Scalars worth logging for a compositional step taken at inner value ``y``: the loss
        ``{"loss": y}`` when the inner value is a loss (DRO), nothing otherwise."""
        return {"loss": y} if isinstance(y, Tensor) and y.dim() == 0 else {}

    def describe(self) -> dict[str, Any]:
        """What is logged with the run's config to say which form of the objective ran."""
        return {"objective": type(self).__name__}


def model_params(model: nn.Module, dtype: torch.dtype | None = None) -> Params:
    """Detached copies of a module's parameters as a plain dict (the ``x`` of the state)."""
    return {name: p.detach().clone().to(dtype or p.dtype) for name, p in model.named_parameters()}


# ---------------------------------------------------------------------- problems
@dataclass(frozen=True)
class ProblemParams:
    """Parameters of a :class:`Problem` (its config node, under the problem's name)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Range checks; raise :class:`ConfigError` naming the key. Extend in subclasses."""

    def require(self, field: str, ok: bool, expected: str, example: str) -> None:
        """Raise a :class:`ConfigError` for ``field`` unless ``ok``."""
        if not ok:
            raise ConfigError.bad_value(field, getattr(self, field), expected, example)


class Problem:
    """A task chosen by the config key ``objective``: the objectives it offers, one per
    composition, and the model size it needs.

    Different updaters train different objectives of the same task (FCSG the conditional AP
    surrogate, FedAvg cross-entropy, CODA+ the min-max AUC loss) and are evaluated the same
    way. An updater gets the first composition of its :attr:`compositions` that the problem
    offers (:meth:`objective_for`).

    Args:
        params: an instance of :attr:`params_cls`.
        data: the federated data (e.g. for the positive ratio).
    """

    name: ClassVar[str] = ""
    params_cls: ClassVar[type[ProblemParams]] = ProblemParams

    def __init__(self, params: ProblemParams, data: FederatedData) -> None:
        self.params = params
        self.data = data

    def num_outputs(self) -> int:
        """The model's output size; the number of classes by default."""
        return self.data.num_classes

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        """The objectives of this task keyed by composition (``"conditional"``, ``"erm"``...)."""
        raise NotImplementedError

    def objective_for(self, compositions: tuple[str, ...], model: nn.Module) -> Objective:
        """The objective for an updater accepting ``compositions`` (in its order of preference)."""
        offered = self.objectives(model)
        for comp in compositions:
            if comp in offered:
                return offered[comp]
        raise ConfigError(
            f"objective={self.name} offers {sorted(offered)}, but the updater needs one of "
            f"{list(compositions)}; run it with another objective or drop it from updaters"
        )

    def describe(self) -> dict[str, Any]:
        """Logged with the run's config."""
        return {"problem": self.name, **dataclasses.asdict(self.params)}


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
