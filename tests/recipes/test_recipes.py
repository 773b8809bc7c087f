"""The comfedl_dro recipe end to end: progress bar, table, W&B offline run and CSV."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lit_fedco.config.load import load_config
from lit_fedco.core.models import build_model
from lit_fedco.engine.schedule import DTYPES
from lit_fedco.experiment.assemble import build_data
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from lit_fedco.report.tracking import read_wandb_offline_run
from tests.helpers import final_checkpoint, the_run

pytestmark = pytest.mark.slow  # every test here runs a recipe in a subprocess


def run_offline(tmp_path: Path, recipe: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m lit_fedco.recipes.RECIPE ARGS`` as a user with no W&B credentials (no W&B
    variables, a HOME without ~/.netrc), so W&B runs offline; asserts that it succeeded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env["HOME"] = str(tmp_path)
    cmd = [sys.executable, "-m", f"lit_fedco.recipes.{recipe}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_recipe_writes_a_wandb_offline_run_and_csv(tmp_path):
    """No credentials → offline; the run's config and history are what the recipe logged."""
    out = tmp_path / "out"
    args = ["updater=comfedl", "seeds=[0]", "rounds=4", "eval_every=2", f"out_dir={out}",
            "data.big=200"]  # fmt: skip
    proc = run_offline(tmp_path, "comfedl_dro", *args)
    assert "100%" in proc.stderr  # the progress bar ran to the end
    run_dir = the_run(out, "comfedl_dro")
    runs = {
        (r := read_wandb_offline_run(p, wait=60))["name"]: r
        for p in (run_dir / "wandb").glob("offline-run-*")
    }
    assert sorted(runs) == ["comfedl_dro-comfedl-seed0", "comfedl_dro-figures"]
    figures = runs["comfedl_dro-figures"]  # the run's figures, as images
    logged = {key.split(".")[0] for key in figures["summary"]}  # images: curves.width, ...
    assert {"curves", "communication", "clients", "weights"} <= logged
    run = runs["comfedl_dro-comfedl-seed0"]
    assert run["config"]["rounds"] == 4 and run["config"]["client_dro"]["form"] == "stable"
    assert run["config"]["client_dro"]["gamma"] == 0.5  # the resolved config
    ran = run["config"]["describe"]  # what ran, under its own key
    assert ran["updater"] == "comfedl" and ran["hparams"]["lr"] == 0.05
    assert ran["objective"] == {"objective": "ClientKLDRO", "gamma": 0.5, "form": "stable"}
    # the partition, printed at the start and logged: one client of 200 images, nine of 20
    # images of 2 classes each (the quantity split), 100 validation images each
    assert "digits: 10 clients, 10 classes, 380 training and 1000 validation" in proc.stdout
    part = run["config"]["partition"]
    assert (part["num_clients"], part["train_total"], part["val_total"]) == (10, 380, 1000)
    assert part["train_per_client"] == {"min": 20, "median": 20, "max": 200}
    assert part["classes_per_client"] == {"min": 2, "median": 2, "max": 10}
    evals = [h for h in run["history"] if "val/acc_worst" in h]
    assert [h["trainer/global_step"] for h in evals] == [2, 4]
    per_class = [evals[-1][f"val/acc_class{c}"] for c in range(10)]  # every class is logged
    assert min(per_class) == pytest.approx(evals[-1]["val/class_acc_worst"])
    results = json.loads((run_dir / "results.json").read_text())
    assert evals[-1]["val/acc_worst"] == results["results"]["comfedl"][0]["val/acc_worst"]
    # CSV: one row per round, the resolved config in the run folder
    rows = list(csv.DictReader((run_dir / "comfedl-seed0" / "metrics.csv").open()))
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]
    assert float(rows[-1]["val/acc_worst"]) == pytest.approx(evals[-1]["val/acc_worst"])
    hp = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert hp["updaters"] == ["comfedl"] and hp["data"]["big"] == 200
    assert hp["executor"] == "vectorized"  # executor=auto's choice for logreg, recorded


def test_comfedl_dro_compares_drfl_and_qfedavg_by_default(tmp_path):
    """The table has a row per method of ComFedL §5.1; DRFL logs its client weights λ (on the
    simplex) at every evaluation."""
    out = tmp_path / "out"
    args = [
        "rounds=3", "eval_every=3", "tracking=[csv]", "progress=false", f"out_dir={out}",
        "data.big=200",
    ]  # fmt: skip
    proc = run_offline(tmp_path, "comfedl_dro", *args)
    table = proc.stdout.split("final metrics per method")[1].splitlines()
    assert [line.split()[0] for line in table[3:7]] == ["comfedl", "drfl", "qfedavg", "fedavg"]
    run_dir = the_run(out, "comfedl_dro")
    results = json.loads((run_dir / "results.json").read_text())["results"]
    cfg = load_config(args, DEFAULTS)
    data = build_data(cfg, 0).to("cpu", DTYPES[cfg.dtype])
    model = build_model(cfg.model.name, tuple(data.x_train.shape[1:]), data.num_classes, 0)
    for name in ("drfl", "qfedavg"):
        # every client's validation accuracy under the saved final model, from its predictions
        ckpt = final_checkpoint(run_dir / f"{name}-seed0")
        with torch.no_grad():
            pred = torch.func.functional_call(model, ckpt["loop"]["server"]["x"], (data.x_val,))
        hit = (pred.argmax(1) == data.y_val).double()
        off = data.val_offsets.tolist()
        acc = [float(hit[lo:hi].mean()) for lo, hi in itertools.pairwise(off)]
        assert len(acc) == 10
        res = results[name][0]
        assert res["val/acc_avg"] == pytest.approx(sum(acc) / 10, abs=1e-12), name
        assert res["val/acc_worst"] == pytest.approx(min(acc), abs=1e-12), name
    last = list(csv.DictReader((run_dir / "drfl-seed0" / "metrics.csv").open()))[-1]
    lam = [float(last[f"dro/weight_client{k}"]) for k in range(10)]
    assert min(lam) >= 0 and sum(lam) == pytest.approx(1.0, abs=1e-6)
    assert max(lam) > 0.1 + 1e-4  # three ascent steps moved λ off uniform
    # the logged weights are the server's λ at the end of the run
    ckpt = final_checkpoint(run_dir / "drfl-seed0")
    assert lam == pytest.approx(ckpt["loop"]["server"]["lam"].tolist(), rel=1e-12, abs=0)
    assert ckpt["updater"] == "drfl" and ckpt["config"]["hparams"]["lam_lr"] == 0.08


