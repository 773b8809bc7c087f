"""Tuning before the comparison (``tune.grid``, issue 30): a grid per updater runs on the tuning
seeds with validation rows held out of the training split, the best value per updater is
chosen and recorded (table, ``results.json``, ``config.yaml``, ``tune.json``), and the
comparison runs on fresh seeds with it; a tuning phase killed with ``kill -9`` resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from lit_fedco.cli import run as main
from lit_fedco.core.errors import ConfigError
from lit_fedco.data import make_federated
from lit_fedco.experiment.tuning import parse_grid
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from tests.helpers import REPO, override

GRID = "tune.grid=['fedavg.lr=0.001,0.1','comfedl.lr=0.001,0.1']"
ARGS = ["updaters=[comfedl,fedavg]", "seeds=[0,1]", "rounds=2", "eval_every=1", "data.big=500",
        "progress=false", "tracking=[csv]", GRID]  # fmt: skip


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def test_a_tiny_grid_selects_the_better_value_per_updater_and_records_it(tmp_path, capsys):
    rows = main("comfedl_dro", DEFAULTS, [*ARGS, f"out_dir={tmp_path}", "run_name=t"])
    out = capsys.readouterr().out
    run, tuning = tmp_path / "comfedl_dro" / "t", tmp_path / "comfedl_dro" / "t-tune"
    record = json.loads((tuning / "tune.json").read_text())
    for name in ("comfedl", "fedavg"):
        grid = record["updaters"][name]["grid"]
        assert [g["values"][f"{name}.lr"] for g in grid] == [0.001, 0.1]
        # 2 rounds at lr 0.001 barely move the model; lr 0.1 learns: the better one is chosen
        assert grid[1]["mean"] > grid[0]["mean"] + 0.1
        assert record["updaters"][name]["best"]["values"] == {f"{name}.lr": 0.1}
    assert record["seeds"] == [100] and record["heldout"] == "train"
    # the tuning ran on its own seed, the comparison on the run's seeds with the chosen values
    folders = ["v0-comfedl-seed100", "v1-comfedl-seed100", "v2-fedavg-seed100", "v3-fedavg-seed100"]
    assert sorted(p.name for p in tuning.glob("v*-seed*")) == folders
    assert [label for label, _ in rows] == ["comfedl (lr=0.1)", "fedavg (lr=0.1)"]
    assert "fedavg (lr=0.1)" in (run / "table.txt").read_text()
    assert "tuned by val/acc_avg" in out and "fedavg: fedavg.lr=0.1" in out
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["fedavg"]["lr"] == 0.1 and config["comfedl"]["lr"] == 0.1
    assert config["tune"]["chosen"] == ["comfedl.lr=0.1", "fedavg.lr=0.1"]
    results = json.loads((run / "results.json").read_text())
    assert results["tuning"]["updaters"]["fedavg"]["best"]["values"] == {"fedavg.lr": 0.1}
    assert len(results["results"]["fedavg (lr=0.1)"]) == 2
    # two methods over two seeds: each against the best, paired seed by seed, under the table
    assert "paired over seeds" in (run / "table.txt").read_text()
    assert {t["n"] for t in results["paired_tests"]} == {2}
    # the tuning selected on rows held out of the training split, never on the test split
    assert yaml.safe_load((tuning / "config.yaml").read_text())["data"]["heldout"] == "train"


def test_the_held_out_slice_of_the_training_split_is_disjoint_from_what_trains():
    spec = dict(name="digits", data_dir="", partition="iid", num_clients=4, big=0, small=0,
                small_classes=0, alpha=0.5, rho=0.3, val_per_client=20, seed=3)  # fmt: skip
    test = make_federated(SimpleNamespace(**spec, heldout="test"))
    train = make_federated(SimpleNamespace(**spec, heldout="train"))
    rows = {tuple(r.flatten().tolist()) for r in train.x_train}
    held = {tuple(r.flatten().tolist()) for r in train.x_val}
    assert not rows & held  # (digits has no duplicate images across these rows)
    assert len(train.y_train) < len(test.y_train)  # a fifth of the training split held out


def test_bad_grids_are_refused_with_one_line():
    from lit_fedco.config.load import load_config

    def check(*items: str) -> str:
        cfg = load_config(["updaters=[comfedl,fedavg]", *items], DEFAULTS)
        with pytest.raises(ConfigError) as err:
            parse_grid(cfg)
        return str(err.value)

    assert "not under one of the run's updaters" in check("tune.grid=['fedavgg.lr=0.1,0.2']")
    assert "variants" in check("tune.grid=['fedavg.lr=0.1']", "variants=['rounds=3']")
    assert "KEY=V1,V2" in check("tune.grid=['fedavg.lr']")
    assert "also the comparison's seeds" in check("tune.grid=['fedavg.lr=0.1']", "tune.seeds=[0]")
    assert "'max' or 'min'" in check("tune.grid=['fedavg.lr=0.1']", "tune.mode=up")


def test_a_bad_grid_on_the_command_line_ends_with_exit_code_2_and_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as end:
        main("comfedl_dro", DEFAULTS, [*ARGS, "tune.mode=up", f"out_dir={tmp_path}"])
    assert end.value.code == 2
    err = capsys.readouterr().err
    assert (
        err == "lit_fedco: tune.mode: got 'up', expected 'max' or 'min'; set e.g. tune.mode=min\n"
    )
    assert not list(tmp_path.iterdir())


def test_a_tuning_phase_killed_with_kill_9_resumes_to_the_same_numbers(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro",
           *override(ARGS, ["rounds=4"]), f"out_dir={tmp_path}"]  # fmt: skip

    def launch(*extra: str, kill: str = "") -> subprocess.CompletedProcess:
        more = {"LIT_FEDCO_KILL_AT": kill} if kill else {}
        return subprocess.run([*cmd, *extra], cwd=REPO, env={**env, **more}, text=True,
                              capture_output=True, timeout=300)  # fmt: skip

    # killed in the third tuning sub-run's evaluation (4 evaluations each, counted from 1)
    killed = launch("run_name=k", kill="evaluation:10")
    assert killed.returncode == -9
    tuning = tmp_path / "comfedl_dro" / "k-tune"
    assert (tuning / "v0-comfedl-seed100" / "status.json").is_file()
    assert not (tuning / "tune.json").exists() and not (tuning.with_name("k")).exists()
    again = launch("run_name=k", "resume=auto")
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stdout  # the sub-runs before the kill are kept
    whole = launch("run_name=w")
    assert whole.returncode == 0, whole.stderr

    def numbers(name: str) -> tuple:
        run = tmp_path / "comfedl_dro" / name
        tune = json.loads((run.with_name(f"{name}-tune") / "tune.json").read_text())
        results = json.loads((run / "results.json").read_text())["results"]
        timeless = {k: [{m: v for m, v in r.items() if not m.startswith("time")} for r in rs]
                    for k, rs in results.items()}  # fmt: skip
        return tune["updaters"], timeless

    assert numbers("k") == numbers("w")


def test_list_sub_runs_numbers_the_tunings_then_the_comparisons(capsys):
    main("comfedl_dro", DEFAULTS, [*ARGS, "run_name=x", "--list-sub-runs"])
    out = capsys.readouterr().out
    assert "tuning run x-tune (sub_run=0..3)" in out
    assert "v3-fedavg-seed100" in out and "\n7      fedavg-seed1" in out


def test_help_documents_the_tune_node(capsys):
    main("comfedl_dro", DEFAULTS, ["--help-all"])
    out = capsys.readouterr().out
    assert "tune.grid" in out and "tune.metric" in out


NEW_PRESETS = [
    ("comfedl_dro_mnist_journal", "comfedl_dro"),
    ("comfedl_dro_mnist_journal_stable", "comfedl_dro"),
    ("comfedl_dro_mnist_journal_gamma", "comfedl_dro"),
    ("comfedl_dro_mnist_journal_tau", "comfedl_dro"),
    ("ds_feddro_digits_fig1", "ds_feddro"),
    ("ds_feddro_digits_fig3", "ds_feddro"),
    ("fcsg_auprc_mnist_scripts", "fcsg_auprc"),
    ("fcsg_auprc_fashion_mnist_scripts", "fcsg_auprc"),
    ("fcsg_invariant_seeds", "fcsg_invariant"),
    ("fcsg_maml_digits_seeds", "fcsg_maml"),
]


@pytest.mark.parametrize(("preset", "recipe"), NEW_PRESETS)
def test_the_papers_presets_load_with_the_settings_they_claim(preset, recipe):
    import importlib

    from lit_fedco.config.load import load_config
    from lit_fedco.experiment.tuning import points

    cfg = load_config(
        [f"preset={preset}"], importlib.import_module(f"lit_fedco.recipes.{recipe}").DEFAULTS
    )
    assert len(cfg.seeds) == 3
    if preset.startswith("comfedl_dro_mnist_journal"):
        assert cfg.client_dro.gamma == (0.5 if preset.endswith("gamma") else 0.2)
        assert cfg.client_dro.form == ("stable" if preset.endswith("stable") else "literal")
    if preset in ("comfedl_dro_mnist_journal", "comfedl_dro_mnist_journal_stable"):
        # §5.3's grids: 7 step sizes for each method, × 3 DRFL weight steps, × 5 values of q
        assert len(points(cfg)) == 7 + 7 * 3 + 7 * 5 + 7
    if preset.endswith("gamma"):
        assert [v.split("=")[1] for v in cfg.variants] == ["0.1", "0.2", "2", "5"]
    if preset == "ds_feddro_digits_fig1":
        assert cfg.data.partition == "iid" and cfg.local_steps == 1 and cfg.rounds == 750
        assert len(points(cfg)) == 6 * 4
    if preset.startswith("fcsg_auprc"):
        assert (cfg.auprc.margin, cfg.rounds, cfg.local_steps) == (0.1, 300, 1)
        assert cfg.auprc.positives == (5 if "fashion" in preset else 3)
        assert cfg.fcsg_m.beta == cfg.acc_fcsg_m.beta == 0.1


def test_the_feddro_fig1_proxy_runs_its_tuning_and_comparison_for_one_round(tmp_path):
    from lit_fedco.recipes.ds_feddro import COLUMNS
    from lit_fedco.recipes.ds_feddro import DEFAULTS as DS

    argv = ["preset=ds_feddro_digits_fig1", "updaters=[feddro,mbsgd]", "seeds=[0,1]", "rounds=1",
            "progress=false", "tracking=[csv]", f"out_dir={tmp_path}", "run_name=f"]  # fmt: skip
    rows = main("ds_feddro", DS, argv, columns=COLUMNS)
    assert [label.split(" (")[0] for label, _ in rows] == ["feddro", "mbsgd"]
    record = json.loads((tmp_path / "ds_feddro" / "f-tune" / "tune.json").read_text())
    assert set(record["updaters"]) == {"feddro", "mbsgd"}  # the others' grids are left out
    assert len(record["updaters"]["feddro"]["grid"]) == 4


def test_the_fcsg_mnist_scripts_preset_runs_one_round_with_the_scripts_model(tmp_path):
    from lit_fedco.recipes.fcsg_auprc import COLUMNS
    from lit_fedco.recipes.fcsg_auprc import DEFAULTS as AUPRC
    from tests.idx_files import make_set, write_idx

    for prefix, n, seed in (("train", 600, 1), ("t10k", 200, 2)):
        write_idx(tmp_path / "mnist", prefix, *make_set(n, seed), gz=False)
    argv = ["preset=fcsg_auprc_mnist_scripts", f"data.data_dir={tmp_path / 'mnist'}", "rounds=1",
            "pretrain.rounds=1", "seeds=[0]", "updaters=[fedavg,fcsg_m]", "data.num_clients=4",
            "cohort=4", "progress=false", "tracking=[csv]", f"out_dir={tmp_path}",
            "run_name=a"]  # fmt: skip
    rows = main("fcsg_auprc", AUPRC, argv, columns=COLUMNS, evaluated_on="test")
    assert [label for label, _ in rows] == ["pretrain", "fedavg", "fcsg_m"]
    config = yaml.safe_load((tmp_path / "fcsg_auprc" / "a" / "config.yaml").read_text())
    assert config["model"]["name"] == "lit_fedco.examples.dauprc_models:MnistModel"
    assert (config["auprc"]["margin"], config["auprc"]["positives"]) == (0.1, 3)
