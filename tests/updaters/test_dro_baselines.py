"""FastDRO and PDSGD (the FedDRO paper's CIFAR-ST baselines), against their definitions.

- the dual form that PDSGD constrains: ``min_μ μ + mean φ*(ℓ − μ)`` is the KL / χ² value;
- FastDRO's mini-batch step is the exact gradient of the pooled batch's DRO loss (autograd of
  the closed form on the concatenated losses), its MLMC step at a level J the gradient of its
  four-term combination, and the MLMC estimator averaged over every level and every order of
  the clients' samples is the full-batch gradient (enumeration);
- PDSGD's fixed point on a two-client quadratic problem is the DRO minimiser (bisection);
- vectorized = sequential, communication, validation, 1 = 2 processes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import RoundInfo
from lit_fedco.core.state import tree_map
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.simulate import run_rounds
from lit_fedco.examples.theorem41 import Scalar
from lit_fedco.objectives.distributed import (
    DistributedObjective,
    chi2_value,
    kl_sample_value,
    make_distributed_objective,
)
from lit_fedco.updaters.dro_baselines import (
    PDSGD,
    FastDRO,
    FastDROHparams,
    PDSGDHparams,
    block_sizes,
    level_probabilities,
)
from tests.helpers import assert_executors_agree, final_checkpoint, make_loop, run_recipe, the_run

ESTIMATOR_TOL = 1e-10  # float64, against autograd of the closed form
FIXED_POINT_TOL = 1e-6
F64 = torch.float64


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread (two spin against each other on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def dro_value(kind: str, losses: Tensor, lam: float) -> Tensor:
    """The sample-level DRO value of a loss vector, in closed form."""
    return kl_sample_value(losses, lam) if kind == "kl" else chi2_value(losses, lam)


# ---------------------------------------------------------------------- the dual form
@pytest.mark.parametrize("kind,lam", [("kl", 0.7), ("chi2", 2.0)])
def test_dual_form_minimum_is_the_dro_value(kind, lam):
    """``Ψ(μ) = μ + mean φ*(ℓ − μ)``: its minimum over μ is the closed form, at μ* (KL: the
    value; χ²: the mean loss), where ``Ψ'(μ*) = 0``; the statistics of m equal batches give
    the union's Ψ at any μ."""
    g = torch.Generator().manual_seed(0)
    losses = torch.rand(3, 5, generator=g, dtype=torch.float64) * 3  # 3 batches of 5
    obj = make_distributed_objective(kind, nn.Linear(1, 1), lam)
    flat = losses.reshape(-1)
    stats = torch.stack([obj.dual_stats(b) for b in losses])

    def psi(mu: Tensor) -> Tensor:
        return mu + obj.dual_penalty(flat - mu).mean()

    for mu in (-1.0, 0.3, 2.5):
        mu_t = torch.tensor(mu, dtype=torch.float64)
        torch.testing.assert_close(obj.dual_value(stats, mu_t), psi(mu_t), rtol=1e-12, atol=0)
    mu_star = obj.dual_minimiser(stats).requires_grad_(True)
    value = psi(mu_star)
    (slope,) = torch.autograd.grad(value, mu_star)
    assert abs(float(slope)) < 1e-12
    torch.testing.assert_close(value.detach(), dro_value(kind, flat, lam), rtol=1e-12, atol=0)
    expected = kl_sample_value(flat, lam) if kind == "kl" else flat.mean()
    torch.testing.assert_close(mu_star.detach(), expected, rtol=1e-12, atol=0)
    grid = torch.linspace(-2.0, 4.0, 601, dtype=torch.float64)
    assert min(float(psi(m)) for m in grid) >= float(value.detach()) - 1e-12


# ---------------------------------------------------------------------- FastDRO
class Linear(nn.Module):
    """A float64 linear classifier (3 classes on 4 features)."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.lin = nn.Linear(4, 3).double()

    def forward(self, x: Tensor) -> Tensor:
        return self.lin(x)


def client_batches(num_clients: int, b: int, seed: int = 1) -> dict[str, Tensor]:
    """``{"x": [K, b, 4], "y": [K, b]}``, random, float64."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_clients, b, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (num_clients, b), generator=g)
    return {"x": x, "y": y}


