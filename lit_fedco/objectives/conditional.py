"""Conditional stochastic objectives (FCSG, Wu et al., "Federated Conditional Stochastic
Optimization", §2).

Client n minimises ``F^n(x) = E_ξ f_ξ(E_{η|ξ} g_η(x, ξ))`` (FCSG eq. 1): the inner samples η
are drawn *conditionally on* the outer sample ξ. With one ξ and m samples η_1..η_m the
plug-in estimator of FCSG §3,

    ∇F̂(x; ξ, B) = (1/m Σ_j ∇g_{η_j}(x, ξ))ᵀ ∇f_ξ(1/m Σ_j g_{η_j}(x, ξ)),

is biased, and is exactly the autograd gradient of ``F̂(x; ξ, B) = f_ξ(mean_j g_{η_j}(x, ξ))``
(FCSG eq. 3) — the mean over η is taken *inside* f. Averaging the loss over η instead,
``mean_j f_ξ(g_{η_j})``, is a different (and wrong) objective
(``tests/objectives/test_conditional.py``).

A :class:`ConditionalObjective` exposes ``inner`` (one inner mean per outer sample, leading
dimension b) and ``outer`` (the mean over the b outer samples of f_ξ); ``value`` is
``outer(inner(x)) + h(x)`` on the step's batch (role ``"inner"``), whose rows are the ξ and
which carries the η drawn for them. Problems here:

- :class:`InvariantLogReg` — FCSG §5.1, eq. 4.
- :class:`AveragePrecision` — FCSG §5.3, eq. 6 (with :class:`ScoreERM` for FedAvg and
  :class:`AUCMinMax` for CODA+ on the same task).
- MAML with task sampling — :mod:`lit_fedco.objectives.maml`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import grad_and_value

from lit_fedco.core.models import call
from lit_fedco.core.state import tree_leaves, tree_map
from lit_fedco.objectives.base import Batch, Context, Objective, Params


def plugin_gradient(
    value: Callable[[Params], Tensor], params: Params
) -> tuple[dict[str, Tensor], Tensor]:
    """``∇F̂(x; ξ, B)`` and ``F̂``: the autograd gradient of the plug-in objective (FCSG §3)."""
    return grad_and_value(value)(params)


class ConditionalObjective(Objective):
    """Base of the conditional objectives: ``F̂(x) = mean_i f_{ξ_i}(y_i) + h(x)`` with
    ``y_i = mean_j g_{η_ij}(x, ξ_i)``, over the b outer samples ξ_i of the batch."""

    composition: ClassVar[str] = "conditional"

    def inner(self, params: Params, batch: Batch, ctx: Context) -> Any:
        """``y_i = mean_j g_{η_ij}(x, ξ_i)`` for every outer sample: leaves of leading size b."""
        raise NotImplementedError

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """``mean_i f_{ξ_i}(y_i)``."""
        raise NotImplementedError

    def regularizer(self, params: Params) -> Tensor | float:
        """The non-compositional term h(x); none by default."""
        return 0.0

    def num_outer(self, batch: Batch) -> int:
        """b, the number of outer samples ξ in ``batch`` (a static shape)."""
        return int(batch["y"].shape[0])

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        """``F̂(x; ξ, B)`` on the step's batch (FCSG eq. 3, averaged over the b outer samples)."""
        batch = batches["inner"]
        return self.outer(self.inner(params, batch, ctx), batch, ctx) + self.regularizer(params)

    def outer_shared(self, y: Any, batch: Batch, ctx: Context) -> Tensor:
        """``mean_i f_{ξ_i}(y)`` at one inner value y shared by every ξ_i of ``batch`` — the
        compositional reading of the problem that Local-SCGD takes (ξ and η independent)."""
        b = self.num_outer(batch)
        return self.outer(tree_map(lambda t: t.expand(b, *t.shape), y), batch, ctx)


