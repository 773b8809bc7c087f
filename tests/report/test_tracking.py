"""Real W&B (offline, read back from its own transaction log) and CSV logging."""

from __future__ import annotations

import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lit_fedco.core.errors import ConfigError
from lit_fedco.report.tracking import (
    check_tracking,
    finalize_loggers,
    make_loggers,
    plain_config,
    read_wandb_offline_run,
    wandb_mode,
    wandb_records,
)
from tests.helpers import REPO

CONFIG = {
    "updater": "comfedl",
    "rounds": 4,
    "comfedl": {"gamma": 0.5, "betas": [0.9, 0.99]},
    "tracking": ["wandb", "csv"],
    "resume": None,
    "vectorized": True,
}


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """A fresh HOME (no ~/.netrc, no wandb settings) and no W&B variables: a CI machine."""
    for key in list(os.environ):
        if key.startswith("WANDB_") or key == "NETRC":
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_wandb_offline_round_trip(tmp_path, monkeypatch, no_credentials):
    """No credentials → offline, without a prompt; the run holds the config and metrics (the
    CSV and JSONL records are the run folder's, tests/experiment/test_run_folders.py)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # nothing may be written outside out_dir
    assert wandb_mode() == "offline"
    out = tmp_path / "out"
    loggers = make_loggers(["wandb", "csv"], out, "rec-comfedl-seed0", "lit_fedco-test", CONFIG)
    logged = [
        (1, {"train/loss": 0.75}),
        (2, {"train/loss": 0.5, "val/acc_worst": 1 / 3}),
        (3, {"train/loss": 0.25}),
        (4, {"train/loss": 0.125, "val/acc_worst": 2 / 3}),
    ]
    for step, metrics in logged:
        for logger in loggers:
            logger.log_metrics(metrics, step=step)
    finalize_loggers(loggers)
    assert list(cwd.iterdir()) == []

    (run_dir,) = (out / "wandb").glob("offline-run-*")
    run = read_wandb_offline_run(run_dir, wait=60)
    assert run["name"] == "rec-comfedl-seed0" and run["project"] == "lit_fedco-test"
    assert run["config"] == CONFIG and run["exit_code"] == 0
    added = {"_step", "_runtime", "_timestamp", "trainer/global_step"}  # by W&B and Lightning
    history = [
        (h["trainer/global_step"], {k: v for k, v in h.items() if k not in added})
        for h in run["history"]
    ]
    assert history == logged  # floats exactly: JSON round trip
    assert run["summary"]["val/acc_worst"] == 2 / 3 and run["summary"]["train/loss"] == 0.125
    assert sorted(p.name for p in out.iterdir()) == ["wandb"]  # csv: nothing from the tracker


def test_transaction_log_checks(tmp_path):
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"not a wandb file")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        list(wandb_records(bad))
    with pytest.raises(FileNotFoundError, match=r"expected one run-\*.wandb file"):
        read_wandb_offline_run(tmp_path / "nowhere")


def test_disabled_writes_nothing(tmp_path, monkeypatch, no_credentials):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    assert make_loggers(["wandb"], tmp_path / "o", "r", "p", {"a": 1}) == []
    monkeypatch.delenv("WANDB_MODE")
    assert make_loggers(["none"], tmp_path / "o", "r", "p", {}) == []
    assert make_loggers([], tmp_path / "o", "r", "p", {}) == []
    assert not (tmp_path / "o").exists()


def test_mode_follows_credentials(tmp_path, monkeypatch, no_credentials):
    assert wandb_mode() == "offline"
    netrc = no_credentials / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    os.chmod(netrc, 0o600)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")  # a private server
    assert wandb_mode() == "offline"
    monkeypatch.setenv("NETRC", str(netrc))
    netrc.write_text("machine wandb.example.com\n  login user\n  password abc\n")
    assert wandb_mode() == "online"
    monkeypatch.delenv("NETRC")
    netrc.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_mode() == "offline"


def test_wandb_mode_errors(monkeypatch, no_credentials):
    monkeypatch.setenv("WANDB_MODE", "online")  # would prompt for a key: fail before starting
    with pytest.raises(ConfigError, match=r"WANDB_MODE: got 'online', but no W&B credentials"):
        check_tracking(["csv", "wandb"])
    check_tracking(["csv"])  # the mode only matters with wandb
    monkeypatch.setenv("WANDB_MODE", "offlin")
    with pytest.raises(ConfigError, match=r"WANDB_MODE: got 'offlin', expected one of"):
        wandb_mode()


def test_unknown_tracker_is_rejected(tmp_path):
    msg = r"tracking: got 'wandbb', expected a list of 'wandb', 'csv' or 'none'; set e\.g\."
    with pytest.raises(ConfigError, match=msg):
        make_loggers(["wandbb"], tmp_path, "r", "p", {})
    with pytest.raises(ConfigError, match=r"tracking: got \['none', 'csv'\]"):
        check_tracking(["none", "csv"])
    assert check_tracking("csv") == ["csv"]
    assert not list(tmp_path.iterdir())


def test_plain_config_resolves_interpolations():
    cfg = OmegaConf.create({"a": 1, "b": "${a}", "c": {"d": [1, 2]}})
    assert plain_config(cfg) == {"a": 1, "b": 1, "c": {"d": [1, 2]}}


def test_plain_config():
    cfg = Namespace(a=np.float64(0.5), b=torch.tensor(3), c=(np.int64(2), Path("/x")), d=None)
    assert plain_config(cfg) == {"a": 0.5, "b": 3, "c": [2, "/x"], "d": None}
    assert type(plain_config(np.float64(0.5))) is float


SCRIPT = """
import atexit, sys
from pathlib import Path

