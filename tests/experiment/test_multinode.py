"""A run over two "nodes" started by an outside launcher (issue 20): ``torchrun --nnodes=2
--nproc-per-node=1`` (two launcher processes on localhost, gloo) and a SLURM-like environment
(two processes with ``SLURM_PROCID`` 0 and 1, as ``srun`` starts them) give the numbers of one
process: server and kept client state to 1e-12 in float64, the same table. Rank 0 writes the run
folder; the other rank writes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_fedco.core.state import tree_leaves
from tests.helpers import REPO, final_checkpoint, free_port

TOL = 1e-12
ARGS = ["rounds=3", "eval_every=3", "seeds=[0]", "updaters=[comfedl,fedavg]", "dtype=float64",
        "tracking=[none]", "progress=false"]  # fmt: skip
RECIPE = ["-m", "lit_fedco.recipes.comfedl_dro"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LIT_FEDCO_"))}
    return {**env, "WANDB_MODE": "disabled", **extra}


def _one_process(out: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, *RECIPE, *ARGS, f"out_dir={out}", "run_name=one"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "comfedl_dro" / "one"


def _both(commands: list[tuple[list[str], dict[str, str]]]) -> list[subprocess.CompletedProcess]:
    procs = [
        subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for cmd, env in commands
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def _same_numbers(one: Path, two: Path) -> None:
    for name in ("comfedl", "fedavg"):
        a = final_checkpoint(one / f"{name}-seed0")["loop"]
        b = final_checkpoint(two / f"{name}-seed0")["loop"]
        assert a["round"] == b["round"] == 3
        for part in ("server", "clients"):
            for x, y in zip(tree_leaves(a[part]), tree_leaves(b[part]), strict=True):
                torch.testing.assert_close(y, x, rtol=TOL, atol=TOL)
    assert (two / "table.txt").read_text() == (one / "table.txt").read_text()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent /
                    "torchrun").exists(), reason="torchrun is not installed")  # fmt: skip
def test_torchrun_two_nodes_on_localhost_give_the_numbers_of_one_process(tmp_path):
    one = _one_process(tmp_path)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    torchrun = torchrun if Path(torchrun).exists() else "torchrun"
    port = str(free_port())
    common = ["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1"]
    common.append(f"--master-port={port}")
    argv = [*RECIPE, *ARGS, f"out_dir={tmp_path}", "num_nodes=2", "run_name=two"]
    done = _both([([torchrun, *common, f"--node-rank={i}", *argv], _env()) for i in (0, 1)])
    for p in done:
        assert p.returncode == 0, p.stderr[-3000:]
    two = tmp_path / "comfedl_dro" / "two"
    _same_numbers(one, two)
    assert "final metrics per method" in done[0].stdout
    assert "final metrics per method" not in done[1].stdout  # rank 1 prints and writes nothing


@pytest.mark.slow
def test_a_slurm_like_environment_gives_the_numbers_of_one_process(tmp_path):
    one = _one_process(tmp_path)
    port = str(free_port())
    argv = [sys.executable, *RECIPE, *ARGS, f"out_dir={tmp_path}", "num_nodes=2", "run_name=sl"]

    def slurm(rank: int) -> dict[str, str]:
        return _env(SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="1", SLURM_PROCID=str(rank),
                    SLURM_LOCALID="0", SLURM_NODEID=str(rank), SLURM_JOB_NAME="lit_fedco",
                    SLURM_NODELIST="localhost", SLURM_JOB_ID="4242", MASTER_PORT=port)  # fmt: skip

    done = _both([(argv, slurm(i)) for i in (0, 1)])
    for p in done:
        assert p.returncode == 0, p.stderr[-3000:]
    _same_numbers(one, tmp_path / "comfedl_dro" / "sl")


def test_several_processes_from_an_outside_launcher_need_a_run_name(tmp_path):
    env = _env(SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="1", SLURM_PROCID="0", SLURM_LOCALID="0",
               SLURM_NODEID="0", SLURM_JOB_NAME="lit_fedco", SLURM_NODELIST="localhost",
               SLURM_JOB_ID="4242", MASTER_PORT=str(free_port()))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, *RECIPE, *ARGS, f"out_dir={tmp_path}", "num_nodes=2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("lit_fedco: run_name: got '', expected a name every process of the run")
    assert not (tmp_path / "comfedl_dro").exists() or not any((tmp_path / "comfedl_dro").iterdir())
