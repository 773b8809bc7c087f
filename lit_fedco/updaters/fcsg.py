"""FCSG, FCSG-M, Acc-FCSG-M (Wu et al., Federated Conditional Stochastic Optimization) and the
baselines they are compared with: Local-SCGD, Local-SCGDM (Gao, Li, Huang 2022) and CODA+
(Yuan et al. 2021).

Every client step uses the plug-in estimator ``∇F̂(x; S)`` of the conditional objective on the
step's samples S (:func:`~lit_fedco.objectives.conditional.plugin_gradient`). Mapping of the
papers' indices to one local step (α the step size, β the momentum weight)::

    FCSG        (Alg. 1 l. 13)  x ← x − α ∇F̂(x; S)                              sync x
    FCSG-M      (Alg. 1 l. 14)  v ← (1−β) v + β ∇F̂(x; S);  x ← x − α v          sync x, v
    Acc-FCSG-M  (Alg. 2 l. 14)  v ← ∇F̂(x; S) + (1−β)(v − ∇F̂(x⁻; S));  x⁻ ← x;  x ← x − α v
                                                                                   sync x, v

Alg. 1/2 update ``x_t = x_{t−1} − α u_t`` and then draw the samples of ``u_{t+1}``; one step
here computes the new direction first and then moves, which is the same sequence. The sync
averages x after the last step's move and v (Alg. 1/2 lines 5–7). In Acc-FCSG-M the correction
is evaluated at the client's *own* previous iterate x⁻ = x_{t−1}^n on the same samples S: x⁻
stays with the client across a sync (a persistent key), so after a sync the correction spans
the averaging too, as Alg. 2 line 14 is written. With partial participation a client's x⁻ is
its last iterate from the last round it took part in (x₀ before that).

The first direction (Alg. 1/2 line 2) ``u₁ = (1/B) Σ ∇F̂(x₀; ξ_i, B_i)`` comes from a larger
batch of B = ``init_batches`` × b outer samples: the extra batches are roles ``init1`` ...
that the momentum methods draw every step but read only at their first step. The first step
is recognised by the absence of v in the state (the server holds no v before round 1), a
Python-level structural test that costs nothing inside ``vmap``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.func import grad, grad_and_value

from lit_fedco.core.protocol import RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.ranges import Bound
from lit_fedco.core.state import (
    State,
    tree_axpy,
    tree_clone,
    tree_leaves,
    tree_map,
    tree_scale,
    tree_sub,
)
from lit_fedco.objectives.base import Batch, Context, Objective, Params
from lit_fedco.objectives.conditional import AUCMinMax, ConditionalObjective, plugin_gradient
from lit_fedco.updaters.base import CompositionalUpdater, H, register
from lit_fedco.updaters.hparams import Hparams


# ---------------------------------------------------------------------- pure update rules
def momentum_direction(v: Params, g: Params, beta: float) -> Params:
    """FCSG-M's ``(1−β) v + β g`` (Alg. 1 line 14)."""
    return tree_map(lambda a, b: (1 - beta) * a + beta * b, v, g)


def storm_direction(g_new: Params, g_prev: Params, v: Params, beta: float) -> Params:
    """Acc-FCSG-M's ``g(x_t) + (1−β)(v − g(x_{t−1}))`` on the same samples (Alg. 2 line 14)."""
    return tree_map(lambda gn, gp, a: gn + (1 - beta) * (a - gp), g_new, g_prev, v)


def mean_of(trees: list[Params]) -> Params:
    """Leaf-wise mean of same-structure trees."""
    return tree_map(lambda *ts: torch.stack(ts).mean(0), *trees)


# ---------------------------------------------------------------------- hyperparameters
@dataclass(frozen=True)
class FCSGHparams(Hparams):
    """FCSG (Algorithm 1 without momentum).

    Attributes:
        lr: α, the client step size (FCSG §5.1 grid: 0.01, 0.005, 0.001).
    """


