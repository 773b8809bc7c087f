"""Issue 33, defects 11, 14 and 15 (the rest): a full disk at the lock, figures that abort or
are interrupted, a dead rank, the launcher's variables, a 1,000-entry ``variants`` list. Each
bad situation is one line, never a traceback or a hang; real processes, real signals, a real
full file system where this machine lets a test mount one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_fedco.core.errors import ConfigError
from tests.helpers import REPO

RECIPE = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro"]
QUICK = ["seeds=[0]", "progress=false", "tracking=[csv]", "updaters=[fedavg]", "rounds=2"]
BANNER = ("Initializing distributed", "----", "distributed_backend", "All distributed")
"""Lines Lightning prints on every start of several processes (not lit_fedco's)."""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (
        "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK", "RANK",
        "LIT_FEDCO_KILL_AT", "LIT_FEDCO_RUN_DIR", "LIT_FEDCO_RUN_OWNER")}  # fmt: skip
    return {**env, "WANDB_MODE": "disabled", **extra}


def _lines(stderr: str) -> list[str]:
    """What lit_fedco said: stderr without blank lines and Lightning's banner."""
    return [s for s in stderr.splitlines() if s.strip() and not s.startswith(BANNER)]


def _run(out: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 300):
    return subprocess.run([*RECIPE, *QUICK, f"out_dir={out}", *args], capture_output=True,
                          text=True, cwd=REPO, env=env or _env(), timeout=timeout)  # fmt: skip


# ------------------------------------------------------------------ a full disk (defect 11)
@pytest.fixture
def full_disk(tmp_path):
    """A real 64 KiB tmpfs, filled to the last block (needs root; skipped elsewhere)."""
    where = tmp_path / "full"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip()})")
    try:
        fd = os.open(where / "fill", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError, match="No space"):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_fails_the_writability_probe(full_disk):
    from lit_fedco.experiment.rundir import check_writable

    with pytest.raises(ConfigError, match=r"out_dir: .*expected a writable folder .*No space"):
        check_writable(full_disk / "runs", "comfedl_dro")


def test_a_lock_that_cannot_be_written_is_one_line(full_disk):
    from lit_fedco.store.files import lock_run

    run_dir = full_disk / "run"
    run_dir.mkdir()  # a folder and an empty file take no block on tmpfs; the record does
    with pytest.raises(ConfigError, match=r"out_dir: cannot write the lock file .*No space left"):
        lock_run(run_dir)


@pytest.mark.slow
def test_a_run_on_a_full_disk_is_refused_before_anything_is_written(full_disk):
    proc = _run(full_disk / "runs", "run_name=x")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = _lines(proc.stderr)
    assert line.startswith("lit_fedco: out_dir: got ") and "No space left on device" in line
    assert sorted(p.name for p in full_disk.iterdir()) == ["fill"]


# ------------------------------------------------------------- 1,000 variants (defect 15)
def _thousand(last: str) -> str:
    return "variants=[" + ",".join(f"rounds={i + 1}" for i in range(999)) + f",{last}]"


@pytest.mark.parametrize(
    ("last", "line"),
    [
        ("rounds=0", r"rounds: got 0, expected an int >= 1; .* \(in variant 'rounds=0'\)"),
        ("model.name=cnnn", r"model\.name: got 'cnnn', expected one of .*e\.g\. model\.name=cnn"),
        ("roundz=3", r"roundz: unknown config key \(from variant 999\); did you mean 'rounds'\?"),
        ("rounds=abc", r"rounds: got 'abc' \(from variant 999\), expected a value of type int"),
        ("seed=3", r"variants\[999\]: sets seed=3, a key of the whole run"),
        ("rounds=3", r"variants: got variants\[2\] 'rounds=3' and variants\[999\] 'rounds=3'"),
        ("'updaters=[fedavgg]'", r"updater: got 'fedavgg', expected one of"),
    ],
)  # fmt: skip
def test_a_bad_entry_of_a_thousand_variants_is_refused_at_once(last, line, tmp_path):
    """One short line (not the 9 KB list echoed), in a fraction of the minutes it took."""
    started = time.perf_counter()
    proc = subprocess.run([*RECIPE, "seeds=[0]", "progress=false", f"out_dir={tmp_path}",
                           _thousand(last)], capture_output=True, text=True, cwd=REPO,
                          env=_env(), timeout=120)  # fmt: skip
    took = time.perf_counter() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    (said,) = proc.stderr.splitlines()
    assert said.startswith("lit_fedco: ")
    import re

    assert re.search(line, said) and len(said) < 2000, said
    assert took < 5, f"{took:.1f} s (was minutes; under 1 s on an idle machine)"
    assert not any(tmp_path.iterdir())


