"""lit_fedco installed, not only checked out: a wheel of the project, installed (``--no-deps``,
non-editable) into a folder of its own on top of this environment, runs from outside the source
tree — presets found through ``importlib.resources``, ``--help preset=NAME``, a 1-round preset
run — and runs a researcher's own module, written only against ``lit_fedco``'s exports, through
a recipe with ``updater=module:Class``."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

from tests.helpers import REPO

PACKAGE = REPO / "lit_fedco"

USER_MODULE = '''
"""my_methods.py: two federated methods of my own, on lit_fedco's public names only."""

from dataclasses import dataclass

import torch
from torch.func import grad_and_value

import lit_fedco
from lit_fedco import CompositionalUpdater, Hparams, Sync, register, tree_map


class MyScaffold(CompositionalUpdater[Hparams]):
    """SCAFFOLD (Karimireddy et al. 2020), option II: local steps corrected by c - c_i."""

    client_state = {"x": Sync.ROUND, "c_i": Sync.KEEP, "dc": Sync.ROUND}
    broadcast_keys = ("x", "c")

    def init_server(self, params, num_clients):
        return {"x": dict(params), "c": tree_map(torch.zeros_like, params)}

    def client_step(self, state, batches, ctx, step):
        g, loss = grad_and_value(lambda p: self.objective.value(p, batches, ctx))(state["x"])
        lr = self.hparams.lr
        x = tree_map(lambda y, gi, ci, c: y - lr * (gi - ci + c),
                     state["x"], g, state["c_i"], state["c"])
        return {**state, "x": x}, {"loss": loss}

    def client_end(self, state, start, ctx, steps):
        scale = 1.0 / (steps * self.hparams.lr)
        c_new = tree_map(lambda ci, c, x, y: ci - c + (x - y) * scale,
                         state["c_i"], state["c"], start["x"], state["x"])
        return {"x": state["x"], "c_i": c_new, "dc": tree_map(torch.sub, c_new, state["c_i"])}

    def server_update(self, server, mean, ctx, info):
        share = info.participants / info.num_clients
        c = tree_map(lambda c, d: c + share * d, server["c"], mean["dc"])
        return {**server, "x": mean["x"], "c": c}


@dataclass(frozen=True)
class MyAdamHparams(Hparams):
    """FedAdam.

    Attributes:
        server_lr: eta, the server step size.
        beta1: the first-moment weight.
        beta2: the second-moment weight.
        tau: the adaptivity.
    """

    server_lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3


@register("my_fedadam")
class MyFedAdam(CompositionalUpdater[MyAdamHparams]):
    """FedAdam (Reddi et al. 2021, Algorithm 2), written by hand."""

    def init_server(self, params, num_clients):
        zeros = tree_map(torch.zeros_like, params)
        v = tree_map(lambda z: z + self.hparams.tau**2, zeros)
        return {"x": dict(params), "m": zeros, "v": v}

    def client_step(self, state, batches, ctx, step):
        g, loss = grad_and_value(lambda p: self.objective.value(p, batches, ctx))(state["x"])
        return {"x": lit_fedco.tree_axpy(-self.hparams.lr, g, state["x"])}, {"loss": loss}

    def server_update(self, server, mean, ctx, info):
        hp = self.hparams
        d = lit_fedco.tree_sub(mean["x"], server["x"])
        m = tree_map(lambda m, d: hp.beta1 * m + (1 - hp.beta1) * d, server["m"], d)
        v = tree_map(lambda v, d: hp.beta2 * v + (1 - hp.beta2) * d * d, server["v"], d)
        x = tree_map(lambda x, m, v: x + hp.server_lr * m / (v.sqrt() + hp.tau), server["x"], m, v)
        return {"x": x, "m": m, "v": v}
