"""Equality of opportunity as a FedDRO problem (``objective=fairness``): the objective against
its definition (smoothed TPR gaps computed directly), ∇f against autograd and finite
differences, the violation metric against numpy, and the FedDRO family on tiny Adult files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric import Fabric
from torch.func import grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.metrics import TPRGapViolation, tpr_violation
from lit_fedco.core.models import build_model
from lit_fedco.data import make_federated
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.loop import FederatedLoop, LoopConfig
from lit_fedco.objectives.base import model_params
from lit_fedco.objectives.fairness import (
    EqualOpportunity,
    fairness_penalty,
    fairness_penalty_grad,
)
from lit_fedco.problems import FairnessParams, FairnessProblem
from lit_fedco.updaters import get_updater
from tests.data.test_adult import write_adult
from tests.helpers import digits_data

EDUCATION = ["Bachelors", "HS-grad", "Masters", "11th"]
WORK = ["Private", "State-gov", "?"]
RACES = ["White", "Black", "Asian-Pac-Islander"]


def random_rows(n: int, seed: int, test: bool = False) -> list[str]:
    """``n`` rows in the UCI Adult format with random values (the label depends on education
    and sex, so that a classifier has something to learn and TPRs differ by group)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        edu = int(rng.integers(len(EDUCATION)))
        sex = ["Female", "Male"][int(rng.integers(2))]
        rich = rng.random() < 0.15 + 0.2 * (edu in (0, 2)) + 0.15 * (sex == "Male")
        label = (">50K" if rich else "<=50K") + ("." if test else "")
        rows.append(
            f"{int(rng.integers(18, 80))}, {WORK[int(rng.integers(3))]}, "
            f"{int(rng.integers(10_000, 400_000))}, {EDUCATION[edu]}, {9 + 2 * edu}, "
            f"Never-married, Sales, Husband, {RACES[int(rng.integers(3))]}, {sex}, "
            f"{int(rng.integers(0, 3)) * 1000}, 0, {int(rng.integers(20, 60))}, United-States, "
            f"{label}"
        )
    return rows


