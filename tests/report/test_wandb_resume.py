"""A W&B offline run killed (``kill -9``) or stopped (SIGTERM) and resumed holds every round once
when read back from W&B's own files: the folder ``wandb sync`` would upload (``status.json``'s
``wandb_dir``; older folders of the run id are marked synced) has the sub-run's whole record,
rounds 1..N each once with the values of ``metrics.jsonl`` and ``metrics.csv``, the config and a
summary of the last round. Real processes, W&B offline, no server."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lit_fedco.report.tracking import (
    WandbTracker,
    read_wandb_offline_run,
    supersede_offline_runs,
)
from tests.helpers import REPO, free_port, override

ROUNDS = 30
# FedAvg on the embedded digits: a few tens of milliseconds a round
ARGS = [
    "updaters=[fedavg]", "seeds=[0]", f"rounds={ROUNDS}", "eval_every=5", "checkpoint_every=5",
    "checkpoint_keep=2", "tracking=[wandb,csv]", "progress=false", "dtype=float64", "threads=1",
]  # fmt: skip
SUB = "fedavg-seed0"
ADDED = {"_step", "_runtime", "_timestamp", "trainer/global_step"}  # by W&B and Lightning


def command(out: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "lit_fedco.recipes.ds_feddro",
        *override([f"out_dir={out}", f"run_name={name}", *ARGS], extra),
    ]  # fmt: skip


def env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    home.mkdir(exist_ok=True)  # no ~/.netrc, no W&B settings: offline without asking
    return {**keep, "HOME": str(home), "WANDB_MODE": "offline", "MASTER_PORT": str(free_port())}


def rounds_logged(sub_dir: Path) -> int:
    path = sub_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def start(out: Path, name: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        command(out, name, *extra), env=env(out / "home"), cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(proc: subprocess.Popen, sub_dir: Path, rows: int) -> None:
    deadline = time.time() + 240
    while rounds_logged(sub_dir) < rows:
        assert proc.poll() is None, f"ended before round {rows}: {proc.communicate()[1]}"
        assert time.time() < deadline
        time.sleep(0.005)


def kill_9_at(out: Path, name: str, rows: int, *extra: str) -> None:
    """Run, and ``kill -9`` the whole process group once ``metrics.jsonl`` has ``rows`` rows."""
    proc = start(out, name, *extra)
    try:
        wait_for(proc, out / "ds_feddro" / name / SUB, rows)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def finish(out: Path, name: str) -> None:
    done = subprocess.run(command(out, name, "resume=auto"), env=env(out / "home"), cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def to_sync(wandb_dir: Path) -> list[Path]:
    """The folders ``wandb sync`` uploads from ``wandb_dir`` (its own listing, no server)."""
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", "."], cwd=wandb_dir,
        env=env(wandb_dir.parent / "home"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = [line.split()[-1] for line in (done.stdout + done.stderr).splitlines()]
    return sorted((wandb_dir / p).resolve().parent for p in listed if p.endswith(".wandb"))


def csv_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def check_read_back(run_dir: Path, processes: int) -> dict[str, Any]:
    """Every round once, as recorded, in the one folder of the sub-run ``wandb sync`` uploads;
    the run's ``processes`` folders all there, the older ones marked synced."""
    sub_dir = run_dir / SUB
    status = json.loads((sub_dir / "status.json").read_text())
    run_id, newest = status["wandb_id"], Path(status["wandb_dir"])
    folders = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}*"))
    assert len(folders) == processes and newest in folders
    for folder in folders:  # the older ones superseded, with W&B's own marker
        assert (folder / f"run-{run_id}.wandb.synced").exists() == (folder != newest)
    uploaded = [d for d in to_sync(run_dir / "wandb") if run_id in d.name]
    assert uploaded == [newest.resolve()]

    run = read_wandb_offline_run(newest, wait=60)
    assert run["run_id"] == run_id and run["exit_code"] == 0
    assert run["name"] == f"ds_feddro-{SUB}"
    record = [json.loads(line) for line in (sub_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in record] == list(range(1, ROUNDS + 1))
    history = [h for h in run["history"] if "trainer/global_step" in h]
    assert [h["trainer/global_step"] for h in history] == list(range(1, ROUNDS + 1))  # once each
    assert [h["_step"] for h in history] == list(range(ROUNDS))
    logged = [{"round": h["trainer/global_step"], **{k: v for k, v in h.items() if k not in ADDED}}
              for h in history]  # fmt: skip
    assert logged == record  # the values exactly (JSON both ways)
    assert [{k: float(v) for k, v in r.items()} for r in logged] == csv_rows(
        sub_dir / "metrics.csv"
    )
    last = {k: v for r in record for k, v in r.items() if k != "round"}  # each key's last value
    assert {k: v for k, v in run["summary"].items() if k not in ADDED} == last
    assert run["summary"]["trainer/global_step"] == ROUNDS
    assert run["config"]["rounds"] == ROUNDS and run["config"]["updaters"] == ["fedavg"]
    assert run["config"]["resume"] == "auto"  # the config of the process that finished it
    return run


@pytest.mark.slow
def test_killed_twice_and_resumed_holds_every_round_once(tmp_path):
    """kill -9 after the first checkpoint (W&B's buffer dies with the process), resume=auto,
    kill -9 again, resume=auto to the end: the newest folder holds rounds 1..N once each."""
    run_dir = tmp_path / "ds_feddro" / "k"
    kill_9_at(tmp_path, "k", 7)  # past round 5's checkpoint
    first = next((run_dir / "wandb").glob("offline-run-*"))
    kill_9_at(tmp_path, "k", 18, "resume=auto")
    finish(tmp_path, "k")
    check_read_back(run_dir, processes=3)
    # what the first process had on its disk when killed: not every round it recorded
    partial = read_wandb_offline_run(first)
    assert partial["exit_code"] is None and len(partial["history"]) < 7


@pytest.mark.slow
def test_stopped_by_sigterm_and_resumed_holds_every_round_once(tmp_path):
    run_dir = tmp_path / "ds_feddro" / "t"
    proc = start(tmp_path, "t")
    wait_for(proc, run_dir / SUB, 8)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    stopped = json.loads((run_dir / SUB / "status.json").read_text())
    assert stopped["state"] == "stopped"
    before = read_wandb_offline_run(stopped["wandb_dir"], wait=60)  # complete to its round
    steps = [h["trainer/global_step"] for h in before["history"]]
    assert steps == list(range(1, stopped["round"] + 1)) and before["exit_code"] == 1
    finish(tmp_path, "t")
    check_read_back(run_dir, processes=2)


# ---------------------------------------------------------------- without processes
class FakeRun:
    """What :meth:`WandbTracker.catch_up` reads of a run W&B resumed online."""

    def __init__(self, resumed: bool, summary: dict[str, Any]) -> None:
        self.resumed, self.summary = resumed, summary
        self.logged: list[dict[str, Any]] = []

    def log(self, row: dict[str, Any]) -> None:
        self.logged.append(row)


@pytest.mark.parametrize(
    ("resumed", "summary", "first"),
    [(True, {"trainer/global_step": 3}, 4), (True, {}, 1), (False, {}, 1)],
)
def test_catch_up_logs_what_the_run_lacks(resumed, summary, first):
    """Online, a resumed run gets the rows after the last round the server holds; a run new to
    the server (or offline) every row."""
    tracker = WandbTracker(project="p", name="n", mode="offline")
    fake = FakeRun(resumed, summary)
    tracker._experiment = fake  # type: ignore[assignment]
    rows = [{"round": r, "train/loss": 1.0 / r} for r in range(1, 6)]
    tracker.catch_up(rows)
    assert [x["trainer/global_step"] for x in fake.logged] == list(range(first, 6))
    assert all(x["train/loss"] == 1.0 / x["trainer/global_step"] for x in fake.logged)
    assert tracker.whole_record == (not resumed)


def test_supersede_marks_only_the_other_folders_of_the_run(tmp_path):
    def folder(name: str, run_id: str) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"run-{run_id}.wandb").write_bytes(b"")
        return tmp_path / name

    old = folder("offline-run-20260101_000000-abc", "abc")
    same_second = folder("offline-run-20260101_000000-abc-1", "abc")
    other = folder("offline-run-20260101_000000-abcd", "abcd")  # another run, a longer id
    new = folder("offline-run-20260101_000001-abc", "abc")
    assert supersede_offline_runs(new, "abc") == [old, same_second]
    assert supersede_offline_runs(new, "abc") == []  # once
    assert not (other / "run-abcd.wandb.synced").exists()
    assert not (new / "run-abc.wandb.synced").exists()
