"""Sample-level KL- and χ²-DRO with a distributed inner function, against the definition.

The definition is the max over the simplex of ``Σ p_i ℓ_i − λ D(p, 1/M)``, computed here
numerically (SLSQP with the simplex as constraints) on small data; the objectives' closed
forms and their (h, g, f) decompositions over clients must agree with it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from torch.func import grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.examples.theorem41 import Scalar, affine
from lit_fedco.objectives.distributed import (
    Chi2SampleDRO,
    DistributedObjective,
    KLSampleDRO,
    chi2_closed_form_valid,
    chi2_primal,
    chi2_value,
    chi2_weights,
    kl_sample_primal,
    kl_sample_value,
    kl_sample_weights,
    make_distributed_objective,
)
from lit_fedco.problems import SampleDROParams
from lit_fedco.updaters.feddro import FedDRO, FedDROHparams

NUM_TOL = 1e-6  # SLSQP's optimum, relative to the closed form


def simplex_max(primal, losses: torch.Tensor, lam: float) -> tuple[float, np.ndarray]:
    """max_{p ∈ Δ} primal(losses, p, λ) by SLSQP from several starts (float64)."""
    m = len(losses)

    def neg(p: np.ndarray) -> float:
        return -float(primal(losses, torch.tensor(p), lam))

    best = None
    rng = np.random.default_rng(0)
    for start in [np.full(m, 1.0 / m), *rng.dirichlet(np.ones(m), size=4)]:
        res = minimize(
            neg,
            start,
            method="SLSQP",
            bounds=[(0.0, 1.0)] * m,
            constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1.0}],
            options={"ftol": 1e-15, "maxiter": 1000},
        )
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    return -float(best.fun), best.x


def client_batches(losses_per_client: list[list[float]]) -> list[dict[str, torch.Tensor]]:
    """Batches for :class:`Scalar` + :func:`affine` whose losses at w = 0 are the given ones
    (ℓ_i(w) = a_i w + b_i with slopes a_i = i + 1, so gradients differ across samples)."""
    out = []
    for k, ls in enumerate(losses_per_client):
        a = torch.arange(1, len(ls) + 1, dtype=torch.float64) * (1 + k)
        out.append(
            {
                "x": torch.zeros(len(ls), 1, dtype=torch.float64),
                "y": torch.stack([a, torch.tensor(ls, dtype=torch.float64)], 1),
            }
        )
    return out


def distributed_value(obj: DistributedObjective, params, batches) -> torch.Tensor:
    """``f(mean_k g_k) + mean_k h_k`` with the objective's own units (as the updaters use)."""
    probes = torch.stack([obj.probe(params, {"value": b}, {}) for b in batches])
    ctx = obj.units(probes)
    g = torch.stack([obj.inner(params, b, ctx) for b in batches]).mean(0)
    h = torch.stack([obj.h(params, b, ctx) for b in batches]).mean(0)
    return obj.f(g, ctx) + h


# ---------------------------------------------------------------------- KL


@pytest.mark.parametrize("lam", [0.3, 1.0, 4.0])
def test_kl_closed_form_is_the_max_over_the_simplex(lam):
    losses = torch.tensor([0.2, 1.5, 0.7, 3.0, 2.2, 0.05], dtype=torch.float64)
    best, p = simplex_max(kl_sample_primal, losses, lam)
    assert float(kl_sample_value(losses, lam)) == pytest.approx(best, rel=NUM_TOL)
    np.testing.assert_allclose(p, kl_sample_weights(losses, lam).numpy(), atol=1e-4)


def test_kl_distributed_form_equals_the_dro_value():
    """Equal split over 3 clients: f(mean_k g_k) = λ log mean_i exp(ℓ_i/λ) over all samples."""
    per_client = [[0.2, 1.5], [0.7, 3.0], [2.2, 0.05]]
    obj = KLSampleDRO(Scalar(0.0), lam=0.5, sample_loss=affine)
    params = {"w": torch.zeros(1, dtype=torch.float64)}
    got = distributed_value(obj, params, client_batches(per_client))
    want = kl_sample_value(
        torch.tensor([v for c in per_client for v in c], dtype=torch.float64), 0.5
    )
    assert float(got) == pytest.approx(float(want), rel=1e-13)


