"""The recipes' command line, parsed once (``lit_fedco.config.parser``) and merged into the
catalog's typed schema (``lit_fedco.config.catalog``): ``--help``, ``--help-all`` and unknown keys
are answered without importing torch, Lightning or W&B. (How fast: measured, not asserted: see
``python -m lit_fedco.benchmarks.cli``.)"""

from __future__ import annotations

import dataclasses
import importlib
import re
import subprocess
import sys

import pytest
from omegaconf import DictConfig, OmegaConf

from lit_fedco import cli
from lit_fedco.config import catalog, helptext
from lit_fedco.config.fields import schema
from lit_fedco.config.load import load_config
from lit_fedco.config.parser import presets
from lit_fedco.core.errors import ConfigError
from lit_fedco.recipes.comfedl_dro import DEFAULTS as DRO_DEFAULTS
from lit_fedco.recipes.ds_feddro import DEFAULTS
from lit_fedco.updaters import Hparams
from lit_fedco.updaters import base as updater_base
from tests.helpers import REPO

RECIPES = sorted(p.stem for p in (REPO / "lit_fedco" / "recipes").glob("*.py") if p.stem[0] != "_")
HEAVY = ("torch", "torchvision", "torchmetrics", "lightning", "lightning_fabric", "wandb")


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``python -X importtime -m lit_fedco.recipes.ds_feddro ARGS``: the process and the top
    packages of every module it imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "lit_fedco.recipes.ds_feddro", *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    imported = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return proc, imported


def has_row(text: str, key_value: str) -> bool:
    """Whether the help ``text`` has a row for ``key=value``."""
    return re.search(rf"^  {re.escape(key_value)}(  |$)", text, flags=re.M) is not None


def stderr_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]


