"""GCIVR (Haddadpour, Kamani, Mahdavi, Karbasi 2022, "Learning distributionally robust models at
scale via composite optimization", ICLR, arXiv 2203.09607): the FedDRO paper's distributed
baseline on Adult (§6, Figure 2), "the only algorithm that can deal with CO and non-CO
objectives simultaneously".

**What was assumed.** The GCIVR paper's text could not be consulted here. What the FedDRO
paper says of it (Table 1): a variance-reduced method for CO + non-CO objectives, with
batch sizes √m in the inner loop and m in the outer loop (m samples in all; guarantees for the
finite-sum case only), a multi-loop structure with large batches. Its name and these facts
match the composite incremental variance reduction of Zhang & Xiao (2019, "A stochastic
composite gradient method with incremental variance reduction", CIVR), generalised to
``Φ = h + f(g)``, so that is what this implements: SARAH/SPIDER-type recursive estimates of
the inner value g, of its Jacobian ∇g and of the gradient ∇h, each refreshed on a large
batch every q steps::

    t ≡ 0 (mod q):  y_t = g(x_t; S₁),   J_t = ∇g(x_t; S₁),   v_t = ∇h(x_t; S₁)
    otherwise:      y_t = y_{t−1} + g(x_t; S₂) − g(x_{t−1}; S₂)            (same S₂ at both points)
                    J_t = J_{t−1} + ∇g(x_t; S₂) − ∇g(x_{t−1}; S₂)
                    v_t = v_{t−1} + ∇h(x_t; S₂) − ∇h(x_{t−1}; S₂)
    x_{t+1} = x_t − η (J_tᵀ ∇f(y_t) + v_t)

(:func:`civr_estimate`, :func:`civr_direction`). Keeping J (p × d) rather than the product
``J_tᵀ∇f(y_t)`` is what makes it CIVR: ∇f is re-read at the current y every step, so the
estimate of the composite gradient is not a recursion on a quantity whose outer factor
changes. Batch schedule: S₂ is a client's minibatch of b rows (the run's ``batch_size``), S₁
``refresh_batches`` such minibatches (J b rows), refreshed every ``q`` rounds. The paper's
finite-sum schedule (S₁ = all m rows, S₂ = q = √m) is ``refresh_batches = n_k / b``,
``q = √m``; the defaults (J = q = 8, SPIDER's ``|S₁| = q |S₂|``) cost on average
``(J + 2(q − 1))/q ≈ 2.75`` minibatch evaluations per round, each with a Jacobian (p + 1
backward passes), against one evaluation and one backward pass for a plain step.

**Distributed, "parallel".** Like MBSGD and the FedDRO paper's other parallel baselines (I = 1,
"the overall gradient computation is K times larger"), one round is one step of the
centralised method on the union of the cohort's batches: each cohort client evaluates its
share at the broadcast points, ``g_k``, ``∇g_k``, ``∇h_k`` at x_t (refresh) or their
differences between x_t and x_{t−1} on one batch S₂ (otherwise); the server averages them,
keeps the estimators (y, J, v) and x_{t−1}, and takes the step. A client keeps nothing
between rounds (the estimators could be kept by the clients and averaged every step instead,
but the averaged recursion is the same and the clients would hold p × d numbers each). Per
round a client receives x (and x_{t−1} outside refresh rounds) and sends
``p + p·d + d`` numbers: GCIVR communicates the Jacobian estimate, a p-fold model. The
composition must be that of :class:`~lit_fedco.objectives.distributed.DistributedObjective`
without units: the estimates are carried in the objective's raw units (the KL objective's
shift is not used; KL with a small λ overflows — run it in float64, or use FedDRO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.func import jacrev

from lit_fedco.core.protocol import Probe, RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.ranges import Bound
from lit_fedco.core.state import State, tree_axpy, tree_map
from lit_fedco.objectives.base import Batch, Context, Objective, Params
from lit_fedco.updaters.base import register
from lit_fedco.updaters.feddro import DistributedUpdater, MBSGDHparams


@dataclass(frozen=True)
class GCIVRHparams(MBSGDHparams):
    """GCIVR, parallel over the cohort.

    Attributes:
        lr: η, the step size.
        lr_decay_round: from this round on the step size is ``lr · lr_decay``; 0 never.
        lr_decay: the factor of that drop.
        local_steps: I = 1, one step of the parallel method per round (the only value
            accepted, as MBSGD's).
        q: the refresh period: the estimators restart from a large batch every q rounds
            (rounds 0, q, 2q, …).
        refresh_batches: J, the large batch S₁ is J minibatches of the run's ``batch_size``
            per client (the small batch S₂ is one).
    """

    q: int = 8
    refresh_batches: int = 8

    bounds: ClassVar[dict[str, Bound]] = {
        "q": Bound("an int >= 1 (the refresh period)", "8", ge=1),
        "refresh_batches": Bound("an int >= 1 (J)", "8", ge=1),
    }


def civr_estimate(previous: Tensor, change: Tensor) -> Tensor:
    """The recursive (SARAH/SPIDER) estimate ``e_t = e_{t−1} + [q(x_t; S) − q(x_{t−1}; S)]``,
    with ``change`` the bracket (the cohort mean of the clients' differences on their own
    batches S₂,k)."""
    return previous + change


def civr_direction(jac: Params, grad_h: Params, cot: Tensor) -> Params:
    """``J_tᵀ ∇f(y_t) + v_t``: the Jacobian estimate ``jac`` (leaves ``[p, ...]``) contracted
    with the cotangent ``cot = ∇f(y_t)`` ``[p]``, plus the gradient estimate ``grad_h``."""
    return tree_map(lambda j, v: torch.tensordot(cot, j, dims=1) + v, jac, grad_h)


@register("gcivr")
class GCIVR(DistributedUpdater[GCIVRHparams]):
    """GCIVR (Haddadpour et al. 2022): recursive estimates of g, ∇g, ∇h refreshed every q rounds.

    Parallel over the cohort (module docstring: what was assumed, and why).

    One round r (I = 1), with refresh rounds ``r ≡ 0 (mod q)``::

        client k:  refresh:   (g_k, ∇g_k, ∇h_k)(x_r; S₁,k)
                   otherwise: (g_k, ∇g_k, ∇h_k)(x_r; S₂,k) − (g_k, ∇g_k, ∇h_k)(x_{r−1}; S₂,k)
        server:    (y, J, v) ← cohort mean                       (refresh)
                   (y, J, v) ← (y, J, v) + cohort mean           (otherwise)
                   x_{r+1} = x_r − η (Jᵀ ∇f(y) + v),   x_{r−1} ← x_r

    The cohort mean of the clients' batch means is the mean over the union of their batches
    (equal batches), so with a full-participation cohort this is the centralised CIVR step on
    m·b rows (J m·b at a refresh).
    """

    client_state: ClassVar[dict[str, Sync]] = {"y": Sync.ROUND, "J": Sync.ROUND, "v": Sync.ROUND}
    y_source = "none"

    def __init__(self, hparams: GCIVRHparams, model: nn.Module, objective: Objective | None = None):
        super().__init__(hparams, model, objective)
        self.batch_roles = tuple(f"part{j}" for j in range(hparams.refresh_batches))

    def refresh(self, round_idx: int) -> bool:
        """Whether round ``round_idx`` restarts the estimators from a large batch."""
        return round_idx % self.hparams.q == 0

    def init_client(self, server: State, info: RoundInfo) -> State:
        """Besides x, outside refresh rounds the previous iterate x_{r−1}."""
        return {} if self.refresh(info.round) else {"x_prev": server["x_prev"]}

    def round_context(self, server: State, info: RoundInfo, probe: Probe) -> RoundContext:
        """The step size, after its drop (nothing else is broadcast; nothing is probed: the
        estimators are the server's, in the objective's raw units)."""
        return RoundContext(broadcast=dict(self.step_size_context(server, info)))

    # ------------------------------------------------------------------ client side
    def pieces(
        self, x: Params, batch: Batch, ctx: Context
    ) -> tuple[Tensor, Params, Params, Tensor]:
        """``(g_k(x; B) [p], ∇g_k(x; B) (leaves [p, ...]), ∇h_k(x; B), mean loss)``: one
        Jacobian of the stacked ``(g, h)`` (p + 1 vector-Jacobian products)."""
        obj = self.obj

        def stacked(p: Params) -> tuple[Tensor, tuple[Tensor, Tensor]]:
            g, h, loss = obj.parts(p, batch, ctx)
            g = g.reshape(-1)
            return torch.cat([g, h.reshape(1)]), (g, loss)

        jac, (g, loss) = jacrev(stacked, has_aux=True)(x)
        p = g.shape[0]
        return g, {k: v[:p] for k, v in jac.items()}, {k: v[p] for k, v in jac.items()}, loss

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        x = state["x"]
        if self.refresh(step.round):  # the large batch S₁, all J parts
            parts = [batches[role] for role in self.batch_roles]
            batch = {key: torch.cat([b[key] for b in parts]) for key in parts[0]}
            g, jac, gh, loss = self.pieces(x, batch, ctx)
            return {"y": g, "J": jac, "v": gh}, {"loss": loss}
        small = batches[self.batch_roles[0]]  # S₂, at both points
        g1, j1, h1, loss = self.pieces(x, small, ctx)
        g0, j0, h0, _ = self.pieces(state["x_prev"], small, ctx)
        diff = tree_map(torch.sub, {"y": g1, "J": j1, "v": h1}, {"y": g0, "J": j0, "v": h0})
        return diff, {"loss": loss}

    # ------------------------------------------------------------------ server side
    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """The estimators (restarted or advanced by the cohort means), then the step."""
        keys = ("y", "J", "v")
        if self.refresh(info.round):
            est = {k: mean[k] for k in keys}
        else:
            est = {k: tree_map(civr_estimate, server[k], mean[k]) for k in keys}
        cot = self.obj.df(est["y"], ctx.broadcast)
        u = civr_direction(est["J"], est["v"], cot)
        x_new = tree_axpy(-self.step_size(ctx.broadcast), u, server["x"])
        return {**server, **est, "x": x_new, "x_prev": server["x"]}