def fastdro(kind: str, lam: float, lr: float = 0.1, **hp) -> FastDRO:
    model = Linear()
    obj = make_distributed_objective(kind, model, lam)
    return FastDRO(FastDROHparams(lr=lr, **hp), model, obj)


def one_step_direction(upd, batches: dict[str, Tensor]) -> dict[str, Tensor]:
    """``(x⁰ − x¹)/η`` of one round on fixed batches (every client in one process)."""
    hist = run_rounds(upd, {role: batches for role in upd.batch_roles}, rounds=1, local_steps=1)
    lr = upd.hparams.lr
    return tree_map(lambda a, b: (a - b) / lr, hist[0]["x"], hist[1]["x"])


def pooled_gradient(upd, kind: str, lam: float, batches: dict[str, Tensor], terms) -> dict:
    """Autograd of ``Σ_s c_s ℒ(x; S_s)`` with ℒ the closed-form DRO value of the losses of
    every client's samples ``S_s`` (index ranges into each client's batch), concatenated."""
    obj = upd.objective
    params = {k: v.detach().clone().requires_grad_(True) for k, v in upd.params().items()}
    losses = torch.stack(
        [
            obj.losses(params, {"x": x, "y": y})
            for x, y in zip(batches["x"], batches["y"], strict=True)
        ]
    )
    total = sum(c * dro_value(kind, losses[:, idx].reshape(-1), lam) for c, idx in terms)
    grads = torch.autograd.grad(total, list(params.values()))
    return dict(zip(params, grads, strict=True))


def assert_trees_close(a: dict, b: dict, rtol: float) -> None:
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=rtol * 1e-2)


@pytest.mark.parametrize("kind,lam", [("kl", 0.5), ("chi2", 1.5)])
def test_fastdro_minibatch_step_is_the_gradient_of_the_pooled_batch_dro_loss(kind, lam):
    """Three clients, six samples each: the averaged step is ∇ℒ(x; the 18 pooled samples),
    ℒ = λ log mean exp(ℓ/λ) (KL) or ℓ̄ + Var/(2λ) (χ²), by autograd of the closed form."""
    batches = client_batches(3, 6)
    upd = fastdro(kind, lam)
    direction = one_step_direction(upd, batches)
    expected = pooled_gradient(upd, kind, lam, batches, [(1.0, slice(0, 6))])
    assert_trees_close(direction, expected, ESTIMATOR_TOL)
    # not the mean of the clients' own DRO gradients (the pooled loss is not separable)
    per_client = [
        pooled_gradient(upd, kind, lam, {k: v[i : i + 1] for k, v in batches.items()},
                        [(1.0, slice(0, 6))])
        for i in range(3)
    ]  # fmt: skip
    mean_own = {k: sum(g[k] for g in per_client) / 3 for k in expected}
    assert not torch.allclose(mean_own["lin.weight"], expected["lin.weight"], rtol=1e-3)


