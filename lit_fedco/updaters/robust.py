"""Minimax baselines with explicit client weights on the simplex: DRFL (Deng, Kamani,
Mahdavi 2020, distributionally robust federated averaging) and TR-MAML (Collins, Mokhtari,
Shakkottai 2020, task-robust MAML), as the ComFedL paper compares them (§5.1, §5.2).

Both solve ``min_x max_{λ ∈ Δ_K} Σ_k λ_k L_k(x)`` (DRFL with the client's empirical risk,
TR-MAML with its post-adaptation MAML loss) by alternating local SGD on x with projected
gradient ascent on λ. One round::

    server broadcasts x̄
    client k: F_k = L_k(x̄; B₀)                    # the probe, one float per client
              I local steps x_k ← x_k − η ∇L_k(x_k; B_t)
              uploads x_k
    server:   x̄ ← Σ_{k∈C} λ_k x_k / Σ_{k∈C} λ_k     # weighted aggregation (the round's weights)
              λ ← Π_Δ(λ + γ_λ (K/m) F_C)            # F_C: F_k on the cohort, 0 elsewhere

(K/m) F_C is the unbiased estimate of the full loss vector under uniform sampling of m of K
clients, as DRFA scales it. With full participation the aggregation is ``Σ_k λ_k x_k``, what
DRFA's sampling of clients with probabilities λ gives in expectation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from lit_fedco.core.protocol import Probe, RoundContext, RoundInfo
from lit_fedco.core.ranges import Bound
from lit_fedco.core.state import State
from lit_fedco.updaters.base import register
from lit_fedco.updaters.combine import combine
from lit_fedco.updaters.fedavg import FedAvg
from lit_fedco.updaters.hparams import Hparams


def project_simplex(v: Tensor) -> Tensor:
    """The Euclidean projection of ``v`` onto the simplex ``{λ ≥ 0, Σ λ = 1}``.

    Sort-based (Held, Wolfe, Crowder 1974; Duchi et al. 2008): with u sorted decreasingly,
    ρ = max{j : u_j − (Σ_{i≤j} u_i − 1)/j > 0}, θ = (Σ_{i≤ρ} u_i − 1)/ρ, λ = max(v − θ, 0).
    """
    u = torch.sort(v, descending=True).values
    css = torch.cumsum(u, 0) - 1
    j = torch.arange(1, len(v) + 1, dtype=v.dtype, device=v.device)
    rho = int(torch.nonzero(u - css / j > 0).max())
    theta = css[rho] / (rho + 1)
    return torch.clamp(v - theta, min=0)


@dataclass(frozen=True)
class DRFLHparams(Hparams):
    """DRFL and TR-MAML hyperparameters.

    Attributes:
        lr: η, the client step size (ComFedL §5.1: 0.01; TR-MAML in §5.2: 0.1).
        lam_lr: γ_λ, the ascent step on the client weights (ComFedL: 8e-2; grid 8e-3, 8e-2,
            8e-1).
    """

    lam_lr: float = 0.08

    bounds: ClassVar[dict[str, Bound]] = {
        "lam_lr": Bound("a float >= 0", "0.08", ge=0),
    }


@register("drfl")
class DRFL(FedAvg[DRFLHparams]):
    """DRFL: FedAvg's local SGD, λ-weighted aggregation, projected ascent on λ (module
    docstring)."""

    compositions: ClassVar[tuple[str, ...]] = ("erm",)

    def init_server(self, params: dict[str, Tensor], num_clients: int) -> State:
        """x⁰ and uniform weights λ = 1/K."""
        ref = next(iter(params.values()))
        return {
            **super().init_server(params, num_clients),
            "lam": ref.new_full((num_clients,), 1.0 / num_clients),
        }

    def round_context(self, server: State, info: RoundInfo, probe: Probe) -> RoundContext:
        """The cohort's losses F_k at the broadcast point (probed), placed in a K-vector and
        scaled by K/m, stay on the server for the ascent step; the server weights the uploads
        by the cohort's λ_k; λ is logged."""
        losses_c = probe(lambda s, b: self.objective.value(s["x"], b, {}))
        lam, cohort = server["lam"], info.cohort.to(server["lam"].device)
        losses = lam.new_zeros(lam.shape).index_copy(0, cohort, losses_c)
        scale = lam.new_tensor(len(lam) / len(cohort))
        return RoundContext(
            server={"ascent": scale * losses}, cohort_weights=lam, weights=lam[cohort]
        )

    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """x̄: the λ-weighted mean (the server's x when the cohort's weights are all 0), then
        ``λ ← Π_Δ(λ + γ_λ (K/m) F_C)``."""
        lam = project_simplex(server["lam"] + self.hparams.lam_lr * ctx.server["ascent"])
        return {**server, **mean, "lam": lam}

    def client_weights(self, server: State, losses: Tensor) -> Tensor | None:
        """The explicit weights λ (logged at evaluation)."""
        return server["lam"]


TRMAML = combine(
    "tr_maml",
    DRFL,
    compositions=("local",),
    default_problem="pfl",
    doc="""TR-MAML (Collins et al. 2020) in the federated form of ComFedL §5.2: DRFL's weights
    and aggregation on the clients' post-adaptation MAML losses; each local step is a MAML
    step ``x ← x − η ∇ L_k(x − α ∇L_k(x; B); B̃)`` (the pfl problem's MAML composition, exact
    second-order meta-gradient).""",
)
