"""The FedDRO paper's centralised DRO baselines on CIFAR10-ST / CIFAR100-ST, run "in parallel".

The FedDRO paper (Khanduri et al., §6) compares FedDRO and DS-FedDRO with FastDRO (Levy et al.
2020, "Large-Scale Methods for Distributionally Robust Optimization") and PDSGD (Xu 2020,
"Primal-dual stochastic gradient method for convex programs with many functional
constraints"), both centralised methods, run as "a parallel version of the centralized
algorithms where the overall gradient computation is K times larger" with I = 1. Here that is
one step per round (``local_steps = 1``, fixed by validation as MBSGD's): every cohort client
computes its share of the gradient at the broadcast x on its own batch, and the server averages
— one step of the centralised method on the union of the m cohort batches.

Both run on the ``sample_dro`` problem (composition ``"distributed"``), whose value over the
samples ``ℓ_i = ℓ(x; ζ_i)`` is (:mod:`lit_fedco.objectives.distributed`)::

    KL:  V = λ log mean_i exp(ℓ_i/λ)                     χ²:  V = ℓ̄ + Var(ℓ)/(2λ)

===========  ==========================================================  ====================
updater      step (one per round)                                        besides x each way
===========  ==========================================================  ====================
``fastdro``  ∇ of the DRO loss of the cohort's pooled batch                probe: B floats up,
             (``minibatch``), or its multilevel Monte Carlo debiasing      2B (+ the KL shift)
             (``mlmc``)                                                    down
``pdsgd``    augmented-Lagrangian primal-dual SGD on the epigraph of the   probe: 1 (KL) or 2
             dual form ``min η s.t. μ + mean φ*(ℓ − μ) ≤ η``; the dual z   (χ²) up; μ up, μ
             and η on the server                                         and m_r down
===========  ==========================================================  ====================

(B = 1 for the minibatch estimator, J_max + 1 for MLMC; after the step-size drop both also
receive the round's step size.) Neither keeps any client state between rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor
from torch.func import grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import Probe, RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.ranges import Bound
from lit_fedco.core.seeding import generator
from lit_fedco.core.state import State, tree_axpy
from lit_fedco.objectives.base import Batch, Context, Params
from lit_fedco.updaters.base import register
from lit_fedco.updaters.feddro import DistributedUpdater, MBSGDHparams

FASTDRO_ESTIMATORS = ("minibatch", "mlmc")

MLMC_STREAM = 0x313C
"""The last key of the level draws' stream, (seed, round, 0x313C)
(:mod:`lit_fedco.core.seeding`)."""


# ---------------------------------------------------------------------- FastDRO
@dataclass(frozen=True)
class FastDROHparams(MBSGDHparams):
    """FastDRO (Levy et al. 2020), parallel over the cohort.

    Attributes:
        lr: η, the step size of the SGD step on the estimated gradient.
        lr_decay_round: from this round on the step size is ``lr · lr_decay`` (FedDRO §6: after
            90 rounds); 0 never decays.
        lr_decay: the factor of that drop (FedDRO §6: 1/10).
        local_steps: I = 1, the "parallel" baseline's one step per round (the only value
            accepted, as MBSGD's).
        estimator: ``"minibatch"``: ∇ℒ(x; S), the gradient of the DRO loss of the batch S
            itself (Levy et al.'s mini-batch estimator: biased, the bias shrinking with |S|);
            ``"mlmc"``: Levy et al.'s multilevel Monte Carlo estimator (after Blanchet & Glynn
            2015), unbiased for ∇ E ℒ(x; S) at the largest batch size.
        mlmc_levels: J_max >= 1, the deepest MLMC level: a client's batch b holds
            n₀ 2^{J_max} samples (b must be a multiple of 2^{J_max}; n₀ = b / 2^{J_max}).
        mlmc_doubling: r ∈ (0, 1), the probability of going one level deeper: level J is drawn
            with ``p_J = (1 − r) r^{J−1}`` for J < J_max and ``p_{J_max} = r^{J_max−1}``
            (r = 1/2: ``p_J = 2^{−J}`` below J_max, the truncated geometric law of the
            authors' public code).
    """

    estimator: str = "minibatch"
    mlmc_levels: int = 2
    mlmc_doubling: float = 0.5

    bounds: ClassVar[dict[str, Bound]] = {
        "mlmc_levels": Bound("an int >= 1 (J_max)", "2", ge=1),
        "mlmc_doubling": Bound("a float in (0, 1)", "0.5", gt=0, lt=1),
    }

    def validate(self) -> None:
        super().validate()
        est = FASTDRO_ESTIMATORS
        self.require("estimator", self.estimator in est, f"one of {est}", "minibatch")


def level_probabilities(levels: int, doubling: float) -> list[float]:
    """``[p_1, ..., p_{J_max}]`` of :class:`FastDROHparams` (they sum to 1)."""
    p = [(1 - doubling) * doubling ** (j - 1) for j in range(1, levels)]
    return [*p, doubling ** (levels - 1)]


def block_units(levels: int) -> list[int]:
    """``n_b / n₀`` of the dyadic blocks: block 0 holds the first n₀ samples, block j >= 1 the
    next ``n₀ 2^{j−1}`` (so blocks 0..j are the first ``n₀ 2^j``); one block when ``levels``
    is 0."""
    return [1] + [2 ** (j - 1) for j in range(1, levels + 1)]


def block_sizes(batch: int, levels: int) -> list[int]:
    """Sizes of the dyadic blocks (:func:`block_units`) of a batch of ``batch`` samples."""
    if batch % 2**levels:
        raise ConfigError.bad_value(
            "batch_size", batch, f"a multiple of 2^mlmc_levels = {2**levels} (fastdro)", "16"
        )
    return [batch // 2**levels * u for u in block_units(levels)]


def mlmc_terms(level: int, prob: float) -> list[tuple[float, tuple[int, ...]]]:
    """The MLMC estimator at level J as (coefficient, blocks) pairs::

        ∇ℒ(S_{n₀}) + (1/p_J) [∇ℒ(S_{n₀2^J}) − ½ ∇ℒ(first half) − ½ ∇ℒ(second half)]

    with S_n the first n samples: blocks {0}, {0..J}, {0..J−1} and {J}."""
    w = 1.0 / prob
    return [
        (1.0, (0,)),
        (w, tuple(range(level + 1))),
        (-w / 2, tuple(range(level))),
        (-w / 2, (level,)),
    ]


@register("fastdro")
class FastDRO(DistributedUpdater[FastDROHparams]):
    """FastDRO (Levy et al. 2020): SGD on the mini-batch (or MLMC) estimate of the DRO gradient.

    The mini-batch DRO loss of a sample set S is the problem's value on S alone,
    ``ℒ(x; S) = h_S(x) + f(g_S(x))`` (KL: ``λ log mean_{i∈S} exp(ℓ_i/λ)``; χ²:
    ``ℓ̄_S + Var_S(ℓ)/(2λ)``), and the **mini-batch estimator** is its exact gradient ∇ℒ(x; S):
    the plug-in, biased for ∇V because the outer f is non-linear, with a bias that shrinks as
    |S| grows (Levy et al. bound it for CVaR and χ²).

    **Parallel = pooled.** With K× the computation per step, S is the union of the m cohort
    clients' batches (m b samples), not one batch per client: the step is the centralised
    method's on a batch m times larger. ℒ over the union needs the pooled inner value, so each
    client sends its batch's inner value (the probe, on the step's own batch), the server
    forms ``ȳ_S = mean_k g_k(x; S_k)`` and broadcasts ``∇f(ȳ_S)``, and each client returns
    ``u_k = ∇h_k(x; S_k) + ∇g_k(x; S_k)ᵀ ∇f(ȳ_S)``; then ``mean_k u_k = ∇ℒ(x; ∪_k S_k)``
    exactly (equal batches) and ``x ← x − η mean_k u_k``. This is MBSGD with the inner value
    taken on the gradient's own batch instead of an independent one.

    **MLMC** (``estimator="mlmc"``): the round draws a level J ∈ {1..J_max} with probability
    p_J (the same for the whole cohort; stream (seed, round, 0x313C)) and the step uses::

        ∇ℒ(S_{n₀}) + (1/p_J) [∇ℒ(S_{n₀2^J}) − ½ ∇ℒ(S_{n₀2^J}^{(1)}) − ½ ∇ℒ(S_{n₀2^J}^{(2)})]

    where ``S_n`` is the union of the clients' first n samples and (1), (2) its two halves
    (first and second n/2 samples of each client). Since a uniformly drawn batch is
    exchangeable, both halves are distributed as ``S_{n₀2^{J−1}}``, and the expectation over J
    telescopes: ``E = ∇ E ℒ(S_{n₀2^{J_max}})``, the mini-batch objective at the whole batch —
    unbiased for it, while its own batch sizes are mostly small. Every set is a union of the
    dyadic blocks of :func:`block_sizes`, so a client sends its B = J_max + 1 block inner
    values, the server broadcasts one weight per block for g and for h
    (:meth:`round_context`), and a client's step is the gradient of
    ``Σ_b a_b g_k(x; block b) + e_b h_k(x; block b)`` — one forward pass on the batch. Here
    every client always computes on its whole batch b (shapes are static under vmap), so the
    MLMC estimator costs as much as the mini-batch one: it is there for its statistics, not
    its savings.
    """

    roles: ClassVar[tuple[str, ...]] = ("grad",)
    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND}
    y_source = "none"

    @property
    def levels(self) -> int:
        """J_max for MLMC, 0 (one block: the whole batch) for the mini-batch estimator."""
        hp = self.hparams
        return hp.mlmc_levels if hp.estimator == "mlmc" else 0

    def blocks(self, losses: Tensor) -> list[Tensor]:
        """The per-sample losses of a batch split into its dyadic blocks."""
        return list(torch.split(losses, block_sizes(losses.shape[0], self.levels)))

    def block_probe(self, state: State, batches: dict[str, Batch]) -> Tensor:
        """A client's probe: the inner value of each block of its step's batch, unit-free,
        ``[B]``."""
        obj = self.obj
        losses = obj.losses(state["x"], batches["grad"])
        return torch.stack([obj.probe_of_losses(part) for part in self.blocks(losses)])

    def draw_level(self, info: RoundInfo) -> int:
        """The round's MLMC level J, from the stream (seed, round, 0x313C)."""
        hp = self.hparams
        probs = torch.tensor(level_probabilities(hp.mlmc_levels, hp.mlmc_doubling))
        g = generator(info.seed, info.round, MLMC_STREAM)
        return int(torch.multinomial(probs, 1, generator=g)) + 1

    def terms(self, info: RoundInfo) -> list[tuple[float, tuple[int, ...]]]:
        """The round's estimator as (coefficient, blocks) pairs: one set, all blocks, for the
        mini-batch estimator; :func:`mlmc_terms` at the drawn level for MLMC."""
        if self.levels == 0:
            return [(1.0, (0,))]
        level = self.draw_level(info)
        prob = level_probabilities(self.hparams.mlmc_levels, self.hparams.mlmc_doubling)
        return mlmc_terms(level, prob[level - 1])

    def round_context(self, server: State, info: RoundInfo, probe: Probe) -> RoundContext:
        """Per block b, the weights ``a_b`` (of ``g_k(x; block b)``) and ``e_b`` (of h) that
        make a client's step the gradient of its share of ``Σ_s c_s ℒ(x; S_s)``: a set S of
        blocks has ``g_S = Σ_{b∈S} (n_b/n_S) g_b`` (g and h are means over samples), so::

            a_b = Σ_s c_s [b ∈ S_s] (n_b / n_{S_s}) ∇f(ȳ_{S_s}),
            e_b = Σ_s c_s [b ∈ S_s] (n_b / n_{S_s}),

        with ``ȳ_S`` the cohort's pooled inner value on S, from the probes ``[m, B]``
        (:meth:`block_probe`)."""
        obj = self.obj
        probes = probe(self.block_probe)
        units = obj.units(probes)
        nb = probes.shape[1]
        sizes = block_units(nb - 1)  # n₀ cancels in n_b / n_S
        ybar = torch.stack([obj.cohort_mean(probes[:, b], units) for b in range(nb)])
        a = torch.zeros_like(ybar)
        e = torch.zeros_like(ybar)
        for coef, blocks in self.terms(info):
            n_set = sum(sizes[b] for b in blocks)
            share = ybar.new_tensor([sizes[b] / n_set if b in blocks else 0.0 for b in range(nb)])
            y_set = (share * ybar).sum()
            a = a + coef * share * obj.df(y_set, units)
            e = e + coef * share
        ctx = {**units, "a": a, "e": e, **self.step_size_context(server, info)}
        return RoundContext(broadcast=ctx)

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        obj = self.obj

        def surrogate(p: Params) -> tuple[Tensor, Tensor]:
            losses = obj.losses(p, batches["grad"])
            parts = self.blocks(losses)
            g = torch.stack([obj.g_of_losses(part, ctx) for part in parts])
            h = torch.stack([obj.h_of_losses(part, ctx) for part in parts])
            return (ctx["a"] * g).sum() + (ctx["e"] * h).sum(), losses.mean()

        u, loss = grad(surrogate, has_aux=True)(state["x"])
        return {"x": tree_axpy(-self.step_size(ctx), u, state["x"])}, {"loss": loss}


