"""What a run says of itself, and refusals that come at once (issue 33).

- Every row of the table, every sub-run's ``status.json``, ``results.json`` and ``--help`` say
  which composition each updater trains; an updater that declares no ``compositions`` and so
  trains another objective than its problem's own is flagged in one line.
- A value outside an enumeration or range the catalog knows, or an updater or seed given twice,
  is refused in one line before torch is imported (the near miss offered as the example).
- What was accepted and then crashed: one client, ``WANDB_MODE=' OFFLINE '``, crafted
  checkpoints (integer or ``meta`` weights, a negative round) with a valid checksum.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from lit_fedco import cli
from lit_fedco.config import catalog, helptext
from lit_fedco.problems import available_problems, get_problem
from lit_fedco.recipes.ds_feddro import DEFAULTS as DS_DEFAULTS
from lit_fedco.updaters.base import _REGISTRY
from tests.helpers import digits_data, override

QUICK = ["seeds=[0]", "rounds=1", "eval_every=1", "progress=false", "tracking=[csv]"]

DYN = '''
"""A method of a researcher's own that declares no compositions."""
from torch.func import grad_and_value

import lit_fedco


class MyDyn(lit_fedco.CompositionalUpdater[lit_fedco.Hparams]):
    """FedDyn-like: local SGD."""

    def client_step(self, state, batches, ctx, step):
        g, loss = grad_and_value(lambda p: self.objective.value(p, batches, ctx))(state["x"])
        return {"x": lit_fedco.tree_axpy(-self.hparams.lr, g, state["x"])}, {"loss": loss}


