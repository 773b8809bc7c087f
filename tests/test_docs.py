"""The documentation's code runs as written: every Python block of ``docs/`` compiles and passes
the project's lint, the tutorial's FedProx runs as a script of its own and from any recipe by
module path, and every ``python -m lit_fedco...`` command line in the docs and README parses.
The API reference lists every name ``lit_fedco`` exports; the config reference is generated
from the catalog; every image the docs and README show exists."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import lit_fedco
from lit_fedco.config.load import load_config
from tests.helpers import REPO

DOCS = REPO / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
TEXTS = [*PAGES, REPO / "README.md"]


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def python_blocks() -> list[tuple[str, str]]:
    return [(f"{p.relative_to(REPO)}#{i}", b) for p in TEXTS for i, b in
            enumerate(_blocks(p, "python"))]  # fmt: skip


def command_lines() -> list[str]:
    """Every ``python -m lit_fedco...`` command of the docs and README: from shell blocks (lines,
    with continuations joined) and from inline code."""
    found: list[str] = []
    for path in TEXTS:
        text = path.read_text()
        for block in _blocks(path, "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                found += re.findall(r"python -m lit_fedco\.\S.*", line.split(" # ")[0])
        found += re.findall(r"`(python -m lit_fedco\.[^`]*)`", text)
        for line in re.findall(r"^ {4,}(python -m lit_fedco\..*)$", text, flags=re.M):
            found.append(line.split(" # ")[0])
    return sorted({" ".join(c.split()) for c in found})


def test_the_docs_have_code_and_commands_to_check():
    assert len(python_blocks()) >= 3
    assert len(command_lines()) >= 20


@pytest.mark.parametrize("where,block", python_blocks(), ids=[w for w, _ in python_blocks()])
def test_every_python_block_compiles_and_passes_the_projects_lint(where, block, tmp_path):
    compile(block, where, "exec")
    script = tmp_path / "block.py"
    script.write_text(block)
    for check in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *check, "--config", str(REPO / "pyproject.toml"),
             str(script)], capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, where + "\n" + proc.stdout + proc.stderr


def _recipe_argv(command: str) -> tuple[str, list[str]] | None:
    """The module and arguments of a command line, placeholders filled in; None for a command
    the docs give as a pattern (``NAME``, ``…``)."""
    words = shlex.split(command.replace("$SLURM_ARRAY_TASK_ID", "0"))
    module = words[2]
    if "…" in command or " [" in command or module.endswith((".", ".NAME")):
        return None
    return module, words[3:]


@pytest.mark.parametrize("command", command_lines())
def test_every_recipe_command_line_parses(command, monkeypatch):
    """A recipe's command line is loaded by the recipe's own config parser (nothing runs); a
    module of one's own (``my_fedprox``) is the tutorial's, checked by the tests below; the
    example model (``bn_cnn``) is found in ``docs/examples``, as the how-to runs it."""
    monkeypatch.syspath_prepend(str(REPO / "docs" / "examples"))
    parsed = _recipe_argv(command)
    if parsed is None or not parsed[0].startswith("lit_fedco.recipes."):
        pytest.skip("not a recipe's command line")
    module, argv = parsed
    if any("my_" in a for a in argv):
        pytest.skip("names the tutorial's own module")
    defaults = importlib.import_module(module).DEFAULTS
    flags = {"--help", "--help-all", "--list-sub-runs"}
    load_config([a for a in argv if a not in flags], defaults)


@pytest.mark.slow
def test_every_other_command_line_parses():
    """Benchmarks, figures, the catalog and the examples: ``--help`` after the command's own
    arguments (argparse checks the options it reads before it)."""
    for command in command_lines():
        parsed = _recipe_argv(command)
        if parsed is None or parsed[0].startswith("lit_fedco.recipes."):
            continue
        module, argv = parsed
        proc = subprocess.run([sys.executable, "-m", module, *argv, "--help"],
                              capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
        assert proc.returncode == 0, command + "\n" + proc.stderr[-2000:]
        assert proc.stdout.strip(), command  # its help


def console_lines() -> list[str]:
    """Every ``lit-fedco ...`` command of the docs and README (inline code and shell blocks)."""
    found: list[str] = []
    for path in TEXTS:
        for block in _blocks(path, "bash"):
            found += re.findall(r"^lit-fedco\b.*$", block, flags=re.M)
        found += re.findall(r"`(lit-fedco\b[^`]*)`", path.read_text())
    return sorted({" ".join(c.split()) for c in found})


def test_every_lit_fedco_command_line_parses():
    from lit_fedco.console import parser

    checked = 0
    for command in console_lines():
        if command == "lit-fedco" or any(c in command for c in ("[", "...", "|")):
            continue  # the command's name, or a pattern
        try:
            parser().parse_args(shlex.split(command)[1:])
        except SystemExit as stop:  # --help
            assert stop.code == 0, command
        checked += 1
    assert checked >= 3


def test_the_api_reference_lists_every_exported_name():
    text = (DOCS / "reference" / "api.md").read_text()
    documented = set(re.findall(r"^\.\. (?:auto\w+|py:\w+):: lit_fedco\.(\w+)$", text, re.M))
    assert documented - {"testing"} == set(lit_fedco.__all__)  # and the lit_fedco.testing module
    assert ".. automodule:: lit_fedco.testing" in text


def test_the_layout_page_lists_the_layers_the_import_test_enforces():
    """``docs/explanation/layout.md``'s table of layers is ``tests/test_imports.py``'s
    ``LAYERS``: every package and top-level module once, at its number; every module path the
    page names exists."""
    from tests.test_imports import LAYERS

    text = (DOCS / "explanation" / "layout.md").read_text()
    listed = {}
    for number, names in re.findall(r"^\| *(\d+) *\| ([^|]+)\|", text, flags=re.M):
        for name in re.findall(r"`(\w+)`", names):
            assert name not in listed, f"{name} listed twice"
            listed[name] = int(number)
    assert listed == LAYERS
    for path in set(re.findall(r"`((?:\w+/)+\w+\.py)`", text)):
        assert (REPO / path).is_file() or (REPO / "lit_fedco" / path).is_file(), path
    for dotted in set(
        re.findall(r"`((?:config|experiment|store|process|engine)(?:\.\w+)+)`", text)
    ):
        parts = ("lit_fedco." + dotted).split(".")
        n = 2  # the longest prefix that is a module; the rest are names inside it
        while n < len(parts) and (REPO / "/".join(parts[: n + 1])).with_suffix(".py").is_file():
            n += 1
        found: object = importlib.import_module(".".join(parts[:n]))
        for name in parts[n:]:  # a class or function inside the module, and its members
            found = getattr(found, name)


def test_the_config_reference_is_generated_from_the_catalog():
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import config_keys
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    schema = json.loads((REPO / "lit_fedco" / "config" / "schema.json").read_text())
    page = config_keys.render(schema)
    for name in schema["run"]["keys"]:
        assert f"| `{name}` |" in page
    for node, spec in schema["nodes"].items():
        for key in spec["keys"]:
            assert f"| `{node}.{key}` |" in page, f"{node}.{key}"
    assert (
        "{include} ../_generated/config_keys.md" in (DOCS / "reference" / "config.md").read_text()
    )


def test_the_compositions_reference_is_generated_from_the_registries():
    from lit_fedco.problems import available_problems
    from lit_fedco.updaters import available_updaters

    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import config_keys
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    page = config_keys.compositions()
    for name in [*available_problems(), *available_updaters()]:
        assert f"| `{name}` |" in page, name
    hooks_page = (DOCS / "reference" / "hooks.md").read_text()
    assert "{include} ../_generated/compositions.md" in hooks_page


def test_every_image_shown_exists():
    shown = 0
    for path in TEXTS:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", path.read_text()):
            assert (path.parent / target).is_file(), f"{path.relative_to(REPO)}: {target}"
            shown += 1
    assert shown >= 8


# ---------------------------------------------------------------------- the tutorial's FedProx
def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


QUICK = ["rounds=4", "eval_every=2", "seeds=[0]", "progress=false", "tracking=[none]"]


@pytest.fixture
def example(tmp_path) -> Path:
    """The tutorial's FedProx block, written to ``my_fedprox.py`` in a folder of its own."""
    blocks = _blocks(DOCS / "tutorial" / "first_method.md", "python")
    block = next(b for b in blocks if "my_fedprox.py" in b)
    script = tmp_path / "my_fedprox.py"
    script.write_text(block)
    return script


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---------------------------------------------------------------------- README
def test_the_readme_is_short_and_holds_the_command_ci_runs():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    ci = (REPO / ".ci" / "run").read_text()
    (test_command,) = [line for line in ci.splitlines() if line.startswith("python3 -m venv")]
    assert test_command in readme.splitlines()
    run = (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
        "python -m lit_fedco.recipes.ds_feddro"
    )
    assert run in readme.splitlines()


def test_every_relative_link_of_the_readme_exists():
    readme = (REPO / "README.md").read_text()
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    assert len(links) >= 15
    for target in links:
        assert (REPO / target.split("#")[0]).exists(), target
