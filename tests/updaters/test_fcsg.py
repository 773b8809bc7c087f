"""FCSG, FCSG-M, Acc-FCSG-M, Local-SCGD(M): hand computations on a quadratic, vectorized vs
sequential executors, 1 vs 2 processes, and resuming the state clients keep across rounds."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from lightning.fabric import Fabric
from torch import nn

from lit_fedco.core.models import build_model
from lit_fedco.core.protocol import StepInfo
from lit_fedco.data.build import make_invariant_logreg
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.loop import FederatedLoop, LoopConfig
from lit_fedco.objectives.conditional import ConditionalObjective
from lit_fedco.problems import InvariantLogRegParams, InvariantLogRegProblem
from lit_fedco.updaters import get_updater
from lit_fedco.updaters.fcsg import FCSGM, AccFCSGM, FCSGMHparams
from tests.helpers import final_checkpoint, flat_server, run_recipe, the_run


# ---------------------------------------------------------------------- quadratic
class Vector(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d, dtype=torch.float64))


class Quadratic(ConditionalObjective):
    """F̂(w; S) = ½ mean_i (a_iᵀw − c_i)²: inner a_iᵀw, outer ½ mean (y_i − c_i)²."""

    def inner(self, params, batch, ctx):
        return batch["x"] @ params["w"]

    def outer(self, y, batch, ctx):
        return 0.5 * ((y - batch["y"]) ** 2).mean()


def quad_grad(w: torch.Tensor, batch: dict) -> torch.Tensor:
    a, c = batch["x"], batch["y"]
    return a.T @ (a @ w - c) / len(c)


def quad_batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(5, 3, generator=g, dtype=torch.float64),
        "y": torch.randn(5, generator=g, dtype=torch.float64),
    }


def vec(seed: int) -> dict:
    return {"w": torch.randn(3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)}


def quad_updater(cls: Any, **hp: Any):
    model = Vector(3)
    return cls(cls.hparams_cls(**hp), model, Quadratic(model))


def test_acc_fcsg_m_correction_on_a_quadratic_equals_the_hand_computation():
    """v ← ∇F̂(x; S) + (1−β)(v − ∇F̂(x⁻; S)), x⁻ ← x, x ← x − α v (Algorithm 2 line 14)."""
    lr, beta = 0.1, 0.3
    upd = quad_updater(AccFCSGM, lr=lr, beta=beta)
    x, x_prev, v, s = vec(1)["w"], vec(2)["w"], vec(3)["w"], quad_batch(4)
    state = {"x": {"w": x}, "x_prev": {"w": x_prev}, "v": {"w": v}}
    new, _ = upd.client_step(state, {"inner": s}, {}, StepInfo(3, 5, 0, 1))
    a, c = s["x"].numpy(), s["y"].numpy()
    g_new = a.T @ (a @ x.numpy() - c) / 5
    g_old = a.T @ (a @ x_prev.numpy() - c) / 5
    v_hand = g_new + (1 - beta) * (v.numpy() - g_old)
    np.testing.assert_allclose(new["v"]["w"].numpy(), v_hand, rtol=1e-13)
    np.testing.assert_allclose(new["x"]["w"].numpy(), x.numpy() - lr * v_hand, rtol=1e-13)
    np.testing.assert_array_equal(new["x_prev"]["w"].numpy(), x.numpy())
    # on a quadratic the correction is exact: v − ∇F̂(x) keeps (1−β)(v − ∇F̂(x⁻)) with
    # ∇F̂(x) − ∇F̂(x⁻) = H (x − x⁻), H = AᵀA/b
    h = a.T @ a / 5
    np.testing.assert_allclose(
        v_hand,
        (1 - beta) * v.numpy() + beta * g_new + (1 - beta) * h @ (x - x_prev).numpy(),
        rtol=1e-12,
    )


def test_fcsg_m_momentum_and_first_direction_from_the_larger_batch():
    lr, beta = 0.05, 0.2
    upd = quad_updater(FCSGM, lr=lr, beta=beta, init_batches=3)
    assert upd.batch_roles == ("inner", "init1", "init2")
    batches = {role: quad_batch(10 + i) for i, role in enumerate(upd.batch_roles)}
    x = vec(5)
    # first step (no v yet): u₁ = (1/B) Σ over the B = 3·b samples (Algorithm 1 line 2)
    first, _ = upd.client_step({"x": x}, batches, {}, StepInfo(0, 2, 0, 1))
    u1 = sum(quad_grad(x["w"], b) for b in batches.values()) / 3
    torch.testing.assert_close(first["v"]["w"], u1, rtol=1e-13, atol=0)
    torch.testing.assert_close(first["x"]["w"], x["w"] - lr * u1, rtol=1e-13, atol=0)
    # later steps: v ← (1−β) v + β ∇F̂(x; S) on the step's batch only
    second, _ = upd.client_step(first, batches, {}, StepInfo(1, 2, 0, 1))
    v2 = (1 - beta) * u1 + beta * quad_grad(first["x"]["w"], batches["inner"])
    torch.testing.assert_close(second["v"]["w"], v2, rtol=1e-13, atol=0)


def test_local_scgd_with_beta_one_on_one_batch_is_the_compositional_gradient():
    """β = 1 and B = B': ŷ = ḡ(x) and u = ∇ḡᵀ ∇f̄(ḡ(x)) — the gradient of ½ mean_i (ḡ − c_i)²."""
    upd = quad_updater(get_updater("local_scgd"), lr=0.1, beta=1.0)
    s, x = quad_batch(7), vec(8)
    new, _ = upd.client_step(
        {"x": x, "y": torch.tensor(5.0)}, {"inner": s, "outer": s}, {}, StepInfo(1, 2, 0, 1)
    )
    a_bar = s["x"].mean(0)
    y = a_bar @ x["w"]
    torch.testing.assert_close(new["y"], y, rtol=1e-13, atol=0)
    u = a_bar * (y - s["y"]).mean()
    torch.testing.assert_close(new["x"]["w"], x["w"] - 0.1 * u, rtol=1e-13, atol=0)