@dataclass(frozen=True)
class FCSGMHparams(Hparams):
    """FCSG-M and Acc-FCSG-M (Algorithms 1 and 2).

    Attributes:
        lr: α, the client step size.
        beta: β ∈ (0, 1], the momentum weight (FCSG §5.1 grid: 0.001 ... 0.9).
        init_batches: B / b, minibatches averaged for the first direction u₁ (line 2).
    """

    beta: float = 0.1
    init_batches: int = 1

    bounds: ClassVar[dict[str, Bound]] = {
        "beta": Bound("a float in (0, 1]", "0.1", gt=0, le=1),
        "init_batches": Bound("an int >= 1", "4", ge=1),
    }


# ---------------------------------------------------------------------- FCSG family
class _Conditional(CompositionalUpdater[H]):
    """Shared by the FCSG family: the conditional objective and its plug-in gradient."""

    compositions: ClassVar[tuple[str, ...]] = ("conditional",)

    def plugin(self, x: Params, batch: Batch, ctx: Context) -> tuple[Params, Tensor]:
        """``∇F̂(x; S)`` and ``F̂(x; S)`` on one batch."""
        obj = self.objective
        return plugin_gradient(lambda p: obj.value(p, {"inner": batch}, ctx), x)


@register("fcsg")
class FCSG(_Conditional[FCSGHparams]):
    """FCSG (Algorithm 1): ``x ← x − α ∇F̂(x; S)``; x averaged every I steps.

    Its direction has no memory, so Algorithm 1's larger first batch would change one step
    only; every step here uses the step's b outer samples.
    """

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        g, loss = self.plugin(state["x"], batches["inner"], ctx)
        return {"x": tree_axpy(-self.hparams.lr, g, state["x"])}, {"loss": loss}


class _Momentum(_Conditional[FCSGMHparams]):
    """The momentum methods: state x and v, v averaged with x; u₁ from B samples."""

    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "v": Sync.ROUND}
    broadcast_keys: ClassVar[tuple[str, ...]] = ("x", "v")

    def __init__(
        self, hparams: FCSGMHparams, model: nn.Module, objective: Objective | None = None
    ) -> None:
        super().__init__(hparams, model, objective)
        # the step's batch and the ``init_batches − 1`` extra batches of u₁
        self.batch_roles = ("inner", *(f"init{i}" for i in range(1, hparams.init_batches)))

    def first_direction(
        self, x: Params, batches: dict[str, Batch], ctx: Context
    ) -> tuple[Params, Tensor]:
        """``u₁ = (1/B) Σ_i ∇F̂(x₀; ξ_i, B_i)`` over every role's batch (Alg. 1/2 line 2)."""
        outs = [self.plugin(x, batches[role], ctx) for role in self.batch_roles]
        return mean_of([g for g, _ in outs]), torch.stack([v for _, v in outs]).mean()


@register("fcsg_m")
class FCSGM(_Momentum):
    """FCSG-M (Algorithm 1, line 14): ``v ← (1−β) v + β ∇F̂(x; S)``, ``x ← x − α v``."""

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        hp = self.hparams
        x = state["x"]
        if "v" in state:
            g, loss = self.plugin(x, batches["inner"], ctx)
            v = momentum_direction(state["v"], g, hp.beta)
        else:
            v, loss = self.first_direction(x, batches, ctx)
        return {"x": tree_axpy(-hp.lr, v, x), "v": v}, {"loss": loss}


@register("acc_fcsg_m")
class AccFCSGM(_Momentum):
    """Acc-FCSG-M (Algorithm 2, line 14): the STORM estimator
    ``v ← ∇F̂(x; S) + (1−β)(v − ∇F̂(x⁻; S))`` with x⁻ the client's own previous iterate and
    the same samples S at both points; ``x⁻ ← x``, ``x ← x − α v``."""

    client_state: ClassVar[dict[str, Sync]] = {
        "x": Sync.ROUND, "v": Sync.ROUND, "x_prev": Sync.KEEP
    }  # fmt: skip

    def init_client(self, server: State, info: RoundInfo) -> State:
        """x⁻ starts at x⁰ (later rounds: the client's own); x and v come from the server."""
        return {"x_prev": server["x"]}

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        hp = self.hparams
        x = state["x"]
        if "v" in state:
            g_new, loss = self.plugin(x, batches["inner"], ctx)
            g_prev, _ = self.plugin(state["x_prev"], batches["inner"], ctx)
            v = storm_direction(g_new, g_prev, state["v"], hp.beta)
        else:
            v, loss = self.first_direction(x, batches, ctx)
        return {"x": tree_axpy(-hp.lr, v, x), "v": v, "x_prev": x}, {"loss": loss}