def test_comfedl_maml_logs_to_wandb_offline_and_csv_with_the_damaml_weights(tmp_path):
    out = tmp_path / "out"
    args = [
        "updater=comfedl_damaml", "rounds=2", "eval_every=2", "local_steps=2", "model.hidden=8",
        "data.val_per_client=20", "progress=false", f"out_dir={out}",
    ]  # fmt: skip
    proc = run_offline(tmp_path, "comfedl_maml", *args)
    assert "comfedl_damaml" in proc.stdout and "val worst acc" in proc.stdout
    run_dir = the_run(out, "comfedl_maml")
    runs = [read_wandb_offline_run(p, wait=60) for p in (run_dir / "wandb").glob("offline-run-*")]
    (run,) = [r for r in runs if r["name"] != "comfedl_maml-figures"]
    assert run["config"]["objective"] == "pfl" and run["config"]["pfl"]["gamma"] == 0.5
    assert run["config"]["describe"]["objective"]["objective"] == "DAMAML"
    assert run["config"]["pfl"]["inner_lr"] == 0.05
    last = [h for h in run["history"] if "val/acc_worst" in h][-1]
    weights = [last[f"dro/weight_client{k}"] for k in range(10)]  # softmax(L/γ) after adaptation
    assert sum(weights) == pytest.approx(1.0, abs=1e-6) and min(weights) > 0
    # w = softmax(L/γ) over the clients' training losses L: γ (log w_max − mean_k log w_k) is
    # L_max − mean_k L_k, the logged train/loss_worst − train/loss_avg (float32 weights)
    spread = 0.5 * (math.log(max(weights)) - sum(map(math.log, weights)) / 10)
    assert last["train/loss_worst"] - last["train/loss_avg"] > 1e-3  # the weights differ
    assert spread == pytest.approx(last["train/loss_worst"] - last["train/loss_avg"], abs=1e-5)
    results = json.loads((run_dir / "results.json").read_text())["results"]
    assert last["val/acc_worst"] == results["comfedl_damaml"][0]["val/acc_worst"]
    rows = list(csv.DictReader((run_dir / "comfedl_damaml-seed0" / "metrics.csv").open()))
    assert len(rows) == 2
    assert float(rows[-1]["dro/weight_client0"]) == pytest.approx(weights[0])


def test_feddro_fairness_on_tiny_adult_files(tmp_path):
    """The fairness recipe on tiny files in the UCI Adult format: a table row per method with
    the violation columns, and the logged test violation is the final model's, computed here
    from its predictions on the test rows."""
    from lit_fedco.recipes.feddro_fairness import DEFAULTS as FAIR
    from tests.data.test_adult import write_adult
    from tests.helpers import run_recipe
    from tests.objectives.test_fairness import random_rows

    folder = write_adult(tmp_path / "adult", train=random_rows(64, 0),
                         test=random_rows(32, 1, test=True))  # fmt: skip
    out = tmp_path / "out"
    args = [
        f"data.data_dir={folder}", "data.num_clients=4", "cohort=4", "rounds=4", "eval_every=2",
        "seeds=[0]", "batch_size=4", "gcivr.q=2", "gcivr.refresh_batches=2",
    ]  # fmt: skip
    results, stdout = run_recipe("feddro_fairness", out, 1, *args)
    table = stdout.split("final metrics per method")[1].splitlines()
    assert "test violation" in table[1]
    assert [line.split()[0] for line in table[3:7]] == ["feddro", "ds_feddro", "gcivr", "fedavg"]
    cfg = load_config(args, FAIR)
    data = build_data(cfg, 0).to("cpu", DTYPES[cfg.dtype])
    model = build_model("logreg", tuple(data.x_train.shape[1:]), 2, 0)
    run_dir = the_run(out, "feddro_fairness")
    for name in FAIR["updaters"]:
        ckpt = final_checkpoint(run_dir / f"{name}-seed0")
        with torch.no_grad():
            logits = torch.func.functional_call(model, ckpt["loop"]["server"]["x"], (data.x_val,))
        pred = (logits[:, 1] > logits[:, 0]).numpy()
        label, group = data.y_val[:, 0].numpy() == 1, data.y_val[:, 1].numpy()
        gaps = [abs(pred[label].mean() - pred[label & (group == a)].mean()) for a in (0, 1)]
        assert results["results"][name][0]["val/violation"] == pytest.approx(max(gaps), abs=1e-12)