def mlmc_sets(level: int, n0: int) -> list[slice]:
    """The samples of S_{n₀}, S_{n₀2^J} and its two halves in each client's batch."""
    n = n0 * 2**level
    return [slice(0, n0), slice(0, n), slice(0, n // 2), slice(n // 2, n)]


@pytest.mark.parametrize("kind,lam", [("kl", 0.5), ("chi2", 1.5)])
@pytest.mark.parametrize("level", [1, 2, 3])
def test_fastdro_mlmc_step_at_a_level_is_the_gradient_of_its_combination(kind, lam, level):
    """J_max = 3, b = 16 (n₀ = 2), three clients; the level forced to J: the step is
    ∇[ℒ(S_{n₀}) + (1/p_J)(ℒ(S_{n₀2^J}) − ½ ℒ(first half) − ½ ℒ(second half))] over the pool."""
    batches = client_batches(3, 16, seed=2)
    upd = fastdro(kind, lam, estimator="mlmc", mlmc_levels=3, mlmc_doubling=0.4)
    upd.draw_level = lambda info: level  # type: ignore[method-assign]
    p = level_probabilities(3, 0.4)[level - 1]
    coefs = [1.0, 1 / p, -0.5 / p, -0.5 / p]
    terms = list(zip(coefs, mlmc_sets(level, 2), strict=True))
    assert_trees_close(
        one_step_direction(upd, batches), pooled_gradient(upd, kind, lam, batches, terms),
        ESTIMATOR_TOL,
    )  # fmt: skip


def test_level_probabilities_and_draws():
    """p_J = (1 − r) r^{J−1}, the rest at J_max; draws follow it and are a function of
    (seed, round) only."""
    assert level_probabilities(3, 0.5) == [0.5, 0.25, 0.25]
    assert level_probabilities(1, 0.3) == [1.0]
    p = level_probabilities(4, 0.4)
    assert sum(p) == pytest.approx(1.0, abs=1e-15)
    assert p == pytest.approx([0.6, 0.24, 0.096, 0.064], abs=1e-15)
    upd = fastdro("kl", 1.0, estimator="mlmc", mlmc_levels=4, mlmc_doubling=0.4)
    info = [RoundInfo(r, 3, torch.arange(3), 1, 7) for r in range(4000)]
    draws = [upd.draw_level(i) for i in info]
    assert draws == [upd.draw_level(i) for i in info]
    freq = [draws.count(j) / len(draws) for j in range(1, 5)]
    assert freq == pytest.approx(p, abs=0.025)
    assert block_sizes(16, 3) == [2, 2, 4, 8] and block_sizes(5, 0) == [5]
    with pytest.raises(ConfigError, match="batch_size: got 12"):
        block_sizes(12, 3)


def orderings(n: int):
    """Every way a uniformly drawn order of n = 4 samples fills the blocks [1, 1, 2] (block 0,
    block 1, the last two as a set): 12 equally likely assignments."""
    for a, b in itertools.permutations(range(n), 2):
        rest = [i for i in range(n) if i not in (a, b)]
        yield [a, b, *rest]


@pytest.mark.parametrize("kind,lam", [("kl", 0.5), ("chi2", 1.5)])
def test_fastdro_mlmc_is_unbiased_for_the_full_batch_gradient(kind, lam):
    """Two clients with four samples each, b = 4, J_max = 2 (n₀ = 1): the MLMC estimate
    averaged exactly over the levels (weights p_J) and over every order of each client's
    samples (what a uniformly drawn batch of all n_k = b samples is) equals the gradient of the
    full-batch plug-in ℒ(x; all 8 samples). A single level or a single order does not."""
    data = client_batches(2, 4, seed=3)
    upd = fastdro(kind, lam, estimator="mlmc", mlmc_levels=2, mlmc_doubling=0.5)
    probs = level_probabilities(2, 0.5)
    x0 = upd.params()
    server = upd.init_server(x0, 2)
    info = RoundInfo(0, 2, torch.arange(2), 1, 0)
    mean: dict[str, Tensor] = {k: torch.zeros_like(v) for k, v in x0.items()}
    orders = list(itertools.product(orderings(4), repeat=2))
    level_means = []
    for level, p in zip((1, 2), probs, strict=True):
        upd.draw_level = lambda info, j=level: j  # type: ignore[method-assign]
        acc = {k: torch.zeros_like(v) for k, v in x0.items()}
        for order in orders:
            batches = [{"x": data["x"][k, o], "y": data["y"][k, o]} for k, o in enumerate(order)]
            probes = torch.stack([upd.block_probe({"x": x0}, {"grad": b}) for b in batches])
            ctx = upd.round_context(server, info, lambda fn, p=probes: p).broadcast
            steps = [upd.client_step({"x": x0}, {"grad": b}, ctx, info.step(0))[0]["x"]
                     for b in batches]  # fmt: skip
            for k in acc:
                acc[k] += sum(x0[k] - s[k] for s in steps) / (2 * upd.hparams.lr * len(orders))
        level_means.append(acc)
        for k in mean:
            mean[k] += p * acc[k]
    full = pooled_gradient(upd, kind, lam, data, [(1.0, slice(0, 4))])
    assert_trees_close(mean, full, ESTIMATOR_TOL)
    for acc in level_means:  # each level alone is biased
        assert not torch.allclose(acc["lin.weight"], full["lin.weight"], rtol=1e-4)


# ---------------------------------------------------------------------- PDSGD
def quad(pred: Tensor, target: Tensor) -> Tensor:
    """ℓ = s (w − t)² with (s, t) = target[:, 0], target[:, 1]."""
    return target[:, 0] * (pred - target[:, 1]) ** 2


TWO_CLIENTS = [[(1.0, 0.0), (2.0, 0.5)], [(1.0, 2.0), (0.5, 3.0)]]
"""(s, t) of each client's two samples."""


def quad_batches() -> dict[str, Tensor]:
    y = torch.tensor(TWO_CLIENTS, dtype=torch.float64)
    return {"x": torch.zeros(2, 2, 1, dtype=torch.float64), "y": y}


def dro_minimiser(kind: str, lam: float) -> float:
    """argmin_w of the DRO value of the four losses, by bisection on its derivative."""
    st = torch.tensor(TWO_CLIENTS, dtype=torch.float64).reshape(-1, 2)

    def slope(w: float) -> float:
        wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        v = dro_value(kind, st[:, 0] * (wt - st[:, 1]) ** 2, lam)
        return float(torch.autograd.grad(v, wt)[0])

    lo, hi = 0.0, 3.0
    assert slope(lo) < 0 < slope(hi)
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if slope(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("kind,lam,lr", [("kl", 0.5, 0.1), ("chi2", 3.0, 0.3)])
def test_pdsgd_fixed_point_is_the_dro_minimiser(kind, lam, lr):
    """Two clients, two samples each, full batches: PDSGD's iterates converge to w* (to 1e-6),
    with z → 1, μ → μ* (KL: the value; χ²: the mean loss) and η → V(w*), the KKT point."""
    model = Scalar(0.0)
    obj = make_distributed_objective(kind, model, lam)
    obj.sample_loss = quad
    upd = PDSGD(PDSGDHparams(lr=lr, lr_dual=1.0, beta=2.0), model, obj)
    batches = {role: quad_batches() for role in upd.batch_roles}
    hist = run_rounds(upd, batches, rounds=300, local_steps=1)
    last = hist[-1]
    w_star = dro_minimiser(kind, lam)
    st = torch.tensor(TWO_CLIENTS, dtype=torch.float64).reshape(-1, 2)
    losses = st[:, 0] * (w_star - st[:, 1]) ** 2
    if kind == "chi2":  # the closed form is the χ²-DRO value here (all weights >= 0)
        assert bool(losses.min() >= losses.mean() - lam)
    assert float(last["x"]["w"]) == pytest.approx(w_star, abs=FIXED_POINT_TOL)
    assert float(last["z"]) == pytest.approx(1.0, abs=FIXED_POINT_TOL)
    assert float(last["eta"]) == pytest.approx(float(dro_value(kind, losses, lam)), abs=1e-6)
    mu_star = kl_sample_value(losses, lam) if kind == "kl" else losses.mean()
    assert float(last["mu"]) == pytest.approx(float(mu_star), abs=FIXED_POINT_TOL)
    # the DRO minimiser is not the average-loss minimiser
    erm = float((st[:, 0] * st[:, 1]).sum() / st[:, 0].sum())
    assert abs(w_star - erm) > 0.05


def test_pdsgd_round_zero_starts_on_the_constraint_and_the_dual_step_is_xu_s():
    """First round: μ₀ = argmin Ψ̂, η₀ = Ψ̂(μ₀) (ĉ = 0), m = z⁰. Later rounds: z ← max(0, z +
    ρ max(ĉ, −z/β)), m = max(0, z + β ĉ), η ← η − α (1 − m)."""
    model = Scalar(0.0)
    obj = make_distributed_objective("chi2", model, 2.0)
    obj.sample_loss = quad
    upd = PDSGD(PDSGDHparams(lr=0.1, lr_dual=0.3, beta=0.5, dual_init=0.8), model, obj)
    server = upd.init_server(upd.params(), 2)
    losses = torch.tensor([[0.5, 1.0], [2.0, 4.0]], dtype=torch.float64)
    stats = torch.stack([obj.dual_stats(b) for b in losses])
    ctx = upd.round_context(server, RoundInfo(0, 2, torch.arange(2), 1, 0), lambda fn: stats)
    assert float(ctx.broadcast["mu"]) == pytest.approx(1.875)
    assert float(ctx.server["eta"]) == pytest.approx(float(chi2_value(losses.reshape(-1), 2.0)))
    assert float(ctx.broadcast["mult"]) == pytest.approx(0.8)
    scalars = {"mu": 1.0, "eta": 1.5, "z": 0.8, "started": 1.0}
    later = {**server, **{k: torch.tensor(v, dtype=F64) for k, v in scalars.items()}}
    ctx = upd.round_context(later, RoundInfo(5, 2, torch.arange(2), 1, 0), lambda fn: stats)
    gap = float(obj.dual_value(stats, torch.tensor(1.0, dtype=F64))) - 1.5
    z = max(0.0, 0.8 + 0.3 * max(gap, -0.8 / 0.5))
    assert float(ctx.server["z"]) == pytest.approx(z, rel=1e-14)
    assert float(ctx.broadcast["mult"]) == pytest.approx(max(0.0, z + 0.5 * gap), rel=1e-14)
    mean = {"x": server["x"], "mu": torch.tensor(1.0, dtype=F64)}
    new = upd.server_update(later, mean, ctx, RoundInfo(5, 2, torch.arange(2), 1, 0))
    m = float(ctx.broadcast["mult"])
    assert float(new["eta"]) == pytest.approx(1.5 - 0.1 * (1 - m), rel=1e-14)


def test_pdsgd_starts_in_the_first_round_that_runs():
    """A round in which every client drops leaves the server as it was, so the start (μ₀, η₀
    from the probes) waits for the next round instead of stepping from μ = η = 0."""
    loop = make_loop("pdsgd", {"lr": 0.05}, rounds=1, failures=Failures(drop=1.0))
    loop.run_round()
    assert float(loop.server["started"]) == 0.0 and float(loop.server["mu"]) == 0.0
    loop.cfg = dataclasses.replace(loop.cfg, failures=None)
    logs = loop.run_round()
    assert float(loop.server["started"]) == 1.0 and float(loop.server["mu"]) > 0.5
    assert logs["train/multiplier"] == pytest.approx(1.0, abs=1e-12)  # z⁰, the start is tight


# ---------------------------------------------------------------------- the round
@pytest.mark.parametrize(
    "name,hparams,problem",
    [
        ("fastdro", {"lr": 0.1}, None),
        ("fastdro", {"lr": 0.1, "estimator": "mlmc", "mlmc_levels": 2}, None),
        ("fastdro", {"lr": 0.1, "estimator": "mlmc", "mlmc_levels": 3}, {"kind": "chi2"}),
        ("pdsgd", {"lr": 0.1}, None),
        ("pdsgd", {"lr": 0.1, "beta": 0.5}, {"kind": "chi2", "lam": 3.0}),
    ],
)
def test_vectorized_equals_sequential(name, hparams, problem):
    assert_executors_agree(name, hparams, problem=problem)


def test_communication_per_client_per_round():
    """d floats of x each way; FastDRO adds its B block probes up, the KL shift and 2B block
    weights down; PDSGD its 1 KL statistic and μ up, μ and the multiplier down."""
    logs, d = {}, 0
    for name, hp in [
        ("fastdro", {"lr": 0.05}),
        ("fastdro", {"lr": 0.05, "estimator": "mlmc", "mlmc_levels": 2}),
        ("pdsgd", {"lr": 0.05}),
    ]:
        loop = make_loop(name, hp, rounds=1, local_steps=4)
        logs[name + hp.get("estimator", "")] = loop.run_round()
        d = sum(p.numel() for p in loop.server["x"].values())
        assert loop.local_steps == 1  # the parallel baselines' I = 1, whatever the run's
    up = {k: v["comm/up_floats_per_client"] for k, v in logs.items()}
    down = {k: v["comm/down_floats_per_client"] for k, v in logs.items()}
    assert up == {"fastdro": 1 + d, "fastdromlmc": 3 + d, "pdsgd": 1 + d + 1}
    assert down == {"fastdro": d + 1 + 2, "fastdromlmc": d + 1 + 6, "pdsgd": d + 2}


def test_hparams_are_validated_with_the_key_in_the_message():
    with pytest.raises(ConfigError, match=r"^local_steps: got 2"):
        FastDROHparams(local_steps=2)
    with pytest.raises(ConfigError, match=r"^local_steps: got 5"):
        PDSGDHparams(local_steps=5)
    with pytest.raises(ConfigError, match="estimator: got 'cvar'"):
        FastDROHparams(estimator="cvar")
    with pytest.raises(ConfigError, match="mlmc_levels: got 0"):
        FastDROHparams(mlmc_levels=0)
    with pytest.raises(ConfigError, match=r"mlmc_doubling: got 1\.0"):
        FastDROHparams(mlmc_doubling=1.0)
    with pytest.raises(ConfigError, match=r"beta: got 0\.0"):
        PDSGDHparams(beta=0.0)
    with pytest.raises(ConfigError, match="lr_dual: got 0"):
        PDSGDHparams(lr_dual=0)
    with pytest.raises(ConfigError, match="dual_init: got -1"):
        PDSGDHparams(dual_init=-1)


def test_an_objective_without_a_dual_form_is_refused_by_name():
    class Plain(DistributedObjective):
        pass

    with pytest.raises(ConfigError, match="Plain has no dual form"):
        Plain(nn.Linear(1, 1)).dual_stats(torch.zeros(3))


def test_they_train_on_digits():
    """A few rounds on the tiny digits split lower the training loss and keep it finite."""
    for name, hp in [("fastdro", {"lr": 0.2}), ("fastdro", {"lr": 0.2, "estimator": "mlmc"}),
                     ("pdsgd", {"lr": 0.2})]:  # fmt: skip
        loop = make_loop(name, hp, rounds=30, batch_size=16, eval_every=30)
        first = loop.run_round()["train/loss"]
        for _ in range(29):
            last = loop.run_round()["train/loss"]
        assert math.isfinite(last) and last < 0.8 * first, (name, hp, first, last)


def _run_recipe(out: Path, devices: int) -> dict:
    args = [
        "updaters=[fastdro,pdsgd]", "rounds=3", "eval_every=3", "dtype=float64",
        "fastdro.estimator=mlmc", "fastdro.mlmc_levels=3", "threads=1",
    ]  # fmt: skip
    results, stdout = run_recipe("ds_feddro", out, devices, *args)
    assert "fastdro" in stdout and "pdsgd" in stdout
    return results


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    """The pooled probes (FastDRO's blocks, PDSGD's statistics) on 2 gloo processes (4 of the 8
    clients each) equal 1 process: server state to 1e-12 (float64), metrics exactly."""
    one = _run_recipe(tmp_path / "one", 1)
    two = _run_recipe(tmp_path / "two", 2)
    for name in ("fastdro", "pdsgd"):
        a = final_checkpoint(the_run(tmp_path / "one", "ds_feddro") / f"{name}-seed0")
        b = final_checkpoint(the_run(tmp_path / "two", "ds_feddro") / f"{name}-seed0")
        sa, sb = a["loop"]["server"], b["loop"]["server"]
        for key, va in sa.items():
            torch.testing.assert_close(sb[key], va, rtol=1e-12, atol=1e-12)
        ra, rb = one["results"][name][0], two["results"][name][0]
        for key in ("val/acc_avg", "val/acc_worst", "val/class_acc_worst", "train/acc_avg"):
            assert ra[key] == rb[key], (name, key)