'''

pytestmark = pytest.mark.slow  # builds a wheel and runs recipes in subprocesses


def test_pyproject_lists_every_package():
    """``[tool.setuptools] packages`` (explicit, for the presets' package-dir) names every
    folder of lit_fedco that is a package, and the presets."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])  # fmt: skip
    found = {
        ".".join(p.parent.relative_to(REPO).parts)
        for p in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert listed == found | {"lit_fedco.presets"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A wheel of the project installed into a folder of its own (``pip --target``)."""
    root = tmp_path_factory.mktemp("installed")
    wheels, site = root / "wheels", root / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(REPO)], check=True, timeout=300, capture_output=True)  # fmt: skip
    (wheel,) = wheels.glob("lit_fedco-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, timeout=300, capture_output=True)  # fmt: skip
    return site


def outside(site: Path, cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd`` (outside the repository) with the installed copy first on the
    path; offline W&B."""
    env = {**os.environ, "PYTHONPATH": str(site), "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_the_installed_package_is_the_wheel_and_ships_its_presets(installed, tmp_path):
    code = (
        "import lit_fedco, importlib.resources as r\n"
        "from lit_fedco.config.parser import preset_dir, presets\n"
        "print(lit_fedco.__file__)\nprint(preset_dir())\n"
        "print(sorted(p.name for p in r.files('lit_fedco.presets').iterdir()"
        " if p.name.endswith('.yaml')))\n"
        "print(len(presets('feddro_fairness')))\n"
    )
    proc = outside(installed, tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, presets_at, names, count = proc.stdout.splitlines()
    assert where.startswith(str(installed)) and presets_at.startswith(str(installed))
    shipped = sorted(p.name for p in (REPO / "recipes").glob("*.yaml"))
    assert json.loads(names.replace("'", '"')) == shipped and int(count) == 2
    assert not (installed / "lit_fedco" / "presets" / "gallery").exists()  # only the YAML


def test_help_and_a_one_round_preset_run_from_an_installed_wheel(installed, tmp_path):
    recipe = "lit_fedco.recipes.feddro_fairness"
    proc = outside(installed, tmp_path, "-m", recipe, "--help", "preset=feddro_fairness_fig2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "  rounds=1500" in proc.stdout and "feddro_fairness_fig2" in proc.stdout
    proc = outside(installed, tmp_path, "-m", recipe, "preset=feddro_fairness_fig2", "rounds=1",
                   "seeds=[0]", "updater=fedavg", "progress=false", "tracking=[csv]",
                   "run_name=one", "out_dir=out")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(
        (tmp_path / "out" / "feddro_fairness" / "one" / "results.json").read_text()
    )
    assert results["config"]["rounds"] == 1 and results["config"]["eval_every"] == 20
    assert len(results["results"]["fedavg"]) == 1


def _code_lines(source: str, node: ast.AST) -> int:
    """Lines of code in ``node``: neither blank nor part of a docstring."""
    lines = source.splitlines()[node.lineno - 1 : node.end_lineno]
    doc = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.ClassDef | ast.FunctionDef) and ast.get_docstring(sub):
            first = sub.body[0]
            doc |= set(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i, line in enumerate(lines, node.lineno) if line.strip() and i not in doc)


def test_a_module_of_ones_own_runs_through_a_recipe_from_an_installed_wheel(installed, tmp_path):
    """SCAFFOLD-like and FedAdam-like updaters in ``my_methods.py`` outside the repository
    (each ≤ 40 lines of code, importing nothing of lit_fedco but its top-level names) run
    through ``comfedl_dro`` with ``updater=my_methods:Class``, and ``--help`` shows their
    hyperparameters."""
    source = textwrap.dedent(USER_MODULE)
    (tmp_path / "my_methods.py").write_text(source)
    tree = ast.parse(source)
    for node in ast.walk(tree):  # only the package's own exports
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lit_fedco"):
            assert node.module == "lit_fedco"
        if isinstance(node, ast.Import):
            assert all(not a.name.startswith("lit_fedco.") for a in node.names)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    assert _code_lines(source, classes["MyScaffold"]) <= 40
    assert (
        _code_lines(source, classes["MyFedAdam"]) + _code_lines(source, classes["MyAdamHparams"])
        <= 40
    )

    recipe = "lit_fedco.recipes.comfedl_dro"
    both = "updaters=[my_methods:MyScaffold,my_methods:MyFedAdam]"
    proc = outside(installed, tmp_path, "-m", recipe, both, "my_fedadam.server_lr=0.02", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("  my_scaffold.lr=", "  my_fedadam.server_lr=0.02", "  my_fedadam.tau=0.001"):
        assert row in proc.stdout, row
    assert "eta, the server step size." in proc.stdout
    assert "SCAFFOLD (Karimireddy et al. 2020), option II" in proc.stdout

    args = [both, "rounds=4", "seeds=[0]", "eval_every=2", "progress=false", "tracking=[csv]",
            "out_dir=out", "run_name=mine"]  # fmt: skip
    proc = outside(installed, tmp_path, "-m", recipe, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "out" / "comfedl_dro" / "mine"
    results = json.loads((run / "results.json").read_text())
    assert list(results["results"]) == ["my_scaffold", "my_fedadam"]
    assert results["config"]["plugins"] == ["my_methods"]
    for rows in results["results"].values():
        assert 0.1 < rows[0]["val/acc_avg"] <= 1.0
    assert "my_scaffold" in proc.stdout and "my_fedadam" in proc.stdout
    # resume finds the same classes again from the config's names
    proc = outside(installed, tmp_path, "-m", recipe, *args, "resume=auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "already complete" in proc.stdout + proc.stderr