def full_error(argv: list[str], defaults: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(argv, defaults)
    return str(exc.value)


# ---------------------------------------------------------------------- in a subprocess
def test_help_describes_the_recipe_without_importing_torch():
    proc, imported = run_cli("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    out = proc.stdout
    assert out.startswith("usage: python -m lit_fedco.recipes.ds_feddro [preset=NAME]")
    assert "DS-FedDRO against FedDRO, FedAvg-CO, MBSGD, FastDRO and PDSGD" in out
    for row in [
        "rounds=150", "data.name=digits_st", "model.hidden=32",  # the recipe's keys and values
        "ds_feddro.gamma_x=1.3", "feddro.beta=0.5", "fedavg_co.case=II", "mbsgd.lr=0.1",
        "sample_dro.kind=kl", "ds_feddro_cifar10_st", "ds_feddro_cifar100_st",  # presets
    ]:  # fmt: skip
        assert has_row(out, row), row
    for text in [
        "S, the communication rounds.", "γ_x > 0, the server step size on x",
        "sample_dro (objective): Sample-level DRO", "λ > 0, the divergence weight.",
        "FedDRO paper §6: imbalanced classification", "--help-all",
    ]:  # fmt: skip
        assert text in out, text
    assert "comfedl_dro_mnist" not in out  # another recipe's preset
    assert "coda_plus.gamma" not in out and "data.big=" not in out  # the rest: --help-all
    assert re.search(r"Run keys: seed, executor", out)  # seeds: the recipe sets it, a row
    assert has_row(out, "seeds=[0,1,2]")


def test_help_all_lists_every_key_without_importing_torch():
    proc, imported = run_cli("--help-all")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not imported & set(HEAVY)
    cat = catalog.load()
    for name, node in [("", cat["run"]), *((f"{k}.", v) for k, v in cat["nodes"].items())]:
        for key in node["keys"]:
            assert f"  {name}{key}=" in proc.stdout, f"{name}{key}"
    assert "coda_plus (not in this run): CODA+" in proc.stdout
    assert has_row(proc.stdout, "data.big=1000") and has_row(proc.stdout, "ds_feddro.gamma_x=1.3")


def test_unknown_key_exits_2_with_the_full_message_without_importing_torch():
    proc, imported = run_cli("rounds=3", "ds_feddro.gama_x=2")
    assert proc.returncode == 2
    assert not imported & set(HEAVY)
    expected = full_error(["rounds=3", "ds_feddro.gama_x=2"], DEFAULTS)
    assert expected.startswith("ds_feddro.gama_x: unknown config key (from the command line); ")
    assert stderr_lines(proc) == [f"lit_fedco: {expected}"]
    assert proc.stdout == ""


def test_import_lit_fedco_and_a_recipe_do_not_import_torch_until_asked():
    code = (
        "import sys, lit_fedco, lit_fedco.recipes.feddro\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
        "print(lit_fedco.ConfigError.__name__, lit_fedco.register.__name__,"
        " lit_fedco.Hparams.__name__, lit_fedco.CompositionalUpdater.__name__)\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        "[]", "ConfigError register Hparams CompositionalUpdater", "True"
    ]  # fmt: skip


# ---------------------------------------------------------------------- the same answers
def test_typed_schema_mirrors_the_full_schema():
    fast, full = catalog.typed_schema(), schema()
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(full)

    def shape(node: DictConfig, prefix: str = "") -> dict[str, tuple]:
        out = {}
        for k in node:
            child = node._get_node(k)
            meta = child._metadata  # type: ignore[union-attr]
            cls = meta.object_type if isinstance(child, DictConfig) else None
            out[prefix + str(k)] = (
                type(child).__name__, child._get_flag("readonly"), child._get_flag("struct"),
                getattr(cls, "__name__", cls), getattr(meta, "element_type", None),
                getattr(meta.ref_type, "__name__", str(meta.ref_type)),
            )  # fmt: skip
            if isinstance(child, DictConfig):
                out.update(shape(child, f"{prefix}{k}."))
        return out

    assert shape(fast) == shape(full)
    assert fast._get_flag("struct") is full._get_flag("struct") is True


BAD = [
    (["roundz=3"], r"^roundz: unknown config key \(from the command line\); did you mean 'rounds'"),
    (["--roundz=3"], r"^roundz: unknown config key"),
    (["client_dro.gama=0.1"], r"^client_dro.gama: unknown config key .*did you mean 'client_dro.gamma'"),
    (["data.nme=x"], r"^data.nme: unknown config key .*'data.name'"),
    (["model.hiden=3"], r"^model.hiden: unknown config key .*'model.hidden'"),
    (["failures.dro=0.1"], r"^failures.dro: unknown config key .*'failures.drop'"),
    (["fedavg.mu=1"], r"^fedavg.mu: unknown config key"),
    (["nonexistent.x=1"], r"^nonexistent: unknown config key"),
    (["rounds=3", "ds_feddro.gama_x=2", "rounds=4"], r"^rounds: given twice \('rounds=3', then 'rounds=4'\); give it once"),
    (["updater=comfed"], r"^updater: got 'comfed', expected one of \[.*\]; did you mean 'comfedl'\? an updater of your own: updater=my_module:MyUpdater"),
    (["updaters=[fedavg,nope]"], r"^updater: got 'nope'"),
    (["objective=sample"], r"^objective: got 'sample', expected one of \["),
    (["preset=ds_feddro_cifar10_st", "data.nme=x"], r"^data.nme: unknown config key"),
    (["rounds=many"], r"^rounds: got 'many' \(from the command line\), expected a value of type int"),
    (["rounds"], r"^command line: got 'rounds', expected key=value"),
    (["preset=nope"], r"^preset: got 'nope', no such file .*available presets: comfedl_dro_mnist"),
    (["data=5"], r"^data: got 5 .*expected a group of keys"),
    (["seeds=[1"], r"^seeds: got '\[1' \(from the command line\), which does not parse"),
    (["roundz=1", "seedz=2"], r"^roundz: unknown config key"),  # the first bad item
]  # fmt: skip


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
@pytest.mark.parametrize("defaults", [DEFAULTS, DRO_DEFAULTS], ids=["ds_feddro", "comfedl_dro"])
def test_bad_command_lines_get_one_line_naming_the_key(argv, message, defaults):
    with pytest.raises(ConfigError, match=message) as exc:
        load_config(argv, defaults)
    assert "\n" not in str(exc.value)


def test_unknown_keys_in_presets_and_defaults_name_their_source(tmp_path):
    (tmp_path / "base.yaml").write_text("rounds: 7\ndata:\n  nmae: digits\n")
    (tmp_path / "grid.yaml").write_text(f"extends: {tmp_path / 'base.yaml'}\nrounds: 3\n")
    for argv, defaults, source in [
        ([f"preset={tmp_path / 'grid.yaml'}"], DEFAULTS, f"preset {tmp_path / 'base.yaml'}"),
        (["rounds=2"], {**DEFAULTS, "cohortt": 3}, "the recipe's defaults"),
        (["roundz=1"], {**DEFAULTS, "sample_dro": {"lamb": 1.0}}, "the recipe's defaults"),
        ([f"preset={tmp_path / 'grid.yaml'}", "roundz=1"], DEFAULTS, "preset"),  # the preset's
    ]:
        with pytest.raises(ConfigError, match=rf"unknown config key \(from {re.escape(source)}"):
            load_config(argv, defaults)


def test_an_empty_preset_is_refused(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    with pytest.raises(ConfigError, match=r"^preset: .*empty.yaml is empty"):
        load_config([f"preset={tmp_path / 'empty.yaml'}"], DEFAULTS)
    assert load_config(["run_name="], DEFAULTS).run_name == ""


def _presets_of(recipe: str) -> list[str]:
    return [name for name, _ in presets(recipe)]


@pytest.mark.parametrize(
    "argv",
    [
        ["roundz=3"],
        ["variants=[rounds=2,roundz=3]"],
        ["preset=comfedl_dro_mnist_q_grid", "variants=[qfedavg.qq=1]"],
    ],
    ids=" ".join,
)
def test_a_bad_key_exits_2_with_one_line_and_writes_nothing(argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli.run("comfedl_dro", DRO_DEFAULTS, [*argv, f"out_dir={tmp_path}"])
    assert exc.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("lit_fedco: ") and "unknown config key" in line
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------- help text
def test_help_shows_the_values_of_a_preset_and_overrides(capsys):
    cli.run("ds_feddro", DEFAULTS, ["--help", "preset=ds_feddro_cifar10_st", "rounds=7"])
    out = capsys.readouterr().out
    for row in ["rounds=7", "data.name=cifar10_st", "model.name=resnet20",
                "ds_feddro.lr_decay_round=90"]:  # fmt: skip
        assert has_row(out, row), row
    with pytest.raises(SystemExit) as exc:
        cli.run("ds_feddro", DEFAULTS, ["--help", "roundz=7"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("lit_fedco: roundz: unknown config key")


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("cols", [80, 100])
def test_help_fits_the_width_and_lists_the_recipes_own_presets(recipe, cols):
    defaults = importlib.import_module(f"lit_fedco.recipes.{recipe}").DEFAULTS
    values = OmegaConf.to_container(load_config([], defaults))
    assert isinstance(values, dict)
    for everything in (False, True):
        text = helptext.render(recipe, defaults, values, everything, cols=cols)
        too_wide = [line for line in text.splitlines() if len(line) > cols]
        assert not too_wide, too_wide
        for name in _presets_of(recipe):
            assert f"\n  {name} " in text
    shipped = {p.stem for p in (REPO / "recipes").glob("*.yaml")}
    assert set().union(*(_presets_of(r) for r in RECIPES)) == shipped


def test_an_updater_registered_at_run_time_goes_the_full_way(monkeypatch, capsys):
    @dataclasses.dataclass(frozen=True)
    class ProxHparams(Hparams):
        """FedProx.

        Attributes:
            mu: μ, the proximal weight.
        """

        mu: float = 0.1

    cls = type(
        "Prox",
        (updater_base.get_updater("fedavg"),),
        {"hparams_cls": ProxHparams, "__doc__": "FedProx: a test."},
    )
    monkeypatch.setattr(cls, "name", "prox_test")
    monkeypatch.setitem(updater_base._REGISTRY, "prox_test", cls)
    assert catalog.runtime_extras() == ["prox_test"]
    cli.run("ds_feddro", DEFAULTS, ["updater=prox_test", "prox_test.mu=0.5", "--help"])
    out = capsys.readouterr().out
    assert "prox_test (trains erm, not sample_dro's own distributed): FedProx: a test." in out
    assert has_row(out, "prox_test.mu=0.5") and "μ, the proximal weight." in out
    with pytest.raises(SystemExit):
        cli.run("ds_feddro", DEFAULTS, ["updater=prox_test", "prox_test.nu=0.5"])
    assert "prox_test.nu: unknown config key" in capsys.readouterr().err
