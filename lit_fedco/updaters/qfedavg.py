"""q-FedAvg (Li, Sanjabi, Beirami, Smith 2020, "Fair Resource Allocation in Federated
Learning", Algorithm 2): FedAvg's local SGD with a server step that solves q-FFL.

q-FFL minimises ``f_q(w) = Σ_k p_k F_k(w)^{q+1} / (q + 1)``, which for q > 0 puts more weight
on the clients with the larger loss F_k (q = 0 is the plain empirical risk). q-FedAvg runs I
local SGD steps on each client's empirical risk, as FedAvg does, and replaces the average of the
iterates by a Newton-like step on f_q with a Lipschitz estimate L = 1/η. Per round, with
``x̄`` the server model and the cohort's clients k::

    F_k   = ℓ(x̄; B_k,0)                                 (client k's step-0 minibatch loss)
    x_k   = I local SGD steps from x̄                    (x ← x − η ∇ℓ(x; B))
    Δw_k  = L (x̄ − x_k)
    Δ_k   = F_k^q Δw_k
    h_k   = q F_k^{q−1} ‖Δw_k‖² + L F_k^q
    x̄     ← x̄ − Σ_k Δ_k / Σ_k h_k  =  x̄ − mean_k Δ_k / mean_k h_k

(Algorithm 2 lines 6–10). At q = 0 this is FedAvg: ``x̄ ← mean_k x_k``. ComFedL compares with
it in §5.1 (with q = 0.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from lit_fedco.core.model_stats import running_stats
from lit_fedco.core.protocol import RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.ranges import Bound
from lit_fedco.core.state import State, tree_leaves, tree_map, tree_scale, tree_sub
from lit_fedco.objectives.base import Batch, Context
from lit_fedco.updaters.base import register
from lit_fedco.updaters.fedavg import FedAvg
from lit_fedco.updaters.hparams import Hparams

LOSS_FLOOR = 1e-10
"""F_k is clamped to at least this before the powers F^q and F^{q−1} (the reference code adds
1e-10), so a zero loss gives finite values."""


@dataclass(frozen=True)
class QFedAvgHparams(Hparams):
    """q-FedAvg (q-FFL, Algorithm 2).

    Attributes:
        lr: η, the client step size; the server's Lipschitz estimate is L = 1/η.
        q: the fairness exponent q ≥ 0 (q-FFL §5 grid: 0.1, 0.2, 0.5, 1, 2; ComFedL §5.1:
            0.2); q = 0 is FedAvg.
    """

    q: float = 0.2

    bounds: ClassVar[dict[str, Bound]] = {
        "q": Bound("a float >= 0", "0.2", ge=0),
    }


@register("qfedavg")
class QFedAvg(FedAvg[QFedAvgHparams]):
    """q-FedAvg: local SGD ``x ← x − η ∇ℓ(x; B)`` for I steps, then the q-FFL server step.

    Each client records, at its first local step, its loss ``F`` at the broadcast point x̄
    (the step-0 minibatch loss, which that step computes anyway). At the end of the round it
    uploads ``Δ = F^q L (x̄ − x)`` and ``h = q F^{q−1} ‖L (x̄ − x)‖² + L F^q``; the server moves
    ``x̄ ← x̄ − mean Δ / mean h`` (the paper's ratio of sums over the cohort).
    """

    compositions: ClassVar[tuple[str, ...]] = ("erm",)
    client_state: ClassVar[dict[str, Sync]] = {"delta": Sync.ROUND, "h": Sync.ROUND}

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        new, logs = super().client_step(state, batches, ctx, step)
        if step.first:  # the loss at the broadcast point x̄
            new["F"] = logs["loss"]
        return new, logs

    def client_end(self, state: State, start: State, ctx: Context, steps: Tensor) -> State:
        """Δ and h from the round's change L (x̄ − x) and F (Algorithm 2, lines 6–8)."""
        hp = self.hparams
        q, lip = hp.q, 1.0 / hp.lr
        log_f = torch.log(state["F"].clamp_min(LOSS_FLOOR))
        f_q = torch.exp(q * log_f)
        dw = tree_scale(lip, tree_sub(start["x"], state["x"]))
        h = lip * f_q
        if q > 0:  # a hyperparameter, not a tensor value; at q = 0 the term is exactly 0
            stats = running_stats(self.model)  # no parameters: the server takes their mean
            moved = {k: d for k, d in dw.items() if k not in stats}
            sq_norm = sum((d * d).sum() for d in tree_leaves(moved))
            h = h + q * torch.exp((q - 1) * log_f) * sq_norm
        return {"delta": tree_map(lambda d: f_q * d, dw), "h": h}

    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """``x̄ ← x̄ − mean Δ / mean h`` (Algorithm 2, line 10)."""
        h = mean["h"]
        return {"x": tree_map(lambda x, d: x - d / h, server["x"], mean["delta"])}
