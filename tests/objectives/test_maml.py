"""MAML with task sampling (FCSG §5.2): the exact second-order meta-gradient against finite
differences (float64, smooth models), first-order MAML, task sampling, task data, Omniglot."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.func import functional_call, grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.data import TaskSampler
from lit_fedco.data.build import make_task_data
from lit_fedco.data.omniglot import load_omniglot
from lit_fedco.objectives.base import model_params
from lit_fedco.objectives.maml import MAML, adapt, maml_loss

N, K, Q, T = 3, 2, 2, 2  # ways, shots, queries, tasks


class SmoothBN(nn.Module):
    """conv → batch norm on batch statistics → tanh → linear: smooth, so central differences
    agree with the exact gradient (ReLU kinks would not)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4, track_running_stats=False)
        self.fc = nn.Linear(4, N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.bn(self.conv(x))).mean(dim=(2, 3)))


class TanhMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 8), nn.Linear(8, N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


def task_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(T * N * (K + Q), 1, 4, 4, generator=g, dtype=torch.float64)}


def flat_fd(f, params, h=1e-6):
    """Central differences of f along every coordinate of every parameter."""
    out = {}
    for key, p in params.items():
        g = torch.zeros_like(p).view(-1)
        for i in range(p.numel()):
            e = torch.zeros_like(p).view(-1)
            e[i] = h
            e = e.view(p.shape)
            g[i] = (f({**params, key: p + e}) - f({**params, key: p - e})) / (2 * h)
        out[key] = g.view(p.shape)
    return out


@pytest.mark.parametrize("net", [TanhMLP, SmoothBN])
@pytest.mark.parametrize("steps", [1, 2])
def test_second_order_meta_gradient_matches_finite_differences(net, steps):
    torch.manual_seed(0)
    model = net().double()
    obj = MAML(model, N, K, Q, inner_lr=0.5, inner_steps=steps)
    params = model_params(model)
    batch = task_batch()

    def f(p):
        return obj.value(p, {"inner": batch}, {})

    exact = grad(f)(params)
    fd = flat_fd(f, params)
    for key in params:
        torch.testing.assert_close(exact[key], fd[key], rtol=1e-6, atol=1e-8)


def test_value_is_outer_of_inner_and_first_order_drops_the_hessian():
    torch.manual_seed(1)
    model = TanhMLP().double()
    params = model_params(model)
    batch = task_batch(1)
    obj = MAML(model, N, K, Q, inner_lr=0.5, inner_steps=1)
    inner = obj.inner(params, batch, {})
    torch.testing.assert_close(obj.value(params, {"inner": batch}, {}), obj.outer(inner, batch, {}))
    # first order: the gradient is mean_i ∇L(y_i; Q_i) at the adapted parameters y_i
    fo = MAML(model, N, K, Q, 0.5, 1, first_order=True)
    g_fo = grad(lambda p: fo.value(p, {"inner": batch}, {}))(params)
    sx, sy, qx, qy = fo.split(batch)
    expected = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in range(T):
        y_i = adapt(fo.task_loss, params, sx[i], sy, 0.5)
        g_i = grad(fo.task_loss)(y_i, qx[i], qy)
        expected = {k: expected[k] + g_i[k] / T for k in params}
    torch.testing.assert_close(g_fo, expected, rtol=1e-12, atol=1e-14)
    g_so = grad(lambda p: obj.value(p, {"inner": batch}, {}))(params)
    gap = sum(float((g_so[k] - g_fo[k]).norm()) for k in params)
    assert gap > 1e-4  # the Hessian term matters


