"""Equality of opportunity (Hardt et al. 2016) as a FedDRO problem (FedDRO paper §2 eq. 2, §6).

A binary classifier with score (margin) ``z = logit₁ − logit₀`` predicts ``ŷ = 1(z > 0)``.
Equality of opportunity asks the true positive rate of every protected group a to equal the
overall one: ``TPR_a = P(ŷ = 1 | y = 1, A = a) = TPR = P(ŷ = 1 | y = 1)``. A TPR is a *ratio
of expectations*, so a penalty on TPR gaps is a function of means over all samples of all
clients — FedDRO's ``Φ(x) = h(x) + f((1/K) Σ_k g_k(x))``:

- ``h_k(x)`` = the client's mean cross-entropy (the accuracy term, non-compositional);
- ``g_k(x)`` = the client's means of the p = 2 + 2G indicator-weighted smoothed predictions ::

      g = ( 1{y=1}·s,  1{y=1},  1{y=1, A=0}·s,  1{y=1, A=0},  …,  1{y=1, A=G−1}·s,  1{y=1, A=G−1} )

  with ``s = σ(z/τ)`` the smoothed prediction (τ → 0: the hard ``1(z > 0)``);
- ``f(u) = λ Σ_a [ (|u₁/u₂ − u_{a1}/u_{a2}| − κ)₊ ]²`` — the squared smoothed TPR gaps beyond a
  slack κ (κ = 0: plain squared gaps), with the denominators (positive counts per sample)
  read at ``max(u, ε)``.

With an equal split ``mean_k g_k`` is the mean over all training rows, so ``f(mean_k g_k)`` is
the penalty on the *pooled* smoothed TPRs; f is not linear, which is why a client cannot
evaluate it alone (each client holds few positives of a small group).

**∇f.** With ``r = u₁/U₂``, ``r_a = u_{a1}/U_{a2}`` (``U = max(u, ε)``), ``d_a = r − r_a`` and
``c_a = 2λ (|d_a| − κ)₊ sign(d_a)`` (the derivative of the a-th term in d_a)::

    ∂f/∂u₁     =  Σ_a c_a / U₂              ∂f/∂u₂     = −Σ_a c_a u₁ / U₂²       (0 if u₂ < ε)
    ∂f/∂u_{a1} = −c_a / U_{a2}              ∂f/∂u_{a2} =  c_a u_{a1} / U_{a2}²   (0 if u_{a2} < ε)

(:meth:`EqualOpportunity.df`; the tests hold it to autograd and to finite differences.) The
floor ε keeps f Lipschitz where an estimate of a group's positive share is near 0 — a
client's minibatch of 16 rows often holds no positive of a small group, and the FedDRO
estimators (eq. 8, the server step γ_y > 1) may undershoot.

Choices (``lit_fedco.problems.fairness``; the paper gives none of them): groups = the values
of ``sex`` (or ``race``); penalty = squared gaps (κ = 0), λ = 10 (chosen before any run so
that the unconstrained model's gaps cost about as much as a good part of its cross-entropy;
measured at the unconstrained FedAvg solution: penalty 0.18 against a cross-entropy of 0.33),
τ = 0.5, ε = 1e-3 (Adult's smaller sex group holds about 3.6% of the rows as positives; race
groups go down to 0.1%).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_fedco.core.errors import ConfigError
from lit_fedco.objectives.base import Batch, Context, Params, class_labels
from lit_fedco.objectives.distributed import DistributedObjective


# ---------------------------------------------------------------------- pure functions
def fairness_inner(
    margin: Tensor, label: Tensor, group: Tensor, num_groups: int, tau: float
) -> Tensor:
    """``g(x; batch)`` of the module docstring, ``[2 + 2G]``: batch means of
    ``(1{y=1} s, 1{y=1}, 1{y=1,A=a} s, 1{y=1,A=a} …)`` with ``s = σ(margin/τ)``.

    Args:
        margin: ``[b]`` scores ``z = logit₁ − logit₀``.
        label: ``[b]`` labels in {0, 1}.
        group: ``[b]`` protected groups in ``[0, G)``.
        num_groups: G.
        tau: τ > 0, the smoothing temperature.
    """
    s = torch.sigmoid(margin / tau)
    pos = (label == 1).to(s.dtype)
    # one-hot by comparison (vmap-safe: no data-dependent shapes)
    member = (group.unsqueeze(-1) == torch.arange(num_groups, device=group.device)).to(s.dtype)
    w = pos.unsqueeze(-1) * member  # [b, G]
    per_group = torch.stack([(w * s.unsqueeze(-1)).mean(0), w.mean(0)], dim=-1)  # [G, 2]
    return torch.cat([torch.stack([(pos * s).mean(), pos.mean()]), per_group.reshape(-1)])


def tpr_gaps(u: Tensor, floor: float) -> Tensor:
    """``d_a = u₁/max(u₂, ε) − u_{a1}/max(u_{a2}, ε)`` for every group, ``[G]``."""
    overall = u[0] / u[1].clamp_min(floor)
    return overall - u[2::2] / u[3::2].clamp_min(floor)


def fairness_penalty(u: Tensor, lam: float, slack: float, floor: float) -> Tensor:
    """``f(u) = λ Σ_a ((|d_a| − κ)₊)²`` (module docstring)."""
    excess = (tpr_gaps(u, floor).abs() - slack).clamp_min(0.0)
    return lam * (excess**2).sum()


def fairness_penalty_grad(u: Tensor, lam: float, slack: float, floor: float) -> Tensor:
    """``∇f(u)``, written out (module docstring, "∇f")."""
    d = tpr_gaps(u, floor)
    c = 2 * lam * (d.abs() - slack).clamp_min(0.0) * torch.sign(d)
    den, gden = u[1].clamp_min(floor), u[3::2].clamp_min(floor)
    live, glive = (u[1] > floor).to(u.dtype), (u[3::2] > floor).to(u.dtype)
    overall = torch.stack([c.sum() / den, -c.sum() * u[0] / den**2 * live])
    per_group = torch.stack([-c / gden, c * u[2::2] / gden**2 * glive], dim=-1)  # [G, 2]
    return torch.cat([overall, per_group.reshape(-1)])


# ---------------------------------------------------------------------- the objective
class EqualOpportunity(DistributedObjective):
    """``Φ = mean_k h_k + f(mean_k g_k)`` for equality of opportunity (module docstring).

    Batches carry targets ``[b, 2]``: the label and the protected group (``data.name=adult``).
    Every piece comes from one forward pass (:meth:`parts`); the inner value is a p-vector,
    p = 2 + 2G, which FedDRO averages every step and DS-FedDRO every I steps.

    Args:
        model: a binary classifier (2 outputs).
        num_groups: G.
        lam: λ > 0, the penalty weight.
        tau: τ > 0, the smoothing temperature of ``s = σ(z/τ)``.
        slack: κ ≥ 0, the tolerated gap.
        floor: ε > 0, the least value a positive share is read at.
    """

    unit_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        model: nn.Module,
        num_groups: int,
        lam: float = 10.0,
        tau: float = 0.5,
        slack: float = 0.0,
        floor: float = 1e-3,
    ) -> None:
        super().__init__(model, lam)
        if num_groups < 1:
            raise ConfigError.bad_value("num_groups", num_groups, "an int >= 1", "2")
        if not tau > 0:
            raise ConfigError.bad_value("fairness.tau", tau, "a float > 0 (τ)", "0.5")
        if not slack >= 0:
            raise ConfigError.bad_value("fairness.slack", slack, "a float >= 0 (κ)", "0.0")
        if not floor > 0:
            raise ConfigError.bad_value("fairness.floor", floor, "a float > 0 (ε)", "1e-3")
        self.num_groups = int(num_groups)
        self.inner_dim = 2 + 2 * self.num_groups  # type: ignore[misc]
        self.tau, self.slack, self.floor = float(tau), float(slack), float(floor)

    # -- per-batch pieces ------------------------------------------------------------
    def parts(self, params: Params, batch: Batch, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        """``(g_k(x; batch) [p], h_k(x; batch), mean loss)`` from one forward pass."""
        logits = self.predict(params, batch["x"])
        target = batch["y"]
        losses = F.cross_entropy(logits, class_labels(target, logits), reduction="none")
        margin = logits[..., 1] - logits[..., 0]
        g = fairness_inner(margin, target[..., 0], target[..., 1], self.num_groups, self.tau)
        return g, losses.mean(), losses.mean()

    def inner(self, params: Params, batch: Batch, ctx: Context) -> Tensor:
        return self.parts(params, batch, ctx)[0]

    def h(self, params: Params, batch: Batch, ctx: Context) -> Tensor:
        return self.parts(params, batch, ctx)[1]

    def f(self, y: Tensor, ctx: Context) -> Tensor:
        return fairness_penalty(y, self.lam, self.slack, self.floor)

    def df(self, y: Tensor, ctx: Context) -> Tensor:
        return fairness_penalty_grad(y, self.lam, self.slack, self.floor)

    def probe(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """``g_k`` at the broadcast point on step 0's value batch (no units: the raw vector)."""
        return self.inner(params, batches["value"], ctx)

    def step_logs(self, y: Any, batches: dict[str, Batch], ctx: Context) -> dict[str, Tensor]:
        return {}

    # -- pieces of the sample-level DRO objectives that do not apply here ----------------
    def _per_sample_only(self) -> ConfigError:
        return ConfigError(
            "objective=fairness: g needs each row's score, label and group, not only its loss; "
            "the updaters that build g from per-sample losses (fastdro, pdsgd) do not apply "
            "to it (use feddro, ds_feddro, fedavg_co, mbsgd or gcivr)"
        )

    def g_of_losses(self, losses: Tensor, ctx: Context) -> Tensor:
        raise self._per_sample_only()

    def h_of_losses(self, losses: Tensor, ctx: Context) -> Tensor:
        raise self._per_sample_only()

    def probe_of_losses(self, losses: Tensor) -> Tensor:
        raise self._per_sample_only()

    def describe(self) -> dict[str, Any]:
        return {
            "objective": type(self).__name__,
            "lam": self.lam,
            "tau": self.tau,
            "slack": self.slack,
            "floor": self.floor,
            "num_groups": self.num_groups,
        }
