"""Personalised FL (ComFedL §5.2): MAML and DA-MAML as local compositions, their updaters and
the baselines (FedMAML, TR-MAML, Ditto, DRFL), and evaluation after adaptation."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.fabric import Fabric
from torch.func import grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.models import build_model
from lit_fedco.core.protocol import RoundInfo, StepInfo
from lit_fedco.core.state import index, stack
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.loop import FederatedLoop, LoopConfig, sample_cohort
from lit_fedco.engine.simulate import run_rounds
from lit_fedco.engine.store import make_store
from lit_fedco.objectives.base import Objective, model_params
from lit_fedco.objectives.dro import kl_dro_primal, kl_dro_value
from lit_fedco.objectives.maml import maml_loss
from lit_fedco.objectives.personalized import DAMAML, MetaLearning
from lit_fedco.problems import PFLParams, PFLProblem
from lit_fedco.updaters import get_updater, project_simplex
from tests.helpers import (
    REPO,
    LastLoops,
    assert_executors_agree,
    digits_data,
    final_checkpoint,
    flat_server,
    make_loop,
    run_recipe,
    the_run,
)
from tests.objectives.test_dro import numerical_max_over_simplex
from tests.objectives.test_maml import SmoothBN, TanhMLP, flat_fd
from tests.updaters.test_updaters import CLIENTS, Scalar, quad_loss

WAYS = 3  # TanhMLP / SmoothBN have 3 outputs and read [b, 1, 4, 4] inputs


def client_batches(seed: int, b: int = 6) -> dict:
    g = torch.Generator().manual_seed(seed)

    def one() -> dict:
        return {
            "x": torch.randn(b, 1, 4, 4, generator=g, dtype=torch.float64),
            "y": torch.randint(WAYS, (b,), generator=g),
        }

    return {"inner": one(), "outer": one()}


# ---------------------------------------------------------------------- objectives
def test_damaml_value_equals_the_max_over_the_simplex_of_eq9():
    """γ log mean_k exp(f_k(g_k(x))/γ) — what ComFedL-DAMAML minimises, through the literal
    DA-MAML objective — equals max_p Σ p_k L_k − γ Σ p_k log(K p_k) (eq. 9) computed
    numerically, where L_k are the clients' post-adaptation losses."""
    torch.manual_seed(0)
    model = TanhMLP().double()
    params = model_params(model)
    batches = [client_batches(k) for k in range(4)]
    meta = MetaLearning(model, inner_lr=0.3)
    losses = torch.stack([meta.meta_loss(params, b) for b in batches]).detach()
    for gamma in (0.1, 0.5, 2.0):
        lit = DAMAML(model, inner_lr=0.3, gamma=gamma, form="literal")
        exp_values = torch.stack([lit.value(params, b, {}) for b in batches]).detach()
        closed = gamma * math.log(float(exp_values.mean()))
        numeric = numerical_max_over_simplex(losses, gamma)
        assert closed == pytest.approx(numeric, abs=1e-9)
        assert closed == pytest.approx(float(kl_dro_value(losses, gamma)), abs=1e-12)
        # and no point of a coarse grid over Δ_4 beats it
        n = 12
        for i, j, k in itertools.product(range(n + 1), repeat=3):
            if i + j + k <= n:
                r = torch.tensor([i, j, k, n - i - j - k], dtype=torch.float64) / n
                assert float(kl_dro_primal(losses, r, gamma)) <= closed + 1e-12


