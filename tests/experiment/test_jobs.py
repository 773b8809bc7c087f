"""A run's sub-runs spread over processes (issue 20): ``jobs=N`` gives the numbers and the table
of ``jobs=1``; a sub-run whose process is killed (``kill -9``) continues alone; the sub-runs
addressed from outside (``--list-sub-runs``, ``sub_run=INDEX``, as a SLURM job array or a W&B
sweep agent runs them) merge into one run folder whose ``resume=auto`` writes the same table."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_fedco.cli import run as main
from lit_fedco.process import serving
from lit_fedco.process.forking import can_fork
from lit_fedco.process.workers import Forked, Task, _longest
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from tests.helpers import REPO, override

ARGS = ["updaters=[comfedl,fedavg]", "seeds=[0,1]", "rounds=120", "eval_every=20",
        "checkpoint_every=10", "progress=false", "tracking=[csv]"]  # fmt: skip


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def recipe(out: Path, *extra: str) -> list[str]:
    argv = override([*ARGS, f"out_dir={out}"], extra)
    return [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", *argv]


def launch(out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.Popen(recipe(out, *extra), cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def finish(proc: subprocess.Popen, timeout: int = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def numbers(run_dir: Path) -> dict:
    """Everything a run's numbers are: its results and every metrics line, without times."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if not k.startswith("time")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    results = json.loads((run_dir / "results.json").read_text())
    rows = {
        sub.parent.name: [strip(json.loads(line)) for line in sub.read_text().splitlines()]
        for sub in sorted(run_dir.glob("*/metrics.jsonl"))
    }
    keep = ("results", "history", "per_client")
    return {"results": strip({k: results[k] for k in keep}), "rows": rows}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict, str]:
    """The run with ``jobs=1``: its numbers and its table."""
    out = tmp_path_factory.mktemp("ref")
    code, _, err = finish(launch(out, "run_name=ref"))
    assert code == 0, err
    run_dir = out / "comfedl_dro" / "ref"
    return numbers(run_dir), (run_dir / "table.txt").read_text()


def test_list_sub_runs_names_every_sub_run_in_order(capsys):
    main("comfedl_dro", DEFAULTS, [*ARGS, "--list-sub-runs"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["index", "folder", "updater", "seed", "variant"]
    rows = [line.split() for line in lines[1:]]
    assert rows == [
        ["0", "comfedl-seed0", "comfedl", "0", "-"],
        ["1", "fedavg-seed0", "fedavg", "0", "-"],
        ["2", "comfedl-seed1", "comfedl", "1", "-"],
        ["3", "fedavg-seed1", "fedavg", "1", "-"],
    ]


def test_list_sub_runs_with_variants_and_a_pre_training(capsys):
    main("comfedl_dro", DEFAULTS, ["updaters=[fedavg]", "seeds=[3]", "pretrain.rounds=2",
                                   "variants=[cohort=5,cohort=10]",
                                   "--list-sub-runs"])  # fmt: skip
    text = capsys.readouterr().out
    assert re.search(r"^0\s+v0-fedavg-seed3\s+fedavg\s+3\s+cohort=5$", text, re.M)
    assert re.search(r"^1\s+v1-fedavg-seed3\s+fedavg\s+3\s+cohort=10$", text, re.M)
    assert "v0-pretrain-seed3, v1-pretrain-seed3" in text


@pytest.mark.skipif(not can_fork(), reason="workers are forked on Linux only")
def test_the_longest_sub_runs_go_first_once_their_kind_has_run_once():
    """Sub-runs whose kind (variant, updater) has not finished yet go first, in the run's order;
    then the kind that took longest: the workers end together on short ones."""
    pairs = [(seed, name) for seed in (0, 1) for name in ("a", "b", "c")]
    todo = [Task(i, f"{u}-seed{s}", [], Path("log"), kind=u) for i, (s, u) in enumerate(pairs)]
    took: dict[str, list[float]] = {}

    def hand_out() -> str:
        return todo.pop(_longest(todo, took)).folder

    assert [hand_out(), hand_out()] == ["a-seed0", "b-seed0"]
    took.update({"a": [0.5], "b": [2.0]})  # both ended; c has not run yet
    assert hand_out() == "c-seed0"
    took["c"] = [1.0]
    assert [hand_out(), hand_out(), hand_out()] == ["b-seed1", "c-seed1", "a-seed1"]


def test_forked_workers_serve_tasks_and_each_ends_when_its_own_input_closes(tmp_path):
    """A worker forked from the launcher answers its tasks (output to the task's log) and ends
    with exit code 0 as soon as its input closes, although another worker was forked after it
    (which must not hold that input open)."""

    def serve(inp, channel):
        serving.serve(inp, channel, main)

    first, second = Forked(serve), Forked(serve)
    try:
        for i, worker in enumerate((first, second)):
            log = tmp_path / f"{i}.txt"
            task = {"recipe": "comfedl_dro", "defaults": DEFAULTS, "main": None,
                    "argv": [*ARGS, "--list-sub-runs"], "log": str(log)}  # fmt: skip
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(json.dumps(task) + "\n")
            assert json.loads(worker.stdout.readline()) == {"code": 0}
            assert re.search(r"^3\s+fedavg-seed1\s", log.read_text(), re.M)
        assert first.stdin is not None
        first.stdin.close()
        assert first.wait(timeout=60) == 0
        assert second.poll() is None
        second.kill()
        assert second.wait(timeout=60) == -signal.SIGKILL
    finally:
        for worker in (first, second):
            if worker.poll() is None:
                worker.kill()


@pytest.mark.skipif(not can_fork(), reason="workers are forked on Linux only")
@pytest.mark.parametrize("own_module", [False, True])
def test_workers_are_forked_only_where_nothing_but_lit_fedcos_code_ran(tmp_path, own_module):
    """A recipe alone: the workers are forks of the launcher (its command line). With a module
    of one's own (``plugins``, which may have computed with torch at import, and a fork after
    torch's thread pool started hangs): fresh ``python -m lit_fedco.worker`` processes."""
    (tmp_path / "my_noop.py").write_text(
        "import torch\n\nNOISE = torch.randn(300, 300) @ torch.randn(300, 300)\n"
    )
    extra = ["plugins=[my_noop]"] if own_module else []
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}  # fmt: skip
    proc = subprocess.Popen(recipe(tmp_path, "run_name=w", "jobs=2", "rounds=4000", *extra),
                            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline, lines = time.monotonic() + 120, []
        while len(lines) < 2 and time.monotonic() < deadline and proc.poll() is None:
            found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
            lines = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in found.stdout.split()]
            time.sleep(0.2)
        assert len(lines) == 2, proc.communicate(timeout=60)
        expected = b"lit_fedco.worker" if own_module else b"lit_fedco.recipes.comfedl_dro"
        assert all(expected in line for line in lines), lines
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)


