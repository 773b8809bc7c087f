"""``lit_fedco.testing.check_updater``, the plug-in contract shipped: the tutorial's SCAFFOLD,
written to a module outside the repository, passes it (all checks, 2 processes included), and
deliberately broken updaters fail it, each at the check it breaks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lit_fedco.testing import CHECKS, ContractError, check_updater
from tests.helpers import REPO

TUTORIAL = REPO / "docs" / "tutorial" / "first_method.md"

BROKEN = '''
"""broken_methods.py: updaters that break the contract, each in one way."""

from typing import ClassVar

from torch.func import grad_and_value

import lit_fedco
from lit_fedco import Sync, tree_axpy


class Local(lit_fedco.CompositionalUpdater[lit_fedco.Hparams]):
    """Local SGD."""

    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND}

    def client_step(self, state, batches, ctx, step):
        g, loss = grad_and_value(lambda p: self.objective.value(p, batches, ctx))(state["x"])
        return {**state, "x": tree_axpy(-self.step_size(), g, state["x"])}, {"loss": loss}

    def step_size(self):
        return self.hparams.lr


class HiddenCounter(Local):
    """Counts its rounds in a Python attribute: a checkpoint does not hold it."""

    rounds_seen = 0

    def server_update(self, server, mean, ctx, info):
        self.rounds_seen += 1
        return {**server, "x": {k: v * (1 + 0.01 * self.rounds_seen) for k, v in mean["x"].items()}}


class CallCounter(Local):
    """Its step size depends on how often client_step was called: once a step under vmap, once
    a client and step in a loop."""

    calls = 0

    def step_size(self):
        self.calls += 1
        return self.hparams.lr * (1 + 0.01 * self.calls)
'''


def _block(marker: str) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", TUTORIAL.read_text(), flags=re.S | re.M)
    return next(b for b in blocks if marker in b)


@pytest.fixture
def outside(tmp_path, monkeypatch) -> Iterator[Path]:
    """A folder outside the repository holding the tutorial's ``my_scaffold.py`` and the
    broken updaters, importable (on ``sys.path``) like a user's own modules."""
    (tmp_path / "my_scaffold.py").write_text(_block("my_scaffold.py"))
    (tmp_path / "broken_methods.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my_scaffold", "broken_methods"):
        sys.modules.pop(name, None)
    from lit_fedco.updaters import base

    registered = dict(base._REGISTRY)
    yield tmp_path
    base._REGISTRY.clear()  # the user's updaters leave with their test, not the process
    base._REGISTRY.update(registered)


@pytest.mark.slow
def test_a_user_updater_passes_the_checks_without_processes(outside):
    from my_scaffold import MyScaffold

    assert REPO not in Path(sys.modules["my_scaffold"].__file__).resolve().parents
    check_updater(MyScaffold, {"lr": 0.1}, processes=False)


@pytest.mark.slow
def test_the_tutorials_check_runs_as_written_from_outside_the_repository(outside):
    """The tutorial's block, as a script in the user's folder: every check, 2 processes too."""
    script = outside / "check_it.py"
    script.write_text(_block("check_updater(MyScaffold"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=outside, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_state_outside_the_checkpoint_fails_resume(outside):
    from broken_methods import HiddenCounter

    with pytest.raises(ContractError, match=r"^check_updater\(HiddenCounter\): resume: "):
        check_updater(HiddenCounter, {"lr": 0.1}, checks=("resume",))


def test_a_step_that_depends_on_how_it_is_called_fails_executors(outside):
    from broken_methods import CallCounter, Local

    check_updater(Local, {"lr": 0.1}, checks=("executors", "traffic"))  # the correct one
    with pytest.raises(ContractError, match=r"^check_updater\(CallCounter\): executors: "):
        check_updater(CallCounter, {"lr": 0.1}, checks=("executors",))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="checks: unknown"):
        check_updater("fedavg", checks=("speed",))
    with pytest.raises(TypeError, match="CompositionalUpdater"):
        check_updater(int)  # type: ignore[arg-type]
    assert CHECKS == ("resume", "executors", "traffic", "failures", "processes")


def test_a_class_defined_in_main_cannot_run_the_process_check():
    from lit_fedco.testing import _importable
    from lit_fedco.updaters import get_updater

    cls = type("Mine", (get_updater("fedavg"),), {"__module__": "__main__"})
    with pytest.raises(ValueError, match="processes=False"):
        _importable(cls)
