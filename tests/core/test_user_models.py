"""A researcher's own model (``model.name=MODULE:NAME``): batch norms' running statistics as
model state (averaged, or kept per client with ``model.buffers=local``), train / eval modes,
dropout seeded per (seed, client, round, step), a recurrent model, the executor ``auto``
probe, and every way of naming a model wrongly (one line, exit code 2, nothing written).

Tolerances: client by client, the running statistics equal a plain PyTorch loop's bit for bit
(the same forward); vmapped, and for the parameters, they agree to 1e-6 (float32: vmapped
convolutions and ``torch.func.grad`` take kernels that sum in other orders, which differ
between AVX2 and AVX-512 CPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from lit_fedco.core.models import (
    CharLSTM,
    build_model,
    call,
    draws_randomly,
    model_state,
    running_stats,
    updated_stats,
)
from lit_fedco.core.protocol import LOCAL_STATS, RoundInfo
from lit_fedco.engine.comm import LocalComm
from lit_fedco.engine.executors import SequentialExecutor, VectorizedExecutor
from lit_fedco.engine.round import federated_round
from lit_fedco.engine.store import make_store
from lit_fedco.updaters import get_updater
from tests.helpers import REPO

MODELS = '''
"""A researcher's models, in a folder outside the repository."""
from dataclasses import dataclass

import torch
from torch import nn


class BNNet(nn.Module):
    """A small CNN with batch normalisation, on 8x8 digits given as 64 features."""

    @dataclass(frozen=True)
    class Params:
        """The model's keys.

        Attributes:
            width: channels of the convolution.
        """

        width: int = 8

    def __init__(self, input_shape, num_classes, params=None):
        super().__init__()
        w = params.width if params is not None else 8
        self.conv = nn.Conv2d(1, w, 3, padding=1)
        self.bn = nn.BatchNorm2d(w)
        self.fc = nn.Linear(w, num_classes)

    def forward(self, x):
        x = x.view(-1, 1, 8, 8)
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def dropout_mlp(input_shape, num_classes, seed):
    """A factory: an MLP with dropout."""
    n = 1
    for s in input_shape:
        n *= s
    return nn.Sequential(nn.Flatten(), nn.Linear(n, 16), nn.ReLU(), nn.Dropout(0.3),
                         nn.Linear(16, num_classes))