def test_jobs_2_gives_the_numbers_and_table_of_jobs_1(tmp_path, reference):
    code, out, err = finish(launch(tmp_path, "run_name=two", "jobs=2"))
    assert code == 0, err
    run_dir = tmp_path / "comfedl_dro" / "two"
    assert numbers(run_dir) == reference[0]
    assert (run_dir / "table.txt").read_text() == reference[1]
    assert "4 sub-runs, 2 at a time" in out
    assert len(re.findall(r"\[\d/4\] \S+: complete", out)) == 4
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [
        f"sub_run-{i}.txt" for i in range(4)
    ]
    assert "sub-run 2 (comfedl-seed1) of" in (run_dir / "logs" / "sub_run-2.txt").read_text()


def test_jobs_2_without_a_run_name_and_sub_runs_with_another_spelling_of_out_dir(
    tmp_path, reference, monkeypatch
):
    """The plainest command line, ``jobs=2`` alone: the run is named by its start time
    (``run_name`` is '' in its ``config.yaml``, the name in its workers' command lines), and
    every sub-run completes. A sub-run given the same folder through a relative ``out_dir``
    joins it too: the folder is what makes it the same run."""
    code, out, err = finish(launch(tmp_path, "jobs=2"))
    assert code == 0, err
    (run_dir,) = (tmp_path / "comfedl_dro").iterdir()
    assert numbers(run_dir) == reference[0]
    assert (run_dir / "table.txt").read_text() == reference[1]
    assert len(re.findall(r"\[\d/4\] \S+: complete", out)) == 4
    argv = override([*ARGS, "out_dir=runs"], ["run_name=rel", "sub_run=0"])
    code, _, err = finish(subprocess.Popen(  # out_dir relative to its working folder
        [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", *argv], cwd=tmp_path,
        env={**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    assert code == 0, err
    code, _, err = finish(launch(tmp_path / "runs", "run_name=rel", "sub_run=1"))
    assert code == 0, err
    assert (tmp_path / "runs" / "comfedl_dro" / "rel" / "fedavg-seed0" / "status.json").is_file()


def test_a_killed_sub_run_continues_alone_then_the_run_writes_its_table(tmp_path, reference):
    proc = launch(tmp_path, "run_name=k", "jobs=2")
    run_dir = tmp_path / "comfedl_dro" / "k"
    deadline = time.monotonic() + 120
    while not list(run_dir.glob("*/checkpoints/round-*.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    os.kill(int(workers.stdout.split()[0]), signal.SIGKILL)  # a worker dies mid-sub-run
    code, out, err = finish(proc)
    assert code == 1, err
    failed = re.findall(r"sub-run (\d) \((\S+)\) failed .*continue it alone with: (.*)$", err, re.M)
    assert len(failed) == 1, err
    index, folder, again = failed[0]
    assert "its process died" in out
    assert not (run_dir / "results.json").exists()
    assert (run_dir / folder / "status.json").is_file() or (run_dir / folder).is_dir()
    assert f"out_dir={tmp_path} " in again + " "
    keys = [a for a in again.split() if not a.startswith("out_dir=")]  # launch() gives it
    code, out, err = finish(launch(tmp_path, *keys))  # the one sub-run, alone
    assert code == 0, err
    assert f"sub-run {index} ({folder}) of {run_dir} is complete" in out
    assert not (run_dir / "results.json").exists()  # the table waits for resume=auto
    code, out, err = finish(launch(tmp_path, "run_name=k", "resume=auto"))
    assert code == 0, err
    assert numbers(run_dir) == reference[0]
    assert (run_dir / "table.txt").read_text() == reference[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG: Linux")
@pytest.mark.parametrize("forked", [True, False])
def test_workers_of_a_launcher_killed_with_kill_9_stop_with_a_checkpoint(
    tmp_path, reference, forked, monkeypatch
):
    """``kill -9`` of the launcher: each worker (forked, or ``python -m lit_fedco.worker`` where
    a module of one's own ran) stops its sub-run after the round, with a checkpoint (it does not
    run on unseen, holding the sub-run's lock) and ends quietly; then ``resume=auto jobs=2``
    gives the numbers of an uninterrupted run."""
    extra = []
    if not forked:
        (tmp_path / "my_noop.py").write_text('"""Nothing."""\n')
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO)]))
        extra = ["plugins=[my_noop]"]
    proc = launch(tmp_path, "run_name=orphans", "jobs=2", *extra)
    run_dir = tmp_path / "comfedl_dro" / "orphans"
    deadline = time.monotonic() + 120
    while len({p.parent.parent for p in run_dir.glob("*/checkpoints/round-*.ckpt")}) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.02)  # both sub-runs are past their first checkpoint, far from their end
    found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    workers = [int(pid) for pid in found.stdout.split()]
    assert len(workers) == 2
    proc.kill()
    _, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() and b"Z" not in _state(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker ran on after its launcher was killed"
        time.sleep(0.1)
    running = [json.loads(p.read_text()) for p in run_dir.glob("*-seed*/status.json")]
    assert sorted(s["state"] for s in running) == ["stopped", "stopped"], running
    assert all(s["round"] < 120 and s["last_checkpoint"] for s in running)
    assert "Traceback" not in err
    code, _, err = finish(launch(tmp_path, "run_name=orphans", "resume=auto", "jobs=2", *extra))
    assert code == 0, err
    assert numbers(run_dir) == reference[0]


def _state(pid: int) -> bytes:
    """The state letter of process ``pid`` (``Z``: ended, not yet reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b"Z"


def test_sub_runs_of_a_job_array_merge_into_one_run(tmp_path, reference):
    """As ``sbatch --array=0-3`` would: each element runs ``sub_run=$SLURM_ARRAY_TASK_ID`` into
    the same run folder (two at a time here), then ``resume=auto`` writes the one table."""
    for pair in ((0, 1), (2, 3)):
        procs = [launch(tmp_path, "run_name=arr", f"sub_run={i}", "threads=1") for i in pair]
        for proc in procs:
            code, _, err = finish(proc)
            assert code == 0, err
    run_dir = tmp_path / "comfedl_dro" / "arr"
    assert (run_dir / "config.yaml").is_file() and not (run_dir / "results.json").exists()
    code, _, err = finish(launch(tmp_path, "run_name=arr", "resume=auto"))
    assert code == 0, err
    assert numbers(run_dir) == reference[0]
    assert (run_dir / "table.txt").read_text() == reference[1]


def test_a_sub_run_is_refused_beside_a_whole_run_of_the_same_name(tmp_path):
    proc = launch(tmp_path, "run_name=busy", "rounds=4000")
    run_dir = tmp_path / "comfedl_dro" / "busy"
    deadline = time.monotonic() + 120
    while not (run_dir / "config.yaml").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None
    try:
        other = subprocess.run(recipe(tmp_path, "run_name=busy", "sub_run=1", "rounds=4000"),
                               cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)
    assert other.returncode == 2
    (line,) = other.stderr.splitlines()
    assert re.match(rf"lit_fedco: run_name: {re.escape(str(run_dir))} is in use by process "
                    rf"{proc.pid} on ", line)  # fmt: skip


def test_jobs_2_with_a_pre_training_runs_it_once_per_seed(tmp_path):
    """Each seed's methods start from its pre-training: the first worker to need it runs it, the
    other waits for it; the numbers are those of ``jobs=1``."""
    extra = ["rounds=4", "eval_every=2", "pretrain.rounds=3"]
    for name, jobs in (("one", "jobs=1"), ("two", "jobs=2")):
        code, out, err = finish(launch(tmp_path, f"run_name={name}", jobs, *extra))
        assert code == 0, err
    one, two = tmp_path / "comfedl_dro" / "one", tmp_path / "comfedl_dro" / "two"
    assert numbers(two) == numbers(one)
    assert (two / "table.txt").read_text() == (one / "table.txt").read_text()
    for seed in (0, 1):
        status = json.loads((two / f"pretrain-seed{seed}" / "status.json").read_text())
        assert status["state"] == "complete" and status["round"] == 3
    logs = "".join(p.read_text() for p in (two / "logs").iterdir())
    assert logs.count("pretrain") >= 2  # run inside the workers, not by the launcher
    assert "is already complete" not in out


def test_a_sub_run_with_another_command_line_is_refused(tmp_path):
    code, _, err = finish(launch(tmp_path, "run_name=mix", "sub_run=0", "rounds=4"))
    assert code == 0, err
    code, _, err = finish(launch(tmp_path, "run_name=mix", "sub_run=1", "rounds=4",
                                 "comfedl.lr=0.5", "threads=1"))  # fmt: skip
    assert code == 2
    (line,) = err.splitlines()
    assert line == (
        "lit_fedco: sub_run: run mix was started with comfedl.lr=0.05, this sub-run has "
        "comfedl.lr=0.5; give every sub-run of a run the same command line (only sub_run, "
        "threads and how it executes may differ)"
    )
    run = tmp_path / "comfedl_dro" / "mix"
    assert not (run / "fedavg-seed0").exists()
    assert sorted(p.name for p in run.glob(".lock-*")) == [".lock-comfedl-seed0"]  # sub-run 0's


def test_jobs_2_workers_track_their_sub_runs_in_wandb(tmp_path):
    """The launcher starts one W&B service and every forked worker's W&B runs use it (each
    run's own log says so): every sub-run's offline run is complete (read back from W&B's log:
    its name, exit code and every logged round), beside the launcher's run of the figures."""
    from lit_fedco.report.tracking import read_wandb_offline_run

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", HOME=str(home))
    extra = ["run_name=wb", "jobs=2", "rounds=6", "eval_every=3", "tracking=[wandb,csv]"]
    argv = override([*ARGS, f"out_dir={tmp_path}"], extra)
    proc = subprocess.Popen([sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", *argv],
                            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    code, _, err = finish(proc)
    assert code == 0, err
    offline = sorted((tmp_path / "comfedl_dro" / "wb" / "wandb").glob("offline-run-*"))
    records = [(d, read_wandb_offline_run(d, wait=60)) for d in offline]
    runs = {r["name"]: r for _, r in records}
    folders = ["comfedl-seed0", "fedavg-seed0", "comfedl-seed1", "fedavg-seed1"]
    assert sorted(runs) == sorted([f"comfedl_dro-{f}" for f in folders] + ["comfedl_dro-figures"])
    for folder in folders:
        run = runs[f"comfedl_dro-{folder}"]
        steps = [h["trainer/global_step"] for h in run["history"] if "train/loss" in h]
        assert run["exit_code"] == 0 and steps == [1, 2, 3, 4, 5, 6]
    for d, run in records:  # the workers' runs: the launcher's service (the figures' is its own)
        log = (d / "logs" / "debug.log").read_text()
        shared = "Connected to an existing wandb-core service via WANDB_SERVICE" in log
        assert shared == (run["name"] != "comfedl_dro-figures"), run["name"]


def test_a_worker_reads_the_runs_config_again_once_it_changed(tmp_path):
    """A worker checks each sub-run against the run's ``config.yaml``, read once while the file
    is unchanged: a file written again (another run of the name, resumed) is read again."""
    from lit_fedco.experiment.records import run_config

    path = tmp_path / "config.yaml"
    assert run_config(path) is None
    path.write_text("rounds: 4\ncomfedl:\n  lr: 0.05\n")
    assert run_config(path) == {"rounds": 4, "comfedl.lr": 0.05}
    path.write_text("rounds: 4\ncomfedl:\n  lr: 0.5\n")  # the same size
    os.utime(path, ns=(1, 1))
    assert run_config(path) == {"rounds": 4, "comfedl.lr": 0.5}
    path.write_text("[unclosed")
    assert run_config(path) is None