def test_momentum_hparams_are_range_checked():
    from lit_fedco.core.errors import ConfigError

    with pytest.raises(ConfigError, match="beta"):
        FCSGMHparams(beta=0.0)
    with pytest.raises(ConfigError, match="init_batches"):
        FCSGMHparams(init_batches=0)


# ---------------------------------------------------------------------- through the loop
def invariant_loop(
    name: str, hparams: dict, executor: str, fabric: Fabric | None = None, **loop_kw: Any
) -> FederatedLoop:
    """The invariant logistic regression (conditional samples η | ξ) on 6 clients; a fresh
    1-process CPU Fabric unless ``fabric`` is given."""
    spec = SimpleNamespace(
        num_clients=6, dim=5, sigma1=1.0, train_per_client=50, val_per_client=40, seed=0
    )
    data = make_invariant_logreg(spec)
    problem = InvariantLogRegProblem(InvariantLogRegParams(sigma2=1.5, m=4), data)
    model = build_model("linear", (5,), problem.num_outputs(), seed=0)
    cls = get_updater(name)
    upd = cls(cls.hparams_cls(**hparams), model, problem.objective_for(cls.compositions, model))
    cfg = dict(rounds=3, local_steps=4, cohort=4, batch_size=3, eval_every=1, progress=False)
    cfg.update(loop_kw)
    fabric = fabric or Fabric(accelerator="cpu", devices=1)
    return FederatedLoop(
        fabric, upd, data, LoopConfig(**cfg), make_executor(executor), torch.float64, problem
    )


UPDATERS = [
    ("fcsg", {"lr": 0.1}),
    ("fcsg_m", {"lr": 0.1, "beta": 0.3, "init_batches": 2}),
    ("acc_fcsg_m", {"lr": 0.1, "beta": 0.3, "init_batches": 2}),
    ("local_scgd", {"lr": 0.1, "beta": 0.5}),
    ("local_scgdm", {"lr": 0.1, "beta": 0.5, "momentum": 0.5}),
]