import lit_fedco
from lit_fedco.recipes.comfedl_dro import DEFAULTS


class Unflushed:
    def on_eval_end(self, *args, **kwargs):
        sys.stdout.write("[callback: no newline, no flush]")


@atexit.register
def at_exit():
    Path(sys.argv[-1].partition("=")[2], "atexit.txt").write_text("ran")
    sys.stdout.write("[at exit: no newline, no flush]")


if __name__ == "__main__":
    lit_fedco.main("comfedl_dro", DEFAULTS, callbacks=[Unflushed()])
"""


def test_a_recipe_run_as_a_program_leaves_its_output_complete(tmp_path, no_credentials):
    """A script ending through :func:`lit_fedco.main` (as every recipe's ``python -m`` does)
    skips the interpreter's teardown, yet its exit functions run, what it wrote to a pipe
    arrives whole, its CSV and JSONL records and its W&B offline run are complete (read back
    from W&B's own log), and the exit code is 0."""
    import json
    import subprocess
    import sys

    from tests.helpers import REPO

    script = tmp_path / "my_recipe.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered
    env.update(WANDB_MODE="offline", PYTHONPATH=str(REPO))
    argv = ["updaters=[fedavg]", "seeds=[0]", "rounds=6", "eval_every=3", "progress=false",
            "tracking=[wandb,csv]", "run_name=prog", f"out_dir={tmp_path}"]  # fmt: skip
    cmd = [sys.executable, str(script), *argv]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "final metrics" in done.stdout and "  results.json\n" in done.stdout
    assert done.stdout.count("[callback: no newline, no flush]") == 2  # rounds 3 and 6
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert done.stdout.endswith("[at exit: no newline, no flush]")
    sub = tmp_path / "comfedl_dro" / "prog" / "fedavg-seed0"
    lines = [json.loads(x) for x in (sub / "metrics.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines if "train/loss" in x][-1] == 6
    assert len((sub / "metrics.csv").read_text().splitlines()) > 1
    offline = sorted((tmp_path / "comfedl_dro" / "prog" / "wandb").glob("offline-run-*"))
    runs = {r["name"]: r for r in (read_wandb_offline_run(d, wait=60) for d in offline)}
    assert sorted(runs) == ["comfedl_dro-fedavg-seed0", "comfedl_dro-figures"]  # + the figures
    run = runs["comfedl_dro-fedavg-seed0"]
    assert run["exit_code"] == 0
    steps = [h["trainer/global_step"] for h in run["history"] if "train/loss" in h]
    assert steps[-1] == 6


@pytest.mark.parametrize(
    ("tracking", "mode", "imported"),
    [(["wandb", "csv"], "offline", True), (["csv"], "offline", False),
     (["wandb"], "disabled", False), (["bogus"], "offline", False)],
)  # fmt: skip
def test_wandb_is_imported_before_workers_are_forked_only_where_the_run_tracks_there(
    tracking, mode, imported
):
    """What a ``jobs=N`` launcher imports before forking its workers: W&B's modules (those its
    first run imports) only where the run tracks to W&B, and never a thread or a W&B service
    (a fork stays safe); bad ``tracking`` is left to the run's checks."""
    code = (
        "import os, sys, threading\n"
        "from lit_fedco.report.tracking import import_wandb\n"
        f"import_wandb({tracking!r})\n"
        "print('wandb.sdk.launch.inputs.internal' in sys.modules, 'wandb' in sys.modules,\n"
        "      threading.active_count(), 'WANDB_SERVICE' in os.environ)\n"
    )
    env = {**os.environ, "WANDB_MODE": mode}
    env.pop("WANDB_SERVICE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=REPO, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(imported), str(imported), "1", "False"]
