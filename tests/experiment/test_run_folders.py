"""Results that cannot be overwritten, mislabelled or lost (issue 19): resuming an older
checkpoint branches into a new run, a run is not shortened, one process at a time holds a run
folder (and a killed one does not block it), history is never shortened silently, a run whose
checkpoints are all corrupt is not restarted unasked, a start interrupted before config.yaml
leads somewhere, and a checkpoint does not rewrite the whole record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_fedco.cli import run as main
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from lit_fedco.store import checkpoint as ckpt
from tests.helpers import REPO, override

ARGS = ["updaters=[comfedl]", "seeds=[0]", "progress=false", "tracking=[csv]", "eval_every=5",
        "checkpoint_every=5", "checkpoint_keep=10"]  # fmt: skip


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def run(out: Path, *extra: str) -> list:
    return main("comfedl_dro", DEFAULTS, override([*ARGS, f"out_dir={out}"], extra))


def refused(out: Path, capsys, *extra: str) -> str:
    """The one line a refused command prints (exit code 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run(out, *extra)
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}  # fmt: skip


def metrics(sub: Path) -> list[dict]:
    return [json.loads(line) for line in (sub / "metrics.jsonl").read_text().splitlines()]


def test_resuming_an_older_checkpoint_of_a_finished_run_branches_and_leaves_it_alone(
    tmp_path, capsys
):
    run(tmp_path, "rounds=30", "run_name=ref30")
    ref = tmp_path / "comfedl_dro" / "ref30"
    before = snapshot(ref)
    older = ref / "comfedl-seed0" / "checkpoints" / ckpt.name_of(10)
    # a run of its own from round 10, to round 25, in a new folder
    line = refused(tmp_path, capsys, "rounds=25", f"resume={older}", "run_name=ref30")
    assert "run_name: got 'ref30', but" in line and "goes to a new folder" in line
    capsys.readouterr()
    run(tmp_path, "rounds=25", f"resume={older}", "run_name=branch")
    err = capsys.readouterr().err
    assert f"resume: {older} is round 10 of a complete run ref30; it continues as a new run" in err
    assert snapshot(ref) == before  # nothing of the finished run changed
    branch = tmp_path / "comfedl_dro" / "branch"
    status = json.loads((branch / "comfedl-seed0" / "status.json").read_text())
    assert status["branched_from"] == {"checkpoint": str(older), "round": 10, "run": str(ref)}
    rows = metrics(branch / "comfedl-seed0")
    assert [r["round"] for r in rows] == list(range(1, 26))  # its record from round 1
    assert rows[:10] == metrics(ref / "comfedl-seed0")[:10]
    results = json.loads((branch / "results.json").read_text())
    assert results["branched_from"]["round"] == 10 and results["config"]["rounds"] == 25
    # the same 25 rounds run straight are the same numbers
    run(tmp_path, "rounds=25", "run_name=straight25")
    straight = json.loads((tmp_path / "comfedl_dro" / "straight25" / "results.json").read_text())
    strip = lambda r: {k: v for k, v in r["results"]["comfedl"][0].items() if k != "time_s"}  # noqa: E731
    assert strip(results) == strip(straight)


def test_the_newest_checkpoint_of_a_stopped_run_continues_in_place(tmp_path, capsys):
    run(tmp_path, "rounds=10", "run_name=r")
    sub = tmp_path / "comfedl_dro" / "r" / "comfedl-seed0"
    status = json.loads((sub / "status.json").read_text())
    (sub / "status.json").write_text(json.dumps({**status, "state": "stopped"}))
    newest = sub / "checkpoints" / ckpt.name_of(10)
    run(tmp_path, "rounds=15", f"resume={newest}")
    assert [r["round"] for r in metrics(sub)] == list(range(1, 16))
    assert sorted(p.name for p in (tmp_path / "comfedl_dro").iterdir()) == ["r"]


def test_a_finished_run_is_not_shortened(tmp_path, capsys):
    run(tmp_path, "rounds=15", "run_name=r")
    before = snapshot(tmp_path / "comfedl_dro" / "r")
    line = refused(tmp_path, capsys, "rounds=10", "run_name=r", "resume=auto")
    assert line == (
        "lit_fedco: rounds: got 10, but comfedl-seed0 has run 15 rounds already (its newest "
        "checkpoint); a run is not shortened: set rounds=15 or more to continue it, or start a "
        "new run from an earlier checkpoint with resume=PATH"
    )
    assert snapshot(tmp_path / "comfedl_dro" / "r") == before