# ---------------------------------------------------------------------- §5.1 invariant LR
def nonconvex_regularizer(params: Params, lam: float, gamma: float) -> Tensor:
    """``λ Σ_i γ x_i² / (1 + γ x_i²)`` over every parameter entry (FCSG eq. 4)."""
    return lam * sum(((gamma * w**2) / (1 + gamma * w**2)).sum() for w in tree_leaves(params))  # type: ignore[return-value]


class InvariantLogReg(ConditionalObjective):
    """Invariant logistic regression (FCSG §5.1, eq. 4; Hu et al. 2020).

    ``F(x) = E_{ξ=(a,b)} log(1 + exp(−b · E_{η|ξ}[η]ᵀx)) + λ Σ_i γx_i²/(1 + γx_i²)`` with
    ``η ~ N(a, σ₂² I)``. Here ``g_η(x, ξ) = s(x; η)`` is the model's score of η (ηᵀx for the
    ``linear`` model), ``f_ξ(u) = log(1 + exp(−b u))``. The batch carries the m samples
    η | ξ of every outer sample under ``"eta"`` (drawn by the ``invariant_logreg`` problem).

    Args:
        model: a model with one output, the score (``linear`` for the paper's x ∈ R^d).
        lam: λ (paper: 0.001). gamma: γ (paper: 10).
    """

    def __init__(self, model: nn.Module, lam: float, gamma: float) -> None:
        super().__init__(model)
        self.lam, self.gamma = float(lam), float(gamma)

    def score(self, params: Params, z: Tensor) -> Tensor:
        """The model's scalar score of every row of ``z`` [n, d] → [n]."""
        return call(self.model, params, z).squeeze(-1)

    def inner(self, params: Params, batch: Batch, ctx: Context) -> Tensor:
        """``mean_j s(x; η_ij)`` per outer sample, [b] (ηᵀx averaged over the m samples)."""
        eta = batch["eta"]
        b, m, d = eta.shape
        return self.score(params, eta.reshape(b * m, d)).view(b, m).mean(1)

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        """``mean_i log(1 + exp(−b_i y_i))`` with ``b_i = 2 y_i^{label} − 1 ∈ {±1}``."""
        assert batch is not None
        sign = 2 * batch["y"].to(y.dtype) - 1
        return F.softplus(-sign * y).mean()

    def regularizer(self, params: Params) -> Tensor:
        return nonconvex_regularizer(params, self.lam, self.gamma)

    def predict(self, params: Params, x: Tensor) -> Tensor:
        """Two-class logits ``[−s/2, s/2]`` of the score of a: the arg-max is sign(aᵀx) and the
        cross-entropy is the logistic loss, so the loop's metrics apply unchanged."""
        s = self.score(params, x)
        return torch.stack([-s / 2, s / 2], dim=-1)

    def describe(self) -> dict[str, Any]:
        return {"objective": "InvariantLogReg", "lam": self.lam, "gamma": self.gamma}