# ---------------------------------------------------------------------- Local-SCGD(M)
@dataclass(frozen=True)
class LocalSCGDHparams(Hparams):
    """Local-SCGD and Local-SCGDM (Gao, Li, Huang 2022).

    Attributes:
        lr: η, the client step size.
        beta: β ∈ (0, 1], the weight of the new inner value in ŷ's moving average.
        momentum: μ ∈ (0, 1], the momentum weight on the direction (Local-SCGDM only).
    """

    beta: float = 0.5
    momentum: float = 0.5

    bounds: ClassVar[dict[str, Bound]] = {
        "beta": Bound("a float in (0, 1]", "0.5", gt=0, le=1),
        "momentum": Bound("a float in (0, 1]", "0.5", gt=0, le=1),
    }


@register("local_scgd")
class LocalSCGD(CompositionalUpdater[LocalSCGDHparams]):
    """Local-SCGD: the conditional problem read as a compositional one (ξ, η independent):

    ``ŷ ← (1−β) ŷ + β ḡ(x; B)``, ``u = ∇ḡ(x; B')ᵀ ∇f̄(ŷ; B')``, ``x ← x − η u``, with
    ``ḡ = mean_i g(x; ξ_i, B_i)`` over the batch's outer samples and ``f̄(y) = mean_i f_{ξ_i}(y)``.
    x and ŷ are averaged every I steps; ŷ starts at ḡ(x₀; B) (its first step takes β = 1).
    """

    compositions: ClassVar[tuple[str, ...]] = ("conditional",)
    roles: ClassVar[tuple[str, ...]] = ("inner", "outer")  # B and B'
    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "y": Sync.ROUND, "v": Sync.ROUND}
    broadcast_keys: ClassVar[tuple[str, ...]] = ("x", "y", "v")
    use_momentum: ClassVar[bool] = False

    def direction(
        self, state: State, batches: dict[str, Batch], ctx: Context
    ) -> tuple[Params, Params, Tensor]:
        """The new ŷ, the direction u and the loss f̄(ŷ; B')."""
        hp = self.hparams
        obj = self.objective
        assert isinstance(obj, ConditionalObjective)

        def g_bar(p: Params, batch: Batch) -> Params:
            return tree_map(lambda t: t.mean(0), obj.inner(p, batch, ctx))

        y_new = g_bar(state["x"], batches["inner"])
        y = y_new if "y" not in state else momentum_direction(state["y"], y_new, hp.beta)
        cot, loss = grad_and_value(lambda v: obj.outer_shared(v, batches["outer"], ctx))(y)

        def pulled(p: Params) -> Tensor:
            """⟨ḡ(p; B'), ∇f̄(ŷ)⟩ + h(p): its gradient is ∇ḡᵀ∇f̄(ŷ) + ∇h, a vector-Jacobian
            product written as a gradient (torch.func.vjp's pullback through MAML's inner
            gradients fails under vmap in torch 2.14)."""
            gb = g_bar(p, batches["outer"])
            dot = sum((a * c).sum() for a, c in zip(tree_leaves(gb), tree_leaves(cot), strict=True))
            return dot + obj.regularizer(p)  # type: ignore[return-value]

        return y, grad(pulled)(state["x"]), loss

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        hp = self.hparams
        y, u, loss = self.direction(state, batches, ctx)
        new: State = {"y": y}
        if self.use_momentum:
            u = u if "v" not in state else momentum_direction(state["v"], u, hp.momentum)
            new["v"] = u
        new["x"] = tree_axpy(-hp.lr, u, state["x"])
        return new, {"loss": loss}


@register("local_scgdm")
class LocalSCGDM(LocalSCGD):
    """Local-SCGDM: Local-SCGD with ``v ← (1−μ) v + μ u``, ``x ← x − η v``; x, ŷ, v averaged."""

    use_momentum: ClassVar[bool] = True


