"""GCIVR: the recursive estimator against its formula, and on a deterministic problem (every
batch is a client's whole data) the estimates equal the exact inner value, Jacobian and
gradient at every iterate, so GCIVR is gradient descent on Φ."""

from __future__ import annotations

import pytest
import torch
from lightning.fabric import Fabric
from torch.func import grad, jacrev

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.models import build_model
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.loop import FederatedLoop, LoopConfig
from lit_fedco.objectives.base import model_params
from lit_fedco.problems import FairnessParams, FairnessProblem
from lit_fedco.updaters import GCIVR, GCIVRHparams
from lit_fedco.updaters.gcivr import civr_direction, civr_estimate
from tests.objectives.test_fairness import tiny_adult


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


def _stochastic_loop(tmp_path, q: int, parts: int, batch: int):
    data = tiny_adult(tmp_path, num_clients=4, n=96)
    net = build_model("logreg", (data.x_train.shape[1],), 2, seed=0).double()
    problem = FairnessProblem(FairnessParams(lam=5.0), data)
    obj = problem.objective_for(GCIVR.compositions, net)
    upd = GCIVR(GCIVRHparams(lr=0.3, q=q, refresh_batches=parts), net, obj)
    cfg = LoopConfig(rounds=1, local_steps=1, cohort=4, batch_size=batch, eval_every=100,
                     progress=False)  # fmt: skip
    loop = FederatedLoop(Fabric(accelerator="cpu", devices=1), upd, data, cfg,
                         make_executor("sequential"), torch.float64, problem)  # fmt: skip
    return loop, obj


def test_the_recursion_on_sampled_batches_is_its_formula(tmp_path):
    """Round 0 refreshes, round 1 recurses on fresh minibatches S_k (24 rows per client, batches
    of 6): y₁ = y₀ + mean_k [g_k(x₁; S_k) − g_k(x₀; S_k)] and likewise J and v, with the batches
    the loop's sampler drew for round 1, recomputed here."""
    loop, _obj = _stochastic_loop(tmp_path, q=5, parts=2, batch=6)
    loop.run_round()
    y0, j0, v0, x0 = (loop.server[k] for k in ("y", "J", "v", "x_prev"))
    x1 = loop.server["x"]
    loop.run_round()
    assert torch.equal(torch.cat([t.flatten() for t in loop.server["x_prev"].values()]),
                       torch.cat([t.flatten() for t in x1.values()]))  # fmt: skip
    idx = loop.sampler.sample_round(torch.arange(4), 1, 1, loop.updater.batch_roles, 6)[0, 0]
    data = loop.data
    dy, dj, dv = 0.0, {k: 0.0 for k in x0}, {k: 0.0 for k in x0}
    for k in range(4):
        batch = {"x": data.x_train[idx[k]], "y": data.y_train[idx[k]]}
        g1, jac1, h1, _ = loop.updater.pieces(x1, batch, {})
        g0, jac0, h0, _ = loop.updater.pieces(x0, batch, {})
        dy = dy + (g1 - g0) / 4
        dj = {n: dj[n] + (jac1[n] - jac0[n]) / 4 for n in x0}
        dv = {n: dv[n] + (h1[n] - h0[n]) / 4 for n in x0}
    torch.testing.assert_close(loop.server["y"], y0 + dy, rtol=1e-10, atol=1e-12)
    for n in x0:
        torch.testing.assert_close(loop.server["J"][n], j0[n] + dj[n], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(loop.server["v"][n], v0[n] + dv[n], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(dy, torch.zeros_like(dy))  # the recursion moved the estimate


def test_batch_schedule_large_refresh_small_recursion(tmp_path, monkeypatch):
    """q = 2, J = 3, b = 4: the client step sees 12 rows at rounds 0, 2, 4 (one evaluation) and
    4 rows at rounds 1, 3 (two evaluations, at x_t and x_{t−1})."""
    loop, _ = _stochastic_loop(tmp_path, q=2, parts=3, batch=4)
    seen: list[list[int]] = []
    real = loop.updater.pieces

    def pieces(x, batch, ctx):  # type: ignore[no-untyped-def]
        seen[-1].append(int(batch["x"].shape[0]))
        return real(x, batch, ctx)

    monkeypatch.setattr(loop.updater, "pieces", pieces)
    per_round = []
    for _ in range(5):
        seen.append([])
        loop.run_round()
        per_round.append([*sorted(set(seen[-1])), len(seen[-1]) // 4])  # sizes, calls/client
    assert per_round == [[12, 1], [4, 2], [12, 1], [4, 2], [12, 1]]