class MyErm(MyDyn):
    """The same, an ERM baseline on purpose."""

    compositions = ("erm",)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``my_rel/methods.py`` on sys.path; the registry and sys.modules restored afterwards."""
    pkg = tmp_path / "my_rel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "methods.py").write_text(textwrap.dedent(DYN))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = dict(_REGISTRY)
    yield "my_rel.methods"
    _REGISTRY.clear()
    _REGISTRY.update(registry)
    for name in [m for m in sys.modules if m.startswith("my_rel")]:
        del sys.modules[name]


@pytest.mark.parametrize("name", available_problems())
def test_each_problem_declares_what_its_objectives_offer(name):
    from lit_fedco.core.models import build_model

    """Here on the digits; fairness (it needs Adult's groups) is checked the same way by
    ``Problem.objective_for`` on every build (tests/objectives/test_fairness.py)."""
    if name == "fairness":
        pytest.skip("needs data with a protected group: checked by objective_for on each build")
    data = digits_data(num_clients=4)
    cls = get_problem(name)
    problem = cls(cls.params_cls(), data)
    model = build_model("mlp", tuple(data.x_train.shape[1:]), problem.num_outputs(), 0, hidden=4)
    assert tuple(problem.objectives(model)) == cls.known_offers(), name
    assert catalog.load()["nodes"][name]["offers"] == list(cls.offers)


def test_an_updater_without_compositions_is_flagged_and_every_row_says_what_it_trains(
    user_module, tmp_path, capsys
):
    out = tmp_path / "out"
    argv = ["updaters=[my_rel.methods:MyDyn,feddro]", *QUICK, f"out_dir={out}", "run_name=r"]
    cli.run("ds_feddro", DS_DEFAULTS, argv)
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert notes == [
        "lit_fedco: note: my_dyn trains 'erm' (it declares no compositions and takes the first "
        "objective=sample_dro offers), not the problem's own 'distributed'; declare "
        "compositions = ('distributed',) in its class to train that one, or compositions = "
        "('erm',) to say it is a baseline"
    ]
    run_dir = out / "ds_feddro" / "r"
    table = (run_dir / "table.txt").read_text().splitlines()
    assert table[1].split()[:2] == ["updater", "trains"]
    rows = [line.split()[:2] for line in table[3:]]
    assert rows == [["my_dyn", "erm"], ["feddro", "distributed"]]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["trains"] == {"my_dyn": "erm", "feddro": "distributed"}
    status = {
        json.loads(p.read_text())["updater"]: json.loads(p.read_text())
        for p in run_dir.glob("*/status.json")
    }
    assert status["my_dyn"]["trains"] == "erm" and status["my_dyn"]["objective"] == "Objective"
    assert status["feddro"]["trains"] == "distributed"
    # declared: a baseline on purpose, not flagged; the table still says it
    argv = ["updaters=[my_rel.methods:MyErm]", *QUICK, f"out_dir={out}", "run_name=s"]
    cli.run("ds_feddro", DS_DEFAULTS, argv)
    assert "note:" not in capsys.readouterr().err
    assert (out / "ds_feddro" / "s" / "table.txt").read_text().splitlines()[3].split()[:2] == [
        "my_erm", "erm"
    ]  # fmt: skip


def test_help_says_what_each_updater_trains(user_module):
    nodes = catalog.load()["nodes"]
    assert helptext.trains_note(nodes, "feddro", "") == " (trains distributed)"
    assert helptext.trains_note(nodes, "fedavg", "client_dro") == (
        " (trains erm, not client_dro's own local)"
    )
    assert helptext.trains_note(nodes, "coda_plus", "auprc") == (
        " (trains minimax, not auprc's own conditional)"
    )
    assert helptext.trains_note(nodes, "fedavg", "") == " (trains erm)"
    assert nodes["fedavg"]["compositions"] == ["erm", "local", "distributed", "conditional"]
    text = cli_help(["updaters=[my_rel.methods:MyDyn,feddro]"])
    assert "my_dyn (trains erm, not sample_dro's own distributed): FedDyn-like" in text
    assert "feddro (trains distributed): FedDRO" in text


def cli_help(argv: list[str]) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli.run("ds_feddro", DS_DEFAULTS, [*argv, "--help"])
    return buf.getvalue()


# ------------------------------------------------------------ refusals before torch (defect 3)
HEAVY = ("torch", "torchvision", "torchmetrics", "lightning", "lightning_fabric", "wandb")


MODELS_RE = r"\('logreg', .*\) or MODULE:NAME"
SOURCES_RE = r"\('digits', .*'digits_st', 'cifar10_st', 'cifar100_st', .*'adult'.*\)"


@pytest.mark.parametrize(
    "argv,line",
    [
        (["model.name=cnnn"], rf"model\.name: got 'cnnn', expected one of {MODELS_RE}; "
         r"set e\.g\. model\.name=cnn$"),
        (["data.partition=dirichlett"], r"data\.partition: got 'dirichlett', expected one of "
         r"\(.*'shards'.*\); set e\.g\. data\.partition=dirichlet$"),
        (["executor=vectorised"], r"executor: got 'vectorised', expected one of \['auto', "
         r"'sequential', 'vectorized'\]; set e\.g\. executor=vectorized$"),
        (["rounds=0"], r"rounds: got 0, expected an int >= 1; set e\.g\. rounds=5$"),
        (["updaters=[fedavg,fedavg]"], r"updaters: got \['fedavg', 'fedavg'\], expected at "
         "least one updater, each once"),
        (["seeds=[1,1]"], r"seeds: got \[1, 1\], expected distinct seeds"),
        (["data.name=adultt"], rf"data\.name: got 'adultt', expected one of {SOURCES_RE}, a "
         r"reader of your own files \('npz', 'imagefolder', 'hf_disk', 'text'\)"),
        (["dtype=float16"], r"dtype: got 'float16', expected one of \['float32', 'float64'\]"),
        (["checkpoint_keep=0"], r"checkpoint_keep: got 0, expected an int >= 1; set e\.g\. "
         r"checkpoint_keep=3$"),
        (["cohort=0"], r"cohort: got 0, expected an int in \[1, 10\] \(K = 10; with another "
         r"data\.num_clients, set cohort too\); set e\.g\. cohort=10$"),
        (["data.num_clients=5"], r"cohort: got 10, expected an int in \[1, 5\] \(K = 5;"),
        (["threads=-1"], r"threads: got -1, expected an int in \[0, \d+\] \(0: the cores shared "
         r"out; at most 4 per CPU core, \d+ here\); set e\.g\. threads=1$"),
        (["jobs=0"], r"jobs: got 0, expected an int in \[1, \d+\]; set e\.g\. jobs=2$"),
        (["failures.drop=1.5"], r"failures\.drop: got 1\.5, expected a float in \[0, 1\]; set "
         r"e\.g\. failures\.drop=0\.1$"),
        (["failures.partial=-0.5"], r"failures\.partial: got -0\.5, expected a float in \[0, 1\]"),
    ],
)  # fmt: skip
def test_enumerations_and_ranges_are_refused_before_torch_is_imported(argv, line, tmp_path):
    import re
    import subprocess

    from tests.helpers import REPO

    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "lit_fedco.recipes.comfedl_dro", *argv,
         f"out_dir={tmp_path / 'out'}"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    imported = {
        row.rsplit("|", 1)[1].strip().split(".")[0]
        for row in proc.stderr.splitlines()
        if row.startswith("import time:") and "|" in row
    }
    lines = [row for row in proc.stderr.splitlines() if not row.startswith("import time:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert re.match(r"lit_fedco: " + line, lines[0]), lines[0]
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert not (tmp_path / "out").exists()


def test_the_checks_read_the_names_from_the_modules_that_define_them():
    from lit_fedco.core.models import MODELS
    from lit_fedco.data import names

    checks = catalog.load()["checks"]
    assert checks["model.name"]["one_of"] == list(MODELS) and checks["model.name"]["refs"]
    assert set(names.PARTITIONS) <= set(checks["data.partition"]["one_of"])
    every = {*names.BUILTIN_SOURCES, *names.OTHER_SOURCES, *names.FILE_READERS}
    assert set(checks["data.name"]["one_of"]) == every
    # a ref with a colon is left to its import (model.name=MODULE:NAME, data.name=MODULE:FN)
    from lit_fedco.config.early import check_values
    from lit_fedco.config.load import load_config
    from lit_fedco.recipes.comfedl_dro import DEFAULTS

    cfg = load_config([], DEFAULTS)
    cfg.model.name, cfg.data.name = "my_models:MyNet", "my_data:load"
    check_values(cfg)


# ------------------------------------------------------- accepted, then crashed (defect 12)
def test_one_client_runs_and_is_evaluated(tmp_path):
    from lit_fedco.recipes.comfedl_dro import DEFAULTS

    out = tmp_path / "out"
    argv = ["updaters=[comfedl,fedavg]", "data.num_clients=1", "cohort=1", *QUICK,
            f"out_dir={out}", "run_name=one"]  # fmt: skip
    rows = dict(cli.run("comfedl_dro", DEFAULTS, argv))
    assert set(rows) == {"comfedl", "fedavg"}
    status = json.loads((out / "comfedl_dro" / "one" / "comfedl-seed0" / "status.json").read_text())
    assert status["state"] == "complete" and len(status["per_client"]) == 1
    assert rows["comfedl"][0]["dro/weight_client0"] == 1.0  # one client: all the weight


def test_wandb_mode_is_passed_on_as_it_was_checked(monkeypatch):
    import os

    from lit_fedco.report.tracking import wandb_mode

    monkeypatch.setenv("WANDB_MODE", " OFFLINE ")
    assert wandb_mode() == "offline" and os.environ["WANDB_MODE"] == "offline"


def _crafted(tmp_path, change) -> tuple[list[str], object]:
    """A real 2-round run, its last checkpoint altered by ``change`` and written back with a
    valid checksum, then ``resume=`` of it: the process's stderr lines and exit code."""
    import contextlib
    import io

    import torch

    from lit_fedco.recipes.comfedl_dro import DEFAULTS
    from lit_fedco.store import checkpoint as ckpt

    out = tmp_path / "out"
    base = ["updater=fedavg", "seeds=[0]", "rounds=2", "eval_every=1", "progress=false",
            "tracking=[csv]", f"out_dir={out}"]  # fmt: skip
    cli.run("comfedl_dro", DEFAULTS, [*base, "run_name=a"])
    (last,) = ckpt.listing(out / "comfedl_dro" / "a" / "fedavg-seed0" / "checkpoints")[-1:]
    content = ckpt.load(last)
    change(content["loop"], torch)
    crafted = tmp_path / "crafted.ckpt"
    crafted.write_bytes(ckpt.encode(content))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
        argv = override(base, ["rounds=3", f"resume={crafted}", "run_name=b"])
        cli.run("comfedl_dro", DEFAULTS, argv)
    assert not (out / "comfedl_dro" / "b").exists()
    return err.getvalue().splitlines(), stop.value.code


def _int_weight(loop, torch):
    x = loop["server"]["x"]
    name = next(iter(x))
    x[name] = torch.ones_like(x[name], dtype=torch.int64)


def _meta_weight(loop, torch):
    x = loop["server"]["x"]
    name = next(iter(x))
    x[name] = torch.empty(x[name].shape, device="meta")


def _negative_round(loop, torch):
    loop["round"] = -5


@pytest.mark.parametrize(
    "change,line",
    [
        (_int_weight, r"resume: .*crafted\.ckpt holds loop\.server\.x\.\S+ as a torch\.int64 "
         r"tensor, expected the floating-point parameter"),
        (_meta_weight, r"resume: .*crafted\.ckpt holds loop\.server\.x\.\S+ = a torch\.strided "
         r"torch\.float32 tensor on meta, expected a dense real tensor holding its values"),
        (_negative_round, r"resume: .*crafted\.ckpt holds loop\.round = -5, expected an int >= 0"),
    ],
)  # fmt: skip
def test_crafted_checkpoints_are_refused_in_one_line(change, line, tmp_path):
    import re

    lines, code = _crafted(tmp_path, change)
    assert code == 2 and len(lines) == 1, lines
    assert re.match(r"lit_fedco: " + line, lines[0]), lines[0]


# ------------------------------------------------------------ the record on resume (defect 6)
def test_metrics_rows_that_do_not_fit_the_checkpoint_are_set_aside(tmp_path):
    from lit_fedco.store.history import SET_ASIDE, History

    rows = [{"round": r, "loss": 1.0 / r} for r in range(1, 22)]  # 21: logged after ckpt 20
    text = "".join(json.dumps(r) + "\n" for r in rows)
    text += '{"round": 99999}\n{"round": 1e400}\n{"round": 5, "loss": 7}\n{"round": "3"}\n'
    (tmp_path / "metrics.jsonl").write_text(text)
    h = History(tmp_path, resumed=20)
    assert [r["round"] for r in h.rows] == list(range(1, 22)) and h.last_round == 21
    assert len(h.notes) == 2 and all("\n" not in n for n in h.notes)
    assert "line(s) 23, 25 cut short or unreadable, dropped" in h.notes[0]
    assert "2 row(s) that do not fit the checkpoint's round 20 (rounds 99999, 5:" in h.notes[1]
    aside = [json.loads(line) for line in (tmp_path / SET_ASIDE).read_text().splitlines()]
    assert [r["round"] for r in aside] == [99999, 5]
    h.append(22, {"loss": 0.5})  # the record goes on after the last round kept
    h.close()
    assert [r["round"] for r in History.read_file(tmp_path / "metrics.jsonl")][-2:] == [21, 22]


def test_a_long_list_of_dropped_lines_is_one_short_line(tmp_path):
    from lit_fedco.store.history import History

    (tmp_path / "metrics.jsonl").write_text("not json\n" * 50_000)
    (note,) = History(tmp_path).notes
    assert "line(s) 1, 2, 3, 4, 5, ... (50000 in all) cut short" in note and len(note) < 300


# ---------------------------------------------------- a damaged run folder (defects 9, 10, 11)
DAMAGES = ("truncate", "garbage", "wrong_type", "folder", "symlink", "fifo")


def damage(path, how: str, outside) -> None:
    """Damage file ``path`` of a run folder one way: emptied, random bytes, a JSON/YAML list,
    a folder, a link to a file ``outside`` the run folder, or a FIFO in its place."""
    import os

    if how == "truncate":
        path.write_bytes(b"")
        return
    if how == "garbage":
        path.write_bytes(bytes(range(256)) * 4)
        return
    if how == "wrong_type":
        path.write_text("[1]\n" if path.suffix in (".json", ".jsonl") else "- 1\n- 2\n")
        return
    path.unlink()
    if how == "folder":
        path.mkdir()
    elif how == "symlink":
        path.symlink_to(outside)
    elif how == "fifo":
        os.mkfifo(path)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A complete 2-round run of two sub-runs, and one file of each kind it wrote (relative
    paths: the first sub-run's files, each checkpoint, one figure of each format)."""
    from lit_fedco.recipes.comfedl_dro import DEFAULTS

    out = tmp_path_factory.mktemp("finished") / "out"
    argv = ["updaters=[fedavg,comfedl]", "seeds=[0]", "rounds=2", "eval_every=1",
            "checkpoint_every=1", "progress=false", "tracking=[csv]", f"out_dir={out}",
            "run_name=r"]  # fmt: skip
    cli.run("comfedl_dro", DEFAULTS, argv)
    run_dir = out / "comfedl_dro" / "r"
    files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
    kinds: dict[str, str] = {}  # one file of each kind: the second sub-run's and the other
    for rel in files:  # figures are written the same way as the first's
        kind = rel.replace("comfedl-seed0", "fedavg-seed0")
        kind = kind.rsplit("/", 1)[0] + Path(kind).suffix if kind.startswith("figures/") else kind
        kinds.setdefault(kind, rel)
    return run_dir, sorted(kinds.values())


def resume_damaged(run_dir, rel: str, how: str, tmp_path) -> tuple[object, list[str], bool]:
    """A copy of the finished run with ``rel`` damaged ``how``, resumed for one more round in
    this process (a hang ends after 120 s): the exit code (0 for a return), the lines on
    stderr, and whether the file outside the run folder a link points to is unchanged."""
    import contextlib
    import io
    import shutil
    import signal

    from lit_fedco.recipes.comfedl_dro import DEFAULTS

    case = tmp_path / "case"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(run_dir.parent.parent, case / "out", symlinks=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n")
    damage(case / "out" / "comfedl_dro" / "r" / rel, how, outside)
    argv = ["updaters=[fedavg,comfedl]", "seeds=[0]", "rounds=3", "eval_every=1",
            "checkpoint_every=1", "progress=false", "tracking=[csv]", f"out_dir={case / 'out'}",
            "run_name=r", "resume=auto"]  # fmt: skip

    def hung(*_):
        raise TimeoutError(f"{rel} {how}: the resume hangs")

    err, code = io.StringIO(), None
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli.run("comfedl_dro", DEFAULTS, argv)
        code = 0
    except SystemExit as stop:
        code = stop.code
    except Exception as exc:  # a traceback: reported as such
        code = f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, err.getvalue().splitlines(), outside.read_text() == "keep me\n"


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGES)
def test_each_damaged_file_of_a_run_folder_is_one_line_or_a_run_that_says_so(
    finished_run, how, tmp_path
):
    """Every file a run writes, damaged ``how``, then ``resume=auto`` with one more round:
    exit 2 with one line, or a complete run whose messages are single ``lit_fedco:`` lines
    (no traceback); the file outside the run folder that a link points to is never written."""
    run_dir, files = finished_run
    kinds = {f.replace("comfedl", "fedavg") for f in files}
    assert {"config.yaml", "results.json", "table.txt", "fedavg-seed0/status.json",
            "fedavg-seed0/metrics.jsonl", "fedavg-seed0/metrics.csv",
            "fedavg-seed0/partition.json"} <= kinds  # fmt: skip
    failures = []
    for rel in files:
        code, err, kept = resume_damaged(run_dir, rel, how, tmp_path)
        one_line = code == 2 and len(err) == 1 and err[0].startswith("lit_fedco: ")
        said = code == 0 and all(line.startswith("lit_fedco: ") for line in err)
        if not (one_line or said) or not kept:
            failures.append(f"{rel} {how}: exit {code!r}, kept {kept}: {err[-3:]!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_a_full_or_closed_stdout_is_one_line_and_the_run_completes(tmp_path):
    import shlex
    import subprocess

    from tests.helpers import REPO

    base = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", "updater=fedavg", "seeds=[0]",
            "rounds=1", "progress=false", "tracking=[csv]", f"out_dir={tmp_path}"]  # fmt: skip
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*base, "run_name=full"], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr.splitlines() == [
        "lit_fedco: stdout cannot be written (No space left on device); the run goes on without "
        "it (its table and results are written to the run folder)"
    ]
    assert (tmp_path / "comfedl_dro" / "full" / "table.txt").is_file()
    proc = subprocess.run(f"{shlex.join(base)} run_name=closed >&-", shell=True, cwd=REPO,
                          stderr=subprocess.PIPE, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == ""
    assert (tmp_path / "comfedl_dro" / "closed" / "table.txt").is_file()


# ------------------------------------------------------------------------ messages (defect 15)
def test_a_non_finite_init_from_is_named_as_such(tmp_path):
    import contextlib
    import io
    import math

    from lit_fedco.recipes.comfedl_dro import DEFAULTS
    from lit_fedco.store import checkpoint as ckpt

    out = tmp_path / "out"
    base = ["updater=fedavg", "seeds=[0]", "rounds=1", "progress=false", "tracking=[csv]",
            f"out_dir={out}"]  # fmt: skip
    cli.run("comfedl_dro", DEFAULTS, [*base, "run_name=a"])
    (last,) = ckpt.listing(out / "comfedl_dro" / "a" / "fedavg-seed0" / "checkpoints")[-1:]
    content = ckpt.load(last)
    x = content["loop"]["server"]["x"]
    name = next(iter(x))
    x[name] = x[name].clone().fill_(math.nan)
    nan = tmp_path / "nan.ckpt"
    nan.write_bytes(ckpt.encode(content))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
        cli.run("comfedl_dro", DEFAULTS, [*base, f"init_from={nan}", "run_name=b"])
    assert stop.value.code == 2
    assert err.getvalue().splitlines() == [
        f"lit_fedco: init_from: {nan} holds non-finite values (NaN or inf) in parameter "
        f"{name!r}; give a checkpoint of a run that did not diverge"
    ]
    assert not (out / "comfedl_dro" / "b").exists()


def test_an_out_dir_with_a_newline_from_a_preset_is_refused():
    from lit_fedco.config.load import load_config
    from lit_fedco.core.errors import ConfigError
    from lit_fedco.experiment.checks import check_run
    from lit_fedco.recipes.comfedl_dro import DEFAULTS

    cfg = load_config([], DEFAULTS)
    cfg.out_dir = "x\ny"  # as a preset's out_dir: "x\ny" gives it
    with pytest.raises(ConfigError, match=r"^out_dir: got 'x\\ny', expected a folder name on one"):
        check_run(cfg)
