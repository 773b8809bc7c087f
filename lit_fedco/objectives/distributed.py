"""Objectives with a distributed inner function (FedDRO paper, eq. 2 and §2.1).

    Φ(x) = h(x) + f((1/K) Σ_k g_k(x)),        h = (1/K) Σ_k h_k

Client k knows only its own ``g_k`` and ``h_k`` (means over its samples); the outer ``f`` is
shared. With an equal split (the paper's setting) the client means average to the mean over all
M samples, so Φ is the sample-level DRO objective over the union of the clients' data; with
unequal client sizes every client counts 1/K and its samples 1/(K n_k).

Sample-level DRO (paper eq. 3) over per-sample losses ``ℓ_i = ℓ(x; ζ_i)``, i = 1..M::

    max_{p ∈ Δ_M}  Σ_i p_i ℓ_i − λ D(p, 1/M)

**KL divergence** ``D = Σ p_i log(M p_i)``. The maximiser is ``p = softmax(ℓ/λ)`` and the value
``λ log((1/M) Σ_i exp(ℓ_i/λ))``: inner ``g_k = mean_{i∈k} exp(ℓ_i/λ)`` (p = 1), outer
``f(u) = λ log u``, h = 0. The paper's eq. (4) drops the factor λ (its gradient is ours divided
by λ, i.e. its step size is η/λ in ours); we keep it so that the value is the minimax value.

**χ² divergence** ``D = (M/2) Σ (p_i − 1/M)²``. Derivation (paper eq. (5) is not it: its signs
are flipped and it misses the mean loss). Drop ``p ≥ 0`` and keep ``Σ p_i = 1`` with a
multiplier μ; stationarity gives ``ℓ_i − λM (p_i − 1/M) − μ = 0``; summing over i fixes
``μ = ℓ̄ = (1/M) Σ ℓ_i``, so ::

    p_i = 1/M + (ℓ_i − ℓ̄)/(λM),
    value = ℓ̄ + (1/(λM)) Σ (ℓ_i − ℓ̄) ℓ_i − (1/(2λM)) Σ (ℓ_i − ℓ̄)² = ℓ̄ + Var(ℓ)/(2λ)
          = mean(ℓ + ℓ²/(2λ)) − (mean ℓ)²/(2λ).

Hence ``h_k = mean_{i∈k} (ℓ_i + ℓ_i²/(2λ))``, ``g_k = mean_{i∈k} ℓ_i`` (p = 1) and
``f(u) = −u²/(2λ)`` (concave). **Validity**: the closed form is the max over the simplex only
when every ``p_i ≥ 0``, i.e. ``min_i ℓ_i ≥ ℓ̄ − λ``. Otherwise the unconstrained maximiser
leaves the simplex and the closed form (a max over the larger affine hull) *overestimates* the
DRO value; :func:`chi2_closed_form_valid` checks the condition.

**Stable KL form.** ``exp(ℓ/λ)`` overflows for small λ (λ = 0.01 and ℓ ≈ 10 give exp(1000)).
Every inner value of the KL objective is carried in *units* ``exp(c/λ)`` with a log-space shift
c shared by all clients: ``g_k^c = mean exp((ℓ_i − c)/λ)`` and ``f_c(u) = λ log u + c``. Then
``f_c(mean_k g_k^c) = f(mean_k g_k)`` exactly, and ``∇f_c(u) ∇g^c`` is unchanged, because the
factor ``exp(−c/λ)`` cancels. The shift is chosen once per round from the cohort's probes
(``c = max_k λ log g_k(x̄; B_k)``, computed with log-sum-exp, so the cohort mean starts in
[1/m, 1]) and estimates carried across rounds are converted exactly, in log space
(:meth:`KLSampleDRO.convert`). Limitation: within a round the shift is fixed, so per-sample
losses must stay within ``λ · log(max float)`` of it (88λ in float32, 709λ in float64): at
λ = 0.01 that is ±0.88 in float32 — run small λ in float64.

**Dual form** (f-divergence duality, Ben-Tal et al. 2013). Both values are a one-dimensional
minimisation over a shift μ of a mean over samples::

    V = min_μ Ψ(μ),   Ψ(μ) = μ + (1/M) Σ_i φ*(ℓ_i − μ),

with φ* the (scaled) convex conjugate of the divergence's generator. KL: the maximiser of
``Σ p_i ℓ_i − λ Σ p_i log(M p_i) − μ (Σ p_i − 1)`` over p ≥ 0 is ``p_i = exp((ℓ_i − μ)/λ − 1)/M``,
and with the multiplier written ``μ − λ``, ``φ*(s) = λ (exp(s/λ) − 1)``: ``Ψ'(μ) = 0`` gives
``μ* = λ log mean exp(ℓ/λ) = V`` (and ``mean φ*(ℓ − μ*) = 0``). χ² (without ``p ≥ 0``, as the
closed form): stationarity in p gives ``p_i = 1/M + (ℓ_i − μ)/(λM)`` and
``φ*(s) = s + s²/(2λ)``; ``μ* = ℓ̄`` and ``Ψ(μ*) = ℓ̄ + Var(ℓ)/(2λ)``. Ψ is linear in the
per-sample terms, so its minibatch gradients in (x, μ) are unbiased — the form the primal-dual
baseline (:mod:`lit_fedco.updaters.dro_baselines`) constrains. A batch's Ψ at any μ is a
function of a few numbers (:meth:`DistributedObjective.dual_stats`): KL ``λ log mean exp(ℓ/λ)``,
χ² ``(mean ℓ, mean ℓ²)``.

``f_c`` reads an estimate u at ``max(u, u_min)``, its projection onto the range of g
(``g ≥ exp(−c/λ)`` for non-negative losses): λ log is Lipschitz only away from 0 (the paper's
Assumption 3.2 needs it), and the hybrid estimator (eq. 8) or the server step γ_y > 1 can push
an estimate of a positive mean towards or below 0 (:class:`KLSampleDRO`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import RoundContext
from lit_fedco.objectives.base import Batch, Context, Objective, Params, cross_entropy

DISTRIBUTED_OBJECTIVES = ("kl", "chi2")

Y_FLOOR = 1e-12
"""The least value ``λ log u`` is read at when no bound of g is known (in the round's units,
in which the cohort mean starts in [1/m, 1])."""


# ---------------------------------------------------------------------- closed forms (tests)
def kl_sample_value(losses: Tensor, lam: float) -> Tensor:
    """``λ log((1/M) Σ_i exp(ℓ_i/λ))``, the KL-DRO value (eq. 3-4), by log-sum-exp."""
    return lam * (torch.logsumexp(losses / lam, dim=-1) - math.log(losses.shape[-1]))


def kl_sample_weights(losses: Tensor, lam: float) -> Tensor:
    """The maximising ``p = softmax(ℓ/λ)``."""
    return torch.softmax(losses / lam, dim=-1)


def kl_sample_primal(losses: Tensor, p: Tensor, lam: float) -> Tensor:
    """``Σ p_i ℓ_i − λ Σ p_i log(M p_i)`` at weights p (0 log 0 = 0)."""
    m = losses.shape[-1]
    ent = torch.where(p > 0, p * torch.log(m * p.clamp_min(1e-300)), torch.zeros_like(p))
    return (p * losses).sum(-1) - lam * ent.sum(-1)


def chi2_value(losses: Tensor, lam: float) -> Tensor:
    """The closed form ``ℓ̄ + Var(ℓ)/(2λ)`` (population variance); the χ²-DRO value only where
    :func:`chi2_closed_form_valid` holds."""
    mean = losses.mean(-1)
    return mean + ((losses - mean.unsqueeze(-1)) ** 2).mean(-1) / (2 * lam)


def chi2_weights(losses: Tensor, lam: float) -> Tensor:
    """The unconstrained maximiser ``p_i = 1/M + (ℓ_i − ℓ̄)/(λM)`` (sums to 1)."""
    m = losses.shape[-1]
    return 1.0 / m + (losses - losses.mean(-1, keepdim=True)) / (lam * m)


def chi2_closed_form_valid(losses: Tensor, lam: float) -> Tensor:
    """``min_i ℓ_i ≥ ℓ̄ − λ``: every weight of :func:`chi2_weights` is non-negative."""
    return losses.min(-1).values >= losses.mean(-1) - lam


def chi2_primal(losses: Tensor, p: Tensor, lam: float) -> Tensor:
    """``Σ p_i ℓ_i − λ (M/2) Σ (p_i − 1/M)²`` at weights p."""
    m = losses.shape[-1]
    return (p * losses).sum(-1) - lam * m / 2 * ((p - 1.0 / m) ** 2).sum(-1)


# ---------------------------------------------------------------------- objectives
class DistributedObjective(Objective):
    """Base class of ``Φ = h + f(mean_k g_k)`` with g, h means over a client's samples.

    Subclasses define the per-batch pieces on the per-sample losses
    (:meth:`g_of_losses`, :meth:`h_of_losses`) and the outer :meth:`f`. Inner values may be
    carried in objective-specific *units* (the KL shift): :meth:`units` picks them from the
    cohort's probes once per round and :meth:`convert` moves a carried estimate between them.
    The default has no units (the identity).

    Args:
        model: the network.
        lam: λ > 0, the divergence weight.
        sample_loss: per-sample loss ``ℓ(logits, target) -> [b]``.
    """

    composition: ClassVar[str] = "distributed"
    has_probe: ClassVar[bool] = True
    unit_keys: ClassVar[tuple[str, ...]] = ()
    """Context entries that fix the units of inner values (kept in the server state)."""

    def __init__(
        self,
        model: nn.Module,
        lam: float = 1.0,
        sample_loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
    ) -> None:
        super().__init__(model, sample_loss)
        if not lam > 0:
            raise ConfigError.bad_value("lam", lam, "a float > 0 (λ)", "1.0")
        self.lam = float(lam)

    # -- per-batch pieces ------------------------------------------------------------
    def g_of_losses(self, losses: Tensor, ctx: Context) -> Tensor:
        """``g_k(x; batch)`` from the batch's per-sample losses; the mean by default."""
        return losses.mean()

    def h_of_losses(self, losses: Tensor, ctx: Context) -> Tensor:
        """``h_k(x; batch)``; zero by default."""
        return losses.sum() * 0.0

    def f(self, y: Tensor, ctx: Context) -> Tensor:
        """The outer function; the identity by default."""
        return y.sum()

    def df(self, y: Tensor, ctx: Context) -> Tensor:
        """``∇f(y)``, the cotangent of eq. (7); by autograd unless a subclass writes it out."""
        return grad(lambda v: self.f(v, ctx))(y)

    def parts(self, params: Params, batch: Batch, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        """``(g_k(x; batch), h_k(x; batch), mean loss)`` from one forward pass."""
        losses = self.losses(params, batch)
        return self.g_of_losses(losses, ctx), self.h_of_losses(losses, ctx), losses.mean()

    # -- the Objective interface -----------------------------------------------------
    def inner(self, params: Params, batch: Batch, ctx: Context) -> Any:
        return self.g_of_losses(self.losses(params, batch), ctx)

    def outer(self, y: Any, batch: Batch | None, ctx: Context) -> Tensor:
        return self.f(y, ctx)

    def h(self, params: Params, batch: Batch, ctx: Context) -> Tensor:
        """The non-compositional term ``h_k(x; batch)``."""
        return self.h_of_losses(self.losses(params, batch), ctx)

    def value(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor:
        """``f(g_k(x; B)) + h_k(x; B)`` on the step's first batch (a one-client estimate)."""
        g, h, _ = self.parts(params, next(iter(batches.values())), ctx)
        return self.f(g, ctx) + h

    # -- units ---------------------------------------------------------------------------
    def probe(self, params: Params, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """The client's inner value at the broadcast point in a unit-free form, on the fresh
        value batch ζ' (``"value"``) of step 0."""
        return self.probe_of_losses(self.losses(params, batches["value"]))

    def probe_of_losses(self, losses: Tensor) -> Tensor:
        """``g_k`` of a batch with per-sample losses ``losses`` in the unit-free form the probe
        sends (what :meth:`units` and :meth:`cohort_mean` read); ``g_of_losses`` by default."""
        return self.g_of_losses(losses, {})

    def units(self, probes: Tensor) -> Context:
        """The round's units, from the cohort's probes ``[m, ...]``; none by default."""
        return {}

    def cohort_mean(self, probes: Tensor, units: Context) -> Tensor:
        """``mean_k g_k(x̄; B_k)`` over the cohort, in ``units``."""
        return probes.mean(0)

    def convert(self, y: Tensor, old: Context, new: Context) -> Tensor:
        """An inner value carried in units ``old``, expressed in units ``new``."""
        return y

    def round_context(self, probes: Tensor) -> RoundContext:
        return RoundContext(broadcast=self.units(probes))

    # -- the dual form (module docstring) ----------------------------------------------------
    def dual_penalty(self, s: Tensor) -> Tensor:
        """``φ*(s)`` element-wise: the DRO value is ``min_μ μ + mean_i φ*(ℓ_i − μ)``."""
        raise ConfigError(f"{type(self).__name__} has no dual form (KL and χ² have one)")

    def dual_stats(self, losses: Tensor) -> Tensor:
        """A batch's few numbers ``[s]`` from which :meth:`dual_value` gives its Ψ at any μ."""
        raise ConfigError(f"{type(self).__name__} has no dual form (KL and χ² have one)")

    def dual_value(self, stats: Tensor, mu: Tensor) -> Tensor:
        """``Ψ(μ) = μ + mean φ*(ℓ − μ)`` over the union of m equal batches, from their
        :meth:`dual_stats` ``[m, s]``."""
        raise ConfigError(f"{type(self).__name__} has no dual form (KL and χ² have one)")

    def dual_minimiser(self, stats: Tensor) -> Tensor:
        """``argmin_μ Ψ(μ)`` over the union of m equal batches (their :meth:`dual_stats`)."""
        raise ConfigError(f"{type(self).__name__} has no dual form (KL and χ² have one)")

    def describe(self) -> dict[str, Any]:
        return {"objective": type(self).__name__, "lam": self.lam}


class KLSampleDRO(DistributedObjective):
    """Sample-level KL-DRO, ``λ log((1/M) Σ_i exp(ℓ_i/λ))`` (paper §2.1, eq. 4 times λ).

    ``g_k^c = mean exp((ℓ − c)/λ)``, ``f_c(u) = λ log max(u, u_min) + c``, h = 0, with the
    shared shift ``c = ctx["shift"]`` (module docstring, "Stable KL form").

    ``u_min`` is the least value g can take: with per-sample losses ``ℓ ≥ loss_floor``
    (cross-entropy: 0), ``g ≥ exp((loss_floor − c)/λ)``. An estimate below it (the hybrid
    estimator (8) or a server step γ_y > 1 can undershoot, even below 0) is projected onto the
    range of g before ``f`` and ``∇f = λ/u`` read it; on that range f is Lipschitz with
    ``B_f = λ exp(−loss_floor/λ)``, as the paper's Assumption 3.2 requires. Without a known
    bound (``loss_floor=None``) only a tiny ``Y_FLOOR`` guards the logarithm.

    Args:
        model, lam, sample_loss: as :class:`DistributedObjective`.
        loss_floor: a lower bound of the per-sample loss, or None.
    """

    unit_keys: ClassVar[tuple[str, ...]] = ("shift",)

    def __init__(
        self,
        model: nn.Module,
        lam: float = 1.0,
        sample_loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
        loss_floor: float | None = 0.0,
    ) -> None:
        super().__init__(model, lam, sample_loss)
        self.loss_floor = loss_floor

    def g_of_losses(self, losses: Tensor, ctx: Context) -> Tensor:
        c = ctx.get("shift")
        z = losses if c is None else losses - c
        return torch.exp(z / self.lam).mean()

    def inner_floor(self, y: Tensor, ctx: Context) -> Tensor:
        """``u_min`` in the units of ``ctx`` (at least ``Y_FLOOR``)."""
        if self.loss_floor is None:
            return y.new_tensor(Y_FLOOR)
        c = ctx.get("shift", y.new_zeros(()))
        return torch.exp((self.loss_floor - c) / self.lam).clamp_min(Y_FLOOR)

    def f(self, y: Tensor, ctx: Context) -> Tensor:
        c = ctx.get("shift")
        out = self.lam * torch.log(torch.maximum(y, self.inner_floor(y, ctx))).sum()
        return out if c is None else out + c

    def df(self, y: Tensor, ctx: Context) -> Tensor:
        """``λ / max(y, u_min)``: ∇f at the projection of y onto the range of g."""
        return self.lam / torch.maximum(y, self.inner_floor(y, ctx))

    def probe_of_losses(self, losses: Tensor) -> Tensor:
        """``λ log g_k(x; B) = λ (logsumexp(ℓ/λ) − log b)``: no overflow at any λ."""
        return self.lam * (torch.logsumexp(losses / self.lam, 0) - math.log(losses.shape[0]))

    def units(self, probes: Tensor) -> Context:
        """The shift ``c = max_k λ log g_k``: the cohort mean then lies in [1/m, 1]."""
        return {"shift": probes.max()}

    def cohort_mean(self, probes: Tensor, units: Context) -> Tensor:
        return torch.exp((probes - units["shift"]) / self.lam).mean(0)

    def convert(self, y: Tensor, old: Context, new: Context) -> Tensor:
        """``y exp((c_old − c_new)/λ)``, in log space so that neither factor overflows."""
        log_y = torch.log(y.abs().clamp_min(torch.finfo(y.dtype).tiny))
        scaled = torch.exp(log_y + (old["shift"] - new["shift"]) / self.lam)
        return torch.where(y == 0, torch.zeros_like(y), torch.sign(y) * scaled)

    def dual_penalty(self, s: Tensor) -> Tensor:
        """``λ (exp(s/λ) − 1)``."""
        return self.lam * torch.expm1(s / self.lam)

    def dual_stats(self, losses: Tensor) -> Tensor:
        """``[λ log mean exp(ℓ/λ)]``, the batch's KL-DRO value (its Ψ's minimiser)."""
        return self.probe_of_losses(losses).reshape(1)

    def dual_value(self, stats: Tensor, mu: Tensor) -> Tensor:
        """``μ + λ (exp((V − μ)/λ) − 1)`` with V the union's value (log-mean-exp of the stats)."""
        return mu + self.lam * torch.expm1((self.dual_minimiser(stats) - mu) / self.lam)

    def dual_minimiser(self, stats: Tensor) -> Tensor:
        """``λ log mean_k exp(V_k/λ)``: the union's KL-DRO value."""
        v = stats[:, 0]
        return self.lam * (torch.logsumexp(v / self.lam, 0) - math.log(v.shape[0]))


class Chi2SampleDRO(DistributedObjective):
    """Sample-level χ²-DRO in closed form (module docstring): ``h = mean(ℓ + ℓ²/(2λ))``,
    ``g = mean ℓ``, ``f(u) = −u²/(2λ)``. Equals the DRO value where
    :func:`chi2_closed_form_valid` holds, and bounds it from above elsewhere."""

    def h_of_losses(self, losses: Tensor, ctx: Context) -> Tensor:
        return (losses + losses**2 / (2 * self.lam)).mean()

    def f(self, y: Tensor, ctx: Context) -> Tensor:
        return -(y**2).sum() / (2 * self.lam)

    def df(self, y: Tensor, ctx: Context) -> Tensor:
        return -y / self.lam

    def dual_penalty(self, s: Tensor) -> Tensor:
        """``s + s²/(2λ)`` (no ``p ≥ 0``, like the closed form)."""
        return s + s**2 / (2 * self.lam)

    def dual_stats(self, losses: Tensor) -> Tensor:
        """``[mean ℓ, mean ℓ²]``."""
        return torch.stack([losses.mean(), (losses**2).mean()])

    def dual_value(self, stats: Tensor, mu: Tensor) -> Tensor:
        """``ℓ̄ + (mean ℓ² − 2 μ ℓ̄ + μ²)/(2λ)`` over the union."""
        m1, m2 = stats[:, 0].mean(), stats[:, 1].mean()
        return m1 + (m2 - 2 * mu * m1 + mu**2) / (2 * self.lam)

    def dual_minimiser(self, stats: Tensor) -> Tensor:
        """``ℓ̄``, the union's mean loss."""
        return stats[:, 0].mean()


def make_distributed_objective(
    name: str,
    model: nn.Module,
    lam: float,
    sample_loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
) -> DistributedObjective:
    """The objective called ``name``: ``"kl"`` or ``"chi2"`` (config ``sample_dro.kind``).

    A ``sample_loss`` other than cross-entropy gives the KL form no lower bound of the loss.
    """
    if name == "kl":
        floor = 0.0 if sample_loss is cross_entropy else None
        return KLSampleDRO(model, lam, sample_loss, loss_floor=floor)
    if name == "chi2":
        return Chi2SampleDRO(model, lam, sample_loss)
    raise ConfigError.bad_value("kind", name, f"one of {DISTRIBUTED_OBJECTIVES}", "kl")
