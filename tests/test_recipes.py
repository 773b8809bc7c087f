"""The comfedl_dro recipe end to end: progress bar, table, W&B offline run and CSV."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lit_fedco.tracking import read_wandb_offline_run

REPO = Path(__file__).resolve().parent.parent


def test_recipe_writes_a_wandb_offline_run_and_csv(tmp_path):
    """No credentials → offline; the run's config and history are what the recipe logged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc: no stored credentials
    out = tmp_path / "out"
    args = [
        sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", "updater=comfedl", "rounds=4",
        "eval_every=2", f"out_dir={out}", "data.big=200",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "100%" in proc.stderr  # the progress bar ran to the end
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    run = read_wandb_offline_run(runs[0])
    assert run["config"]["rounds"] == 4 and run["config"]["form"] == "stable"
    assert run["config"]["comfedl"]["gamma"] == 0.5
    evals = [h for h in run["history"] if "val/acc_worst" in h]
    assert [h["trainer/global_step"] for h in evals] == [2, 4]
    per_class = [evals[-1][f"val/acc_class{c}"] for c in range(10)]  # every class is logged
    assert min(per_class) == pytest.approx(evals[-1]["val/class_acc_worst"])
    results = json.loads((out / "comfedl_dro-results.json").read_text())
    assert evals[-1]["val/acc_worst"] == results["results"]["comfedl"][0]["val/acc_worst"]
    # CSV: one row per round, the resolved config beside it
    (csv_dir,) = list((out / "comfedl_dro-comfedl-seed0").glob("version_*"))
    rows = list(csv.DictReader((csv_dir / "metrics.csv").open()))
    assert len(rows) == 4
    assert float(rows[-1]["val/acc_worst"]) == pytest.approx(evals[-1]["val/acc_worst"])
    hp = yaml.safe_load((csv_dir / "hparams.yaml").read_text())
    assert hp["updater"] == "comfedl" and hp["data"]["big"] == 200
