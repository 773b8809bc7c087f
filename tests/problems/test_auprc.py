"""The AUPRC task (FCSG §5.3): AP surrogate, binarised data, positive sampler, AP metric,
CODA+'s min-max AUC loss."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score
from torch import nn
from torch.func import grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.metrics import PooledAccuracyAtPrior, PooledAveragePrecision, accuracy_at_prior
from lit_fedco.data import PositiveSampler, make_federated
from lit_fedco.data.build import binarize, drop_positives
from lit_fedco.objectives.conditional import AveragePrecision, auc_minmax_loss
from lit_fedco.problems import AUPRCParams, AUPRCProblem
from tests.helpers import LastLoops, the_run


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 1).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def brute_force_ap_surrogate(params, model, x, y, s):
    """mean over positives i of −u₁_i/u₂_i, every sum written out (FCSG eq. 6)."""
    h = torch.sigmoid(torch.func.functional_call(model, params, (x,)).squeeze(-1))
    terms = []
    for i in range(len(y)):
        if y[i] != 1:
            continue
        u1 = sum((y[j] == 1) * torch.clamp(s - h[i] + h[j], min=0) ** 2 for j in range(len(y)))
        u2 = sum(torch.clamp(s - h[i] + h[j], min=0) ** 2 for j in range(len(y)))
        terms.append(-(u1 / len(y)) / (u2 / len(y)))
    return torch.stack(terms).mean()


def test_ap_surrogate_and_its_gradient_equal_autograd_of_minus_u1_over_u2():
    g = torch.Generator().manual_seed(0)
    model = Linear()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(9, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([1, 0, 0, 1, 0, 1, 0, 0, 0])
    obj = AveragePrecision(model, margin=0.7)
    batch = {"x": x, "y": y}
    value = obj.value(params, {"inner": batch}, {})
    brute = brute_force_ap_surrogate(params, model, x, y, 0.7)
    torch.testing.assert_close(value, brute, rtol=1e-12, atol=1e-14)
    g_obj = grad(lambda p: obj.value(p, {"inner": batch}, {}))(params)
    g_brute = grad(lambda p: brute_force_ap_surrogate(p, model, x, y, 0.7))(params)
    torch.testing.assert_close(g_obj, g_brute, rtol=1e-10, atol=1e-12)
    assert -1 <= float(value) < 0  # −precision-like


def test_binarize_and_drop_positives():
    y = torch.arange(10).repeat(100)
    yb = binarize(y, 10)
    assert yb[:10].tolist() == [0] * 5 + [1] * 5
    keep = drop_positives(yb, 0.8, np.random.default_rng(0))
    assert int((yb[keep] == 1).sum()) == 100  # 500 positives, 80% removed
    assert int((yb[keep] == 0).sum()) == 500  # negatives untouched
    with pytest.raises(ConfigError, match="drop_positive"):
        drop_positives(yb, 1.0, np.random.default_rng(0))


def binary_digits(num_clients: int = 4):
    spec = SimpleNamespace(
        name="digits", data_dir="", partition="iid", num_clients=num_clients, big=0, small=0,
        small_classes=0, alpha=0.5, rho=0.3, val_per_client=1, seed=0, binary=True,
        drop_positive=0.8, val_mode="all",
    )  # fmt: skip
    return make_federated(spec)


def test_binary_data_removes_training_positives_and_keeps_the_test_set():
    from lit_fedco.data.sources import load_source

    _, y, _, y_te, _ = load_source("digits")
    data = binary_digits()
    pos_before = int((y >= 5).sum())
    assert int((data.y_train == 1).sum()) == pos_before - round(0.8 * pos_before)
    assert int((data.y_train == 0).sum()) == int((y < 5).sum())
    # the test set: every held-out row, unchanged class mix, split evenly over the clients
    assert len(data.y_val) == len(y_te)
    assert int(data.y_val.sum()) == int((y_te >= 5).sum())
    sizes = data.sizes("val")
    assert int(sizes.max() - sizes.min()) <= 1


def test_positive_sampler_puts_positives_in_every_batch():
    data = binary_digits()
    sampler = PositiveSampler(data, seed=0, positives=4)
    idx = sampler.sample_round(torch.arange(4), 2, steps=5, roles=("inner",), batch_size=12)
    assert idx.shape == (5, 1, 4, 12)
    y = data.y_train[idx]
    assert bool((y[..., :4] == 1).all())
    for k in range(4):  # rows of client k only
        lo, hi = int(data.train_offsets[k]), int(data.train_offsets[k + 1])
        assert bool(((idx[:, :, k] >= lo) & (idx[:, :, k] < hi)).all())
    again = sampler.sample_round(torch.tensor([2]), 2, steps=5, roles=("inner",), batch_size=12)
    assert torch.equal(again[:, :, 0], idx[:, :, 2])  # a function of (seed, client, round)
    with pytest.raises(ConfigError, match="batch_size"):
        sampler.sample_round(torch.arange(4), 0, 1, ("inner",), 4)


def test_pooled_average_precision_matches_scikit_learn():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(200, generator=g) * 30  # large scores: no ties from a saturated sigmoid
    y = (torch.rand(200, generator=g) < 0.2).long()
    metric = PooledAveragePrecision()
    for part in (slice(0, 70), slice(70, 200)):
        logits = torch.stack([-s[part] / 2, s[part] / 2], dim=-1)
        metric.update(logits, y[part], torch.zeros_like(y[part]))
    expected = average_precision_score(y.numpy(), s.numpy())
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-6)  # float32 inside


def direct_accuracy_at_prior(scores: np.ndarray, y: np.ndarray) -> float:
    """Label the P best-scored rows positive (P: the rows' positives), and every row tied with
    the P-th; accuracy of that labelling, counted row by row."""
    p = int(y.sum())
    if p == 0:
        return float((y == 0).mean())
    tau = sorted(scores.tolist(), reverse=True)[p - 1]
    hits = [int(s >= tau) == t for s, t in zip(scores.tolist(), y.tolist(), strict=True)]
    return sum(hits) / len(y)


def test_accuracy_at_prior_matches_a_direct_computation():
    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        n = 1 + trial * 7
        s = torch.randn(n, generator=g, dtype=torch.float64)
        if trial % 3 == 0:
            s = s.round()  # many ties
        y = (torch.rand(n, generator=g) < 0.3).long()
        got = float(accuracy_at_prior(s, y))
        assert got == pytest.approx(direct_accuracy_at_prior(s.numpy(), y.numpy()), abs=1e-12)
    # the metric pools rows from several updates; its threshold ignores the score's offset
    s = torch.randn(300, generator=g, dtype=torch.float64)
    y = (s + 0.8 * torch.randn(300, generator=g, dtype=torch.float64) > 1.0).long()
    expected = direct_accuracy_at_prior(s.numpy(), y.numpy())
    for shift in (0.0, -25.0):
        metric = PooledAccuracyAtPrior()
        for part in (slice(0, 120), slice(120, 300)):
            t = s[part] + shift
            metric.update(torch.stack([-t / 2, t / 2], dim=-1), y[part], torch.zeros_like(y[part]))
        assert float(metric.compute()) == pytest.approx(expected, abs=1e-12)
    # a perfect ranking is perfectly accurate at the prior, at any offset; 0 would say 0.5 here
    y = torch.tensor([0, 0, 1, 1])
    assert float(accuracy_at_prior(torch.tensor([-9.0, -8.0, -7.0, -6.0]), y)) == 1.0
    assert float(accuracy_at_prior(torch.tensor([3.0, 2.0, 1.0, 0.0]), y)) == 0.0  # reversed


def test_codas_loss_is_stationary_at_its_closed_form_saddle_point():
    """min over (a, b), max over α: a = mean positive score, b = mean negative score,
    α = m + b − a (p the batch's positive ratio)."""
    g = torch.Generator().manual_seed(2)
    h = torch.rand(50, generator=g, dtype=torch.float64)
    y = (torch.rand(50, generator=g) < 0.3).long()
    p, m = float(y.double().mean()), 1.0
    a, b = h[y == 1].mean(), h[y == 0].mean()
    alpha = m + b - a
    ga, gb, gal = grad(
        lambda a_, b_, al_: auc_minmax_loss(h, y, a_, b_, al_, p, m).mean(), argnums=(0, 1, 2)
    )(a, b, alpha)
    for v in (ga, gb, gal):
        assert abs(float(v)) < 1e-12


def test_problem_takes_the_positive_ratio_from_the_data():
    data = binary_digits()
    problem = AUPRCProblem(AUPRCParams(), data)
    objs = problem.objectives(Linear())
    expected = float((data.y_train == 1).double().mean())
    assert objs["minimax"].p == pytest.approx(expected)  # type: ignore[attr-defined]
    assert 0.1 < expected < 0.2  # 80% of the positives removed from a balanced split
    assert problem.objective_for(("erm", "conditional"), Linear()).composition == "erm"
    assert problem.objective_for(("conditional",), Linear()).composition == "conditional"
    with pytest.raises(ConfigError, match="offers"):
        problem.objective_for(("distributed",), Linear())


def test_recipe_runs_every_method_and_logs(tmp_path):
    from lit_fedco.cli import run as main
    from lit_fedco.recipes.fcsg_auprc import COLUMNS, DEFAULTS

    seen = LastLoops()
    argv = ["rounds=2", "local_steps=2", "eval_every=2", "cohort=4", "tracking=[csv]",
            "progress=false", f"out_dir={tmp_path}", "pretrain.rounds=2"]  # fmt: skip
    rows = main("fcsg_auprc", DEFAULTS, argv, columns=COLUMNS, callbacks=[seen])
    assert [name for name, _ in rows] == ["pretrain", *DEFAULTS["updaters"]]
    assert [loop.updater.name for loop in seen.loops] == ["fedavg", *DEFAULTS["updaters"]]
    for (name, (res,)), loop in zip(rows, seen.loops, strict=True):
        # AP by scikit-learn on the final server model's scores of every held-out row
        data, model = loop.data, loop.updater.model
        with torch.no_grad():
            s = torch.func.functional_call(model, loop.server["x"], (data.x_val,)).squeeze(-1)
        y = data.y_val.numpy()
        assert 0 < y.sum() < len(y)
        expected = average_precision_score(y, s.double().numpy())
        assert res["val/ap"] == pytest.approx(expected, rel=1e-6), name  # float32 inside
        # float32 scores from batches of another size: a row at the cut may flip, no more
        acc = direct_accuracy_at_prior(s.double().numpy(), y)
        assert res["val/acc_prior"] == pytest.approx(acc, abs=1 / len(y) + 1e-12), name
    assert (the_run(tmp_path, "fcsg_auprc") / "fcsg_m-seed0" / "metrics.csv").is_file()