# ---------------------------------------------------------------------- χ²


@pytest.mark.parametrize("lam", [2.0, 5.0])
def test_chi2_closed_form_is_the_max_where_valid(lam):
    losses = torch.tensor([1.0, 1.4, 2.1, 1.8, 1.2, 2.6], dtype=torch.float64)
    assert bool(chi2_closed_form_valid(losses, lam))  # min ℓ ≥ ℓ̄ − λ
    best, p = simplex_max(chi2_primal, losses, lam)
    assert float(chi2_value(losses, lam)) == pytest.approx(best, rel=NUM_TOL)
    np.testing.assert_allclose(p, chi2_weights(losses, lam).numpy(), atol=1e-5)


def test_chi2_closed_form_overestimates_where_invalid():
    """One small loss pushes its unconstrained weight below 0: the closed form (a max over the
    affine hull) exceeds the true max over the simplex; the projected maximiser attains it."""
    losses = torch.tensor([0.0, 3.0, 3.2, 2.9, 3.1, 3.0], dtype=torch.float64)
    lam = 1.0
    assert not bool(chi2_closed_form_valid(losses, lam))
    assert float(chi2_weights(losses, lam).min()) < 0
    best, _ = simplex_max(chi2_primal, losses, lam)
    assert float(chi2_value(losses, lam)) > best + 0.05
    # the exact maximiser is the Euclidean projection of 1/M + ℓ/(λM) onto the simplex
    v = (1 / 6 + losses / (lam * 6)).numpy()
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1
    rho = np.nonzero(u - css / np.arange(1, 7) > 0)[0][-1]
    proj = np.maximum(v - css[rho] / (rho + 1), 0)
    assert float(chi2_primal(losses, torch.tensor(proj), lam)) == pytest.approx(best, rel=1e-7)


def test_chi2_distributed_form_equals_the_dro_value():
    per_client = [[1.0, 1.4], [2.1, 1.8], [1.2, 2.6]]
    obj = Chi2SampleDRO(Scalar(0.0), lam=2.0, sample_loss=affine)
    params = {"w": torch.zeros(1, dtype=torch.float64)}
    got = distributed_value(obj, params, client_batches(per_client))
    losses = torch.tensor([v for c in per_client for v in c], dtype=torch.float64)
    best, _ = simplex_max(chi2_primal, losses, 2.0)
    assert float(got) == pytest.approx(float(chi2_value(losses, 2.0)), rel=1e-13)
    assert float(got) == pytest.approx(best, rel=NUM_TOL)


def test_paper_eq5_is_not_the_chi2_dro_value():
    """The paper's eq. (5), −(1/(2λM)) Σ ℓ² + (1/(2λ)) ℓ̄², is minus the variance term and
    lacks ℓ̄: it disagrees with the max over the simplex; the derived form agrees."""
    losses = torch.tensor([1.0, 1.4, 2.1, 1.8, 1.2, 2.6], dtype=torch.float64)
    lam = 2.0
    eq5 = -(losses**2).mean() / (2 * lam) + losses.mean() ** 2 / (2 * lam)
    best, _ = simplex_max(chi2_primal, losses, lam)
    assert abs(float(eq5) - best) > 1.0
    assert float(chi2_value(losses, lam)) == pytest.approx(best, rel=NUM_TOL)


# ---------------------------------------------------------------------- gradients