def test_maml_loss_adapts_on_the_support_set():
    model = TanhMLP().double()
    params = model_params(model)
    x = torch.randn(6, 16, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2])

    def loss(p, a, b):
        return torch.nn.functional.cross_entropy(functional_call(model, p, (a,)), b)

    after = maml_loss(loss, params, (x, y), (x, y), lr=0.5, steps=3)
    assert float(after) < float(loss(params, x, y))
    # three plain gradient steps of size 0.5 on the support set, by torch.autograd
    p = {k: v.clone() for k, v in params.items()}
    for _ in range(3):
        leaves = {k: v.requires_grad_(True) for k, v in p.items()}
        grads = torch.autograd.grad(loss(leaves, x, y), list(leaves.values()))
        p = {k: (v - 0.5 * g).detach() for (k, v), g in zip(leaves.items(), grads, strict=True)}
    assert float(after) == pytest.approx(float(loss(p, x, y)), rel=1e-12)


def digits_tasks(**kw):
    spec = dict(
        name="digits", data_dir="", partition="classes", num_clients=8, rotations=4,
        classes_per_client=6, heldout_classes=3, seed=0,
    )  # fmt: skip
    spec.update(kw)
    return make_task_data(SimpleNamespace(**spec))


def test_task_data_keeps_training_and_held_out_classes_apart():
    data = digits_tasks()
    assert data.num_clients == 8
    train_classes = set(data.y_train.tolist())
    val_classes = set(data.y_val.tolist())
    assert len(train_classes) == 28 and len(val_classes) == 12  # 7 and 3 digits, 4 rotations
    assert not train_classes & val_classes
    for k in range(8):
        _, y = data.client_slice(k)
        assert len(set(y.tolist())) == 6
    # every image of a class goes to exactly one client
    assert len(data.y_train) == 1797 * 4 * 7 // 10 or len(set(data.y_train.tolist())) == 28


def test_task_sampler_draws_n_way_tasks_from_the_clients_own_classes():
    data = digits_tasks()
    sampler = TaskSampler(data, seed=0, ways=5, per_class=3)
    idx = sampler.sample_round(torch.tensor([1, 4]), 7, steps=2, roles=("inner",), batch_size=3)
    assert idx.shape == (2, 1, 2, 3 * 5 * 3)
    for c, k in enumerate((1, 4)):
        lo, hi = int(data.train_offsets[k]), int(data.train_offsets[k + 1])
        rows = idx[:, 0, c]
        assert bool(((rows >= lo) & (rows < hi)).all())
        tasks = data.y_train[rows].view(2, 3, 5, 3)  # steps, tasks, ways, per class
        assert bool((tasks == tasks[..., :1]).all())  # one class per block
        for s in range(2):
            for t in range(3):
                assert len(set(tasks[s, t, :, 0].tolist())) == 5  # 5 distinct classes
                assert len(set(rows.view(2, 3, 15)[s, t].tolist())) == 15  # distinct images
    with pytest.raises(ConfigError, match="ways"):
        TaskSampler(data, seed=0, ways=7, per_class=3)


def write_tiny_omniglot(root: Path, chars: int = 3, drawers: int = 4) -> None:
    """Omniglot's folder layout with ``chars`` characters per set, 105×105 PNGs."""
    rng = np.random.default_rng(0)
    for folder in ("images_background", "images_evaluation"):
        for c in range(chars):
            d = root / "omniglot-py" / folder / "Alphabet_X" / f"character{c + 1:02d}"
            d.mkdir(parents=True)
            for i in range(drawers):
                img = (rng.random((105, 105)) > 0.5).astype(np.uint8) * 255
                Image.fromarray(img, mode="L").save(d / f"{c:04d}_{i:02d}.png")


def resized_pngs(folder: Path) -> np.ndarray:
    """The folder's PNGs as MAML's Omniglot reads them: 28×28 (Lanczos), ink = 1, in [0, 1]."""
    out = []
    for png in sorted(folder.glob("*.png")):
        small = Image.open(png).convert("L").resize((28, 28), Image.Resampling.LANCZOS)
        out.append(1.0 - np.asarray(small, dtype=np.float32) / 255.0)
    return np.stack(out)


