"""Issue 33, defects 14 and 15: the launcher's variables checked against ``devices`` and
``num_nodes`` before anything is written (they hung: ``NODE_RANK=1`` on one node, a
``MASTER_ADDR`` that does not resolve), and a rank killed mid-run told in one line by the
process that survives it, the run resumable; Fabric's processes end with the run that started
them. Real processes, real ``kill -9``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lit_fedco.core.errors import ConfigError
from lit_fedco.process.launch_env import check_launch_env, lost_peer_line
from tests.experiment.test_reliability_more import QUICK, RECIPE, _env, _lines
from tests.helpers import REPO, free_port

TWO = SimpleNamespace(devices=2, num_nodes=1)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"NODE_RANK": "1"}, r"NODE_RANK: got '1', expected an int in \[0, 1\) \(num_nodes=1\); unset NODE_RANK"),  # noqa: E501
        ({"NODE_RANK": "x"}, r"NODE_RANK: got 'x', expected an int in \[0, 1\)"),
        ({"LOCAL_RANK": "2"}, r"LOCAL_RANK: got '2', expected an int in \[0, 2\) \(devices=2 per node\)"),  # noqa: E501
        ({"RANK": "-1"}, r"RANK: got '-1', expected an int in \[0, 2\)"),
        ({"WORLD_SIZE": "3"}, r"WORLD_SIZE: got '3', expected 2 \(devices=2 × num_nodes=1\)"),
        ({"MASTER_PORT": "0"}, r"MASTER_PORT: got '0', expected a TCP port in \[1, 65535\]"),
        ({"MASTER_ADDR": "no.such.host.invalid"}, r"MASTER_ADDR: got 'no\.such\.host\.invalid', expected a host name or address that resolves here"),  # noqa: E501
        ({"LIT_FEDCO_RENDEZVOUS_TIMEOUT": "soon"}, r"LIT_FEDCO_RENDEZVOUS_TIMEOUT: got 'soon', expected seconds > 0"),  # noqa: E501
        ({"LIT_FEDCO_RENDEZVOUS_TIMEOUT": "0"}, r"LIT_FEDCO_RENDEZVOUS_TIMEOUT: got '0', expected seconds > 0"),  # noqa: E501
    ],
)  # fmt: skip
def test_launcher_variables_that_do_not_fit_are_named(env, line, monkeypatch):
    for key in (
        "NODE_RANK",
        "LOCAL_RANK",
        "RANK",
        "WORLD_SIZE",
        "MASTER_PORT",
        "MASTER_ADDR",
        "LIT_FEDCO_RENDEZVOUS_TIMEOUT",
    ):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=line):
        check_launch_env(TWO)
    if "LIT_FEDCO_RENDEZVOUS_TIMEOUT" in env:  # read by any run with strategy=ddp
        with pytest.raises(ConfigError, match=line):
            check_launch_env(SimpleNamespace(devices=1, num_nodes=1))
        return
    check_launch_env(SimpleNamespace(devices=1, num_nodes=1))  # one process meets no other


def test_launcher_variables_that_fit_pass(monkeypatch):
    for key, value in {"NODE_RANK": "1", "LOCAL_RANK": "0", "RANK": "1", "WORLD_SIZE": "2",
                       "MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    check_launch_env(SimpleNamespace(devices=1, num_nodes=2))  # torchrun's second node


def test_a_lost_peer_is_told_and_other_errors_are_not():
    gloo = RuntimeError(
        "[/x/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
        "[127.0.0.1]:43708. This is typically caused by a remote worker crashing."
    )
    line = lost_peer_line(gloo, "/runs/comfedl_dro/d")
    assert line == (
        "lit_fedco: another process of this run died or was killed (Connection closed by peer "
        "[127.0.0.1]:43708); this one stopped too; continue from its last checkpoint with: "
        "resume=auto run_name=d out_dir=/runs"
    )
    assert lost_peer_line(ConnectionRefusedError("Connection refused")) is None  # not torch's
    assert lost_peer_line(RuntimeError("shape mismatch")) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "start"),
    [
        ({"NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1"}, "lit_fedco: NODE_RANK: got '1'"),
        ({"MASTER_ADDR": "no.such.host.invalid"}, "lit_fedco: MASTER_ADDR: got 'no.such.host"),
    ],
)
def test_launches_that_hung_are_refused_before_anything_is_written(env, start, tmp_path):
    proc = subprocess.run([*RECIPE, *QUICK, f"out_dir={tmp_path}", "devices=2"],
                          capture_output=True, text=True, cwd=REPO, env=_env(**env),
                          timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith(start)
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_node_that_never_comes_is_one_line_after_the_rendezvous_timeout(tmp_path):
    """Node 0 of a two-node run whose node 1 is never started: it waits
    ``LIT_FEDCO_RENDEZVOUS_TIMEOUT`` seconds, then says so in one line (exit code 1), not a
    traceback, and not torch's 30 minutes."""
    env = _env(NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               LIT_FEDCO_RENDEZVOUS_TIMEOUT="3")  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run([*RECIPE, *QUICK, f"out_dir={tmp_path}", "run_name=alone", "devices=1",
                           "num_nodes=2"], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert time.monotonic() - start < 60
    (line,) = _lines(proc.stderr)
    assert line.startswith("lit_fedco: the run's processes did not all start (Timed out after")
    assert line.endswith(f"then run it again with: resume=auto run_name=alone out_dir={tmp_path}")


def _start_two(out: Path) -> tuple[subprocess.Popen, int]:
    """A long two-process run (gloo), once it has written a checkpoint: (launcher, its rank)."""
    args = [*RECIPE, "seeds=[0]", "progress=false", "tracking=[csv]", "updaters=[fedavg]",
            "rounds=100000", "checkpoint_every=20", f"out_dir={out}", "run_name=d",
            "devices=2"]  # fmt: skip
    env = _env(MASTER_PORT=str(free_port()))
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    ckpts = out / "comfedl_dro" / "d" / "fedavg-seed0" / "checkpoints"
    deadline = time.monotonic() + 240
    while not list(ckpts.glob("round-*.ckpt")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.2)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return proc, int(children[0])


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["rank 1", "launcher"])
def test_a_dead_rank_is_one_line_and_the_run_resumes(killed, tmp_path):
    proc, rank1 = _start_two(tmp_path)
    try:
        os.kill(rank1 if killed == "rank 1" else proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        assert _gone(rank1, 60), "rank 1 outlived the run that started it"
    finally:
        for pid in (proc.pid, rank1):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if killed == "rank 1":  # the launcher survived it: one line, not gloo's traceback
        assert proc.returncode == 1, err[-2000:]
        (line,) = _lines(err)
        assert line.startswith("lit_fedco: another process of this run died or was killed (")
        assert line.endswith(f"resume=auto run_name=d out_dir={tmp_path}")
    resumed = subprocess.run([*RECIPE, "seeds=[0]", "progress=false", "tracking=[csv]",
                              "updaters=[fedavg]", "rounds=60", "checkpoint_every=20",
                              f"out_dir={tmp_path}", "run_name=d", "devices=2", "resume=auto"],
                             capture_output=True, text=True, cwd=REPO,
                             env=_env(MASTER_PORT=str(free_port())), timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (tmp_path / "comfedl_dro" / "d" / "results.json").is_file()