# ---------------------------------------------------------------------- PDSGD
@dataclass(frozen=True)
class PDSGDHparams(MBSGDHparams):
    """PDSGD (Xu 2020) on the epigraph of the DRO dual form, parallel over the cohort.

    Attributes:
        lr: α, the primal step size (on x, the dual-form shift μ and the epigraph variable η).
        lr_decay_round: from this round on α is ``lr · lr_decay`` (FedDRO §6: after 90 rounds;
            ρ does not drop); 0 never decays.
        lr_decay: the factor of that drop (FedDRO §6: 1/10).
        local_steps: I = 1, the "parallel" baseline's one step per round (the only value
            accepted, as MBSGD's).
        lr_dual: ρ > 0, the dual step size.
        beta: β > 0, the augmented Lagrangian's penalty (ψ_β); with β = 0 the primal-dual
            iteration on this linear-objective program only circles its saddle point.
        dual_init: z⁰ >= 0, the initial multiplier (1 is its value at every KKT point).
    """

    lr_dual: float = 0.5
    beta: float = 1.0
    dual_init: float = 1.0

    bounds: ClassVar[dict[str, Bound]] = {
        "lr_dual": Bound("a float > 0 (ρ)", "0.5", gt=0),
        "beta": Bound("a float > 0 (β)", "1.0", gt=0),
        "dual_init": Bound("a float >= 0 (z⁰)", "1.0", ge=0),
    }