@pytest.mark.parametrize("name,lam", [("kl", 0.5), ("chi2", 3.0)])
def test_eq7_direction_with_the_exact_inner_value_is_the_gradient(name, lam):
    """Averaged over clients on full data, with y = mean_k g_k(x), the updaters' direction
    (eq. 7) is ∇Φ, the autograd gradient of the closed-form DRO value."""
    per_client = [[0.4, 1.1, 0.9], [1.6, 0.3, 1.2]]
    batches = client_batches(per_client)
    model = Scalar(0.3)
    obj = make_distributed_objective(name, model, lam, sample_loss=affine)
    upd = FedDRO(FedDROHparams(), model, obj)
    obj = upd.obj
    w = {"w": torch.tensor([0.3], dtype=torch.float64)}
    probes = torch.stack([obj.probe(w, {"value": b}, {}) for b in batches])
    ctx = obj.units(probes)
    y = obj.cohort_mean(probes, ctx)
    u = sum(upd.direction(w, y, b, ctx)[0]["w"] for b in batches) / len(batches)

    def closed(p):
        losses = torch.cat([affine(p["w"].expand(len(b["y"])), b["y"]) for b in batches])
        return kl_sample_value(losses, lam) if name == "kl" else chi2_value(losses, lam)

    torch.testing.assert_close(u, grad(closed)(w)["w"], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- stability


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kl_no_overflow_at_small_lambda_with_losses_near_10(dtype):
    lam = 0.01
    assert math.isinf(torch.exp(torch.tensor(10.0 / lam, dtype=dtype)).item())  # literal form
    per_client = [[9.8, 10.1, 10.3], [10.0, 9.9, 10.2]]
    model = Scalar(0.0).to(dtype)
    upd = FedDRO(FedDROHparams(), model, KLSampleDRO(model, lam, affine))
    obj = upd.obj
    batches = [{k: v.to(dtype) for k, v in b.items()} for b in client_batches(per_client)]
    w = {"w": torch.zeros(1, dtype=dtype)}
    probes = torch.stack([obj.probe(w, {"value": b}, {}) for b in batches])
    ctx = obj.units(probes)
    y = obj.cohort_mean(probes, ctx)
    value = obj.f(y, ctx)
    u = sum(upd.direction(w, y, b, ctx)[0]["w"] for b in batches) / 2
    assert torch.isfinite(probes).all() and torch.isfinite(y) and torch.isfinite(u).all()
    losses = torch.tensor([v for c in per_client for v in c], dtype=torch.float64)
    # float32 stores ℓ ≈ 10 to ~1e-6, i.e. the exponent ℓ/λ to ~1e-4: weights to ~1e-4
    tol = 1e-3 if dtype == torch.float32 else 1e-10
    assert float(value) == pytest.approx(float(kl_sample_value(losses, lam)), rel=tol)
    slopes = torch.cat([b["y"][:, 0] for b in batches]).double()
    want = (kl_sample_weights(losses, lam) * slopes).sum()  # ∇ of λ log mean exp(ℓ/λ)
    assert float(u) == pytest.approx(float(want), rel=tol)


def test_kl_convert_moves_between_shifts_exactly_in_log_space():
    """A carried 1e-30 (float32) moved to a shift lower by 1.0 at λ = 0.01 is 1e-30 · e^100:
    representable, though the factor e^100 alone overflows float32."""
    obj = KLSampleDRO(Scalar(0.0), lam=0.01)
    old, new = {"shift": torch.tensor(10.0)}, {"shift": torch.tensor(9.0)}
    assert math.isinf(torch.exp(torch.tensor(100.0)).item())
    got = obj.convert(torch.tensor(1e-30), old, new)
    assert float(got) == pytest.approx(1e-30 * math.exp(100), rel=1e-5)
    back = obj.convert(got, new, old)
    assert float(back) == pytest.approx(1e-30, rel=1e-5)
    assert float(obj.convert(torch.tensor(-0.5), old, old)) == -0.5
    assert float(obj.convert(torch.tensor(0.0), old, new)) == 0.0


def test_kl_reads_an_estimate_below_the_range_of_g_at_the_least_value_of_g():
    """Cross-entropies are ≥ 0, so g = mean exp((ℓ − c)/λ) ≥ exp(−c/λ): an estimate below it
    (even negative) is read there — finite f, ∇f = λ / exp(−c/λ) — and one above is left."""
    lam, ctx = 0.5, {"shift": torch.tensor(2.0, dtype=torch.float64)}
    obj = KLSampleDRO(Scalar(0.0), lam=lam)
    least = math.exp(-2.0 / lam)
    for y in (-0.3, 0.0, least / 2):
        t = torch.tensor(y, dtype=torch.float64)
        assert float(obj.df(t, ctx)) == pytest.approx(lam / least, rel=1e-12)
        assert float(obj.f(t, ctx)) == pytest.approx(0.0, abs=1e-12)  # λ log e^{−c/λ} + c
    assert float(obj.df(torch.tensor(0.2, dtype=torch.float64), ctx)) == pytest.approx(lam / 0.2)
    losses = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)  # the least g any batch has
    assert float(obj.g_of_losses(losses, ctx)) == pytest.approx(least, rel=1e-12)


