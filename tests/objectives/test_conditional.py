"""The conditional plug-in estimator (FCSG §3) and the invariant logistic regression problem."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lit_fedco.core.models import build_model
from lit_fedco.data.build import make_invariant_logreg
from lit_fedco.engine.loop import client_generator
from lit_fedco.objectives.conditional import InvariantLogReg, plugin_gradient
from lit_fedco.problems import InvariantLogRegParams, InvariantLogRegProblem

D, B, M = 4, 3, 5
LAM, GAMMA, SIGMA2 = 0.001, 10.0, 1.5


def invariant_problem(m: int) -> InvariantLogRegProblem:
    """The §5.1 problem (it draws η | ξ) on a tiny data set of the same kind."""
    spec = SimpleNamespace(
        num_clients=1, dim=D, sigma1=1.0, train_per_client=3, val_per_client=3, seed=0
    )
    params = InvariantLogRegParams(sigma2=SIGMA2, m=m, lam=LAM, gamma=GAMMA)
    return InvariantLogRegProblem(params, make_invariant_logreg(spec))


def problem(seed: int = 0):
    """A linear score model, a batch of 3 outer samples with 5 inner samples each."""
    g = torch.Generator().manual_seed(seed)
    model = build_model("linear", (D,), 1, seed=seed).double()
    obj = InvariantLogReg(model, LAM, GAMMA)
    a = torch.randn(1, B, D, generator=g, dtype=torch.float64)
    y = torch.tensor([[1, 0, 1]])
    gens = [torch.Generator().manual_seed(seed + 1)]
    batch = invariant_problem(M).augment(obj, {"x": a, "y": y}, gens)
    one = {k: v[0] for k, v in batch.items()}  # the single client's batch
    params = {"linear.weight": torch.randn(1, D, generator=g, dtype=torch.float64)}
    return obj, one, params


def reg_grad(w: torch.Tensor) -> torch.Tensor:
    """∇ λ Σ γw²/(1 + γw²) = λ 2γw / (1 + γw²)²."""
    return LAM * 2 * GAMMA * w / (1 + GAMMA * w**2) ** 2


def test_plugin_estimator_is_the_gradient_of_f_of_the_inner_mean():
    """(mean_j ∇g_j)ᵀ ∇f(mean_j g_j) by hand equals autograd of f(mean g) (FCSG §3)."""
    obj, batch, params = problem()
    g, value = plugin_gradient(lambda p: obj.value(p, {"inner": batch}, {}), params)
    w = params["linear.weight"][0]
    eta_bar = batch["eta"].mean(1)  # [b, d]: ∇_w of mean_j η_jᵀw
    sign = 2 * batch["y"].double() - 1
    u = eta_bar @ w  # the inner means
    df = -sign * torch.sigmoid(-sign * u)  # f'(u) of log(1 + exp(−b u))
    hand = (df.unsqueeze(1) * eta_bar).mean(0) + reg_grad(w)
    torch.testing.assert_close(g["linear.weight"][0], hand, rtol=1e-12, atol=1e-14)
    expected = F.softplus(-sign * u).mean() + LAM * (GAMMA * w**2 / (1 + GAMMA * w**2)).sum()
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-14)


def test_plugin_estimator_differs_from_averaging_the_loss_over_eta():
    """The classic mistake, mean_j f(g_{η_j}), is another objective with another gradient."""
    obj, batch, params = problem()
    g, _ = plugin_gradient(lambda p: obj.value(p, {"inner": batch}, {}), params)
    w = params["linear.weight"][0]
    sign = (2 * batch["y"].double() - 1).unsqueeze(1)  # [b, 1]
    scores = batch["eta"] @ w  # [b, m]
    df = -sign * torch.sigmoid(-sign * scores)
    mistake = (df.unsqueeze(2) * batch["eta"]).mean((0, 1)) + reg_grad(w)
    diff = (g["linear.weight"][0] - mistake).norm() / mistake.norm()
    assert diff > 0.05, diff
    # with one inner sample the two coincide: the difference is the mean inside f
    obj1 = InvariantLogReg(obj.model, LAM, GAMMA)
    one = {**batch, "eta": batch["eta"][:, :1]}
    g1, _ = plugin_gradient(lambda p: obj1.value(p, {"inner": one}, {}), params)
    s1, e1 = scores[:, :1], batch["eta"][:, :1]
    d1 = -sign * torch.sigmoid(-sign * s1)
    torch.testing.assert_close(
        g1["linear.weight"][0],
        (d1.unsqueeze(2) * e1).mean((0, 1)) + reg_grad(w),
        rtol=1e-12,
        atol=1e-14,
    )


def test_augment_draws_eta_around_a_from_each_clients_generator():
    obj, _, _ = problem()
    prob = invariant_problem(20000)
    assert prob.draws_conditional(obj)
    a = torch.randn(2, 1, D, dtype=torch.float64)
    gens = [client_generator(0, k, 3) for k in (4, 7)]
    out = prob.augment(obj, {"x": a, "y": torch.zeros(2, 1)}, gens)
    assert out["eta"].shape == (2, 1, 20000, D)
    torch.testing.assert_close(out["eta"].mean(2), a, atol=0.05, rtol=0)
    assert out["eta"].std(2).sub(SIGMA2).abs().max() < 0.05
    # client 7's draws do not depend on client 4 being drawn beside it
    alone = prob.augment(obj, {"x": a[1:], "y": torch.zeros(1, 1)}, [client_generator(0, 7, 3)])
    torch.testing.assert_close(alone["eta"][0], out["eta"][1], rtol=0, atol=0)


def test_invariant_data_follows_section_5_1():
    spec = SimpleNamespace(
        num_clients=16, dim=10, sigma1=1.0, train_per_client=100, val_per_client=3125, seed=3
    )
    data = make_invariant_logreg(spec)
    assert data.num_clients == 16 and len(data.y_val) == 50000
    x_star = torch.tensor(data.stats["x_star"])
    assert torch.equal(data.y_val, (data.x_val @ x_star > 0).long())
    assert torch.equal(data.y_train, (data.x_train @ x_star > 0).long())
    assert abs(float(data.x_val.std()) - 1.0) < 0.01
    again = make_invariant_logreg(spec)
    assert torch.equal(again.x_train, data.x_train)


@pytest.mark.parametrize("key,value", [("dim", 0), ("sigma1", 0.0)])
def test_invariant_data_rejects_bad_sizes(key, value):
    from lit_fedco.core.errors import ConfigError

    spec = dict(num_clients=2, dim=3, sigma1=1.0, train_per_client=5, val_per_client=5, seed=0)
    spec[key] = value
    with pytest.raises(ConfigError, match=f"data.{key}"):
        make_invariant_logreg(SimpleNamespace(**spec))