@pytest.mark.parametrize("name,hparams", UPDATERS)
def test_vectorized_equals_sequential(name, hparams):
    out = {}
    for ex in ("vectorized", "sequential"):
        loop = invariant_loop(name, hparams, ex)
        loop.run()
        out[ex] = (flat_server(loop), loop.history[-1], loop.store.rows)
    np.testing.assert_allclose(out["vectorized"][0], out["sequential"][0], rtol=1e-10, atol=1e-12)
    for key, v in out["vectorized"][1].items():
        assert v == pytest.approx(out["sequential"][1][key], rel=1e-9, abs=1e-12), key
    for key in out["vectorized"][2]:  # Acc-FCSG-M's x⁻, kept per client
        torch.testing.assert_close(out["vectorized"][2][key], out["sequential"][2][key])


def test_acc_fcsg_m_resumes_exactly_with_the_previous_iterates(tmp_path):
    hp = {"lr": 0.1, "beta": 0.3}
    straight = invariant_loop("acc_fcsg_m", hp, "vectorized", rounds=4, cohort=3)
    straight.run()
    first = invariant_loop("acc_fcsg_m", hp, "vectorized", rounds=2, cohort=3)
    first.run()
    first.save(tmp_path / "run.ckpt")
    resumed = invariant_loop("acc_fcsg_m", hp, "vectorized", rounds=4, cohort=3)
    resumed.load(tmp_path / "run.ckpt")
    resumed.run()
    np.testing.assert_array_equal(flat_server(resumed), flat_server(straight))
    torch.testing.assert_close(resumed.store.rows, straight.store.rows, rtol=0, atol=0)


def test_fcsg_m_learns_the_separator():
    loop = invariant_loop(
        "fcsg_m", {"lr": 0.5, "beta": 0.5}, "vectorized", rounds=10, local_steps=10
    )
    out = loop.run()
    assert out["val/acc_pooled"] > 0.9
    # the pooled accuracy is the share of held-out rows whose score has the label's sign
    model = loop.updater.model
    with torch.no_grad():
        s = torch.func.functional_call(model, loop.server["x"], (loop.data.x_val,)).squeeze(-1)
    hand = float(((s > 0).long() == loop.data.y_val).double().mean())
    assert out["val/acc_pooled"] == pytest.approx(hand, abs=1e-12)


# ---------------------------------------------------------------------- processes
def _run_recipe(out: Path, devices: int) -> dict:
    args = [
        "variants=[]", "updaters=[fcsg_m,acc_fcsg_m]", "rounds=2", "eval_every=2",
        "local_steps=5", "cohort=5", "data.num_clients=6", "data.train_per_client=30",
        "data.val_per_client=50", "fcsg_m.init_batches=2", "dtype=float64",

    ]  # fmt: skip
    return run_recipe("fcsg_invariant", out, devices, *args)[0]


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    """FCSG-M and Acc-FCSG-M on 2 gloo processes: server x, v and every client's x⁻ to 1e-12,
    metrics exactly (float64); η | ξ drawn from per-client generators on either process."""
    one = _run_recipe(tmp_path / "one", 1)
    two = _run_recipe(tmp_path / "two", 2)
    for name in ("fcsg_m", "acc_fcsg_m"):
        a = final_checkpoint(the_run(tmp_path / "one", "fcsg_invariant") / f"{name}-seed0")
        b = final_checkpoint(the_run(tmp_path / "two", "fcsg_invariant") / f"{name}-seed0")
        torch.testing.assert_close(b["loop"]["server"], a["loop"]["server"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(
            b["loop"]["clients"], a["loop"]["clients"], rtol=1e-12, atol=1e-12
        )
        ra, rb = one["results"][name][0], two["results"][name][0]
        assert ra["val/acc_pooled"] == rb["val/acc_pooled"], name
        assert ra["val/loss_avg"] == pytest.approx(rb["val/loss_avg"], rel=1e-12)
