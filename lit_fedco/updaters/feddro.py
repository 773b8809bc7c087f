"""FedDRO, DS-FedDRO and their baselines on a distributed inner function (Khanduri et al.).

The problem (paper eq. 2) is ``Φ(x) = h(x) + f((1/K) Σ_k g_k(x))``: client k knows only its
``g_k`` and ``h_k`` (:mod:`lit_fedco.objectives.distributed`). Every method here steps along
the estimate of eq. (7)::

    u_k = ∇h_k(x_k; ξ) + ∇g_k(x_k; ζ)ᵀ ∇f(y)        # one vector-Jacobian product

and they differ in the inner estimate ``y`` and in what is communicated when:

==================  ===================================================  ======================
updater             y                                                    communicated
==================  ===================================================  ======================
``feddro``          hybrid estimator (8), cohort-averaged every step     ȳ every step, x every I
``ds_feddro``       local moving average, server steps γ_x, γ_y          x and y every I steps
``fedavg_co``       local ``g_k(x_k)``; case II starts each round at ȳ    x (case II: and y)
``mbsgd``           cohort mean of ``g_k(x̄; B'_k)`` (the probe)           x every step (I = 1)
==================  ===================================================  ======================

Batches: each local step draws two independent minibatches per client, ``"grad"`` (ζ and ξ of
eq. 7) and ``"value"`` (the fresh ζ' of the inner estimate). The probe at the start of a round
reads the ``"value"`` batch of step 0; it fixes the round's units of inner values (the KL shift)
and, at round 0 (or every round for MBSGD), the cohort mean ``mean_k g_k(x̄; B_k)`` that
initialises ȳ: the estimate starts at the cohort's inner value at x⁰, not at 0, whose ∇f would
send the first steps anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeVar

from torch import Tensor
from torch.func import grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import Probe, RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.ranges import Bound
from lit_fedco.core.server_opt import sgd_step
from lit_fedco.core.state import State, tree_axpy, tree_map
from lit_fedco.objectives.base import Batch, Context, Params
from lit_fedco.objectives.distributed import (
    DistributedObjective,
)
from lit_fedco.updaters.base import CompositionalUpdater, register
from lit_fedco.updaters.combine import combine
from lit_fedco.updaters.hparams import Hparams

FEDAVG_CO_CASES = ("I", "II")


@dataclass(frozen=True)
class DistributedHparams(Hparams):
    """Hyperparameters shared by the updaters of this module (the DRO kind and λ are the
    problem's: ``sample_dro.kind``, ``sample_dro.lam``).

    Attributes:
        lr: η, the client step size.
        lr_decay_round: from this round on, the step size is ``lr · lr_decay`` (paper §6:
            "dropped to 1/10th after 90 communication rounds"); 0 never decays. The round's
            step size is then broadcast with the round context (1 float).
        lr_decay: the factor of that drop.
    """

    lr: float = 0.05
    lr_decay_round: int = 0
    lr_decay: float = 0.1

    bounds: ClassVar[dict[str, Bound]] = {
        "lr_decay_round": Bound("an int >= 0 (0: never)", "90", ge=0),
        "lr_decay": Bound("a float > 0", "0.1", gt=0),
    }


@dataclass(frozen=True)
class FedDROHparams(DistributedHparams):
    """FedDRO (Algorithm 2).

    Attributes:
        beta: β ∈ (0, 1], the weight of the fresh value in the hybrid estimator (8);
            β = 1 is a plain minibatch estimate (Theorem 4.3 takes β proportional to η).
    """

    beta: float = 0.1

    bounds: ClassVar[dict[str, Bound]] = {
        "beta": Bound("a float in (0, 1]", "0.1", gt=0, le=1),
    }


@dataclass(frozen=True)
class DSFedDROHparams(FedDROHparams):
    """DS-FedDRO (Algorithm 3).

    Attributes:
        beta: β ∈ (0, 1], the moving-average weight of the local y (Theorem 5.2: β = c_β η).
        gamma_x: γ_x > 0, the server step size on x (paper §6: 1.3 or 1.4; 1 is averaging).
        gamma_y: γ_y > 0, the server step size on y.
    """

    gamma_x: float = 1.0
    gamma_y: float = 1.0

    bounds: ClassVar[dict[str, Bound]] = {
        "gamma_x": Bound("a float > 0 (γ_x)", "1.3", gt=0),
        "gamma_y": Bound("a float > 0 (γ_y)", "1.4", gt=0),
    }


@dataclass(frozen=True)
class FedAvgCOHparams(DistributedHparams):
    """Vanilla FedAvg for CO (Algorithm 1).

    Attributes:
        case: ``"I"`` (share x only) or ``"II"`` (share x and y every I steps).
    """

    case: str = "II"

    def validate(self) -> None:
        super().validate()
        self.require("case", self.case in FEDAVG_CO_CASES, f"one of {FEDAVG_CO_CASES}", "II")


HD = TypeVar("HD", bound=DistributedHparams)


class DistributedUpdater(CompositionalUpdater[HD]):
    """Shared machinery: the objective, the eq. (7) direction, the round's inner estimate.

    Server state: ``x``, and after the first round the carried inner estimate ``y`` with the
    ``units`` it is expressed in (the KL shift). Subclasses set :attr:`y_source` and implement
    :meth:`client_step`.
    """

    hparams_cls: ClassVar[type[Hparams]] = DistributedHparams
    compositions: ClassVar[tuple[str, ...]] = ("distributed",)
    roles: ClassVar[tuple[str, ...]] = ("grad", "value")
    default_problem: ClassVar[str] = "sample_dro"
    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "y": Sync.ROUND}
    y_source: ClassVar[str] = "carried"
    """What the round context's ``"y"`` holds: ``"carried"`` (the server's estimate, converted
    to the round's units; the probe mean at round 0), ``"fresh"`` (the probe mean every round)
    or ``"none"`` (no ``"y"``)."""

    @property
    def obj(self) -> DistributedObjective:
        """The objective, typed."""
        if not isinstance(self.objective, DistributedObjective):
            raise ConfigError(f"{self.name}: needs a DistributedObjective")
        return self.objective

    @property
    def y_mode(self) -> str:
        """:attr:`y_source`, overridable per instance (FedAvg-CO's case)."""
        return self.y_source

    def round_context(self, server: State, info: RoundInfo, probe: Probe) -> RoundContext:
        """The round's units (kept with y on the server), its starting inner estimate ``"y"``
        (see :attr:`y_source`) and, after the step-size drop, its step size. The probes are
        ``g_k(x̄; B'_k)`` in the objective's unit-free form, on step 0's value batch."""
        obj = self.obj
        probes = probe(lambda s, b: obj.probe(s["x"], b, {}))
        units = obj.units(probes)
        ctx = {**units, **self.step_size_context(server, info)}
        mode = self.y_mode
        if mode == "carried" and "y" in server:  # server side: no vmap here
            ctx["y"] = obj.convert(server["y"], server["units"], units)
        elif mode != "none":
            ctx["y"] = obj.cohort_mean(probes, units)
        return RoundContext(broadcast=ctx, server={"units": units})

    def step_size_context(self, server: State, info: RoundInfo) -> Context:
        """``{"lr": η_r}`` when the step size drops at some round, else nothing."""
        hp = self.hparams
        if hp.lr_decay_round <= 0:
            return {}
        late = info.round >= hp.lr_decay_round
        ref = next(iter(server["x"].values()))
        return {"lr": ref.new_tensor(hp.lr * (hp.lr_decay if late else 1.0))}

    def step_size(self, ctx: Context) -> float | Tensor:
        """η of this round: the context's (after a drop) or the configured one."""
        return ctx.get("lr", self.hparams.lr)

    # ------------------------------------------------------------------ client side
    def direction(self, x: Params, y: Tensor, batch: Batch, ctx: Context) -> tuple[Params, Tensor]:
        """``u = ∇h_k(x; B) + ∇g_k(x; B)ᵀ ∇f(y)`` (eq. 7) and the batch's mean loss.

        ``∇f(y)`` is a p-vector, so u is the gradient of the surrogate
        ``⟨∇f(y), g_k(x; B)⟩ + h_k(x; B)`` with ``∇f(y)`` held fixed: one backward pass.
        """
        obj = self.obj
        cot = obj.df(y, ctx)

        def surrogate(p: Params) -> tuple[Tensor, Tensor]:
            g, h, loss = obj.parts(p, batch, ctx)
            return (cot * g).sum() + h, loss

        u, loss = grad(surrogate, has_aux=True)(x)
        return u, loss

    def inner_value(self, x: Params, batch: Batch, ctx: Context) -> Tensor:
        """``g_k(x; batch)`` in the round's units (no gradient needed)."""
        return self.obj.inner(x, batch, ctx)


@register("feddro")
class FedDRO(DistributedUpdater[FedDROHparams]):
    """FedDRO (Algorithm 2, eqs. 7-8): the cohort shares ȳ after every local step.

    One local step at client k, from ``(x_k, ȳ)``::

        u_k   = ∇h_k(x_k; ξ) + ∇g_k(x_k; ζ)ᵀ ∇f(ȳ)                      (eq. 7)
        x_k⁺  = x_k − η u_k
        y_k   = (1 − β)(ȳ − g_k(x_k; ζ')) + g_k(x_k⁺; ζ')              (eq. 8, same ζ')
        ȳ     ← mean_k y_k                      (all-reduce of p numbers, every step)

    and ``x_k ← mean_k x_k`` every I steps. ȳ carries over rounds; at round 0 it starts at the
    cohort mean of ``g_k(x⁰; B_k)``. By induction, with β = 1 or deterministic g, ȳ equals
    ``mean_k g_k(x_k)`` at the current local points.
    """

    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "y": Sync.STEP}

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        hp = self.hparams
        x = state["x"]
        ybar = ctx["y"] if step.first else state["y"]
        u, loss = self.direction(x, ybar, batches["grad"], ctx)
        x_new = tree_axpy(-self.step_size(ctx), u, x)
        g_old = self.inner_value(x, batches["value"], ctx)
        g_new = self.inner_value(x_new, batches["value"], ctx)
        y = hybrid_estimate(ybar, g_old, g_new, hp.beta)
        return {"x": x_new, "y": y}, {"loss": loss}


def hybrid_estimate(ybar: Tensor, g_old: Tensor, g_new: Tensor, beta: float) -> Tensor:
    """Eq. (8): ``(1 − β)(ȳ − g(x_prev; ζ')) + g(x; ζ')`` — a STORM-type estimate: SARAH's
    correction ``g(x; ζ') − g(x_prev; ζ')`` on the old estimate, plus β times a fresh one."""
    return (1 - beta) * (ybar - g_old) + g_new


@register("ds_feddro")
class DSFedDRO(DistributedUpdater[DSFedDROHparams]):
    """DS-FedDRO (Algorithm 3): local moving-average y, two-sided (server) step sizes.

    Client step, with the client's own ``y_k`` (from the server's y at the round start)::

        u_k   = ∇h_k(x_k; ξ) + ∇g_k(x_k; ζ)ᵀ ∇f(y_k)
        x_k⁺  = x_k − η u_k
        y_k⁺  = (1 − β) y_k + β g_k(x_k⁺; ζ')

    Every I steps (Algorithm 3, step 7)::

        x ← x − γ_x (x − mean_k x_k),     y ← y − γ_y (y − mean_k y_k)

    γ_x = γ_y = 1 is plain averaging. Nothing is communicated between syncs.
    """

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        hp = self.hparams
        x = state["x"]
        y = ctx["y"] if step.first else state["y"]
        u, loss = self.direction(x, y, batches["grad"], ctx)
        x_new = tree_axpy(-self.step_size(ctx), u, x)
        y_new = (1 - hp.beta) * y + hp.beta * self.inner_value(x_new, batches["value"], ctx)
        return {"x": x_new, "y": y_new}, {"loss": loss}

    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """Algorithm 3, step 7: x and y move from where the clients started, e₀ (what the round
        context broadcast, else the server's), by γ towards the mean: a server SGD step of size
        γ on the pseudo-gradient e₀ − mean (:func:`~lit_fedco.core.server_opt.sgd_step`)."""
        new = super().server_update(server, mean, ctx, info)
        for key, gamma in (("x", self.hparams.gamma_x), ("y", self.hparams.gamma_y)):
            start = ctx.broadcast.get(key, server.get(key))
            new[key] = tree_map(lambda e, m: sgd_step(e, e - m, gamma), start, mean[key])
        return new


@register("fedavg_co")
class FedAvgCO(DistributedUpdater[FedAvgCOHparams]):
    """Vanilla FedAvg for CO (Algorithm 1), the paper's negative result (Theorem 4.1).

    Each client estimates the inner function by its own ``g_k`` (step 5)::

        u_k   = ∇h_k(x_k; ξ) + ∇g_k(x_k; ζ)ᵀ ∇f(y_k)
        x_k⁺  = x_k − η u_k,       y_k⁺ = g_k(x_k⁺; ζ')

    Every I steps x is averaged and (step 7) case I restarts from ``y_k = g_k(x̄; ζ')``, case II
    from the shared ``ȳ = mean_k y_k`` of the round's last local values. Case II with ȳ shared
    every step instead would be FedDRO with β = 1 (Theorem 4.2).
    """

    @property
    def y_mode(self) -> str:
        return "carried" if self.hparams.case == "II" else "none"

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        x = state["x"]
        if not step.first:
            y = state["y"]
        elif self.y_mode == "carried":
            y = ctx["y"]
        else:
            y = self.inner_value(x, batches["value"], ctx)
        u, loss = self.direction(x, y, batches["grad"], ctx)
        x_new = tree_axpy(-self.step_size(ctx), u, x)
        return {"x": x_new, "y": self.inner_value(x_new, batches["value"], ctx)}, {"loss": loss}

    def client_end(self, state: State, start: State, ctx: Context, steps: Tensor) -> State:
        """Case II uploads x and y; case I only x (it restarts every round from the clients'
        own values), so its y is not kept for the upload."""
        return state if self.y_mode == "carried" else {"x": state["x"]}


@dataclass(frozen=True)
class FedAvgCOCaseIHparams(FedAvgCOHparams):
    """FedAvg-CO, case I (Algorithm 1, step 7): only x is shared.

    Attributes:
        case: ``"I"`` (the only value accepted: ``fedavg_co`` with ``case=II`` is the other).
    """

    case: str = "I"

    def validate(self) -> None:
        super().validate()
        self.require("case", self.case == "I", "I (fedavg_co runs case II)", "I")


FedAvgCOCaseI = combine(
    "fedavg_co_i",
    FedAvgCO,
    compositions=FedAvgCO.compositions,
    hparams_cls=FedAvgCOCaseIHparams,
    doc="Vanilla FedAvg for CO, case I (Algorithm 1): each client restarts every round from "
    "its own ``y_k = g_k(x̄; ζ')`` and only x is averaged; beside ``fedavg_co`` (case II) so "
    "that one run can compare both cases.",
)


@dataclass(frozen=True)
class MBSGDHparams(DistributedHparams):
    """Minibatch SGD for CO.

    Attributes:
        local_steps: I = 1: one step per round is the method (the only value accepted).
    """

    local_steps: int = 1

    def validate(self) -> None:
        super().validate()
        self.require("local_steps", self.local_steps == 1, "1 (one step per round)", "1")


@register("mbsgd")
class MBSGD(DistributedUpdater[MBSGDHparams]):
    """Minibatch SGD for CO (the paper's MBSGD baseline, after Ghadimi & Lan 2013).

    One step per round on the whole cohort's minibatch: the probe gathers
    ``ȳ = mean_k g_k(x̄; B'_k)``, each client computes ``u_k`` (eq. 7) at x̄ with ȳ on its own
    batch, and the server takes ``x ← x̄ − η mean_k u_k``. One step per round
    (``mbsgd.local_steps = 1``, whatever the run's ``local_steps``).
    """

    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND}
    y_source = "fresh"

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        u, loss = self.direction(state["x"], ctx["y"], batches["grad"], ctx)
        return {"x": tree_axpy(-self.step_size(ctx), u, state["x"])}, {"loss": loss}
