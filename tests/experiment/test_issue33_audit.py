"""Issue 33's cases that held or were fixed in its audit without a test of their own.

Each runs the recipe as a user would (a real process, real files): a link, a file or a dangling
link where the run folder goes; ``resumes.jsonl`` a link; a sub-run's folder a file;
``config.yaml`` holding YAML that does not parse or an interpolation that does not resolve; a
recipe started inside a run (by an updater or a plugin); a huge file that is no checkpoint;
a ``strategy`` outside the enumeration; and the README's CPU-only install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

RECIPE = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", "seeds=[0]", "progress=false",
          "tracking=[csv]", "eval_every=1", "checkpoint_every=1"]  # fmt: skip


def recipe(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The recipe in a process of its own (FedAvg unless ``argv`` names the updaters), W&B
    off: its exit code, stdout and stderr."""
    full = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    full.pop("LIT_FEDCO_RUN_DIR", None)
    which = [] if any(a.startswith("updaters=") for a in argv) else ["updater=fedavg"]
    return subprocess.run([*RECIPE, *which, *argv], capture_output=True, text=True, cwd=REPO,
                          env=full, timeout=300)  # fmt: skip


def one_line(proc: subprocess.CompletedProcess, pattern: str) -> None:
    """Exit 2 and a single ``lit_fedco:`` line on stderr that contains ``pattern``."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("lit_fedco: ") and pattern in lines[0], lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A complete 2-round run: ``<out>/comfedl_dro/r``."""
    out = tmp_path_factory.mktemp("finished") / "out"
    proc = recipe("rounds=2", "run_name=r", f"out_dir={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def copy_of(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the finished run's ``out_dir``, and a file outside it that must stay as is."""
    out = tmp_path / "out"
    shutil.copytree(finished, out, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep me\n")
    return out, outside


def entries(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``folder`` with its modification time and size (links not followed)."""
    return {str(p): (p.lstat().st_mtime_ns, p.lstat().st_size) for p in folder.rglob("*")}


# ------------------------------------------------------- where the run folder goes (9, 10)
def _link_to_folder(path: Path, outside: Path) -> None:
    path.symlink_to(outside, target_is_directory=True)


def _dangling_link(path: Path, outside: Path) -> None:
    path.symlink_to(outside / "nowhere")


def _a_file(path: Path, outside: Path) -> None:
    path.write_text("not a run\n")


@pytest.mark.slow
@pytest.mark.parametrize("resume", [False, True], ids=["new-run", "resume"])
@pytest.mark.parametrize("put", [_link_to_folder, _dangling_link, _a_file],
                         ids=["link-to-a-folder", "dangling-link", "a-file"])  # fmt: skip
def test_a_link_or_a_file_where_the_run_folder_goes_is_one_line(put, resume, tmp_path):
    """``<out_dir>/<recipe>/<run_name>`` a link (to a folder elsewhere, or to nothing) or a
    file: one line, exit 2; nothing is written through the link."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    (out / "comfedl_dro").mkdir(parents=True)
    outside.mkdir()
    put(out / "comfedl_dro" / "r", outside)
    before = entries(outside)
    proc = recipe("rounds=2", "run_name=r", f"out_dir={out}", *(["resume=auto"] * resume))
    one_line(proc, "comfedl_dro/r")
    assert entries(outside) == before and not (outside / "nowhere").exists()


@pytest.mark.slow
def test_resumes_jsonl_a_link_is_one_line_and_its_target_is_untouched(finished, tmp_path):
    out, outside = copy_of(finished, tmp_path)
    (out / "comfedl_dro" / "r" / "resumes.jsonl").symlink_to(outside / "victim.txt")
    proc = recipe("rounds=3", "run_name=r", f"out_dir={out}", "resume=auto")
    one_line(proc, "resumes.jsonl is a symbolic link, expected the file lit_fedco writes there")
    assert (outside / "victim.txt").read_text() == "keep me\n"


@pytest.mark.slow
def test_a_sub_run_folder_that_is_a_file_is_one_line(finished, tmp_path):
    out, _ = copy_of(finished, tmp_path)
    sub = out / "comfedl_dro" / "r" / "fedavg-seed0"
    shutil.rmtree(sub)
    sub.write_text("not a folder\n")
    proc = recipe("rounds=3", "run_name=r", f"out_dir={out}", "resume=auto")
    one_line(proc, "fedavg-seed0 is a file, expected the folder lit_fedco writes there")
    assert sub.read_text() == "not a folder\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "text,why",
    [("rounds: [1, 2\n  b: }}\n", "ParserError"),
     ("rounds: ${oc.env:NO_SUCH_VARIABLE_33}\n", "InterpolationResolutionError")],
    ids=["invalid-yaml", "unresolvable-interpolation"],
)  # fmt: skip
def test_a_damaged_config_yaml_is_said_and_the_resume_completes(finished, text, why, tmp_path):
    """The run's ``config.yaml`` damaged: one line saying so, written again, the run goes on
    to its new last round (the checkpoints verify what resumes)."""
    out, _ = copy_of(finished, tmp_path)
    run_dir = out / "comfedl_dro" / "r"
    (run_dir / "config.yaml").write_text(text)
    proc = recipe("rounds=3", "run_name=r", f"out_dir={out}", "resume=auto")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"lit_fedco: {run_dir / 'config.yaml'} is damaged ({why}")
    assert "written again from this command line" in lines[0]
    rows = (run_dir / "fedavg-seed0" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["round"] for row in rows] == [1, 2, 3]
    assert "rounds: 3" in (run_dir / "config.yaml").read_text()


# ------------------------------------------------------- a recipe started inside a run (8)
SPAWNER = '''
"""An updater that starts a recipe of its own once, as a plugin might."""
import os
import subprocess
import sys

from torch.func import grad_and_value

import lit_fedco

STARTED = []


class Spawn(lit_fedco.CompositionalUpdater[lit_fedco.Hparams]):
    """Local SGD; its first step runs a whole recipe in a child process."""

    compositions = ("erm",)

    def client_step(self, state, batches, ctx, step):
        if not STARTED:
            STARTED.append(1)
            argv = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", "seeds=[0]",
                    "progress=false", "tracking=[csv]", "updater=fedavg", "rounds=1",
                    "run_name=inner", "out_dir=" + os.environ["INNER_OUT"]]
            proc = subprocess.run(argv, capture_output=True, text=True)
            with open(os.environ["INNER_REPORT"], "w") as f:
                f.write(f"{proc.returncode}\\n{proc.stderr}")
        g, loss = grad_and_value(lambda p: self.objective.value(p, batches, ctx))(state["x"])
        return {"x": lit_fedco.tree_axpy(-self.hparams.lr, g, state["x"])}, {"loss": loss}
'''


@pytest.mark.slow
def test_a_recipe_started_inside_a_run_is_a_run_of_its_own(tmp_path):
    """The run's folder is passed only to the processes Fabric starts: a recipe an updater (or
    a plugin) starts writes its own run in its own ``out_dir``, nothing in the outer run's."""
    (tmp_path / "spawner_33.py").write_text(textwrap.dedent(SPAWNER))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "INNER_OUT": str(tmp_path / "inner"),
           "INNER_REPORT": str(tmp_path / "report")}  # fmt: skip
    proc = recipe("updaters=[spawner_33:Spawn]", "rounds=1", "executor=sequential",
                  "run_name=outer", f"out_dir={tmp_path / 'outer'}", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    code, _, err = (tmp_path / "report").read_text().partition("\n")
    assert code == "0", err[-2000:]
    outer = tmp_path / "outer" / "comfedl_dro" / "outer"
    assert sorted(p.name for p in outer.iterdir() if p.is_dir()) == ["figures", "spawn-seed0"]
    assert not (outer / "resumes.jsonl").exists()
    assert json.loads((outer / "results.json").read_text())["trains"] == {"spawn": "erm"}
    inner = tmp_path / "inner" / "comfedl_dro" / "inner"
    assert (inner / "fedavg-seed0" / "status.json").is_file()


# ------------------------------------------------------- bounded reads (13)
@pytest.mark.parametrize("key", ["resume", "init_from"])
def test_a_huge_file_that_is_no_checkpoint_is_refused_without_reading_it(key, tmp_path):
    """A 20 GiB (sparse) file of zeros: refused from its first bytes, in well under a second,
    not read into memory first."""
    from lit_fedco.store import checkpoint as ckpt

    big = tmp_path / "big.ckpt"
    with open(big, "wb") as f:
        f.truncate(20 << 30)
    start = time.monotonic()
    with pytest.raises(ckpt.CheckpointError, match=rf"^{key}: .*big\.ckpt is not a lit_fedco "):
        ckpt.load(big, key)
    assert time.monotonic() - start < 1.0


# ------------------------------------------------------- enumerations before torch (3)
@pytest.mark.parametrize(
    "arg,said",
    [*((f"strategy={v}", f"strategy: got '{v}', expected one of ('auto', 'ddp') (the loop shards")
       for v in ("bogus", "fsdp", "dp")),
     ("chunk_size=-1", "chunk_size: got -1, expected an int >= 0 (0: no chunks); set e.g. chunk_")],
)  # fmt: skip
def test_an_enumeration_or_range_found_in_the_audit_is_refused_before_torch(arg, said, tmp_path):
    """As the other enumerations (tests/experiment/test_reliability.py): one line, exit 2,
    torch never imported, nothing written."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *RECIPE[1:], arg, f"out_dir={tmp_path / 'out'}"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    imported = {row.rsplit("|", 1)[1].strip().split(".")[0]
                for row in proc.stderr.splitlines() if row.startswith("import time:")}  # fmt: skip
    proc.stderr = "".join(f"{row}\n" for row in proc.stderr.splitlines()
                          if not row.startswith("import time:"))  # fmt: skip
    one_line(proc, said)
    assert "torch" not in imported and not (tmp_path / "out").exists()


# ------------------------------------------------------- the install (5)
def test_the_readme_offers_a_cpu_only_install_and_says_what_each_costs():
    text = (REPO / "README.md").read_text()
    install = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in (
        install
    )
    assert "pip install -e ." in install and "GB" in install and "CPU only" in install