@pytest.mark.parametrize("net", [TanhMLP, SmoothBN])
def test_comfedl_maml_direction_is_the_maml_meta_gradient(net):
    """ComFedL-MAML's estimator (a vjp through ``adapt``) = torch.func.grad of the
    conditional issue's ``maml_loss`` = FedMAML's gradient = central finite differences."""
    torch.manual_seed(0)
    model = net().double()
    params = model_params(model)
    batches = client_batches(1)
    obj = MetaLearning(model, inner_lr=0.4)
    cls = get_updater("comfedl_maml")
    upd = cls(cls.hparams_cls(lr=0.1), model, obj)
    u, _ = upd.direction(params, batches, {})
    s, q = batches["inner"], batches["outer"]

    def f(p):
        return maml_loss(obj.batch_loss, p, (s["x"], s["y"]), (q["x"], q["y"]), 0.4)

    exact = grad(f)(params)
    fd = flat_fd(f, params)
    fed_cls = get_updater("fedmaml")
    fedmaml = fed_cls(fed_cls.hparams_cls(lr=1.0, hessian="support"), model, obj)
    stepped = fedmaml.client_step({"x": params}, batches, {}, StepInfo(0, 1, 0, 1))[0]["x"]
    for key in params:
        torch.testing.assert_close(u[key], exact[key], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(exact[key], fd[key], rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(params[key] - stepped[key], exact[key], rtol=1e-10, atol=1e-12)
    # first-order MAML is a different direction
    fo = MetaLearning(model, inner_lr=0.4, first_order=True)
    u_fo, _ = cls(cls.hparams_cls(lr=0.1), model, fo).direction(params, batches, {})
    assert max(float((u_fo[k] - exact[k]).abs().max()) for k in params) > 1e-6


@pytest.mark.parametrize("net", [TanhMLP, SmoothBN])
def test_per_fedavg_direction_takes_the_hessian_on_its_own_batch(net):
    """FedMAML (Per-FedAvg, Algorithm 1): u = (I − α ∇²L(x; D″)) ∇L(x − α ∇L(x; D); D′).
    With D″ = D it is grad of ``maml_loss`` (the one meta-gradient); with an independent D″
    the Hessian-vector product matches central differences of ∇L(·; D″) along ∇L(y; D′)."""
    from lit_fedco.core.state import tree_axpy
    from lit_fedco.objectives.maml import adapt, per_fedavg_direction

    torch.manual_seed(0)
    model = net().double()
    params = model_params(model)
    obj = MetaLearning(model, inner_lr=0.4)
    b, h = client_batches(1), client_batches(7)["inner"]
    s, q = (b["inner"]["x"], b["inner"]["y"]), (b["outer"]["x"], b["outer"]["y"])
    same, loss = per_fedavg_direction(obj.batch_loss, params, s, q, s, 0.4)
    exact = grad(lambda p: maml_loss(obj.batch_loss, p, s, q, 0.4))(params)
    for key in params:
        torch.testing.assert_close(same[key], exact[key], rtol=1e-10, atol=1e-12)
    u, _ = per_fedavg_direction(obj.batch_loss, params, s, q, (h["x"], h["y"]), 0.4)
    y = adapt(obj.batch_loss, params, *s, 0.4)
    g_q = grad(obj.batch_loss)(y, *q)
    assert float(loss) == pytest.approx(float(obj.batch_loss(y, *q)), rel=1e-12)
    eps = 1e-5

    def grad_h(p):
        return grad(obj.batch_loss)(p, h["x"], h["y"])

    plus, minus = grad_h(tree_axpy(eps, g_q, params)), grad_h(tree_axpy(-eps, g_q, params))
    for key in params:
        hvp = (plus[key] - minus[key]) / (2 * eps)
        torch.testing.assert_close(u[key], g_q[key] - 0.4 * hvp, rtol=1e-6, atol=1e-8)
    assert max(float((u[k] - same[k]).abs().max()) for k in params) > 1e-4  # D″ matters
    fo, _ = per_fedavg_direction(obj.batch_loss, params, s, q, s, 0.4, first_order=True)
    for key in params:
        torch.testing.assert_close(fo[key], g_q[key])


def test_fedmaml_draws_three_batches_and_rejects_a_multi_step_per_fedavg():
    torch.manual_seed(0)
    model = TanhMLP().double()
    cls = get_updater("fedmaml")
    obj = MetaLearning(model, inner_lr=0.4)
    assert cls(cls.hparams_cls(lr=0.1), model, obj).batch_roles == ("inner", "outer", "hessian")
    assert cls(cls.hparams_cls(lr=0.1, hessian="support"), model, obj).batch_roles == (
        "inner",
        "outer",
    )
    first = MetaLearning(model, inner_lr=0.4, first_order=True)
    assert cls(cls.hparams_cls(lr=0.1), model, first).batch_roles == ("inner", "outer")
    two = MetaLearning(model, inner_lr=0.4, inner_steps=2)
    with pytest.raises(ConfigError, match=r"pfl\.inner_steps: got 2.*fedmaml\.hessian=support"):
        cls(cls.hparams_cls(lr=0.1), model, two)
    with pytest.raises(ConfigError, match=r"hessian: got 'diagonal'"):
        cls.hparams_cls(hessian="diagonal")


def test_damaml_stable_and_literal_directions_differ_by_one_positive_factor_per_round():
    torch.manual_seed(0)
    model = TanhMLP().double()
    params = model_params(model)
    batches = [client_batches(k) for k in range(3)]
    cls = get_updater("comfedl_damaml")
    stable = cls(cls.hparams_cls(lr=0.1), model, DAMAML(model, inner_lr=0.05, gamma=0.2))
    literal = cls(
        cls.hparams_cls(lr=0.1), model, DAMAML(model, inner_lr=0.05, gamma=0.2, form="literal")
    )
    probes = torch.stack([stable.objective.probe(params, b, {}) for b in batches]).detach()
    info = RoundInfo(0, 3, torch.arange(3), 1, 0)
    round_ctx = stable.round_context({}, info, lambda fn: probes)
    ctx = round_ctx.broadcast
    factor = 0.2 * torch.exp(-ctx["shift"] / 0.2) / ctx["norm"]
    for b in batches:
        us, _ = stable.direction(params, b, ctx)
        ul, _ = literal.direction(params, b, {})
        for key in params:
            torch.testing.assert_close(us[key], factor * ul[key], rtol=1e-10, atol=1e-14)
    # at the broadcast point the client weights are K softmax(L/γ): the largest loss counts most
    assert int(round_ctx.cohort_weights.argmax()) == int(probes.argmax())
    # the logged step weight is the multiplier f′(L) of the MAML direction, in both forms
    meta = MetaLearning(model, inner_lr=0.05)
    for b in batches:
        _, logs_s = stable.client_step({"x": params}, b, ctx, StepInfo(0, 1, 0, 3))
        _, logs_l = literal.client_step({"x": params}, b, {}, StepInfo(0, 1, 0, 3))
        us, _ = stable.direction(params, b, ctx)
        gm = grad(lambda p, b=b: meta.meta_loss(p, b))(params)
        for key in params:
            torch.testing.assert_close(
                us[key], logs_s["step_weight"] * gm[key], rtol=1e-8, atol=1e-12
            )
        torch.testing.assert_close(logs_l["step_weight"], logs_s["step_weight"] / factor)


# ---------------------------------------------------------------------- DRFL / TR-MAML
def brute_force_projection(v: np.ndarray) -> np.ndarray:
    """argmin ‖p − v‖ over the simplex by trying every support set S: on S the KKT point is
    p_S = v_S − (Σ v_S − 1)/|S|; keep the feasible one closest to v."""
    best, best_d = None, math.inf
    for r in range(1, len(v) + 1):
        for s in itertools.combinations(range(len(v)), r):
            p = np.zeros_like(v)
            idx = list(s)
            p[idx] = v[idx] - (v[idx].sum() - 1) / len(idx)
            if (p >= -1e-15).all():
                d = float(((p - v) ** 2).sum())
                if d < best_d:
                    best, best_d = p, d
    assert best is not None
    return best


def test_simplex_projection_matches_brute_force():
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 5, 6):
        for scale in (0.1, 1.0, 5.0):
            v = rng.normal(size=k) * scale + 1.0 / k
            got = project_simplex(torch.tensor(v)).numpy()
            np.testing.assert_allclose(got, brute_force_projection(v), atol=1e-12)
            assert got.min() >= 0 and got.sum() == pytest.approx(1.0, abs=1e-12)
    already = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    torch.testing.assert_close(project_simplex(already), already)


def run_scalar(name: str, hparams: dict, rounds: int, local_steps: int = 2):
    """Two clients of tests/updaters/test_updaters: L_1 = w², L_2 = 2 (w − 1)², through the
    round the loop runs (lit_fedco.engine.round), full participation."""

    cls, model = get_updater(name), Scalar(0.0)
    upd = cls(cls.hparams_cls(**hparams), model, Objective(model, sample_loss=quad_loss))
    return run_rounds(upd, {"inner": stack(CLIENTS)}, rounds, local_steps)[-1]


@pytest.mark.slow
def test_drfl_reaches_the_minimax_point_of_two_quadratics():
    """min_w max(w², 2(w − 1)²) is at w* = 2 − √2, where L_1 = L_2; the weights make w*
    stationary: λ_1 2w* = λ_2 4(1 − w*), so λ* = (√2, 1)/(1 + √2). With one local step DRFL
    is projected gradient descent-ascent on Σ λ_k L_k and converges to both."""
    server = run_scalar("drfl", {"lr": 0.05, "lam_lr": 0.05}, rounds=3000, local_steps=1)
    assert float(server["x"]["w"]) == pytest.approx(2 - math.sqrt(2), abs=1e-6)
    lam_star = np.array([math.sqrt(2), 1.0]) / (1 + math.sqrt(2))
    np.testing.assert_allclose(server["lam"].numpy(), lam_star, atol=1e-6)


def test_drfl_with_frozen_weights_is_fedavg():
    """γ_λ = 0: λ stays uniform and the weighted aggregate is the plain mean."""
    a = make_loop("drfl", {"lr": 0.05, "lam_lr": 0.0}, rounds=3)
    b = make_loop("fedavg", {"lr": 0.05}, rounds=3)
    a.run()
    b.run()
    np.testing.assert_allclose(flat_server(a)[: len(flat_server(b))], flat_server(b), atol=1e-12)
    torch.testing.assert_close(a.server["lam"], torch.full((6,), 1 / 6, dtype=torch.float64))


def test_drfl_weights_follow_the_cohorts_losses():
    """One round by the loop: λ¹ = Π_Δ(λ⁰ + γ_λ (K/m) F) with F the cohort's probes."""
    seen = {}

    class Spy:
        def on_round_end(self, loop, logs):
            seen["lam"] = loop.server["lam"].clone()

    fabric = Fabric(accelerator="cpu", devices=1, callbacks=[Spy()])
    loop = make_loop("drfl", {"lr": 0.05, "lam_lr": 0.5}, rounds=1, cohort=3, fabric=fabric)
    upd = loop.updater
    lam0 = loop.server["lam"].clone()
    probes = {}
    orig = upd.round_context

    def record(server, info, probe):
        def recording(fn):
            rows = probe(fn)
            probes["p"], probes["cohort"] = rows.clone(), info.cohort.clone()
            return rows

        return orig(server, info, recording)

    upd.round_context = record  # type: ignore[method-assign]
    loop.run()
    v = torch.zeros(6, dtype=torch.float64)
    v[probes["cohort"]] = probes["p"] * 6 / 3
    torch.testing.assert_close(seen["lam"], project_simplex(lam0 + 0.5 * v))
    assert float(seen["lam"][probes["cohort"]].sum()) > 0.5  # mass moved to the cohort


# ---------------------------------------------------------------------- Ditto
@pytest.mark.slow
def test_ditto_personal_models_reach_their_closed_form():
    """With L_k(v) = s_k (v − t_k)², the global model converges to the FedAvg point and each
    personal model to argmin L_k(v) + λ/2 (v − w)² = (2 s_k t_k + λ w)/(2 s_k + λ)."""
    lam, cls, model = 0.5, get_updater("ditto"), Scalar(0.0)
    hp = cls.hparams_cls(lr=0.05, personal_lr=0.05, lam=lam)
    upd = cls(hp, model, Objective(model, sample_loss=quad_loss))
    store = make_store(upd, upd.init_server(upd.params(), 2), 2)
    # one local step: FedAvg is then gradient descent on the mean
    server = run_rounds(upd, {"inner": stack(CLIENTS)}, 2000, 1, store=store)[-1]
    personal = [index(store.rows["personal"], k) for k in range(2)]
    w = float(server["x"]["w"])
    assert w == pytest.approx(2 / 3, abs=1e-8)  # argmin w² + 2(w − 1)²
    for v, (s, t) in zip(personal, [(1.0, 0.0), (2.0, 1.0)], strict=True):
        assert float(v["w"]) == pytest.approx((2 * s * t + lam * w) / (2 * s + lam), abs=1e-8)


# ---------------------------------------------------------------------- evaluation
def pfl_loop(
    name: str,
    hparams: dict,
    executor: str = "sequential",
    fabric: Fabric | None = None,
    **kw,
) -> FederatedLoop:
    """A loop on the dominant-class digits with the ``pfl`` problem's objective; a fresh
    1-process CPU Fabric unless ``fabric`` is given."""
    data = digits_data(num_clients=5, partition="dominant_class", rho=0.5, val_per_client=20)
    net = build_model("mlp", tuple(data.x_train.shape[1:]), 10, seed=0, hidden=8)
    params = PFLParams(inner_lr=0.2, eval_support=12)
    cls, problem = get_updater(name), PFLProblem(params, data)
    upd = cls(cls.hparams_cls(**hparams), net, problem.objective_for(cls.compositions, net))
    cfg = dict(rounds=2, local_steps=2, cohort=5, batch_size=6, eval_every=1, progress=False)
    cfg.update(kw)
    fabric = fabric or Fabric(accelerator="cpu", devices=1)
    return FederatedLoop(
        fabric, upd, data, LoopConfig(**cfg), make_executor(executor), torch.float64, problem
    )


def test_evaluation_adapts_each_client_on_its_own_support_rows():
    """FedAvg on the pfl problem is scored after one step of size α on each client's fixed
    support rows: recomputed here by hand with torch.autograd."""
    loop = pfl_loop("fedavg", {"lr": 0.1})
    loop.run()
    per_client = loop.evaluate_clients.last_per_client
    data, x = loop.data, loop.server["x"]
    model = loop.updater.model
    for i, k in enumerate(loop.evaluate_clients.clients.tolist()):
        rows = loop.evaluate_clients.support[i]
        lo, hi = int(data.train_offsets[k]), int(data.train_offsets[k + 1])
        assert ((rows >= lo) & (rows < hi)).all()  # the client's own rows
        p = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        out = torch.func.functional_call(model, p, (data.x_train[rows],))
        loss = torch.nn.functional.cross_entropy(out, data.y_train[rows])
        grads = torch.autograd.grad(loss, list(p.values()))
        adapted = {n: (t - 0.2 * g).detach() for (n, t), g in zip(p.items(), grads, strict=True)}
        vlo, vhi = int(data.val_offsets[k]), int(data.val_offsets[k + 1])
        pred = torch.func.functional_call(model, adapted, (data.x_val[vlo:vhi],)).argmax(1)
        acc = float((pred == data.y_val[vlo:vhi]).double().mean())
        assert float(per_client[k]) == pytest.approx(acc, abs=1e-12)
    # and the support rows are the same at every evaluation
    again = loop.evaluate_clients._support_rows(12)
    assert torch.equal(again, loop.evaluate_clients.support)


def test_ditto_is_evaluated_with_its_persistent_personal_models():
    loop = pfl_loop("ditto", {"lr": 0.1, "personal_lr": 0.1, "lam": 0.5}, rounds=3, cohort=3)
    loop.run()
    personal = loop.evaluate_clients.personal_params(loop.server, loop.store)
    for key, v in loop.store.rows["personal"].items():
        torch.testing.assert_close(personal[key], v[loop.evaluate_clients.clients])
    # clients that took part moved away from x⁰; the others kept x⁰
    x0 = loop.updater.params()
    moved = [
        not torch.allclose(loop.store.rows["personal"]["fc1.weight"][k].float(), x0["fc1.weight"])
        for k in range(5)
    ]
    took_part = set().union(*(sample_cohort(0, r, 5, 3).tolist() for r in range(3)))
    assert moved == [k in took_part for k in range(5)]


@pytest.mark.parametrize(
    ("name", "hparams", "problem"),
    [
        ("comfedl_damaml", {"lr": 0.1}, {"gamma": 0.5}),
        ("comfedl_damaml", {"lr": 0.0005}, {"gamma": 0.5, "form": "literal"}),
        ("fedmaml", {"lr": 0.1}, None),
        ("tr_maml", {"lr": 0.1, "lam_lr": 0.1}, None),
        ("ditto", {"lr": 0.1}, None),
        ("drfl", {"lr": 0.1, "lam_lr": 0.1}, None),
    ],
)
def test_vectorized_equals_sequential(name, hparams, problem):
    assert_executors_agree(name, hparams, cohort=4, problem=problem)


def test_personalised_evaluation_is_the_same_under_both_executors():
    res = {}
    for ex in ("vectorized", "sequential"):
        loop = pfl_loop("comfedl_damaml", {"lr": 0.1}, executor=ex)
        res[ex] = loop.run()
    for key, v in res["vectorized"].items():
        assert v == pytest.approx(res["sequential"][key], rel=1e-9, abs=1e-12), key


def test_bad_problem_parameters_name_the_key():
    with pytest.raises(ConfigError, match="inner_lr"):
        PFLParams(inner_lr=0.0)
    with pytest.raises(ConfigError, match="lam_lr"):
        get_updater("drfl").hparams_cls(lam_lr=-1.0)
    with pytest.raises(ConfigError, match="personal_lr"):
        get_updater("ditto").hparams_cls(personal_lr=0.0)


# ---------------------------------------------------------------------- the recipe
def _run_recipe(out: Path, devices: int, *extra: str) -> dict:
    args = [
        "rounds=2", "eval_every=2", "local_steps=2", "batch_size=6", "model.name=mlp",
        "model.hidden=8", "dtype=float64", "data.val_per_client=20",
        *extra,
    ]  # fmt: skip
    return run_recipe("comfedl_maml", out, devices, *args)[0]


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    """ComFedL-DAMAML, TR-MAML and Ditto on 2 gloo processes = 1 process: server state and
    personal models to 1e-12 (float64), per-client metrics exactly."""
    names = ["comfedl_damaml", "tr_maml", "ditto"]
    sel = f"updaters=[{','.join(names)}]"
    one = _run_recipe(tmp_path / "one", 1, sel)
    two = _run_recipe(tmp_path / "two", 2, sel)
    for name in names:
        a = final_checkpoint(the_run(tmp_path / "one", "comfedl_maml") / f"{name}-seed0")
        b = final_checkpoint(the_run(tmp_path / "two", "comfedl_maml") / f"{name}-seed0")
        fa, fb = (np.concatenate([t.reshape(-1).numpy() for t in _leaves(c)]) for c in (a, b))
        np.testing.assert_allclose(fb, fa, rtol=1e-12, atol=1e-12)
        ra, rb = one["results"][name][0], two["results"][name][0]
        for key in ("val/acc_avg", "val/acc_worst", "train/acc_avg", "train/acc_worst"):
            assert ra[key] == rb[key], (name, key)
        assert ra["val/loss_avg"] == pytest.approx(rb["val/loss_avg"], rel=1e-12)


def _leaves(ckpt: dict) -> list[torch.Tensor]:
    from lit_fedco.core.state import tree_leaves

    return tree_leaves({"server": ckpt["loop"]["server"], "clients": ckpt["loop"]["clients"]})


@pytest.mark.slow
def test_recipe_rejects_a_bad_value_before_writing_anything(tmp_path):
    out = tmp_path / "out"
    args = [
        sys.executable, "-m", "lit_fedco.recipes.comfedl_maml", "pfl.inner_lr=-1",
        f"out_dir={out}",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert "pfl.inner_lr" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_cifar10_preset_runs_on_a_cifar_format_folder(tmp_path, capsys):
    """``preset=comfedl_maml_cifar10``: torchvision's CIFAR10 reads the folder, the dominant-class
    split gives client i a share ρ of class i, MAML's conv4 trains and is evaluated after
    adaptation (shrunk: one round, 8 filters)."""
    from lit_fedco.cli import run as main
    from lit_fedco.config.load import load_config
    from lit_fedco.experiment.assemble import build_data
    from tests.data.test_cifar_st import write_cifar

    write_cifar(tmp_path / "data", "cifar10", per_class_train=30, per_class_test=10, c=10)
    out = tmp_path / "out"
    argv = [
        "preset=comfedl_maml_cifar10", f"data.data_dir={tmp_path / 'data'}", "rounds=1",
        "local_steps=1", "batch_size=4", "model.hidden=8", "data.val_per_client=10",
        "updaters=[comfedl_damaml,ditto]", "tracking=[none]", "progress=false",
        f"out_dir={out}",
    ]  # fmt: skip
    cfg = load_config(argv)
    seen = LastLoops()
    rows = main("comfedl_maml", {}, argv, callbacks=[seen])
    assert [name for name, _ in rows] == ["comfedl_damaml", "ditto"]
    assert [loop.updater.name for loop in seen.loops] == ["comfedl_damaml", "ditto"]
    for (name, (res,)), loop in zip(rows, seen.loops, strict=True):
        # every client's validation accuracy with its own model, recomputed here: DA-MAML's
        # server model after one step of size α = pfl.inner_lr on the client's support rows,
        # Ditto's kept personal model
        d, model, ev = loop.data, loop.updater.model, loop.evaluate_clients
        assert ev.support is not None  # both personalise: fixed support rows per client
        acc = []
        for i, k in enumerate(ev.clients.tolist()):
            if name == "ditto":
                own = {n: v[k] for n, v in loop.store.rows["personal"].items()}
            else:
                p = {n: t.clone().requires_grad_(True) for n, t in loop.server["x"].items()}
                rows_k = ev.support[i]
                logits = torch.func.functional_call(model, p, (d.x_train[rows_k],))
                loss = torch.nn.functional.cross_entropy(logits, d.y_train[rows_k])
                grads = torch.autograd.grad(loss, list(p.values()))
                own = {n: (t - cfg.pfl.inner_lr * g).detach()
                       for (n, t), g in zip(p.items(), grads, strict=True)}  # fmt: skip
            lo, hi = int(d.val_offsets[k]), int(d.val_offsets[k + 1])
            with torch.no_grad():
                pred = torch.func.functional_call(model, own, (d.x_val[lo:hi],)).argmax(1)
            acc.append(float((pred == d.y_val[lo:hi]).double().mean()))
        assert res["val/acc_avg"] == pytest.approx(float(np.mean(acc)), abs=1e-12), name
        assert res["val/acc_worst"] == pytest.approx(min(acc), abs=1e-12), name
    assert (cfg.model.name, cfg.data.rho, cfg.local_steps) == ("conv4", 0.28, 1)
    data = build_data(cfg, 0)
    assert tuple(data.x_train.shape[1:]) == (3, 32, 32)
    counts = np.array(data.stats["train"]["class_counts"])  # [client, class]
    share = counts[np.arange(10), np.arange(10)] / counts.sum(1)
    np.testing.assert_allclose(share, 0.28, atol=0.05)
    assert (np.argmax(counts, 1) == np.arange(10)).all()  # client i is dominated by class i