# ---------------------------------------------------------------------- CODA+
@dataclass(frozen=True)
class CODAHparams(Hparams):
    """CODA+ (Yuan et al. 2021, Algorithm 1) on the min-max AUC loss.

    Attributes:
        lr: η, the primal step size on (x, a, b).
        lr_dual: the dual step size on α (D-AUPRC: lr / 10).
        gamma: γ, the weight of the proximal term (γ/2)‖v − v₀‖² around the stage's anchor v₀.
        stage_rounds: rounds per stage; at a stage's end v₀ ← v̄ and both step sizes are
            multiplied by ``decay``.
        decay: step-size factor per stage (CODA+: 1/3).
    """

    lr_dual: float = 0.001
    gamma: float = 0.002
    stage_rounds: int = 50
    decay: float = 1 / 3

    bounds: ClassVar[dict[str, Bound]] = {
        "lr_dual": Bound("a float > 0", "0.001", gt=0),
        "gamma": Bound("a float >= 0", "0.002", ge=0),
        "stage_rounds": Bound("an int >= 1", "50", ge=1),
        "decay": Bound("a float in (0, 1]", "0.333", gt=0, le=1),
    }


@register("coda_plus")
class CODAPlus(CompositionalUpdater[CODAHparams]):
    """CODA+: local primal-descent / dual-ascent on the min-max AUC loss F(v, α), v = (x, a, b)::

        v ← v − η s (∇_v F + γ (v − v₀)),   α ← max(α + η_α s ∇_α F, 0)

    with s the stage's step-size scale; v and α averaged every I steps; every
    ``stage_rounds`` rounds the server sets v₀ ← v̄ and s ← s · decay. The positive ratio p of
    F comes from the training data (:class:`~lit_fedco.objectives.conditional.AUCMinMax`).
    The anchor is part of the broadcast state, so the logged download counts it every round,
    although a client needs it only once per stage.
    """

    compositions: ClassVar[tuple[str, ...]] = ("minimax",)
    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "aux": Sync.ROUND}
    broadcast_keys: ClassVar[tuple[str, ...]] = ("x", "aux", "anchor", "scale")

    def init_server(self, params: dict[str, Tensor], num_clients: int) -> State:
        x = {k: v.clone() for k, v in params.items()}
        zero = next(iter(x.values())).new_zeros(())
        aux = {"a": zero.clone(), "b": zero.clone(), "alpha": zero.clone()}
        anchor = {"x": {k: v.clone() for k, v in x.items()}, "a": zero.clone(), "b": zero.clone()}
        return {"x": x, "aux": aux, "anchor": anchor, "scale": zero + 1}

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        hp = self.hparams
        obj = self.objective
        assert isinstance(obj, AUCMinMax)
        batch, aux, anchor, s = batches["inner"], state["aux"], state["anchor"], state["scale"]
        (gx, gaux), loss = grad_and_value(
            lambda p, q: obj.minimax_value(p, q, batch), argnums=(0, 1)
        )(state["x"], aux)
        prox_x = tree_scale(hp.gamma, tree_sub(state["x"], anchor["x"]))
        x = tree_axpy(-hp.lr * s, tree_map(torch.add, gx, prox_x), state["x"])
        new_aux = {
            key: aux[key] - hp.lr * s * (gaux[key] + hp.gamma * (aux[key] - anchor[key]))
            for key in ("a", "b")
        }
        new_aux["alpha"] = (aux["alpha"] + hp.lr_dual * s * gaux["alpha"]).clamp_min(0)
        return {**state, "x": x, "aux": new_aux}, {"loss": loss}

    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """Average, and at the end of a stage move the anchor and decay the step sizes."""
        hp = self.hparams
        new = {**server, **mean}
        if (info.round + 1) % hp.stage_rounds == 0:  # the stage's last round
            # a copy: the anchor is its own server entry, broadcast beside x (and counted so)
            anchor = {"x": mean["x"], "a": mean["aux"]["a"], "b": mean["aux"]["b"]}
            new["anchor"] = tree_clone(anchor)
            new["scale"] = server["scale"] * hp.decay
        return new
