"""Faults at every phase boundary of a run, for real: the process sends itself ``SIGKILL``
(:mod:`lit_fedco.process.faults`) before ``config.yaml`` is written, in the middle of a checkpoint
write, in the middle of a metrics line, during an evaluation, and after the last round before
``results.json``; ``resume=auto`` then completes the run, bit-identical to one never killed.
A write that fails on a full file system (a real ``EFBIG`` from the kernel under a file-size
limit) stops the run with one line, a non-zero exit and a ``status.json`` that says so, and
the run resumes once there is room."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_fedco.process.faults import ENV, POINTS
from lit_fedco.store import checkpoint as ckpt
from tests.helpers import REPO, override

pytestmark = pytest.mark.slow  # real processes

ARGS = [
    "updaters=[comfedl,ditto]", "seeds=[0]", "rounds=6", "eval_every=3", "checkpoint_every=2",
    "checkpoint_keep=2", "tracking=[csv]", "progress=false", "dtype=float64", "threads=1",
]  # fmt: skip
KILLS = {
    "run_folder_created": "run_folder_created",
    "checkpoint_written": "checkpoint_written:3",  # comfedl's round-6 checkpoint
    "metrics_line_half": "metrics_line_half:9",  # ditto's round 3
    "evaluation": "evaluation:3",  # ditto's evaluation after round 3
    "before_results": "before_results",
}


def run(out: Path, *extra: str, kill: str = "", limit: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop(ENV, None)
    if kill:
        env[ENV] = kill

    def cap() -> None:  # a file-size limit: a write past it fails with EFBIG
        if limit:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    argv = override([f"out_dir={out}", *ARGS], extra)
    args = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", *argv]
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
                          preexec_fn=cap)  # fmt: skip


def outcome(run_dir: Path) -> dict:
    """What must not depend on a kill: the results (without times), every round's record,
    and the final server and client-held state."""
    results = json.loads((run_dir / "results.json").read_text())
    finals = {k: [{m: v for m, v in r.items() if m != "time_s"} for r in rows]
              for k, rows in results["results"].items()}  # fmt: skip
    records, states = {}, {}
    for sub in ("comfedl-seed0", "ditto-seed0"):
        lines = (run_dir / sub / "metrics.jsonl").read_text().splitlines()
        records[sub] = [json.loads(line) for line in lines]
        found = ckpt.load(ckpt.listing(run_dir / sub / "checkpoints")[-1])["loop"]
        states[sub] = (found["round"], found["server"], found["clients"])
    return {"finals": finals, "history": results["history"], "records": records, "states": states}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ref")
    proc = run(out, "run_name=ref")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return outcome(out / "comfedl_dro" / "ref")


def test_every_fail_point_is_killed_at():
    assert sorted(KILLS) == sorted(POINTS)


@pytest.mark.parametrize("phase", list(KILLS))
def test_a_kill_at_a_phase_boundary_resumes_bit_identically(phase, reference, tmp_path):
    killed = run(tmp_path, "run_name=k", kill=KILLS[phase])
    assert killed.returncode == -signal.SIGKILL, (phase, killed.stderr[-2000:])
    run_dir = tmp_path / "comfedl_dro" / "k"
    assert run_dir.is_dir() and not (run_dir / "results.json").exists()
    resumed = run(tmp_path, "run_name=k", "resume=auto")
    assert resumed.returncode == 0, (phase, resumed.stderr[-3000:])
    got = outcome(run_dir)
    assert got["finals"] == reference["finals"] and got["history"] == reference["history"]
    assert got["records"] == reference["records"]  # every round once, in order, equal
    for sub, (r, server, clients) in reference["states"].items():
        r2, server2, clients2 = got["states"][sub]
        assert r2 == r == 6
        for a, b in zip(
            ckpt_leaves(server) + ckpt_leaves(clients),
            ckpt_leaves(server2) + ckpt_leaves(clients2),
            strict=True,
        ):
            assert torch.equal(a, b)
    assert not [p for p in run_dir.rglob(".*.tmp*")]  # no temporary file left behind


def ckpt_leaves(tree) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    from lit_fedco.core.state import tree_leaves

    return tree_leaves(tree)


ONE = ["updaters=[comfedl]", "dtype=float32", "rounds=40", "eval_every=3"]
"""One method whose checkpoint (5.6 KB) fits an 8 KB file-size limit and whose record does not."""


def test_a_full_record_stops_the_run_with_one_line_and_it_resumes(tmp_path):
    """metrics.jsonl outgrows an 8 KB file-size limit (the kernel answers EFBIG): exit code 1,
    one line naming the file, the error and the last good checkpoint, ``status.json`` saying
    ``failed`` with the error; without the limit, ``resume=auto`` completes it exactly as a run
    never stopped."""
    straight = run(tmp_path, "run_name=s", *ONE)
    assert straight.returncode == 0, straight.stderr[-3000:]
    full = run(tmp_path, "run_name=f", *ONE, limit=8 * 1024)
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    (line,) = [ln for ln in full.stderr.splitlines() if ln.startswith("lit_fedco: ")]
    assert re.match(
        r"lit_fedco: cannot write \S+/metrics.jsonl \(File too large\) \(after "
        r"round \d+\); the last good checkpoint is \S+round-\d+.ckpt; make room",
        line,
    )
    run_dir = tmp_path / "comfedl_dro" / "f"
    status = json.loads((run_dir / "comfedl-seed0" / "status.json").read_text())
    assert status["state"] == "failed" and "File too large" in status["error"]
    assert status["last_checkpoint"] and not (run_dir / "results.json").exists()
    resumed = run(tmp_path, "run_name=f", *ONE, "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.loads((run_dir / "results.json").read_text())["results"]
    b = json.loads((tmp_path / "comfedl_dro" / "s" / "results.json").read_text())["results"]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time_s"} for r in rows]  # noqa: E731
    assert strip(a["comfedl"]) == strip(b["comfedl"])
    assert (run_dir / "comfedl-seed0" / "metrics.jsonl").read_text() == (
        tmp_path / "comfedl_dro" / "s" / "comfedl-seed0" / "metrics.jsonl").read_text()  # fmt: skip


def test_a_checkpoint_that_cannot_be_written_fails_the_run_and_names_no_checkpoint(
    reference, tmp_path
):
    """A 5 KB limit refuses every float64 checkpoint: the run does not go on, let alone end
    "complete" with exit 0: one line, exit 1, ``status.json`` failed; then it resumes."""
    proc = run(tmp_path, "run_name=c", limit=5 * 1024)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("lit_fedco: ")]
    assert "round-0000002.ckpt (File too large)" in line and "; no checkpoint;" in line
    sub = tmp_path / "comfedl_dro" / "c" / "comfedl-seed0"
    status = json.loads((sub / "status.json").read_text())
    assert status["state"] == "failed" and "cannot write" in status["error"]
    resumed = run(tmp_path, "run_name=c", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert outcome(tmp_path / "comfedl_dro" / "c")["finals"] == reference["finals"]