def test_bad_objective_settings_raise_config_errors():
    with pytest.raises(ConfigError, match="kind: got 'cvar'"):
        make_distributed_objective("cvar", Scalar(0.0), 1.0)
    with pytest.raises(ConfigError, match="lam: got -1"):
        KLSampleDRO(Scalar(0.0), lam=-1.0)
    with pytest.raises(ConfigError, match=r"lam: got 0\.0"):
        SampleDROParams(lam=0.0)
    with pytest.raises(ConfigError, match="kind: got 'cvar'"):
        SampleDROParams(kind="cvar")


@pytest.mark.parametrize(("kind", "lam"), [("kl", 1.0), ("kl", 0.05), ("chi2", 3.0)])
def test_objective_metric_is_eq2_over_the_clients_full_data(kind, lam):
    """``val/objective`` of the sample_dro problem: Φ = mean_k h_k + f(mean_k g_k) with g_k,
    h_k the means of client k's rows, computed here from the definition (float64; the KL form
    by log-sum-exp, the χ² form from its h, g, f), rows fed in chunks that mix clients and one
    client without rows."""
    from lit_fedco.problems.dro import DistributedObjectiveValue

    gen = torch.Generator().manual_seed(3)
    sizes = [5, 1, 0, 9]
    owner = torch.cat([torch.full((n,), k) for k, n in enumerate(sizes)])
    logits = torch.randn(len(owner), 4, generator=gen, dtype=torch.float64) * 3
    target = torch.randint(0, 4, (len(owner),), generator=gen)
    perm = torch.randperm(len(owner), generator=gen)
    obj = make_distributed_objective(kind, torch.nn.Identity(), lam)
    metric = DistributedObjectiveValue(obj, num_clients=len(sizes))
    for chunk in perm.split(4):
        metric.update(logits[chunk].float(), target[chunk], owner[chunk])
    losses = torch.nn.functional.cross_entropy(logits.float().double(), target, reduction="none")
    per = [losses[owner == k] for k in range(len(sizes)) if sizes[k]]
    if kind == "kl":  # λ log mean_k mean_{i∈k} exp(ℓ_i/λ)
        lse = torch.stack([torch.logsumexp(p / lam, 0) - math.log(len(p)) for p in per])
        want = lam * (torch.logsumexp(lse, 0) - math.log(len(per)))
    else:  # mean_k mean(ℓ + ℓ²/2λ) − (mean_k mean ℓ)²/2λ
        h = torch.stack([(p + p**2 / (2 * lam)).mean() for p in per]).mean()
        g = torch.stack([p.mean() for p in per]).mean()
        want = h - g**2 / (2 * lam)
    assert float(metric.compute()) == pytest.approx(float(want), rel=1e-12)


def test_objective_metric_with_equal_clients_is_the_union_dro_value():
    """With equal client sizes, Φ is the DRO value over the union of the rows (eq. 3-4)."""
    from lit_fedco.problems.dro import DistributedObjectiveValue

    gen = torch.Generator().manual_seed(4)
    owner = torch.arange(3).repeat_interleave(6)
    logits = torch.randn(18, 3, generator=gen, dtype=torch.float64)
    target = torch.randint(0, 3, (18,), generator=gen)
    metric = DistributedObjectiveValue(KLSampleDRO(torch.nn.Identity(), 0.5), num_clients=3)
    metric.update(logits, target, owner)
    losses = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    assert float(metric.compute()) == pytest.approx(float(kl_sample_value(losses, 0.5)), rel=1e-12)
