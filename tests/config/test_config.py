"""Bad configuration is rejected with a message that names the key, the value and a fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lit_fedco.cli import run as main
from lit_fedco.config.load import load_config, node_params, problem_name
from lit_fedco.core.errors import ConfigError
from lit_fedco.problems import ClientDROParams
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from tests.helpers import REPO


def test_defaults_and_overrides_merge_in_order(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("rounds: 7\nclient_dro:\n  gamma: 0.2\n")
    cfg = load_config([f"preset={preset}", "client_dro.gamma=0.3", "updater=fedavg"], DEFAULTS)
    assert cfg.rounds == 7  # preset over recipe default
    assert cfg.client_dro.gamma == 0.3  # command line over preset
    assert list(cfg.updaters) == ["fedavg"]
    assert cfg.local_steps == DEFAULTS["local_steps"]


def test_a_preset_extends_its_base_and_overrides_it(tmp_path):
    """A grid preset names its setting under ``extends``: base ← grid ← command line."""
    (tmp_path / "base.yaml").write_text("rounds: 7\nlocal_steps: 3\nclient_dro:\n  gamma: 0.2\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"extends: {tmp_path / 'base.yaml'}\nlocal_steps: 9\nvariants: ['rounds=2']\n")
    cfg = load_config([f"preset={grid}", "client_dro.gamma=0.3"], DEFAULTS)
    assert (cfg.rounds, cfg.local_steps, cfg.client_dro.gamma) == (7, 9, 0.3)
    assert list(cfg.variants) == ["rounds=2"]
    assert "extends" not in cfg


@pytest.mark.parametrize(
    "files,pattern",
    [
        ({"a": "extends: {d}/b.yaml\n", "b": "extends: {d}/a.yaml\n"}, r"a\.yaml extends itself"),
        ({"a": "extends: [1, 2]\n"}, r"extends: got \[1, 2\] in preset .*a\.yaml"),
        ({"a": "extends: nowhere\n"}, r"preset: got 'nowhere', no such file"),
        ({"a": "rounds: [1\n"}, r"preset: .*a\.yaml is not a readable YAML mapping"),
        ({"a": "- rounds=1\n"}, r"preset: .*a\.yaml must hold a mapping"),
        ({"a": "extends: {d}/b.yaml\n", "b": "roundz: 3\n"}, r"roundz: unknown config key"),
    ],
)
def test_bad_presets_are_config_errors(tmp_path, files, pattern):
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text.format(d=tmp_path))
    with pytest.raises(ConfigError, match=pattern):
        load_config([f"preset={tmp_path / 'a.yaml'}"], DEFAULTS)


def _shipped_presets() -> list[tuple[str, str]]:
    """(preset, recipe) for every YAML file in recipes/, the recipe read off its ``Run:`` line."""
    import re

    out = []
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        m = re.search(r"python -m lit_fedco\.recipes\.(\w+) preset=(\w+)", path.read_text())
        assert m and m.group(2) == path.stem, f"{path.name}: its Run: line names another preset"
        out.append((path.stem, m.group(1)))
    return out


@pytest.mark.parametrize(("preset", "recipe"), _shipped_presets())
def test_every_shipped_preset_and_each_of_its_variants_validates(preset, recipe):
    """Keys against the schema, the checks made before torch (every shipped node's ranges
    among them), and every updater's hyperparameters against their ranges."""
    import importlib

    from lit_fedco.config.early import check_values

    defaults = importlib.import_module(f"lit_fedco.recipes.{recipe}").DEFAULTS
    cfg = load_config([f"preset={preset}"], defaults)
    check_values(cfg)
    for variant in [*cfg.variants, ""]:
        c = load_config([f"preset={preset}", *variant.split()], defaults)
        check_values(c)
        for name in c.updaters:
            node_params(c, name)
        for name in {problem_name(c, u) for u in c.updaters} - {""}:
            node_params(c, name)


@pytest.mark.parametrize(
    "argv,pattern",
    [
        (["roundz=3"], r"roundz: unknown config key .*did you mean 'rounds'"),
        (
            ["client_dro.gama=0.1"],
            r"client_dro\.gama: unknown config key .*did you mean 'client_dro\.gamma'",
        ),
        (["rounds=many"], r"rounds: got 'many' .*expected a value of type int"),
        (
            ["client_dro.gamma=abc"],
            r"client_dro\.gamma: got 'abc' .*expected a value of type float",
        ),
        (["updater=comfed"], r"updater: got 'comfed', expected one of .*did you mean 'comfedl'"),
        (["rounds"], r"command line: got 'rounds', expected key=value"),
        (["preset=nope"], r"preset: got 'nope', no such file"),
    ],
)
def test_bad_keys_and_types_are_rejected(argv, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(argv, DEFAULTS)


def test_bad_updater_values_are_rejected():
    cfg = load_config(["comfedl.lr=0"], DEFAULTS)
    with pytest.raises(ConfigError, match=r"comfedl\.lr: got 0\.0, expected a float > 0"):
        node_params(cfg, "comfedl")


@pytest.mark.parametrize(
    "argv,pattern",
    [
        (
            ["client_dro.gamma=-1"],
            r"client_dro\.gamma: got -1\.0, expected a float > 0 \(γ\); "
            r"set e\.g\. client_dro\.gamma=0\.5",
        ),
        (
            ["client_dro.form=exact"],
            r"client_dro\.form: got 'exact', expected one of \('stable', 'literal'\)",
        ),
    ],
)
def test_bad_problem_values_are_rejected(argv, pattern):
    cfg = load_config(argv, DEFAULTS)
    with pytest.raises(ConfigError, match=pattern):
        node_params(cfg, "client_dro")


def test_problem_parameters_validate_directly():
    with pytest.raises(ConfigError, match=r"gamma: got 0\.0, expected a float > 0"):
        ClientDROParams(gamma=0.0)


@pytest.mark.parametrize(
    "argv,pattern",
    [
        (["data.partition=zipf"], r"data\.partition: got 'zipf'"),
        (["data.name=cifar7"], r"data\.name: got 'cifar7'"),
        (["data.name=mnist", "data.data_dir=/nonexistent/x"], r"data\.data_dir: .*/nonexistent/x"),
        (["data.big=100000"], r"data\.big"),
        (["executor=gpu"], r"executor: got 'gpu', expected one of"),
        (["cohort=50"], r"cohort: got 50, expected an int in \[1, 10\]"),
        (["tracking=[wandbb]"], r"tracking: got 'wandbb'"),
        (["dtype=float16"], r"dtype: got 'float16'"),
    ],
)
def test_recipe_exits_2_with_one_clear_line_and_writes_nothing(tmp_path, capsys, argv, pattern):
    with pytest.raises(SystemExit) as exc:
        main("comfedl_dro", DEFAULTS, [*argv, f"out_dir={tmp_path / 'out'}", "progress=false"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lit_fedco: ")
    assert "Traceback" not in err
    import re

    assert re.search(pattern, err), err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_command_line_error_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", "client_dro.gamma=-2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "client_dro.gamma: got -2.0, expected a float > 0" in proc.stderr
    assert "Traceback" not in proc.stderr
