"""FedAvg (McMahan et al. 2017): local SGD on the empirical risk, x averaged every I steps; and
FedAvg with a server optimizer (Reddi et al. 2021, "Adaptive Federated Optimization",
Algorithm 2; Hsu et al. 2019 for FedAvgM): FedAvgM, FedAdam, FedYogi.

With a server optimizer the clients run FedAvg's local SGD from x, and the server takes the
cohort's mean change Δ = mean_k x_k − x as minus a pseudo-gradient
(:mod:`lit_fedco.core.server_opt`)::

    FedAvgM   v ← β v + Δ,                                          x ← x + η v
    FedAdam   m ← β₁ m + (1 − β₁) Δ,  v ← β₂ v + (1 − β₂) Δ²,         x ← x + η m / (√v + τ)
    FedYogi   m as FedAdam,  v ← v − (1 − β₂) Δ² sign(v − Δ²),        x ← x + η m / (√v + τ)

Any updater gets the same through the run's ``server_opt`` key (``server_opt.name=adam``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from lit_fedco.core.protocol import StepInfo
from lit_fedco.core.ranges import Bound
from lit_fedco.core.server_opt import ServerOptConfig
from lit_fedco.core.state import State, foreach_axpy_, tree_axpy
from lit_fedco.objectives.base import Batch, Context
from lit_fedco.updaters.base import CompositionalUpdater, H, register
from lit_fedco.updaters.combine import combine
from lit_fedco.updaters.hparams import ServerOptHparams


@register("fedavg")
class FedAvg(CompositionalUpdater[H]):
    """FedAvg: ``x ← x − η ∇ℓ(x; B)`` locally, ``x̄ ← mean_k x_k`` every I steps.

    The cohort mean is unweighted (each sampled client counts 1/m), as in ComFedL's
    Algorithm 1 line 20, so that the two are compared on the same aggregation.
    """

    compositions: ClassVar[tuple[str, ...]] = ("erm", "local", "distributed", "conditional")
    """A baseline: the problem's empirical risk where it offers one, else its own objective."""

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        g, loss = self.loss_gradient(state["x"], batches, ctx)
        return {**state, "x": tree_axpy(-self.hparams.lr, g, state["x"])}, {"loss": loss}

    def client_step_inplace(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> dict[str, Tensor]:
        """:meth:`client_step` written into the client's rows: ``x ← x + (−η ∇ℓ)``, the same
        two roundings as the out-of-place step (the product, then the sum), so the same
        numbers, in one pass over the weights where the device allows
        (:func:`~lit_fedco.core.state.foreach_axpy_`): no new tensor per step."""
        g, loss = self.loss_gradient(state["x"], batches, ctx)
        foreach_axpy_(-self.hparams.lr, [g[k] for k in state["x"]], list(state["x"].values()))
        return {"loss": loss}

    def client_step_stacked(
        self, states: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        """:meth:`client_step` of the vectorized executor's clients at once: one stacked forward
        and one backward for all of them (the same products as ``vmap``, the same numbers)."""
        g, loss = self.loss_gradient(states["x"], batches, ctx, stacked=True)
        return {**states, "x": tree_axpy(-self.hparams.lr, g, states["x"])}, {"loss": loss}


@dataclass(frozen=True)
class FedAvgMHparams(ServerOptHparams):
    """FedAvgM (Hsu, Qi, Brown 2019): FedAvg with server momentum.

    Attributes:
        lr: η_l, the client step size.
        server_lr: η, the server step size.
        server_momentum: β, the server momentum (Hsu et al.: 0.9 ... 0.997).
    """

    server_momentum: float = 0.9

    bounds: ClassVar[dict[str, Bound]] = {
        "server_momentum": Bound("a float in [0, 1)", "0.9", ge=0, lt=1),
    }

    def server_opt(self, name: str) -> ServerOptConfig:
        """``name`` with the server step size and momentum β."""
        return ServerOptConfig(name, lr=self.server_lr, momentum=self.server_momentum)


@dataclass(frozen=True)
class AdaptiveHparams(ServerOptHparams):
    """FedAdam and FedYogi (Reddi et al. 2021, Algorithm 2).

    Attributes:
        lr: η_l, the client step size.
        server_lr: η, the server step size (Reddi et al. tune it on {10^-3, ..., 10^1}).
        beta1: β₁, the first-moment weight (Reddi et al.: 0.9).
        beta2: β₂, the second-moment weight (Reddi et al.: 0.99).
        tau: τ, the adaptivity (Reddi et al.: 1e-3).
    """

    server_lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    bounds: ClassVar[dict[str, Bound]] = {
        "beta1": Bound("a float in [0, 1) (β₁)", "0.9", ge=0, lt=1),
        "beta2": Bound("a float in [0, 1) (β₂)", "0.99", ge=0, lt=1),
        "tau": Bound("a float > 0 (τ)", "0.001", gt=0),
    }

    def server_opt(self, name: str) -> ServerOptConfig:
        """``name`` with the server step size, β₁, β₂ and τ (the adaptivity, ``eps``)."""
        return ServerOptConfig(
            name, lr=self.server_lr, beta1=self.beta1, beta2=self.beta2, eps=self.tau
        )


FedAvgM = combine(
    "fedavgm",
    FedAvg,
    hparams_cls=FedAvgMHparams,
    server_optimizer="momentum",
    doc="FedAvgM (Hsu et al. 2019): FedAvg's local SGD, server momentum on the mean change "
    "Δ: ``v ← β v + Δ``, ``x ← x + η v``.",
)
FedAdam = combine(
    "fedadam",
    FedAvg,
    hparams_cls=AdaptiveHparams,
    server_optimizer="adam",
    doc="FedAdam (Reddi et al. 2021, Algorithm 2): FedAvg's local SGD, Adam on the server "
    "with the mean change Δ as minus the gradient, ``x ← x + η m / (√v + τ)``.",
)
FedYogi = combine(
    "fedyogi",
    FedAvg,
    hparams_cls=AdaptiveHparams,
    server_optimizer="yogi",
    doc="FedYogi (Reddi et al. 2021, Algorithm 2): FedAdam with Yogi's second moment "
    "``v ← v − (1 − β₂) Δ² sign(v − Δ²)``.",
)
