"""Crash-safe runs, tested with real processes: ``kill -9`` at random rounds and ``resume=auto``
ends bit-identical to a run never stopped (1 process, and 2 gloo processes resumed on 2);
SIGTERM stops cleanly with a checkpoint; corrupted, truncated and swapped checkpoints are
refused by a one-line message; an unwritable output location damages nothing; two runs at
once in one out_dir keep both results."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_fedco.core.state import tree_leaves
from lit_fedco.store import checkpoint as ckpt
from tests.helpers import REPO, free_port, override

pytestmark = pytest.mark.slow

# ds_feddro on the embedded digits, small: 8 clients, FedDRO's per-step all-reduce and
# DS-FedDRO's server steps; every round takes a few tens of milliseconds
ARGS = [
    "updaters=[feddro,ds_feddro]", "seeds=[0]", "rounds=24", "eval_every=6", "checkpoint_every=3",
    "checkpoint_keep=2", "tracking=[none]", "progress=false", "dtype=float64", "threads=1",
]  # fmt: skip


def command(out: Path, *extra: str, devices: int = 1) -> list[str]:
    return [
        sys.executable, "-m", "lit_fedco.recipes.ds_feddro",
        *override([f"out_dir={out}", f"devices={devices}", *ARGS], extra),
    ]  # fmt: skip


def env() -> dict[str, str]:
    return {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_MODE": "disabled"}


def run(out: Path, *extra: str, devices: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(out, *extra, devices=devices), capture_output=True, text=True, env=env(),
        cwd=REPO, timeout=300,
    )  # fmt: skip


def server_leaves(run_dir: Path, sub: str) -> list[torch.Tensor]:
    found = ckpt.load(ckpt.listing(run_dir / sub / "checkpoints")[-1])
    assert found["loop"]["round"] == 24
    return tree_leaves({"s": found["loop"]["server"], "c": found["loop"]["clients"]})


def rounds_logged(run_dir: Path, sub: str) -> int:
    path = run_dir / sub / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def kill_at(out: Path, name: str, sub: str, at: int, devices: int = 1) -> None:
    """Start the run and ``kill -9`` its whole process group once ``sub`` logged round ``at``."""
    proc = subprocess.Popen(
        command(out, f"run_name={name}", devices=devices), env=env(), cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 240
    try:
        while rounds_logged(out / "ds_feddro" / name, sub) < at:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.time() < deadline
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("devices", [1, 2])
def test_kill_9_at_random_rounds_then_resume_is_bit_identical(tmp_path, devices):
    straight = run(tmp_path, "run_name=straight", devices=devices)
    assert straight.returncode == 0, straight.stderr[-2000:]
    reference = {s: server_leaves(tmp_path / "ds_feddro" / "straight", s)
                 for s in ("feddro-seed0", "ds_feddro-seed0")}  # fmt: skip
    rng = random.Random(devices)
    for trial in range(2):
        name = f"killed{trial}"
        # first in FedDRO (the second sub-run then starts fresh), then in DS-FedDRO
        sub = "feddro-seed0" if trial == 0 else "ds_feddro-seed0"
        kill_at(tmp_path, name, sub, rng.randint(2, 22), devices)
        resumed = run(tmp_path, f"run_name={name}", "resume=auto", devices=devices)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        run_dir = tmp_path / "ds_feddro" / name
        for s, leaves in reference.items():
            got = server_leaves(run_dir, s)
            assert all(torch.equal(a, b) for a, b in zip(got, leaves, strict=True)), (trial, s)
            rounds = [json.loads(line)["round"] for line in
                      (run_dir / s / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
            assert rounds == list(range(1, 25))  # every round once: none lost, none twice
        results = json.loads((run_dir / "results.json").read_text())["results"]
        straight_results = json.loads(
            (tmp_path / "ds_feddro" / "straight" / "results.json").read_text()
        )["results"]
        for method in ("feddro", "ds_feddro"):
            a = {k: v for k, v in results[method][0].items() if k != "time_s"}
            b = {k: v for k, v in straight_results[method][0].items() if k != "time_s"}
            assert a == b
        assert not list(run_dir.rglob(".*.tmp*"))  # no orphaned temporary files


@pytest.mark.parametrize("devices", [1, 2])
def test_sigterm_stops_after_a_checkpoint_and_resume_finishes(tmp_path, devices):
    """SIGTERM to the launching process stops every process after the same round: with 2
    processes, rank 1 learns of it from the stop request carried in a round's aggregation."""
    proc = subprocess.Popen(
        command(tmp_path, "run_name=t", devices=devices), env=env(), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run_dir = tmp_path / "ds_feddro" / "t"
    deadline = time.time() + 120
    while rounds_logged(run_dir, "feddro-seed0") < 5:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM after round" in err and "resume=auto run_name=t" in err
    assert "Traceback" not in err
    stopped_at = json.loads((run_dir / "feddro-seed0" / "status.json").read_text())["round"]
    assert (
        ckpt.load(ckpt.listing(run_dir / "feddro-seed0" / "checkpoints")[-1])["loop"]["round"]
        == stopped_at
    )  # the checkpoint is of the round it stopped after
    resumed = run(tmp_path, "run_name=t", "resume=auto", devices=devices)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = run(tmp_path, "run_name=t", "resume=auto", devices=devices)
    assert again.returncode == 0 and "already complete" in again.stderr + again.stdout


def write_bad(path: Path, how: str) -> Path:
    data = path.read_bytes()
    if how == "flip":
        i = len(data) - 100
        data = data[:i] + bytes([data[i] ^ 1]) + data[i + 1 :]
    elif how == "truncate":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = b""
    elif how == "text":
        data = b"hello\n"
    out = path.with_name(f"{how}.ckpt")
    out.write_bytes(data)
    return out


def test_bad_checkpoints_are_refused_with_one_line(tmp_path):
    ok = run(tmp_path, "run_name=a", "rounds=6", "checkpoint_every=3")
    assert ok.returncode == 0, ok.stderr[-2000:]
    good = ckpt.listing(tmp_path / "ds_feddro" / "a" / "feddro-seed0" / "checkpoints")[0]
    ds = ckpt.listing(tmp_path / "ds_feddro" / "a" / "ds_feddro-seed0" / "checkpoints")[0]
    cases = [
        (write_bad(good, "flip"), "updater=feddro", r"fails its checksum"),
        (write_bad(good, "truncate"), "updater=feddro", r"fails its checksum"),
        (write_bad(good, "empty"), "updater=feddro", r"is not a lit_fedco checkpoint"),
        (write_bad(good, "text"), "updater=feddro", r"is not a lit_fedco checkpoint"),
        (tmp_path / "missing.ckpt", "updater=feddro", r"cannot read .*missing\.ckpt"),
        (ds, "updater=feddro", r"another updater: 'ds_feddro', this run has 'feddro'"),
        (good, "updater=feddro data.imbalance_ratio=5", r"another data partition"),
        (good, "updater=feddro model.hidden=16", r"another model"),
        (
            good,
            "updater=feddro feddro.beta=0.3",
            r"made with feddro\.beta=0\.5, this run has feddro\.beta=0\.3",
        ),
        (good, "updater=feddro sample_dro.lam=2.0", r"made with sample_dro\.lam=1\.0"),
        (good, "updater=ds_feddro", r"another updater"),
    ]
    import re

    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    for path, extra, pattern in cases:
        proc = run(tmp_path / "fresh", f"resume={path}", *extra.split())
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (extra, proc.stderr[-1500:])
        assert len(lines) == 1 and re.search(pattern, lines[0]), (pattern, lines)
    assert not (tmp_path / "fresh").exists()  # refused before anything was written
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == before
    # resume=auto skips a corrupted newest checkpoint for the previous valid one, and says so
    newest = ckpt.listing(tmp_path / "ds_feddro" / "a" / "feddro-seed0" / "checkpoints")[-1]
    newest.write_bytes(newest.read_bytes()[:-10])
    proc = run(tmp_path, "run_name=a", "resume=auto", "rounds=9")
    assert proc.returncode == 0 and "skipped: resume:" in proc.stderr and "checksum" in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions")
def test_read_only_output_location_is_refused_and_nothing_is_damaged(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    (out / "keep.txt").write_text("earlier results")
    out.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        proc = run(out)
        assert proc.returncode == 2 and "out_dir: got" in proc.stderr and "writable" in proc.stderr
    finally:
        out.chmod(stat.S_IRWXU)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "earlier results"


def test_an_output_location_that_refuses_writes_is_refused_even_for_root(tmp_path):
    """/proc takes no new files, whoever asks: the probe finds it before the run starts."""
    proc = run(Path("/proc/lit_fedco-test-out"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-1000:]
    assert lines[0].startswith("lit_fedco: out_dir: got '/proc/lit_fedco-test-out'")
    assert "a writable folder" in lines[0]


def test_a_file_in_the_way_of_out_dir_is_refused(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("not a folder")
    proc = run(blocker / "sub")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "out_dir: got" in proc.stderr and "is a file" in proc.stderr
    assert blocker.read_text() == "not a folder"


def test_a_full_disk_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    """A write that fails part-way (ENOSPC) raises, removes its temporary file and leaves the
    checkpoint of the same name as it was."""
    path = tmp_path / "round-0000003.ckpt"
    ckpt.save(path, {"loop": {"round": 3}})
    before = path.read_bytes()
    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(path, {"loop": {"round": 4}})
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert path.read_bytes() == before and ckpt.load(path)["loop"]["round"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_two_runs_at_once_keep_both_results(tmp_path):
    procs = [
        subprocess.Popen(command(tmp_path, f"rounds={r}"), env=env(), cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (6, 9)
    ]  # fmt: skip
    for p in procs:
        p.communicate(timeout=300)
        assert p.returncode == 0
    runs = sorted((tmp_path / "ds_feddro").iterdir())
    assert len(runs) == 2
    rounds = sorted(json.loads((r / "results.json").read_text())["config"]["rounds"] for r in runs)
    assert rounds == [6, 9]
    for r in runs:
        for sub in ("feddro-seed0", "ds_feddro-seed0"):
            assert json.loads((r / sub / "status.json").read_text())["state"] == "complete"


def test_a_named_run_is_not_overwritten(tmp_path):
    first = run(tmp_path, "run_name=x", "rounds=3")
    assert first.returncode == 0
    table = (tmp_path / "ds_feddro" / "x" / "table.txt").read_text()
    second = run(tmp_path, "run_name=x", "rounds=3")
    assert second.returncode == 2
    assert "already holds a run; continue it with resume=auto" in second.stderr
    assert (tmp_path / "ds_feddro" / "x" / "table.txt").read_text() == table
