"""A researcher's own updaters brought in by module path (lit_fedco.config.plugins): resolved,
registered, named in the config and described by ``--help``; every way of naming one wrongly is
one line with exit code 2. The modules are written by the tests into a folder of their own."""

from __future__ import annotations

import sys
import textwrap

import pytest

from lit_fedco import cli
from lit_fedco.config.load import load_config
from lit_fedco.config.plugins import snake
from lit_fedco.core.errors import ConfigError
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from lit_fedco.updaters.base import _REGISTRY

PROX = '''
"""A module of a researcher's own."""
from dataclasses import dataclass

from torch.func import grad_and_value

import lit_fedco


@dataclass(frozen=True)
class ProxHparams(lit_fedco.Hparams):
    """FedProx.

    Attributes:
        mu: μ, the proximal weight.
    """

    mu: float = 0.1


class MyProx(lit_fedco.CompositionalUpdater[ProxHparams]):
    """FedProx: local SGD on ℓ(x) + μ/2 ‖x − x̄‖²."""

    def client_step(self, state, batches, ctx, step):
        g, loss = grad_and_value(lambda p: self.objective.value(p, batches, ctx))(state["x"])
        return {"x": lit_fedco.tree_axpy(-self.hparams.lr, g, state["x"])}, {"loss": loss}


@lit_fedco.register("named_prox")
class Named(MyProx):
    """FedProx, registered under a name of its own."""


def not_an_updater():
    """A function."""
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``my_lab/methods.py`` on sys.path; the registry and sys.modules restored afterwards."""
    pkg = tmp_path / "my_lab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "methods.py").write_text(textwrap.dedent(PROX))
    (pkg / "broken.py").write_text("import lit_fedco\n\nx = 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = dict(_REGISTRY)
    yield "my_lab.methods"
    _REGISTRY.clear()
    _REGISTRY.update(registry)
    for name in [m for m in sys.modules if m.startswith("my_lab")]:
        del sys.modules[name]


def test_a_class_by_module_path_is_registered_and_named_in_the_config(user_module):
    cfg = load_config(["updater=my_lab.methods:MyProx", "my_prox.mu=0.5"], DEFAULTS)
    assert list(cfg.updaters) == ["my_prox"] and cfg.my_prox.mu == 0.5
    assert list(cfg.plugins) == ["my_lab.methods"]
    assert _REGISTRY["my_prox"].__name__ == "MyProx"


def test_a_registered_class_keeps_its_name_and_plugins_bring_a_whole_module(user_module):
    cfg = load_config(["updaters=[my_lab.methods:Named,fedavg]"], DEFAULTS)
    assert list(cfg.updaters) == ["named_prox", "fedavg"]
    cfg = load_config(["plugins=[my_lab.methods]", "updaters=[named_prox]"], DEFAULTS)
    assert list(cfg.updaters) == ["named_prox"] and list(cfg.plugins) == ["my_lab.methods"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["updater=my_lab.nowhere:MyProx"], r"^updater: cannot import module 'my_lab.nowhere' \(No module named 'my_lab.nowhere'\); run from the folder"),
        (["updater=no_such_pkg.methods:A"], r"^updater: cannot import module 'no_such_pkg.methods' \(No module named 'no_such_pkg'\)"),
        (["updater=my_lab.methods:Nope"], r"^updater: module 'my_lab.methods' has no class 'Nope' \(its updaters: MyProx, Named\); name one of them"),
        (["updater=my_lab.methods:not_an_updater"], r"^updater: 'my_lab.methods:not_an_updater' is a function, expected a subclass of lit_fedco.CompositionalUpdater"),
        (["plugins=[my_lab.missing]"], r"^plugins: cannot import module 'my_lab.missing'"),
        (["plugins=[my_lab.broken]"], r"^plugins: importing module 'my_lab.broken' failed \(ZeroDivisionError: division by zero at .*broken.py:3\); fix the module"),
        (["updater=my_lab.methods:MyProx", "my_prox.nu=1"], r"^my_prox.nu: unknown config key \(from the command line\); valid keys under my_prox: lr, local_steps, mu"),
        (["updater=my_prox"], r"^updater: got 'my_prox', expected one of .*an updater of your own: updater=my_module:MyUpdater"),
    ],
)  # fmt: skip
def test_a_wrong_module_or_class_is_one_line(argv, message, user_module, capsys, tmp_path):
    with pytest.raises(ConfigError, match=message) as exc:
        load_config(argv, DEFAULTS)
    assert "\n" not in str(exc.value)
    with pytest.raises(SystemExit) as stop:
        cli.run("comfedl_dro", DEFAULTS, [*argv, f"out_dir={tmp_path / 'out'}"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"lit_fedco: {exc.value}"
    assert not (tmp_path / "out").exists()


def test_help_lists_the_hyperparameters_of_a_class_of_ones_own(user_module, capsys):
    cli.run("comfedl_dro", DEFAULTS, ["updater=my_lab.methods:MyProx", "my_prox.mu=0.3", "--help"])
    out = capsys.readouterr().out
    assert "my_prox (trains erm, not client_dro's own local): FedProx: local SGD on" in out
    assert "  my_prox.mu=0.3" in out and "μ, the proximal weight." in out


@pytest.mark.parametrize(
    "name,expected", [("MyScaffold", "my_scaffold"), ("FedAdam", "fed_adam"), ("SCAFFOLD", "scaffold"), ("QFedAvgX", "q_fed_avg_x")]
)  # fmt: skip
def test_snake_case_names(name, expected):
    assert snake(name) == expected
