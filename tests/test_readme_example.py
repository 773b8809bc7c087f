"""README.md's "Writing a new updater" example runs as written: as a script of its own, and from
any recipe by module path (``updater=my_fedprox:FedProx``), with ``--help`` listing its
hyperparameters; and it passes the project's own lint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # every test here runs a recipe in a subprocess


@pytest.fixture
def example(tmp_path) -> Path:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    block = next(b for b in blocks if "my_fedprox.py" in b)
    script = tmp_path / "my_fedprox.py"
    script.write_text(block)
    return script


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


QUICK = ["rounds=4", "eval_every=2", "seeds=[0]", "progress=false", "tracking=[none]"]


def test_the_example_passes_the_projects_lint(example):
    for check in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *check, "--config", str(REPO / "pyproject.toml"),
             str(example)], capture_output=True, text=True, cwd=example.parent,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_example_runs_as_a_script_of_its_own(example):
    out = example.parent / "out"
    proc = _run([sys.executable, str(example), "fedprox.mu=0.5", *QUICK, f"out_dir={out}"],
                example.parent)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fedprox" in proc.stdout and "fedavg" in proc.stdout
    (run_dir,) = (out / "fedprox_demo").iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["config"]["fedprox"]["mu"] == 0.5
    # μ > 0 pulls every client towards x̄, so FedProx's model differs from FedAvg's
    a, b = results["results"]["fedprox"][0], results["results"]["fedavg"][0]
    assert a["val/loss_avg"] != b["val/loss_avg"]
    proc = _run([sys.executable, str(example), "--help"], example.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: python {example} [preset=NAME]")  # no such module


def test_any_recipe_runs_the_example_by_module_path(example):
    recipe = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro"]
    both = "updaters=[my_fedprox:FedProx,fedavg]"
    proc = _run([*recipe, both, "fedprox.mu=0.7", "--help"], example.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "  fedprox.mu=0.7" in proc.stdout and "μ, the proximal weight." in proc.stdout
    out = example.parent / "out"
    proc = _run([*recipe, both, *QUICK, f"out_dir={out}", "run_name=r"], example.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "comfedl_dro" / "r" / "results.json").read_text())
    assert list(results["results"]) == ["fedprox", "fedavg"]
    assert results["config"]["plugins"] == ["my_fedprox"]
    proc = _run([*recipe, "updater=my_fedprox:FedProxy", f"out_dir={out}"], example.parent)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "lit_fedco: updater: module 'my_fedprox' has no class 'FedProxy' (its updaters: "
        "FedProx); name one of them, e.g. updater=my_fedprox:FedProx"
    ]


def test_the_example_under_a_built_in_recipes_name_runs_its_own_updater_with_jobs_2(example):
    """A script that passes one of lit_fedco's recipe names (``comfedl_dro``) is still a script
    of one's own: with ``jobs=2`` each worker runs it first, so that its FedProx is registered
    there too (the workers were told it was lit_fedco's recipe and failed: unknown updater)."""
    text = example.read_text()
    mine = text.replace('lit_fedco.main("fedprox_demo"', 'lit_fedco.main("comfedl_dro"')
    assert mine != text
    example.write_text(mine)
    out = example.parent / "out"
    proc = _run([sys.executable, str(example), *QUICK, "jobs=2", f"out_dir={out}",
                 "run_name=j"], example.parent)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 sub-runs, 2 at a time" in proc.stdout
    results = json.loads((out / "comfedl_dro" / "j" / "results.json").read_text())
    assert list(results["results"]) == ["fedprox", "fedavg"]
