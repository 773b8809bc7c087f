"""Client-level KL distributionally robust objective (ComFedL eqs. 4-6).

The minimax problem

    min_x max_{r ∈ Δ_K} Σ_k r_k L_k(x) − γ Σ_k r_k log(K r_k)

has the closed form ``γ log((1/K) Σ_k exp(L_k(x)/γ))`` (ComFedL eq. 5, Lemma 1), attained at
``r = softmax(L/γ)``. ComFedL minimises the monotone transform ``(1/K) Σ_k exp(L_k(x)/γ)``
(eq. 6), a local composition with inner ``g_k(x) = L_k(x)`` (p = 1) and outer
``f(y) = exp(y/γ)``.

Numerical stability: at initialisation a cross-entropy near 2.3 with γ = 0.1 gives
exp(23) ≈ 10¹⁰. The **stable** form replaces ``f`` by
``f_c(y) = γ exp((y − c)/γ) / Z`` with a shift ``c`` and a normaliser ``Z`` that are computed
once per round from the cohort's losses at the broadcast model and shared with every client:
``c = max_k L_k(x̄)``, ``Z = mean_k exp((L_k(x̄) − c)/γ)``. Its gradient
``exp((y − c)/γ)/Z`` is the literal ``exp(y/γ)/γ`` times the positive factor
``γ exp(−c/γ)/Z``, the same for every client and constant within a round: the update
direction is unchanged, only the step is rescaled so that at the broadcast point the client
weights are ``K · softmax(L/γ)`` (mean 1) — the gradient of the log-sum-exp form (eq. 5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import RoundContext
from lit_fedco.objectives.base import Batch, Context, Objective, Params, cross_entropy

FORMS = ("stable", "literal")


def kl_dro_value(losses: Tensor, gamma: float) -> Tensor:
    """``γ log((1/K) Σ_k exp(L_k/γ))`` computed with log-sum-exp (ComFedL eq. 5)."""
    k = losses.shape[-1]
    return gamma * (torch.logsumexp(losses / gamma, dim=-1) - math.log(k))


def kl_dro_weights(losses: Tensor, gamma: float) -> Tensor:
    """The maximising client weights ``r = softmax(L/γ)`` of the minimax form (eq. 4)."""
    return torch.softmax(losses / gamma, dim=-1)


def kl_dro_primal(losses: Tensor, r: Tensor, gamma: float) -> Tensor:
    """The inner objective of eq. 4 at weights r: ``Σ r_k L_k − γ Σ r_k log(K r_k)``."""
    k = losses.shape[-1]
    ent = torch.where(r > 0, r * torch.log(k * r.clamp_min(1e-300)), torch.zeros_like(r))
    return (r * losses).sum(-1) - gamma * ent.sum(-1)


def shift_and_norm(losses: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """The stable form's shared shift ``c = max L`` and normaliser ``Z = mean exp((L − c)/γ)``."""
    c = losses.max()
    z = torch.exp((losses - c) / gamma).mean()
    return c, z


def exp_outer(loss: Tensor, gamma: float, form: str, ctx: Context) -> Tensor:
    """The outer function of a KL-regularised objective applied to a client's loss L:
    ``exp(L/γ)`` (literal) or ``γ exp((L − c)/γ)/Z`` (stable; c and Z are ``ctx["shift"]`` and
    ``ctx["norm"]`` from :func:`shift_and_norm`). Shared by client-level KL-DRO and DA-MAML."""
    if form == "literal":
        return torch.exp(loss / gamma)
    return gamma * torch.exp((loss - ctx["shift"]) / gamma) / ctx["norm"]


def kl_round_context(probes: Tensor, gamma: float) -> RoundContext:
    """The stable form's shift and normaliser from the cohort's losses at the broadcast model
    (broadcast), and the implied weights ``softmax(L/γ)`` (logged)."""
    c, z = shift_and_norm(probes, gamma)
    return RoundContext(
        broadcast={"shift": c, "norm": z}, cohort_weights=kl_dro_weights(probes, gamma)
    )


class ClientKLDRO(Objective):
    """Client-level KL-DRO for ComFedL: inner ``L_k(x; B)``, outer ``exp(y/γ)`` (eq. 6).

    Args:
        model: the network.
        gamma: γ > 0, the KL regularisation weight (small γ → close to the worst client).
        form: ``"stable"`` (shifted and normalised weights, see the module docstring) or
            ``"literal"`` (``exp(y/γ)`` as written in the paper).
        sample_loss: per-sample loss.
    """

    composition: ClassVar[str] = "local"
    has_probe: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        gamma: float,
        form: str = "stable",
        sample_loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
    ) -> None:
        super().__init__(model, sample_loss)
        if form not in FORMS:
            raise ConfigError(
                f"form: got {form!r}, expected one of {FORMS}; "
                "use form=stable unless you are reproducing the literal exp(L/γ) step"
            )
        self.gamma = float(gamma)
        self.form = form

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """``exp(y/γ)`` (literal) or ``γ exp((y − c)/γ)/Z`` (stable, c and Z from ``ctx``)."""
        return exp_outer(y, self.gamma, self.form, ctx)

    def probe(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """The client's loss at the broadcast model on its first inner batch of the round."""
        return self.losses(params, batches["inner"]).mean()

    def round_context(self, probes: Tensor) -> RoundContext:
        """Shift and normaliser for the stable form, and the implied weights for logging."""
        return kl_round_context(probes, self.gamma)

    def client_weights(self, losses: Tensor) -> Tensor | None:
        """``softmax(L/γ)``, the maximising r of eq. 4 at the given per-client losses."""
        return kl_dro_weights(losses, self.gamma)

    def describe(self) -> dict[str, Any]:
        return {"objective": "ClientKLDRO", "gamma": self.gamma, "form": self.form}