def test_a_valid_grid_of_a_thousand_variants_is_screened_in_a_second():
    from lit_fedco.config.load import load_config
    from lit_fedco.config.variants import screen_variants
    from lit_fedco.recipes.comfedl_dro import DEFAULTS

    grid = [f"'rounds={r} comfedl.lr={lr} local_steps={s}'"
            for r in range(1, 11) for lr in (0.01 * k for k in range(1, 11))
            for s in range(1, 11)]  # fmt: skip
    cfg = load_config(["seeds=[0]", f"variants=[{','.join(grid)}]"], DEFAULTS)
    assert len(cfg.variants) == 1000
    started = time.perf_counter()
    screen_variants(cfg, {})
    assert time.perf_counter() - started < 2


# ------------------------------------------------------------ figures (defects 11 and 15)
def test_a_drawing_that_raises_or_aborts_is_one_line_and_no_files(tmp_path, capfd):
    from lit_fedco.report.guarded import EMPTY, guarded

    def raises() -> dict:
        raise ValueError("no font\nsecond line")

    assert guarded(raises, tmp_path) == EMPTY
    assert capfd.readouterr().err.splitlines() == [
        f"lit_fedco: figures not made: ValueError: no font; the results are complete in {tmp_path}"
    ]

    def aborts() -> dict:
        import faulthandler

        faulthandler.disable()  # pytest's: it would dump the child's modules on the abort
        os.abort()

    assert guarded(aborts, tmp_path) == EMPTY  # a real abort, in the drawing child
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith("lit_fedco: figures not made: the drawing process was killed by SIGABRT")
    assert guarded(lambda: {"files": [], "plotted": {"a": 1}, "labels": {}}, tmp_path)["plotted"]


def _complete(run_dir: Path) -> None:
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results["results"]) == ["fedavg"] and (run_dir / "table.txt").is_file()


@pytest.mark.slow
def test_a_killed_drawing_leaves_a_complete_run_and_exit_code_0(tmp_path):
    proc = _run(tmp_path, "run_name=k", env=_env(LIT_FEDCO_KILL_AT="figures"))
    run_dir = tmp_path / "comfedl_dro" / "k"
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _lines(proc.stderr) == [
        "lit_fedco: figures not made: the drawing process was killed by SIGKILL; the results "
        f"are complete in {run_dir}"
    ]
    _complete(run_dir)


@pytest.mark.slow
def test_figures_under_a_memory_limit_never_fail_a_complete_run(tmp_path):
    import shlex

    cmd = shlex.join([*RECIPE, *QUICK, f"out_dir={tmp_path}", "run_name=u"])
    proc = subprocess.run(["bash", "-c", f"ulimit -v 4000000; {cmd}"], capture_output=True,
                          text=True, cwd=REPO, env=_env(), timeout=300)  # fmt: skip
    run_dir = tmp_path / "comfedl_dro" / "u"
    assert proc.returncode == 0, proc.stderr[-2000:]
    _complete(run_dir)
    said = _lines(proc.stderr)  # figures made, or not: then one line says so
    assert len(said) <= 1 and all("lit_fedco: figures not made: " in s for s in said), said


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stopped_child(pid: int) -> int | None:
    """A child of ``pid`` that is stopped (``T`` in ``/proc``)."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "T" and int(fields[1]) == pid:
            return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_while_figures_are_drawn_is_one_line(signum, tmp_path):
    args = [*RECIPE, *QUICK, f"out_dir={tmp_path}", "run_name=c"]
    env = _env(LIT_FEDCO_KILL_AT="figures:1:SIGSTOP")  # the drawing child holds still there
    # SIGINT as in a terminal: a shell's background job (CI's own, say) inherits it ignored
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_sigint_default)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while _stopped_child(proc.pid) is None and proc.poll() is None:
            assert time.monotonic() < deadline, "the drawing child never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signum)  # as Ctrl-C does: the whole foreground group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    run_dir = tmp_path / "comfedl_dro" / "c"
    assert proc.returncode == 128 + signum, err[-2000:]
    name = signal.Signals(signum).name
    assert _lines(err) == [
        f"lit_fedco: figures not made: stopped by {name}; the results are complete in {run_dir}"
    ]
    _complete(run_dir)