def same_images(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the stacks a and b hold the same images, in any order."""
    return len(a) == len(b) and all(any(np.allclose(u, v, atol=1e-6) for v in b) for u in a)


def test_omniglot_is_read_from_a_local_folder(tmp_path):
    write_tiny_omniglot(tmp_path)
    x, y = load_omniglot(tmp_path)
    assert x.shape == (24, 1, 28, 28) and x.dtype == torch.float32
    assert y.tolist() == [c for c in range(6) for _ in range(4)]
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    # each character's images are one folder's PNGs resized to 28×28 (Lanczos) with ink = 1;
    # torchvision lists characters and images in directory order, so match them as sets
    for split, labels in (("images_background", range(3)), ("images_evaluation", range(3, 6))):
        chars = sorted((tmp_path / "omniglot-py" / split / "Alphabet_X").iterdir())
        want = [resized_pngs(d) for d in chars]
        matched = [[i for i, w in enumerate(want) if same_images(x[y == c, 0].numpy(), w)]
                   for c in labels]  # fmt: skip
        assert sorted(map(tuple, matched)) == [(0,), (1,), (2,)], matched  # a folder per label
    with pytest.raises(ConfigError, match="omniglot-py"):
        load_omniglot(tmp_path / "missing")


def test_omniglot_task_data_splits_characters(tmp_path):
    from lit_fedco.data.omniglot import omniglot_split

    assert omniglot_split(1623) == (1028, 172, 423)
    write_tiny_omniglot(tmp_path, chars=10, drawers=4)  # 20 characters: 13 / 2 / 5
    data = digits_tasks(
        name="omniglot", data_dir=str(tmp_path), num_clients=2, rotations=2, classes_per_client=0
    )
    assert len(set(data.y_train.tolist())) == 26 and len(set(data.y_val.tolist())) == 10
    assert not set(data.y_train.tolist()) & set(data.y_val.tolist())
    assert data.x_train.shape[1:] == (1, 28, 28)


@pytest.mark.slow
def test_recipe_runs_every_method_above_chance(tmp_path):
    """Every updater, FedAvg included, is evaluated after the same adaptation steps."""
    from lit_fedco.cli import run as main
    from lit_fedco.recipes.fcsg_maml import COLUMNS, DEFAULTS

    argv = [
        "rounds=1", "local_steps=2", "eval_every=1", "cohort=2", "batch_size=1",
        "maml.eval_tasks=2", "tracking=[none]", "progress=false", f"out_dir={tmp_path}",
    ]  # fmt: skip
    rows = main("fcsg_maml", DEFAULTS, argv, columns=COLUMNS)
    assert [name for name, _ in rows] == DEFAULTS["updaters"]
    for _, (res,) in rows:
        assert res["val/acc_avg"] > 1 / 5 + 0.1  # 5-way: chance is 0.2


@pytest.mark.parametrize("name", ["fcsg_m", "local_scgdm"])
def test_vectorized_equals_sequential_on_maml(name):
    """Second-order meta-gradients with batch-statistics BN under vmap over clients."""
    from lightning.fabric import Fabric

    from lit_fedco.config.load import load_config
    from lit_fedco.engine.executors import make_executor
    from lit_fedco.engine.loop import FederatedLoop
    from lit_fedco.experiment.assemble import build_data, build_updater, loop_config
    from lit_fedco.recipes.fcsg_maml import DEFAULTS
    from tests.helpers import flat_server

    cfg = load_config(
        ["rounds=2", "local_steps=2", "cohort=3", "batch_size=1", "maml.eval_tasks=1",
         "model.hidden=4", "progress=false", "maml.queries=2", f"updater={name}"],
        DEFAULTS,
    )  # fmt: skip
    data = build_data(cfg, 0)
    servers = []
    for ex in ("vectorized", "sequential"):
        upd, problem = build_updater(cfg, name, data, 0)
        loop = FederatedLoop(
            Fabric(accelerator="cpu", devices=1), upd, data, loop_config(cfg, 0),
            make_executor(ex), torch.float64, problem,
        )  # fmt: skip
        loop.run_round()
        servers.append(flat_server(loop))
    np.testing.assert_allclose(servers[0], servers[1], rtol=1e-9, atol=1e-11)
