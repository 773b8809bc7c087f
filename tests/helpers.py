"""Small shared builders for the tests (tiny real data, no files from ../shared)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from lit_fedco.engine.loop import FederatedLoop

# the tiny digits run every test builds on is the plug-in contract's (lit_fedco.testing)
from lit_fedco.testing import digits_data as digits_data
from lit_fedco.testing import digits_loop as make_loop
from lit_fedco.testing import make_updater as make_updater

REPO = Path(__file__).resolve().parent.parent


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
    from lit_fedco.store import checkpoint

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