class Wide(nn.Module):
    """A fully connected model of one's own."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.fc(x.flatten(1))


def bn_mlp(input_shape, num_classes):
    """A factory: an MLP with a batch norm, for any input shape."""
    n = 1
    for s in input_shape:
        n *= s
    return nn.Sequential(nn.Flatten(), nn.Linear(n, 16), nn.BatchNorm1d(16), nn.ReLU(),
                         nn.Linear(16, num_classes))


def wrong_outputs(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes + 1))


def not_a_model(input_shape, num_classes):
    return 3
'''


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def _batches(n: int, steps: int, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [
        {"inner": {"x": torch.randn(n, 5, 1, 6, 6, generator=g),
                   "y": torch.randint(3, (n, 5), generator=g)}}
        for _ in range(steps)
    ]  # fmt: skip


def _comm() -> LocalComm:
    return LocalComm(torch.float32)  # sums in the parameters' dtype, as a run does


def _fedavg(model: nn.Module, lr: float = 0.1):  # type: ignore[no-untyped-def]
    cls = get_updater("fedavg")
    return cls(cls.hparams_cls(lr=lr), model)


def test_running_statistics_are_state_and_a_training_forward_leaves_them_alone():
    torch.manual_seed(0)
    model = Net()
    state = model_state(model)
    assert running_stats(model) == ("bn.running_mean", "bn.running_var")
    assert list(state)[-2:] == ["bn.running_mean", "bn.running_var"]
    before = {k: v.clone() for k, v in state.items()}
    x = torch.randn(5, 1, 6, 6)
    call(model, state, x)
    assert all(torch.equal(before[k], state[k]) for k in state)  # no tensor written
    assert torch.equal(model.bn.running_mean, torch.zeros(4))  # nor the module's own
    ref = Net()
    ref.load_state_dict(model.state_dict())
    ref(x)
    new = updated_stats(model, state, x)
    assert torch.equal(new["bn.running_mean"], ref.bn.running_mean)
    assert torch.equal(new["bn.running_var"], ref.bn.running_var)
    # without batch norms there is nothing more in the state (the built-in models)
    plain = build_model("cnn", (1, 8, 8), 10, 0, hidden=8)
    assert running_stats(plain) == () and list(model_state(plain)) == [
        n for n, _ in plain.named_parameters()
    ]


@pytest.mark.parametrize("executor", [SequentialExecutor, VectorizedExecutor])
def test_a_round_of_fedavg_with_batch_norm_is_a_plain_training_loop(executor, monkeypatch):
    """One client, I = 4 steps of FedAvg: the server's parameters and running statistics are
    those a plain PyTorch loop (SGD, the module's own batch norm) leaves. Run client by client,
    the statistics are those of the step's own forward (no forward of their own)."""
    from lit_fedco.engine import round as round_module

    forwards = []
    real = round_module.updated_stats
    monkeypatch.setattr(round_module, "updated_stats", lambda *a: forwards.append(1) or real(*a))
    torch.manual_seed(0)
    model = Net()
    upd = _fedavg(model)
    steps = _batches(1, 4)
    server = upd.init_server(upd.params(), 1)
    info = RoundInfo(0, 1, torch.arange(1), 4, 0)
    res = federated_round(upd, server, info, torch.arange(1), lambda t: steps[t], _comm(),
                          executor())  # fmt: skip
    ref = Net()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for b in steps:
        opt.zero_grad()
        nn.functional.cross_entropy(ref(b["inner"]["x"][0]), b["inner"]["y"][0]).backward()
        opt.step()
    want = ref.state_dict()
    for name, value in res.server["x"].items():
        if name in running_stats(model) and executor is SequentialExecutor:
            assert torch.equal(value, want[name]), name  # the same kernels as the plain loop
        else:  # vmapped convolutions take other kernels (AVX2 against AVX-512: other sums)
            torch.testing.assert_close(value, want[name], rtol=0, atol=1e-6)
    assert len(forwards) == (0 if executor is SequentialExecutor else 4)


def test_vectorized_and_sequential_agree_with_batch_norm_and_the_statistics_are_averaged():
    torch.manual_seed(0)
    model = Net()
    upd = _fedavg(model)
    steps = _batches(3, 2)
    server = upd.init_server(upd.params(), 3)
    info = RoundInfo(0, 3, torch.arange(3), 2, 0)
    out = [
        federated_round(upd, server, info, torch.arange(3), lambda t: steps[t], _comm(),
                        ex).server["x"]
        for ex in (SequentialExecutor(), VectorizedExecutor())
    ]  # fmt: skip
    for name in out[0]:
        torch.testing.assert_close(out[0][name], out[1][name], rtol=0, atol=1e-6)
    # the mean of the three clients' statistics, each the plain loop's
    means = []
    for k in range(3):
        ref = Net()
        ref.load_state_dict(model.state_dict())
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for b in steps:
            opt.zero_grad()
            nn.functional.cross_entropy(ref(b["inner"]["x"][k]), b["inner"]["y"][k]).backward()
            opt.step()
        means.append(ref.bn.running_var)
    torch.testing.assert_close(out[0]["bn.running_var"], torch.stack(means).mean(0))


def test_local_buffers_are_kept_per_client_and_not_averaged():
    """``model.buffers=local`` (FedBN): each client starts its round from its own statistics,
    left by its previous round, whatever the server's mean."""
    torch.manual_seed(0)
    model = Net()
    upd = _fedavg(model)
    upd.keep_running_stats_local()
    assert upd.client_state[LOCAL_STATS].name == "KEEP"
    server = upd.init_server(upd.params(), 2)
    store = make_store(upd, server, 2)
    assert torch.equal(store.rows[LOCAL_STATS]["bn.running_var"], torch.ones(2, 4))
    # client 1's data are shifted: its statistics differ from client 0's
    steps = _batches(2, 2)
    for b in steps:
        b["inner"]["x"][1] += 3.0
    info = RoundInfo(0, 2, torch.arange(2), 2, 0)
    res = federated_round(upd, server, info, torch.arange(2), lambda t: steps[t], _comm(),
                          SequentialExecutor(), store)  # fmt: skip
    own = store.rows[LOCAL_STATS]["bn.running_mean"]
    assert not torch.allclose(own[0], own[1])
    torch.testing.assert_close(res.server["x"]["bn.running_mean"], own.mean(0))
    # round 2 with client 1 alone: it starts from its own statistics, not the server's mean
    kept = own[1].clone()
    info2 = RoundInfo(1, 2, torch.tensor([1]), 1, 0)
    one = [{"inner": {k: v[1:] for k, v in steps[0]["inner"].items()}}]
    federated_round(upd, res.server, info2, torch.tensor([1]), lambda t: one[t], _comm(),
                    SequentialExecutor(), store)  # fmt: skip
    x1 = one[0]["inner"]["x"][0]
    start = {**res.server["x"], "bn.running_mean": kept,
             "bn.running_var": store.rows[LOCAL_STATS]["bn.running_var"][1]}  # fmt: skip
    # its new statistics: one update from its own kept ones (the momentum 0.1 of the mean)
    conv = nn.functional.conv2d(x1, res.server["x"]["conv.weight"], res.server["x"]["conv.bias"],
                                padding=1)  # fmt: skip
    want = 0.9 * start["bn.running_mean"] + 0.1 * conv.mean(dim=(0, 2, 3))
    torch.testing.assert_close(store.rows[LOCAL_STATS]["bn.running_mean"][1], want)
    assert torch.equal(store.rows[LOCAL_STATS]["bn.running_mean"][0], own[0])  # untouched


def test_dropout_is_seeded_per_client_round_and_step():
    """A client's dropout masks depend on (seed, client, round, step) only: client 1 trains
    the same alone as beside client 0 (so 1 and N processes agree), and rerunning gives the
    same numbers; another seed gives others."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    assert draws_randomly(model)
    upd = _fedavg(model)
    steps = _batches(2, 3)
    server = upd.init_server(upd.params(), 2)

    def run(clients: torch.Tensor, seed: int) -> dict:
        rows = [{"inner": {k: v[clients] for k, v in b["inner"].items()}} for b in steps]
        info = RoundInfo(0, 2, clients, 3, seed)
        res = federated_round(upd, server, info, clients, lambda t: rows[t], _comm(),
                              SequentialExecutor())  # fmt: skip
        return res.server["x"]

    both, again = run(torch.arange(2), 0), run(torch.arange(2), 0)
    assert all(torch.equal(both[k], again[k]) for k in both)
    alone_0, alone_1 = run(torch.tensor([0]), 0), run(torch.tensor([1]), 0)
    for k in both:  # the pair's mean is the mean of each alone
        torch.testing.assert_close(both[k], (alone_0[k] + alone_1[k]) / 2, rtol=0, atol=1e-7)
    other = run(torch.arange(2), 1)
    assert not torch.equal(other["1.weight"], both["1.weight"])


def test_char_lstm_reads_token_ids_and_does_not_vmap():
    model = build_model("char_lstm", (12,), 30, 0, hidden=16)
    assert isinstance(model, CharLSTM)
    x = torch.randint(30, (4, 12))
    out = call(model, model_state(model), x)
    assert out.shape == (4, 30)
    with pytest.raises(RuntimeError):
        state = {k: torch.stack([v, v]) for k, v in model_state(model).items()}
        torch.func.vmap(lambda p, v: call(model, p, v))(state, torch.stack([x, x]))


# ---------------------------------------------------------------------- the command line
def _cli(
    args: list[str], cwd: Path, timeout: int = 300, recipe: str = "comfedl_dro"
) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", f"lit_fedco.recipes.{recipe}", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    (tmp_path / "my_models.py").write_text(textwrap.dedent(MODELS))
    return tmp_path


BAD = [
    ("model.name=no_such_module:Net", "cannot import module 'no_such_module'"),
    ("model.name=my_models:Missing", "module 'my_models' has no 'Missing'"),
    ("model.name=my_models:wrong_outputs", "expected [2, 10]"),
    ("model.name=my_models:not_a_model", "returned a int, expected a torch.nn.Module"),
    ("model.buffers=nope", "model.buffers"),
    ("model.widht=3", "widht"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("arg", "message"), BAD)
def test_a_model_named_wrongly_is_one_line_and_nothing_is_written(lab, arg, message):
    args = [arg] if arg.startswith("model.name") else ["model.name=my_models:BNNet", arg]
    out = lab / "runs"
    res = _cli([*args, "rounds=1", "seeds=[0]", "progress=false", "tracking=[csv]",
                f"out_dir={out}"], lab)  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert not out.exists()


@pytest.mark.slow
def test_a_batch_norm_model_from_outside_runs_with_its_keys_and_local_buffers(lab):
    out = lab / "runs"
    common = [
        "model.name=my_models:BNNet",
        "model.width=4",
        "updaters=[fedavg,comfedl]",
        "rounds=2",
        "seeds=[0]",
        "progress=false",
        "tracking=[csv]",
        f"out_dir={out}",
    ]
    res = _cli([*common, "run_name=avg"], lab)
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = (out / "comfedl_dro" / "avg" / "config.yaml").read_text()
    assert "name: my_models:BNNet" in cfg and "width: 4" in cfg and "buffers: average" in cfg
    # the probe: it runs under vmap, but a convolutional model is faster client by client
    assert "executor: sequential" in cfg
    assert "executor_reason: a convolutional model runs faster client by client on the CPU" in cfg
    res = _cli([*common, "run_name=local", "model.buffers=local"], lab)
    assert res.returncode == 0, res.stderr[-3000:]
    help_text = _cli(["model.name=my_models:BNNet", "--help-all"], lab).stdout
    assert "model.width" in help_text and "channels of the convolution" in help_text


@pytest.mark.slow
def test_executor_auto_takes_the_sequential_executor_for_a_model_that_cannot_vmap(lab):
    out = lab / "runs"
    res = _cli(["model.name=my_models:dropout_mlp", "updaters=[fedavg]", "rounds=2",
                "seeds=[0]", "progress=false", "tracking=[csv]", f"out_dir={out}",
                "run_name=d"], lab)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = (out / "comfedl_dro" / "d" / "config.yaml").read_text()
    assert "executor: sequential" in cfg
    assert "executor_reason: 'it does not run under vmap: RuntimeError: vmap: called random" in cfg
    args = ["model.name=my_models:Wide", "updaters=[fedavg]", "rounds=2", "seeds=[0]"]
    res = _cli([*args, "progress=false", "tracking=[csv]", f"out_dir={out}", "run_name=w"], lab)
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = (out / "comfedl_dro" / "w" / "config.yaml").read_text()
    assert "executor: vectorized" in cfg and "executor_reason: it runs under vmap" in cfg


def test_the_example_model_module_is_importable():
    """The documented example (docs/howto/own_model.md) imports and builds."""
    sys.path.insert(0, str(REPO / "docs" / "examples"))
    try:
        from bn_cnn import BNCNN  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    model = BNCNN((3, 16, 16), 5, BNCNN.Params(width=8))
    assert running_stats(model) and model(torch.zeros(2, 3, 16, 16)).shape == (2, 5)


def _image_tree(root: Path) -> None:
    """3 classes of 12×12 grey PNGs by 4 writers (a writer's style: a brighter stripe)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 4)):
        for c in range(3):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for w in range(4):
                for i in range(n):
                    img = rng.uniform(0, 60, (12, 12))
                    img[:, c * 4 : (c + 1) * 4] += 150 + 10 * w
                    name = folder / f"writer{w}_{i:03d}.png"
                    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(name)


def _final_metrics(run: Path) -> dict[str, list[dict]]:
    import csv

    return {
        u: list(csv.DictReader((run / f"{u}-seed0" / "metrics.csv").open()))
        for u in ("fedavg", "comfedl")
    }


@pytest.mark.slow
def test_bn_cnn_on_an_image_folder_by_writer_is_the_same_run_under_jobs_devices_and_kill(
    tmp_path: Path,
):
    """The issue's end-to-end case, from a folder outside the repository: the documented BN CNN
    (docs/examples/bn_cnn.py) on an ImageFolder tree split one client per writer, through
    comfedl_dro with FedAvg and ComFedL: jobs=2, devices=2, and a kill -9 then resume=auto
    give the metrics of the plain run, row for row; model.buffers=local runs too."""
    (tmp_path / "bn_cnn.py").write_text((REPO / "docs" / "examples" / "bn_cnn.py").read_text())
    _image_tree(tmp_path / "tree")
    out = tmp_path / "runs"
    common = [
        "model.name=bn_cnn:BNCNN", "model.width=4", "data.name=imagefolder",
        f"data.data_dir={tmp_path / 'tree'}", "data.partition=natural", "data.num_clients=4",
        "cohort=4", "data.val_mode=own", "updaters=[fedavg,comfedl]", "rounds=12",
        "checkpoint_every=1", "seeds=[0]", "progress=false", "tracking=[csv]", f"out_dir={out}",
    ]  # fmt: skip
    runs = out / "comfedl_dro"
    for extra in (["run_name=plain"], ["run_name=jobs", "jobs=2"], ["run_name=dev", "devices=2"]):
        res = _cli([*common, *extra], tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
    plain = _final_metrics(runs / "plain")
    assert _final_metrics(runs / "jobs") == plain
    dev = _final_metrics(runs / "dev")  # 2 processes: the same up to summation order
    for u, rows in plain.items():
        for a, b in zip(rows, dev[u], strict=True):
            for key in ("val/acc_avg", "train/loss"):
                if a.get(key):
                    assert abs(float(a[key]) - float(b[key])) < 1e-5, (u, key, a[key], b[key])
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", *common, "run_name=killed"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    ckpts = runs / "killed" / "fedavg-seed0" / "checkpoints"
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(ckpts.glob("*.ckpt"))) < 3:
        time.sleep(0.05)
    proc.kill()  # SIGKILL
    proc.wait()
    assert len(list(ckpts.glob("*.ckpt"))) >= 1
    res = _cli([*common, "run_name=killed", "resume=auto"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _final_metrics(runs / "killed") == plain
    res = _cli([*common, "run_name=local", "model.buffers=local"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "buffers: local" in (runs / "local" / "config.yaml").read_text()


def test_an_in_place_step_whose_forward_is_elsewhere_falls_back_to_a_forward_of_its_own():
    """FedAvg's in-place step on an objective that feeds the model something other than the
    minibatch's inputs (a few-shot problem's tasks, here x + 1): the statistics come from a
    forward of their own at the step's starting point, as the vectorized executor computes
    them."""
    from lit_fedco.objectives import Objective

    class Shifted(Objective):
        def predict(self, params, x):  # type: ignore[no-untyped-def]
            return call(self.model, params, x + 1.0)

    torch.manual_seed(0)
    model = Net()
    cls = get_updater("fedavg")
    steps = _batches(2, 3)
    out = []
    for ex in (SequentialExecutor(), VectorizedExecutor()):
        upd = cls(cls.hparams_cls(lr=0.1), model, Shifted(model))
        assert upd.inplace()
        server = upd.init_server(upd.params(), 2)
        info = RoundInfo(0, 2, torch.arange(2), 3, 0)
        res = federated_round(upd, server, info, torch.arange(2), lambda t: steps[t], _comm(), ex)
        out.append(res.server["x"])
    for name in out[0]:
        torch.testing.assert_close(out[0][name], out[1][name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["fedadam", "fedavgm"])
def test_a_server_optimizer_steps_the_parameters_and_averages_the_statistics(name):
    """FedAdam / FedAvgM on a batch-norm model: their server step moves the parameters only;
    the running statistics are the clients' mean, the same as FedAvg's (an Adam step on a
    variance could make it negative)."""
    from lit_fedco.core.server_opt import ServerOptimizer

    torch.manual_seed(0)
    model = Net()
    steps = _batches(2, 2)
    info = RoundInfo(0, 2, torch.arange(2), 2, 0)
    out = {}
    for upd_name in ("fedavg", name):
        cls = get_updater(upd_name)
        upd = cls(cls.hparams_cls(lr=0.1), model)
        server = upd.init_server(upd.params(), 2)
        cfg = upd.server_opt_config()
        opt = ServerOptimizer(cfg) if cfg is not None else None
        res = federated_round(upd, server, info, torch.arange(2), lambda t: steps[t], _comm(),
                              SequentialExecutor(), server_opt=opt)  # fmt: skip
        out[upd_name] = res.server["x"]
    for stat in running_stats(model):
        assert torch.equal(out[name][stat], out["fedavg"][stat])
    if name == "fedadam":  # FedAvgM's first step, from zero momentum, is FedAvg's
        assert not torch.equal(out[name]["conv.weight"], out["fedavg"]["conv.weight"])
    assert list(out[name]) == list(out["fedavg"])  # parameters, then the statistics


def test_the_server_takes_the_clients_mean_statistics_whatever_its_update():
    """q-FedAvg uploads Δ and h, not the model, and its server step is no mean: the server's
    statistics are still the clients' mean (FedAvg's, whose clients train alike), and the
    statistics do not count in the norm of the model's change (h)."""
    torch.manual_seed(0)
    model = Net()
    steps = _batches(2, 3)
    info = RoundInfo(0, 2, torch.arange(2), 3, 0)
    out = {}
    for name in ("fedavg", "qfedavg"):
        cls = get_updater(name)
        upd = cls(cls.hparams_cls(lr=0.1), model)
        server = upd.init_server(upd.params(), 2)
        res = federated_round(upd, server, info, torch.arange(2), lambda t: steps[t], _comm(),
                              SequentialExecutor())  # fmt: skip
        out[name] = res.server["x"]
    for stat in running_stats(model):
        torch.testing.assert_close(out["qfedavg"][stat], out["fedavg"][stat], rtol=0, atol=1e-7)
    cls = get_updater("qfedavg")
    upd = cls(cls.hparams_cls(lr=0.1, q=1.0), model)
    start = upd.init_server(upd.params(), 1)["x"]
    moved = {k: v + (10.0 if k in running_stats(model) else 0.1) for k, v in start.items()}
    f = torch.tensor(2.0)
    end = upd.client_end({"x": moved, "F": f}, {"x": start}, {}, torch.tensor(1.0))
    n_params = sum(v.numel() for k, v in start.items() if k not in running_stats(model))
    torch.testing.assert_close(end["h"], 10.0 * f + 1.0 * n_params * 1.0**2 * 100 * 0.01)


@pytest.mark.slow
def test_models_the_run_cannot_train_are_refused_before_anything_is_written(lab):
    cases = [
        (["model.name=my_models:bn_mlp", "updaters=[gcivr]"], "gcivr cannot train"),
        (["model.name=my_models:dropout_mlp", "executor=vectorized"], "draws random numbers"),
    ]  # fmt: skip
    (lab / "more_models.py").write_text(
        "from dataclasses import dataclass\nfrom torch import nn\n\n\n"
        "class NoDefault(nn.Module):\n"
        "    @dataclass(frozen=True)\n    class Params:\n        width: int\n\n"
        "    def __init__(self, input_shape, num_classes, params=None):\n"
        "        super().__init__()\n        self.fc = nn.Linear(64, num_classes)\n\n"
        "class Clash(NoDefault):\n"
        "    @dataclass(frozen=True)\n    class Params:\n        hidden: int = 3\n"
    )
    cases += [
        (["model.name=more_models:NoDefault"], "Params.width has no default"),
        (["model.name=more_models:Clash"], "clashes with lit_fedco's own key model.hidden"),
    ]
    for args, message in cases:
        out = lab / "runs"
        recipe = "feddro_fairness" if "gcivr" in str(args) else "comfedl_dro"
        res = _cli([*args, "rounds=1", "seeds=[0]", "progress=false", "tracking=[csv]",
                    f"out_dir={out}"], lab, recipe=recipe)  # fmt: skip
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and message in lines[0], res.stderr[-2000:]
        assert not out.exists()


@pytest.mark.slow
def test_a_batch_norm_model_under_maml_runs_sequentially_and_the_reason_is_recorded(lab):
    out = lab / "runs"
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(lab)}
    res = subprocess.run(
        [sys.executable, "-m", "lit_fedco.recipes.comfedl_maml", "model.name=my_models:BNNet",
         "updaters=[comfedl_maml]", "rounds=1", "seeds=[0]", "progress=false",
         "tracking=[csv]", f"out_dir={out}", "run_name=m"],
        cwd=lab, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = (out / "comfedl_maml" / "m" / "config.yaml").read_text()
    assert "executor: sequential" in cfg
    assert "executor_reason: comfedl_maml differentiates through batch norms" in cfg
