"""Objectives: the functions an updater differentiates.

An objective is stateless and written for **one client** on explicit parameter dicts, so that
it can be vmapped over clients. A compositional objective exposes an inner map
``y = g(x; batch)`` and an outer function ``f(y; batch)``; ``value = f(g(x)) + h(x)``.
Where the composition lives (``erm``, ``local``, ``distributed``, ``conditional``:
:mod:`lit_fedco.objectives`) is the class attribute :attr:`Objective.composition`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_fedco.core.model_stats import model_state
from lit_fedco.core.models import call, call_stacked, stacks
from lit_fedco.core.protocol import RoundContext

if TYPE_CHECKING:
    pass

Batch = dict[str, Tensor]
"""One client's minibatch: ``{"x": inputs [b, ...], "y": targets [b]}`` (or ``[b, 1 + s]``:
the class label in column 0 and side columns after it, e.g. Adult's protected group)."""
Context = dict[str, Tensor]
"""Round-level values broadcast to every client (e.g. the log-space shift of the DRO weights)."""
Params = dict[str, Tensor]


def class_labels(target: Tensor, logits: Tensor) -> Tensor:
    """The class labels of ``target`` for ``logits`` ``[..., C]``: ``target`` itself
    (``[...]``), or its column 0 when it carries side columns (``[..., 1 + s]``)."""
    return target[..., 0] if target.dim() == logits.dim() else target


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Per-sample cross-entropy (no reduction) against :func:`class_labels` of ``target``."""
    return F.cross_entropy(logits, class_labels(target, logits), reduction="none")


class Objective:
    """Base class: plain empirical risk, ``g(x; B) = mean_i ℓ(x; ξ_i)`` (p = 1) and ``f(y) = y``.

    Args:
        model: the network, used only through :func:`~lit_fedco.core.models.call`
            (``torch.func.functional_call``, or a small model's stateless forward).
        sample_loss: per-sample loss ``ℓ(logits, target) -> [b]``; cross-entropy by default.
    """

    composition: ClassVar[str] = "erm"
    """``"erm"``, ``"local"`` (ComFedL, FCSG), ``"distributed"`` (FedDRO) or ``"conditional"``."""
    inner_dim: ClassVar[int] = 1
    """p, the size of the inner value y (what FedDRO would communicate per step)."""
    outer_needs_batch: ClassVar[bool] = False
    """Whether ``outer`` reads a batch of its own (ComFedL's B̃); False for deterministic f."""
    has_probe: ClassVar[bool] = False
    """Whether :meth:`probe` returns a value (the loop then runs it at the start of each round)."""

    def __init__(
        self, model: nn.Module, sample_loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy
    ) -> None:
        self.model = model
        self.sample_loss = sample_loss

    def predict(self, params: Params, x: Tensor) -> Tensor:
        """The model's output for inputs ``x`` under parameters ``params``."""
        return call(self.model, params, x)

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

    def stacks(self) -> bool:
        """Whether :meth:`values` runs without ``vmap``: the plain empirical risk (this class
        itself, not a subclass) with the default cross-entropy, on a model with a stacked
        forward (:data:`~lit_fedco.core.models.STACKED`)."""
        return type(self) is Objective and self.sample_loss is cross_entropy and stacks(self.model)

    def values(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        """:meth:`value` of n clients at once, ``[n]``: every leaf of ``params`` and of
        ``batches`` has a leading client dimension (client i: ``params[·][i]`` on
        ``batches[·][·][i]``). Where :meth:`stacks`, the mean cross-entropy of one stacked
        forward (:func:`~lit_fedco.core.models.call_stacked`); else ``vmap`` of :meth:`value`.
        Client i's value depends on client i's rows only, so the gradient of the sum is every
        client's own gradient (:func:`~lit_fedco.core.autodiff.stacked_grad_and_value`)."""
        if not self.stacks():
            return torch.func.vmap(self.value, in_dims=(0, 0, None))(params, batches, ctx)
        batch = batches["inner"]
        logits = call_stacked(self.model, params, batch["x"])
        n, b = logits.shape[:2]
        labels = class_labels(batch["y"], logits).reshape(n * b)
        losses = F.cross_entropy(logits.reshape(n * b, -1), labels, reduction="none")
        return losses.view(n, b).mean(1)

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

    def step_logs(self, y: Any, batches: dict[str, Batch], ctx: Context) -> dict[str, Tensor]:
        """Scalars worth logging for a compositional step taken at inner value ``y``: the loss
        ``{"loss": y}`` when the inner value is a loss (DRO), nothing otherwise."""
        return {"loss": y} if isinstance(y, Tensor) and y.dim() == 0 else {}

    def describe(self) -> dict[str, Any]:
        """What is logged with the run's config to say which form of the objective ran."""
        return {"objective": type(self).__name__}


def model_params(model: nn.Module, dtype: torch.dtype | None = None) -> Params:
    """Detached copies of a module's parameters, then its running statistics if it has batch
    norms that track them, as a plain dict (the ``x`` of the state:
    :func:`~lit_fedco.core.model_stats.model_state`)."""
    return model_state(model, dtype)
