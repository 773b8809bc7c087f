"""What a run says of itself, and refusals that come at once (issue 33).

- Every row of the table, every sub-run's ``status.json``, ``results.json`` and ``--help`` say
  which composition each updater trains; an updater that declares no ``compositions`` and so
  trains another objective than its problem's own is flagged in one line.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from lit_fedco import cli
from lit_fedco.config import catalog, helptext
from lit_fedco.problems import available_problems, get_problem
from lit_fedco.recipes.ds_feddro import DEFAULTS as DS_DEFAULTS
from lit_fedco.updaters.base import _REGISTRY
from tests.helpers import digits_data

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
    ``Problem.objective_for`` on every build (tests/test_fairness.py)."""
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