def test_history_is_kept_line_by_line_and_what_is_dropped_or_missing_is_said(tmp_path, capsys):
    run(tmp_path, "rounds=12", "run_name=r")
    sub = tmp_path / "comfedl_dro" / "r" / "comfedl-seed0"
    lines = (sub / "metrics.jsonl").read_text().splitlines()
    # a damaged line in the middle, and the last line cut short by a kill
    damaged = [*lines[:4], lines[4][:20], *lines[5:10]]
    (sub / "metrics.jsonl").write_text("\n".join(damaged) + "\n" + lines[10][:30])
    (sub / "checkpoints" / ckpt.name_of(12)).unlink()  # it resumes from round 10
    status = json.loads((sub / "status.json").read_text())
    (sub / "status.json").write_text(json.dumps({**status, "state": "stopped"}))
    capsys.readouterr()
    run(tmp_path, "rounds=14", "run_name=r", "resume=auto")
    err = capsys.readouterr().err
    assert (
        "metrics.jsonl: line(s) 5, 11 cut short or unreadable, dropped; the other 9 rounds" in err
    )
    assert "lacks 1 of the rounds before the checkpoint's round 10 (rounds 5" in err
    rounds = [r["round"] for r in metrics(sub)]
    assert rounds == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14]  # every later line kept
    # a record removed altogether: the rounds before the checkpoint are named as missing
    (sub / "metrics.jsonl").unlink()
    status = json.loads((sub / "status.json").read_text())
    (sub / "status.json").write_text(json.dumps({**status, "state": "stopped"}))
    capsys.readouterr()
    run(tmp_path, "rounds=16", "run_name=r", "resume=auto")
    assert "lacks 14 of the rounds before the checkpoint's round 14 (rounds 1..14" in (
        capsys.readouterr().err
    )


def test_a_run_whose_every_checkpoint_is_corrupt_is_not_restarted_unasked(tmp_path, capsys):
    run(tmp_path, "rounds=10", "run_name=r")
    sub = tmp_path / "comfedl_dro" / "r" / "comfedl-seed0"
    for path in ckpt.listing(sub / "checkpoints"):
        data = path.read_bytes()
        path.write_bytes(data[:-10] + bytes(10))
    line = refused(tmp_path, capsys, "rounds=12", "run_name=r", "resume=auto")
    assert line.startswith("lit_fedco: resume: every checkpoint of comfedl-seed0 fails its check")
    assert "move " in line and "to run comfedl-seed0 again from round 0" in line


def test_a_start_cut_before_config_yaml_leads_somewhere(tmp_path, capsys):
    base = tmp_path / "comfedl_dro"
    (base / "cut").mkdir(parents=True)
    (base / "cut" / ".lock").write_text("")
    run(tmp_path, "rounds=5", "run_name=cut")  # a new run takes the wreck over
    assert (base / "cut" / "results.json").is_file()
    (base / "cut2").mkdir()
    capsys.readouterr()
    run(tmp_path, "rounds=5", "run_name=cut2", "resume=auto")  # so does a resume
    assert "never got past its start" in capsys.readouterr().err
    assert (base / "cut2" / "results.json").is_file()
    # a run whose config.yaml was removed: resume writes it again, a new run is refused
    (base / "cut2" / "config.yaml").unlink()
    line = refused(tmp_path, capsys, "rounds=5", "run_name=cut2")
    assert "already holds a run; continue it with resume=auto" in line
    run(tmp_path, "rounds=7", "run_name=cut2", "resume=auto")
    assert "config.yaml was missing; written again" in capsys.readouterr().err
    assert (base / "cut2" / "config.yaml").is_file()


def test_a_checkpoint_does_not_rewrite_the_record(tmp_path, monkeypatch):
    """metrics.csv is written when a sub-run ends or stops, not at every checkpoint: with a
    checkpoint every round, the CSV is written once."""
    from lit_fedco.store import history

    writes = []
    real = history.History.write_csv
    monkeypatch.setattr(history.History, "write_csv", lambda self: writes.append(1) or real(self))
    run(tmp_path, "rounds=20", "run_name=r", "checkpoint_every=1")
    assert len(writes) == 1
    assert len(ckpt.listing(tmp_path / "comfedl_dro" / "r" / "comfedl-seed0" / "checkpoints")) == 10


@pytest.mark.slow
def test_one_process_at_a_time_holds_a_run_and_a_killed_one_does_not_block_it(tmp_path):
    args = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", *ARGS, f"out_dir={tmp_path}",
            "run_name=x", "rounds=100000"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled"}
    first = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        lock = tmp_path / "comfedl_dro" / "x" / ".lock"
        for _ in range(600):
            if lock.is_file() and lock.read_text():
                break
            time.sleep(0.1)
        time.sleep(2)  # running rounds now
        second = subprocess.run([*args, "resume=auto"], env=env, cwd=REPO, capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            f"lit_fedco: run_name: {tmp_path}/comfedl_dro/x is in use by process {first.pid} on "
            f"{json.loads(lock.read_text())['host']} (since "
            f"{json.loads(lock.read_text())['since']}); wait for it to end, or stop it (kill "
            f"{first.pid}), then run again"
        ]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    third = subprocess.Popen([*args, "resume=auto"], env=env, cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    time.sleep(8)
    third.send_signal(signal.SIGTERM)  # it runs: the stale lock of the killed one did not block
    _, err = third.communicate(timeout=120)
    assert third.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM" in err


def test_a_reader_that_stops_early_costs_the_run_nothing(tmp_path):
    """``... | head -1``: the reader leaves after the first line, whatever the run prints next
    (the partition's statistics, the table); the run still ends with exit code 0 and writes its
    results, table and figures (the output is dropped once its reader has gone)."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    args = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro",
            *override([*ARGS, f"out_dir={tmp_path}"], ["rounds=5", "run_name=head"])]  # fmt: skip
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()  # as head does: the run has printed one line or a few by now
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    run_dir = tmp_path / "comfedl_dro" / "head"
    assert json.loads((run_dir / "results.json").read_text())["results"]["comfedl"]
    assert (run_dir / "table.txt").is_file() and (run_dir / "figures" / "curves.png").is_file()