# ---------------------------------------------------------------------- §5.3 AUPRC
def ap_surrogate_terms(h: Tensor, y: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """``u₁_i = mean_j 1(y_j = 1) ℓ_ij`` and ``u₂_i = mean_j ℓ_ij`` with the squared hinge
    ``ℓ_ij = ℓ(x; z_i, z_j) = (max{s − h(z_i) + h(z_j), 0})²`` (FCSG §5.3), for every row i
    as anchor and every row j of the batch (the anchor included, as in the definition of AP:
    the precision at z⁺'s own threshold counts z⁺); only positive anchors are used.

    Args:
        h: scores [b]. y: labels in {0, 1} [b]. margin: s.

    Returns:
        u₁, u₂, each [b].
    """
    loss = torch.relu(margin - h.unsqueeze(1) + h.unsqueeze(0)) ** 2
    pos = (y == 1).to(h.dtype)
    return (loss * pos.unsqueeze(0)).mean(1), loss.mean(1)


def ap_surrogate(u: Tensor, y: Tensor) -> Tensor:
    """``mean over positive anchors i of f(u_i) = −u₁_i / u₂_i`` (FCSG eq. 6; u₂ ≥ s²/b > 0)."""
    pos = (y == 1).to(u.dtype)
    return (pos * (-u[:, 0] / u[:, 1])).sum() / pos.sum()


class BinaryScorer(Objective):
    """Shared by the objectives of the AUPRC task: a one-output model's score, two-class logits
    ``[−s/2, s/2]`` for the loop's accuracy and loss."""

    def score(self, params: Params, x: Tensor) -> Tensor:
        """The raw score of every row, [n]."""
        return call(self.model, params, x).squeeze(-1)

    def predict(self, params: Params, x: Tensor) -> Tensor:
        s = self.score(params, x)
        return torch.stack([-s / 2, s / 2], dim=-1)


class AveragePrecision(BinaryScorer, ConditionalObjective):
    """The AP surrogate (FCSG eq. 6): ``F(x) = E_{ξ⁺} f(E_ξ g(x; ξ⁺, ξ))`` with
    ``g = (1(y = 1) ℓ, ℓ) ∈ R²`` and ``f(u₁, u₂) = −u₁/u₂``, on scores ``h = sigmoid(score)``
    (bounded, as in Qi et al. 2021's SOAP). The batch's positives are the outer samples ξ⁺ and
    all its rows the inner samples (the ``auprc`` problem puts positives in every batch).

    Args:
        model: a one-output model. margin: s.
    """

    def __init__(self, model: nn.Module, margin: float) -> None:
        super().__init__(model)
        self.margin = float(margin)

    def inner(self, params: Params, batch: Batch, ctx: Context) -> Tensor:
        """``(u₁_i, u₂_i)`` for every row i as anchor, [b, 2]."""
        h = torch.sigmoid(self.score(params, batch["x"]))
        u1, u2 = ap_surrogate_terms(h, batch["y"], self.margin)
        return torch.stack([u1, u2], dim=-1)

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        assert batch is not None
        return ap_surrogate(y, batch["y"])

    def describe(self) -> dict[str, Any]:
        return {"objective": "AveragePrecision", "margin": self.margin}


class ScoreERM(BinaryScorer):
    """Cross-entropy of the two-class logits, i.e. the logistic loss of the score (FedAvg's
    objective in FCSG §5.3), on plain minibatches."""


def auc_minmax_loss(
    h: Tensor, y: Tensor, a: Tensor, b: Tensor, alpha: Tensor, p: float, margin: float
) -> Tensor:
    """Per-sample min-max margin AUC square loss (Yuan et al. 2021, the loss of CODA+):

    ``(1−p)(h−a)² 1[y=1] + p(h−b)² 1[y=0] + 2α(p(1−p)m + p h 1[y=0] − (1−p) h 1[y=1])
    − p(1−p)α²``, minimised over (x, a, b) and maximised over α ≥ 0; p is the positive ratio.
    """
    pos = (y == 1).to(h.dtype)
    neg = 1 - pos
    return (
        (1 - p) * (h - a) ** 2 * pos
        + p * (h - b) ** 2 * neg
        + 2 * alpha * (p * (1 - p) * margin + p * h * neg - (1 - p) * h * pos)
        - p * (1 - p) * alpha**2
    )


class AUCMinMax(BinaryScorer):
    """The min-max AUC objective of CODA+ on scores ``h = sigmoid(score)``; p from the data.

    Args:
        model: a one-output model. p: the training positive ratio. margin: m.
    """

    composition: ClassVar[str] = "minimax"

    def __init__(self, model: nn.Module, p: float, margin: float) -> None:
        super().__init__(model)
        self.p, self.margin = float(p), float(margin)

    def minimax_value(self, params: Params, aux: dict[str, Tensor], batch: Batch) -> Tensor:
        """Mean :func:`auc_minmax_loss` with ``aux = {"a", "b", "alpha"}`` (scalars)."""
        h = torch.sigmoid(self.score(params, batch["x"]))
        return auc_minmax_loss(
            h, batch["y"], aux["a"], aux["b"], aux["alpha"], self.p, self.margin
        ).mean()

    def describe(self) -> dict[str, Any]:
        return {"objective": "AUCMinMax", "positive_ratio": self.p, "margin": self.margin}
