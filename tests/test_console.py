"""The ``lit-fedco`` console script (``[project.scripts]``): its help lists its commands, it
lists the recipes and their presets, redraws a finished run's figures and runs the benchmarks;
its help and listing do not import torch. Each test runs the installed command in a
subprocess."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_fedco.console import recipes
from tests.helpers import REPO, run_recipe, the_run

SCRIPT = Path(sys.executable).with_name("lit-fedco")


def lit_fedco(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)  # fmt: skip


def test_the_script_is_installed_and_named_in_pyproject():
    assert SCRIPT.is_file(), "pip install -e . installs the lit-fedco script next to python"
    assert 'lit-fedco = "lit_fedco.console:main"' in (REPO / "pyproject.toml").read_text()


def test_help_lists_the_commands_fast():
    start = time.perf_counter()
    proc = lit_fedco("--help")
    took = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: lit-fedco")
    for command in ("recipes", "plot", "bench"):
        assert f"    {command} " in proc.stdout, command
    assert took < 5  # no torch: 0.07 s measured on the 2-core machine
    assert (
        lit_fedco("--version").stdout.strip() == f"lit_fedco {__import__('lit_fedco').__version__}"
    )


def test_help_and_the_recipe_list_do_not_import_torch():
    code = ("import sys; from lit_fedco.console import main; main(['recipes']); "
            "assert 'torch' not in sys.modules, 'torch imported'")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_recipes_lists_every_recipe_and_its_presets():
    proc = lit_fedco("recipes")
    assert proc.returncode == 0, proc.stderr
    names = [name for name, _ in recipes()]
    modules = sorted(p.stem for p in (REPO / "lit_fedco" / "recipes").glob("[!_]*.py"))
    assert names == modules and len(names) >= 8
    for name in names:
        assert f"\n    python -m lit_fedco.recipes.{name} [preset=NAME]" in f"\n{proc.stdout}"
    assert "    preset=comfedl_dro_mnist: " in proc.stdout
    assert "    preset=ds_feddro_cifar10_st" in proc.stdout


def test_bench_runs_a_benchmarks_own_command_line():
    proc = lit_fedco("bench", "cli", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--repeat" in proc.stdout
    proc = lit_fedco("bench", "nope")
    assert proc.returncode == 2
    assert "invalid choice: 'nope'" in proc.stderr


def test_a_missing_command_or_run_folder_is_an_error(tmp_path):
    assert lit_fedco().returncode == 2
    assert lit_fedco("plot").returncode == 2
    proc = lit_fedco("plot", str(tmp_path))  # a folder that holds no finished run
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"lit_fedco.report.plot: {tmp_path}/results.json is not a finished run's results "
        f"([Errno 2] No such file or directory: '{tmp_path}/results.json')"
    ]


@pytest.mark.slow
def test_plot_redraws_a_finished_run(tmp_path):
    run_recipe("comfedl_dro", tmp_path, 1, "updaters=[fedavg,comfedl]", "seeds=[0]", "rounds=2",
               "eval_every=1")  # fmt: skip
    run = the_run(tmp_path, "comfedl_dro")
    out = tmp_path / "redrawn"
    proc = lit_fedco("plot", str(run), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    drawn = sorted(p.name for p in out.iterdir())
    assert "summary.md" in drawn and any(n.endswith(".png") for n in drawn), drawn
    assert "| FedAvg |" in (out / "summary.md").read_text()
    assert str(out / "summary.md") in proc.stdout
