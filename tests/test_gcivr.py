"""GCIVR: the recursive estimator against its formula, and on a deterministic problem (every
batch is a client's whole data) the estimates equal the exact inner value, Jacobian and
gradient at every iterate, so GCIVR is gradient descent on Φ."""

from __future__ import annotations

import pytest
import torch
from lightning.fabric import Fabric
from torch.func import grad, jacrev

from lit_fedco.errors import ConfigError
from lit_fedco.executors import make_executor
from lit_fedco.loop import FederatedLoop, LoopConfig
from lit_fedco.models import build_model
from lit_fedco.objectives.base import model_params
from lit_fedco.problems import FairnessParams, FairnessProblem
from lit_fedco.updaters import GCIVR, GCIVRHparams
from lit_fedco.updaters.gcivr import civr_direction, civr_estimate
from tests.test_fairness import tiny_adult


def test_recursion_and_direction_against_their_formulas():
    gen = torch.Generator().manual_seed(0)
    prev, at_x, at_prev = (torch.randn(6, generator=gen, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(civr_estimate(prev, at_x - at_prev), prev + at_x - at_prev)
    jac = {"w": torch.randn(3, 2, 4, generator=gen), "b": torch.randn(3, 2, generator=gen)}
    gh = {"w": torch.randn(2, 4, generator=gen), "b": torch.randn(2, generator=gen)}
    cot = torch.randn(3, generator=gen)
    u = civr_direction(jac, gh, cot)
    for k in jac:
        expected = sum(cot[i] * jac[k][i] for i in range(3)) + gh[k]
        torch.testing.assert_close(u[k], expected)


def test_hparams_are_checked():
    with pytest.raises(ConfigError, match="refresh period"):
        GCIVRHparams(q=0)
    with pytest.raises(ConfigError, match="one step per round"):
        GCIVRHparams(local_steps=2)


def test_on_a_deterministic_problem_the_estimates_are_exact_and_gcivr_is_gradient_descent(
    tmp_path,
):
    """4 clients of 8 rows, batches of 8 drawn without replacement: every batch is a client's
    whole data, so g(x; S) = g_k(x). After each round the server's (y, J, v), advanced by the
    recursion since round 0 (q = 100: no refresh after it), equal mean_k g_k, ∇g, ∇h at x_prev,
    and x follows gradient descent on Φ = h + f(g) (float64, to 1e-10)."""
    data = tiny_adult(tmp_path, num_clients=4, n=32)
    assert data.sizes().tolist() == [8, 8, 8, 8]
    net = build_model("logreg", (data.x_train.shape[1],), 2, seed=0).double()
    problem = FairnessProblem(FairnessParams(lam=5.0), data)
    obj = problem.objective_for(GCIVR.compositions, net)
    lr = 0.5
    upd = GCIVR(GCIVRHparams(lr=lr, q=100, refresh_batches=2), net, obj)
    fabric = Fabric(accelerator="cpu", devices=1)
    cfg = LoopConfig(rounds=1, local_steps=1, cohort=4, batch_size=8, eval_every=100,
                     progress=False)  # fmt: skip
    loop = FederatedLoop(fabric, upd, data, cfg, make_executor("vectorized"), torch.float64,
                         problem)  # fmt: skip
    whole = {"x": data.x_train.double(), "y": data.y_train}

    def exact(x):
        def stacked(p):
            g, h, _ = obj.parts(p, whole, {})
            return torch.cat([g, h.reshape(1)])

        jac = jacrev(stacked)(x)
        p = obj.inner_dim
        return obj.inner(x, whole, {}), {k: v[:p] for k, v in jac.items()}, \
            {k: v[p] for k, v in jac.items()}  # fmt: skip

    def phi(x):
        g, h, _ = obj.parts(x, whole, {})
        return h + obj.f(g, {})

    reference = model_params(net)
    for _ in range(6):
        loop.run_round()
        server = loop.server
        torch.testing.assert_close(server["x_prev"], reference, rtol=1e-10, atol=1e-12)
        y, jac, gh = exact(server["x_prev"])
        torch.testing.assert_close(server["y"], y, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(server["J"], jac, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(server["v"], gh, rtol=1e-10, atol=1e-12)
        step = grad(phi)(reference)
        reference = {k: reference[k] - lr * step[k] for k in reference}
        torch.testing.assert_close(server["x"], reference, rtol=1e-10, atol=1e-12)
    assert loop.round == 6
