"""Small shared builders for the tests (tiny real data, no files from ../shared)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from lightning.fabric import Fabric

from lit_fedco.core.models import build_model
from lit_fedco.data import FederatedData, make_federated
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.loop import FederatedLoop, LoopConfig
from lit_fedco.problems import Classification, get_problem
from lit_fedco.updaters import get_updater

REPO = Path(__file__).resolve().parent.parent


def digits_data(num_clients: int = 6, seed: int = 0, **kw) -> FederatedData:
    """Real digits, quantity- and label-imbalanced, small."""
    cfg = dict(
        name="digits",
        data_dir="",
        partition="quantity",
        num_clients=num_clients,
        big=200,
        small=20,
        small_classes=2,
        alpha=0.5,
        rho=0.28,
        val_per_client=30,
        seed=seed,
    )
    cfg.update(kw)
    return make_federated(SimpleNamespace(**cfg))


def make_updater(name: str, hparams: dict | None, net, data, problem: dict | None = None):
    """Updater ``name`` on its default problem (``problem``: that problem's parameters, e.g.
    ``{"gamma": 0.2}`` for ComFedL's ``client_dro``), as the runner builds it; and the problem."""
    cls = get_updater(name)
    prob_cls = get_problem(cls.default_problem) if cls.default_problem else Classification
    prob = prob_cls(prob_cls.params_cls(**(problem or {})), data)
    updater = cls(
        cls.hparams_cls(**(hparams or {})), net, prob.objective_for(cls.compositions, net)
    )
    return updater, prob


def make_loop(
    name: str = "comfedl",
    hparams: dict | None = None,
    executor: str = "vectorized",
    dtype: torch.dtype = torch.float64,
    fabric: Fabric | None = None,
    data: FederatedData | None = None,
    model: str = "logreg",
    problem: dict | None = None,
    **loop_kw,
) -> FederatedLoop:
    """A FederatedLoop on small digits data with a fresh 1-process CPU Fabric; the updater on
    its default problem with parameters ``problem``."""
    fabric = fabric or Fabric(accelerator="cpu", devices=1)
    data = data or digits_data()
    net = build_model(model, tuple(data.x_train.shape[1:]), data.num_classes, seed=0, hidden=16)
    updater, prob = make_updater(name, hparams, net, data, problem)
    cfg = dict(rounds=3, local_steps=3, cohort=4, batch_size=8, eval_every=1, progress=False)
    cfg.update(loop_kw)
    return FederatedLoop(
        fabric, updater, data, LoopConfig(**cfg), make_executor(executor), dtype, prob
    )


def flat_server(loop: FederatedLoop) -> np.ndarray:
    """The server state as one float64 numpy vector."""
    from lit_fedco.core.state import flatten

    return flatten(loop.server)[0].double().cpu().numpy()


EXECUTOR_TOL = 1e-10  # float64; the executors differ only in the order of batched sums


def assert_executors_agree(name: str, hparams: dict, **kw) -> None:  # kw: make_loop's
    """The shared parity check: the same run under the vectorized and the sequential executor
    ends with the same server state (rtol/atol 1e-10, float64) and the same logs (rel 1e-9)."""
    import pytest

    results = {}
    for ex in ("vectorized", "sequential"):
        loop = make_loop(name, hparams, executor=ex, **{"model": "mlp", **kw})
        loop.run()
        results[ex] = (flat_server(loop), loop.history[-1])
    np.testing.assert_allclose(
        results["vectorized"][0], results["sequential"][0], rtol=EXECUTOR_TOL, atol=EXECUTOR_TOL
    )
    for key, v in results["vectorized"][1].items():
        assert v == pytest.approx(results["sequential"][1][key], rel=1e-9, abs=1e-12), key


class LastLoops:
    """A loop callback (``callbacks=[...]`` of the runner's ``main`` or of a Fabric) keeping
    every run's :class:`FederatedLoop`, in order, as it is after its last evaluation; the
    runner's last evaluation is the end of the run, so the state is the one the results
    were computed from."""

    def __init__(self) -> None:
        self.loops: list[FederatedLoop] = []

    def on_eval_end(self, loop: FederatedLoop, metrics: dict[str, float]) -> None:
        if not self.loops or self.loops[-1] is not loop:
            self.loops.append(loop)


def free_port() -> int:
    """A free TCP port on the loopback interface (parallel test runs do not collide)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def the_run(out: Path, recipe: str) -> Path:
    """The one run folder a test's recipe run wrote under ``out`` (``out/recipe/<run>/``)."""
    (run,) = [p for p in (out / recipe).iterdir() if p.is_dir()]
    return run


def final_checkpoint(sub_dir: Path) -> dict:
    """The newest checkpoint of a sub-run folder (``<run>/<updater>-seed<s>/``), verified."""
    from lit_fedco.experiment import checkpoint

    return checkpoint.load(checkpoint.listing(sub_dir / "checkpoints")[-1])


def run_recipe(recipe: str, out: Path, devices: int, *args: str) -> tuple[dict, str]:
    """``python -m lit_fedco.recipes.RECIPE devices=N out_dir=OUT ARGS`` in a subprocess (Fabric
    starts the other processes: gloo on CPU), without tracking or progress bars; returns the
    results JSON it wrote (in its run folder) and its standard output."""
    cmd = [
        sys.executable, "-m", f"lit_fedco.recipes.{recipe}", f"devices={devices}",
        "tracking=[none]", "progress=false", f"out_dir={out}", *args,
    ]  # fmt: skip
    env = {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_MODE": "disabled"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((the_run(out, recipe) / "results.json").read_text()), proc.stdout


def run_module(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` from the repository root in a subprocess, on a free
    ``MASTER_PORT`` (Fabric starts any further processes itself: gloo on CPU), without
    tracking; fails the test on a non-zero exit, with the end of its standard error."""
    env = {
        **os.environ,
        "MASTER_PORT": str(free_port()),
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def override(base: list[str] | tuple[str, ...], extra: list[str] | tuple[str, ...]) -> list[str]:
    """``base`` command-line items without those whose key ``extra`` gives, then ``extra`` as it
    is (a key given twice is refused by the command line itself; ``updater=`` counts as
    ``updaters=``)."""

    def key(item: str) -> str:
        k = item.partition("=")[0].lstrip("-")
        return "updaters" if k == "updater" else k

    given = {key(item) for item in extra}
    return [item for item in base if key(item) not in given] + list(extra)