def tiny_adult(folder: Path, num_clients: int = 4, n: int = 96, protected: str = "sex"):
    """Random Adult-format files (``n`` training rows, n/2 test rows) split over the clients."""
    write_adult(folder, train=random_rows(n, 0), test=random_rows(n // 2, 1, test=True))
    spec = SimpleNamespace(
        name="adult", data_dir=str(folder), partition="iid", num_clients=num_clients,
        alpha=0.5, seed=0, protected=protected,
    )  # fmt: skip
    return make_federated(spec)


def smoothed_tprs(margin: np.ndarray, label: np.ndarray, group: np.ndarray, g: int, tau: float):
    """The overall and per-group smoothed TPRs, ``mean_{y=1} σ(z/τ)``, computed directly."""
    s = 1 / (1 + np.exp(-margin / tau))
    pos = label == 1
    return s[pos].mean(), np.array([s[pos & (group == a)].mean() for a in range(g)])


# ---------------------------------------------------------------------- the objective
@pytest.mark.parametrize("protected", ["sex", "race"])
def test_f_of_the_mean_inner_value_is_the_penalty_on_pooled_smoothed_tprs(tmp_path, protected):
    """Equal client batches: f(mean_k g_k) = λ Σ_a (TPR − TPR_a)², TPRs of the pooled rows."""
    data = tiny_adult(tmp_path, n=96, protected=protected).to("cpu", torch.float64)
    groups = len(data.stats["groups"])
    net = build_model("logreg", (data.x_train.shape[1],), 2, seed=3).double()
    params = model_params(net)
    lam, tau = 3.0, 0.7
    obj = EqualOpportunity(net, groups, lam=lam, tau=tau)
    g = torch.stack(
        [obj.inner(params, {"x": x, "y": y}, {}) for x, y in
         (data.client_slice(k) for k in range(data.num_clients))]
    )  # fmt: skip
    assert g.shape == (4, 2 + 2 * groups) and obj.inner_dim == 2 + 2 * groups
    value = obj.f(g.mean(0), {})
    logits = net(data.x_train).detach().numpy()
    y = data.y_train.numpy()
    overall, per_group = smoothed_tprs(logits[:, 1] - logits[:, 0], y[:, 0], y[:, 1], groups, tau)
    expected = lam * ((overall - per_group) ** 2).sum()
    assert float(value) == pytest.approx(expected, rel=1e-10)
    # h is the mean cross-entropy; Φ = h + f
    ce = torch.nn.functional.cross_entropy(net(data.x_train), data.y_train[:, 0]).detach()
    h = torch.stack([obj.h(params, {"x": x, "y": y}, {}) for x, y in
                     (data.client_slice(k) for k in range(4))]).mean()  # fmt: skip
    assert float(h) == pytest.approx(float(ce), rel=1e-10)


def _points(groups: int):
    """Inner values at which to check ∇f: generic ones, and one whose group count is below
    the floor (its ratio reads u / ε)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(4):
        counts = 0.05 + torch.rand(1 + groups, generator=gen, dtype=torch.float64) * 0.3
        rates = torch.rand(1 + groups, generator=gen, dtype=torch.float64)
        out.append(torch.stack([rates * counts, counts], -1).reshape(-1))
    low = out[0].clone()
    low[3] = 2e-4  # group 0's positive share below ε = 1e-3
    low[2] = 1e-4
    return [*out, low]


@pytest.mark.parametrize("slack", [0.0, 0.05])
@pytest.mark.parametrize("groups", [2, 5])
def test_df_matches_autograd_and_finite_differences(groups, slack):
    lam, floor = 4.0, 1e-3
    for u in _points(groups):
        written = fairness_penalty_grad(u, lam, slack, floor)
        auto = grad(lambda v: fairness_penalty(v, lam, slack, floor))(u)
        torch.testing.assert_close(written, auto, rtol=1e-10, atol=1e-12)
        eps = 1e-7
        for i in range(len(u)):
            e = torch.zeros_like(u)
            e[i] = eps
            fd = (fairness_penalty(u + e, lam, slack, floor)
                  - fairness_penalty(u - e, lam, slack, floor)) / (2 * eps)  # fmt: skip
            assert float(written[i]) == pytest.approx(float(fd), rel=1e-5, abs=1e-6), i


def test_slack_and_floor_do_what_they_say():
    u = torch.tensor([0.3, 0.5, 0.1, 0.25, 0.2, 0.25], dtype=torch.float64)  # TPRs .6, .4, .8
    assert float(fairness_penalty(u, 1.0, 0.0, 1e-3)) == pytest.approx(0.2**2 + 0.2**2)
    assert float(fairness_penalty(u, 1.0, 0.15, 1e-3)) == pytest.approx(2 * 0.05**2)
    assert float(fairness_penalty(u, 1.0, 0.3, 1e-3)) == 0.0
    zero = u.clone()
    zero[2:4] = 0.0  # no positive of group 0: its ratio reads 0 / ε
    assert float(fairness_penalty(zero, 1.0, 0.0, 1e-3)) == pytest.approx(0.6**2 + 0.2**2)


def test_feddro_direction_is_the_gradient_of_phi_on_one_batch(tmp_path):
    """With y = g(x; B), eq. (7)'s u = ∇h + ∇gᵀ∇f(y) is ∇[h + f(g)] on B: the p-vector g runs
    through the FedDRO direction (one vector-Jacobian product with cotangent ∇f(y))."""
    data = tiny_adult(tmp_path).to("cpu", torch.float64)
    net = build_model("logreg", (data.x_train.shape[1],), 2, seed=1).double()
    problem = FairnessProblem(FairnessParams(lam=5.0), data)
    obj = problem.objective_for(("distributed",), net)
    feddro = get_updater("feddro")
    upd = feddro(feddro.hparams_cls(), net, obj)
    x = model_params(net)
    batch = {"x": data.x_train[:40], "y": data.y_train[:40]}
    y = obj.inner(x, batch, {})
    u, _ = upd.direction(x, y, batch, {})
    expected = grad(lambda p: obj.h(p, batch, {}) + obj.f(obj.inner(p, batch, {}), {}))(x)
    for k in x:
        torch.testing.assert_close(u[k], expected[k], rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------- the metric
def test_violation_metric_matches_numpy():
    rng = np.random.default_rng(4)
    n, groups = 500, 3
    logits = torch.from_numpy(rng.normal(size=(n, 2)))
    label = rng.integers(0, 2, n)
    group = rng.integers(0, groups, n)
    target = torch.from_numpy(np.stack([label, group], 1))
    client = torch.from_numpy(rng.integers(0, 4, n))
    metric = TPRGapViolation(groups)
    for i in range(0, n, 128):  # in chunks, as the evaluator feeds it
        metric.update(logits[i : i + 128], target[i : i + 128], client[i : i + 128])
    pred = (logits[:, 1] > logits[:, 0]).numpy()
    pos = label == 1
    tpr = pred[pos].mean()
    gaps = [abs(tpr - pred[pos & (group == a)].mean()) for a in range(groups)]
    assert float(metric.compute()) == pytest.approx(max(gaps), rel=1e-12)
    # a group without positives is left out; no positives at all: NaN
    assert float(tpr_violation(torch.tensor([3, 0]), torch.tensor([4, 0]))) == 0.0
    assert np.isnan(float(tpr_violation(torch.tensor([0, 0]), torch.tensor([0, 0]))))
    with pytest.raises(ValueError, match=r"targets \[n, 2\]"):
        metric.update(logits, torch.from_numpy(label), client)


# ---------------------------------------------------------------------- the problem
def test_objective_metric_is_phi_on_the_split(tmp_path):
    """``<split>/objective`` = mean_k h_k + f(mean_k g_k) over the split's rows (equal clients),
    fed in chunks."""
    data = tiny_adult(tmp_path, n=96).to("cpu", torch.float64)
    params = FairnessParams(lam=7.0, tau=0.3, slack=0.01)
    problem = FairnessProblem(params, data)
    net = build_model("logreg", (data.x_train.shape[1],), 2, seed=2).double()
    obj = problem.objective_for(("distributed",), net)
    x = model_params(net)
    parts = [obj.parts(x, {"x": xs, "y": ys}, {}) for xs, ys in
             (data.client_slice(k) for k in range(data.num_clients))]  # fmt: skip
    phi = torch.stack([p[1] for p in parts]).mean() + obj.f(
        torch.stack([p[0] for p in parts]).mean(0), {}
    )
    metric = problem.eval_metrics()["objective"]
    logits = net(data.x_train).detach()
    for i in range(0, 96, 40):
        metric.update(logits[i : i + 40], data.y_train[i : i + 40], torch.zeros(40).long())
    assert float(metric.compute()) == pytest.approx(float(phi), rel=1e-10)


def test_fairness_needs_targets_with_a_group():
    with pytest.raises(ConfigError, match=r"data\.name=adult"):
        FairnessProblem(FairnessParams(), digits_data())
    with pytest.raises(ConfigError, match="tau"):
        FairnessParams(tau=0.0)


def fair_loop(name: str, hparams: dict, data, **kw) -> FederatedLoop:
    net = build_model("logreg", (data.x_train.shape[1],), 2, seed=0)
    problem = FairnessProblem(FairnessParams(lam=5.0), data)
    cls = get_updater(name)
    upd = cls(cls.hparams_cls(**hparams), net, problem.objective_for(cls.compositions, net))
    cfg = dict(rounds=4, local_steps=2, cohort=4, batch_size=8, eval_every=2, progress=False)
    cfg.update(kw)
    fabric = Fabric(accelerator="cpu", devices=1)
    return FederatedLoop(fabric, upd, data, LoopConfig(**cfg), make_executor("vectorized"),
                         torch.float64, problem)  # fmt: skip


@pytest.mark.parametrize(
    "name,hparams",
    [
        ("feddro", {"lr": 0.1, "beta": 0.5}),
        ("ds_feddro", {"lr": 0.1, "beta": 0.5, "gamma_x": 1.3, "gamma_y": 1.4}),
        ("fedavg_co", {"lr": 0.1}),
        ("mbsgd", {"lr": 0.1}),
        ("gcivr", {"lr": 0.1, "q": 2, "refresh_batches": 2}),
        ("fedavg", {"lr": 0.1, "local_steps": 1}),
    ],
)
def test_every_method_of_the_comparison_runs_on_fairness(tmp_path, name, hparams):
    """The FedDRO family and GCIVR train the fairness objective (FedAvg its cross-entropy);
    evaluation logs the violation on both splits, and the train violation is the metric of
    the final model computed here directly."""
    data = tiny_adult(tmp_path)
    loop = fair_loop(name, hparams, data)
    loop.run()
    logs = loop.history[-1]
    assert {"train/violation", "val/violation", "val/acc_pooled", "train/objective"} <= set(logs)
    assert isinstance(loop.updater.objective, EqualOpportunity) == (name != "fedavg")
    x = loop.updater.eval_params(loop.server)
    logits = torch.func.functional_call(loop.updater.model, x, (data.x_train.double(),))
    pred = (logits[:, 1] > logits[:, 0]).numpy()
    y = data.y_train.numpy()
    pos = y[:, 0] == 1
    gaps = [abs(pred[pos].mean() - pred[pos & (y[:, 1] == a)].mean()) for a in (0, 1)]
    assert logs["train/violation"] == pytest.approx(max(gaps), rel=1e-9)
