"""Client-level KL-DRO (ComFedL eqs. 4-6) against its definition, and ComFedL's two forms."""

from __future__ import annotations

import math

import pytest
import torch

from lit_fedco.objectives.dro import (
    ClientKLDRO,
    kl_dro_primal,
    kl_dro_value,
    kl_dro_weights,
    shift_and_norm,
)


def numerical_max_over_simplex(losses: torch.Tensor, gamma: float, iters: int = 20000) -> float:
    """Maximise Σ r L − γ Σ r log(K r) over the simplex by exponentiated-gradient ascent."""
    k = len(losses)
    r = torch.full((k,), 1.0 / k, dtype=torch.float64)
    for _ in range(iters):
        grad = losses - gamma * (torch.log(k * r) + 1)
        r = r * torch.exp(0.05 * grad)
        r = r / r.sum()
    return float(kl_dro_primal(losses, r, gamma))


@pytest.mark.slow
def test_kl_dro_value_equals_numerical_max_over_simplex():
    g = torch.Generator().manual_seed(0)
    for gamma in (0.1, 0.5, 2.0):
        losses = torch.rand(5, generator=g, dtype=torch.float64) * 3
        closed = float(kl_dro_value(losses, gamma))
        numeric = numerical_max_over_simplex(losses, gamma)
        assert abs(closed - numeric) < 1e-9, (gamma, closed, numeric)
        # the maximiser is softmax(L/γ)
        r = kl_dro_weights(losses, gamma)
        assert abs(float(kl_dro_primal(losses, r, gamma)) - closed) < 1e-12


@pytest.mark.slow
def test_kl_dro_value_upper_bounds_random_simplex_points_on_a_grid():
    losses = torch.tensor([0.3, 1.7, 0.9], dtype=torch.float64)
    gamma = 0.4
    closed = float(kl_dro_value(losses, gamma))
    best = -math.inf
    n = 400
    for i in range(n + 1):
        for j in range(n + 1 - i):
            r = torch.tensor([i, j, n - i - j], dtype=torch.float64) / n
            best = max(best, float(kl_dro_primal(losses, r, gamma)))
    assert best <= closed + 1e-12
    assert closed - best < 1e-4  # the grid's resolution


def test_kl_dro_value_does_not_overflow_and_tends_to_max():
    losses = torch.tensor([2.3, 2.2, 0.5], dtype=torch.float64)
    v = kl_dro_value(losses, 0.001)
    assert torch.isfinite(v)
    assert abs(float(v) - (2.3 - 0.001 * math.log(3))) < 1e-6


def _client_direction(obj: ClientKLDRO, params, batch, ctx):
    from torch.func import grad, vjp

    y, pullback = vjp(lambda p: obj.inner(p, batch, ctx), params)
    cot = grad(lambda v: obj.outer(v, None, ctx))(y)
    return pullback(cot)[0], y


def test_stable_and_literal_forms_give_the_same_direction():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).double()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    gamma = 0.1
    batches = [
        {"x": torch.randn(8, 4, dtype=torch.float64), "y": torch.randint(0, 3, (8,))}
        for _ in range(4)
    ]
    literal = ClientKLDRO(model, gamma, "literal")
    stable = ClientKLDRO(model, gamma, "stable")
    probes = torch.stack([stable.probe(params, {"inner": b}, {}) for b in batches])
    ctx = stable.round_context(probes).broadcast
    u_lit = [_client_direction(literal, params, b, {})[0] for b in batches]
    u_st = [_client_direction(stable, params, b, ctx)[0] for b in batches]
    c, z = shift_and_norm(probes, gamma)
    factor = gamma * torch.exp(-c / gamma) / z  # stable = factor × literal, for every client
    for ul, us in zip(u_lit, u_st, strict=True):
        for name in ul:
            torch.testing.assert_close(us[name], factor * ul[name], rtol=1e-10, atol=0)
    # the cohort's stable weights at the broadcast point are K·softmax(L/γ): mean 1
    w = torch.exp((probes - ctx["shift"]) / gamma) / ctx["norm"]
    torch.testing.assert_close(w, len(probes) * kl_dro_weights(probes, gamma))
    # literal weights overflow float32 where the stable ones do not
    assert not torch.isfinite(torch.exp(torch.tensor(12.0, dtype=torch.float32) / 0.1))