@register("pdsgd")
class PDSGD(DistributedUpdater[PDSGDHparams]):
    """PDSGD (Xu 2020): augmented-Lagrangian primal-dual SGD on a constrained form of the DRO.

    **The constrained form.** Both kinds of the ``sample_dro`` problem have a dual form
    (f-divergence duality; :mod:`lit_fedco.objectives.distributed`)::

        V(x) = min_μ Ψ(x, μ),   Ψ(x, μ) = μ + mean_i φ*(ℓ_i(x) − μ),
        KL: φ*(s) = λ (exp(s/λ) − 1),   χ²: φ*(s) = s + s²/(2λ),

    so ``min_x V(x)`` is the program with one functional constraint ::

        min_{x, μ, η} η   s.t.   c(x, μ, η) = Ψ(x, μ) − η ≤ 0.

    Its Lagrangian ``η + z c`` is linear in the per-sample terms ``φ*(ℓ_i − μ)``, so
    minibatch gradients of it are unbiased — the point of the primal-dual route, against the
    biased plug-in of FastDRO — and for convex losses it is a convex program in (x, μ, η).
    KKT: ``∂_η = 1 − z = 0`` gives ``z* = 1``, complementary slackness ``η* = Ψ``,
    ``∂_μ Ψ = 0`` the minimising μ (KL: μ* = V; χ²: μ* = ℓ̄) and ``∂_x Ψ = 0`` the DRO
    stationarity ``Σ_i p_i ∇ℓ_i = 0`` with the worst-case weights ``p_i = φ*'(ℓ_i − μ*)/M``.

    **The iteration** (Xu's primal-dual stochastic gradient method on the classical augmented
    Lagrangian ``η + ψ_β(c, z)``, ``ψ_β(c, z) = z c + β c²/2`` if ``β c + z ≥ 0`` else
    ``−z²/(2β)``), one step per round r from the broadcast (x_r, μ_r) and the server's (η_r,
    z_r)::

        ĉ_r     = Ψ̂(x_r, μ_r) − η_r                          the cohort's "value" batches (probe)
        z_r     = max(0, z_{r−1} + ρ max(ĉ_r, −z_{r−1}/β))    dual ascent on ψ_β (r ≥ 1)
        m_r     = max(0, z_r + β ĉ_r)                         ∂ψ_β/∂c: the step's multiplier
        (x, μ) ← (x, μ)_r − α m_r ∇_{(x,μ)} Ψ̂(x_r, μ_r)       the cohort's "grad" batches
        η      ← η_r − α (1 − m_r)

    The dual step uses the constraint at the new point x_r with an independent sample (the
    probe), as Xu's method samples a second constraint value for it; the projection onto
    z ≥ 0 is a no-op when ρ ≤ β. The multiplier's ``β ĉ_r`` also comes from the probe, so the
    primal step is unbiased given it. Without β the (η, z) pair only circles (z − 1, η − Ψ) = 0
    (the linearised map has determinant 1); with β > 0 its determinant is 1 − αβ.

    **Parallel.** Each cohort client sends the two (χ²) or one (KL) numbers from which the
    server evaluates Ψ̂ at any μ (:meth:`~DistributedObjective.dual_stats`), computes
    ``∇_{(x,μ)} Ψ̂`` on its own batch at the broadcast point, and the server averages: the
    centralised step on the pooled batch. The server keeps the dual z and the epigraph
    variable η (its gradient ``1 − m_r`` needs no data); μ travels with x.

    **Start.** In its first round the server sets μ₀ to the minimiser of the round's Ψ̂ (KL:
    the pooled batch's log-mean-exp; χ²: its mean loss) and η₀ = Ψ̂(x₀, μ₀), so the constraint
    starts tight and the first step is the DRO gradient at the scale of the loss;
    z₀ = ``dual_init``.
    """

    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "mu": Sync.ROUND}
    y_source = "none"

    def init_server(self, params: dict[str, Tensor], num_clients: int) -> State:
        """x; the scalars μ and η (set by the first round that runs: ``started`` = 0 until
        then) and the dual z = ``dual_init``."""
        server = super().init_server(params, num_clients)
        zero = next(iter(params.values())).new_zeros(())
        scalars = {"mu": zero, "eta": zero.clone(), "z": zero + self.hparams.dual_init}
        return {**server, **scalars, "started": zero.clone()}

    def dual_probe(self, state: State, batches: dict[str, Batch]) -> Tensor:
        """A client's probe: the dual-form statistics of its value batch at the broadcast x."""
        obj = self.obj
        return obj.dual_stats(obj.losses(state["x"], batches["value"]))

    def round_context(self, server: State, info: RoundInfo, probe: Probe) -> RoundContext:
        """The dual step and the round's multiplier (class docstring), from the cohort's dual
        statistics (:meth:`dual_probe`); in the first round that runs, the start."""
        obj, hp = self.obj, self.hparams
        probes = probe(self.dual_probe)
        if not bool(server["started"]):
            mu = obj.dual_minimiser(probes).to(server["mu"].dtype)
            eta = obj.dual_value(probes, mu)
            z = server["z"]
            gap = torch.zeros_like(eta)
        else:
            mu, eta, z_prev = server["mu"], server["eta"], server["z"]
            gap = obj.dual_value(probes, mu) - eta
            z = (z_prev + hp.lr_dual * torch.maximum(gap, -z_prev / hp.beta)).clamp_min(0.0)
        mult = (z + hp.beta * gap).clamp_min(0.0)
        broadcast = {"mu": mu, "mult": mult, **self.step_size_context(server, info)}
        kept = {"eta": eta, "z": z, "started": torch.ones_like(server["started"])}
        return RoundContext(broadcast=broadcast, server=kept)

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        obj = self.obj

        def dual_form(p: Params, mu: Tensor) -> tuple[Tensor, Tensor]:
            losses = obj.losses(p, batches["grad"])
            return mu + obj.dual_penalty(losses - mu).mean(), losses.mean()

        (gx, gmu), loss = grad(dual_form, argnums=(0, 1), has_aux=True)(state["x"], ctx["mu"])
        step_size = self.step_size(ctx) * ctx["mult"]
        x = tree_axpy(-step_size, gx, state["x"])
        mu = ctx["mu"] - step_size * gmu
        return {"x": x, "mu": mu}, {"loss": loss, "multiplier": loss * 0 + ctx["mult"]}

    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """x and μ: the cohort means; η ← η_r − α (1 − m_r); z: the round's (``ctx.server``)."""
        new = super().server_update(server, mean, ctx, info)
        mult = ctx.broadcast["mult"]
        new["eta"] = ctx.server["eta"] - self.step_size(ctx.broadcast) * (1 - mult)
        return new
