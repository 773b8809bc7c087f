"""The command line under generated input (Hypothesis): keys of the real config and keys one
typo away from them, with values of the right type, of the wrong one, and absurd ones. Whatever
comes, a recipe either accepts the command line (it reaches the point where it would start its
processes) or ends with exit code 2 and one line, having written nothing; never a traceback.

The examples are bounded and derandomized (a fixed seed): the same ones run in CI every time."""

from __future__ import annotations

import importlib
import os
import re
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_fedco import cli
from lit_fedco.config import catalog
from lit_fedco.experiment import runner

RECIPES = ["comfedl_dro", "ds_feddro", "fcsg_invariant"]
AVOID = {"out_dir", "plugins", "variants", "init_from", "resume", "project"}
"""Keys not generated: they would write or import outside the test's folder (their own checks
are tested case by case in tests/config/test_bad_inputs.py and tests/config/test_plugins.py)."""


def _keys() -> list[tuple[str, str]]:
    """(key, type) of every leaf of the catalog the recipes know, but :data:`AVOID`."""
    cat = catalog.load()
    out = [(k, v["type"]) for k, v in cat["run"]["keys"].items() if k not in AVOID]
    for name in ("data", "model", "failures", "server_opt", "pretrain"):
        out += [(f"{name}.{k}", v["type"]) for k, v in cat["nodes"][name]["keys"].items()]
    for name in ("comfedl", "fedavg", "drfl", "ds_feddro", "client_dro", "sample_dro", "fcsg_m"):
        out += [(f"{name}.{k}", v["type"]) for k, v in cat["nodes"][name]["keys"].items()]
    return out


KEYS = _keys()
WORDS = st.text(string.ascii_letters + string.digits + "_-./:,[]{}'\" =$\\\n\t", max_size=12)
NUMBERS = st.one_of(
    st.integers(-5, 200),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1e309", "-1e309", ".inf", ".nan", "0x10", "1_000"]),
)
TYPED = {
    "int": st.integers(-3, 12).map(str),
    "float": st.floats(-2, 3, allow_nan=False).map(lambda v: f"{v:.3g}"),
    "str": st.sampled_from(["digits", "auto", "logreg", "mlp", "cpu", "kl", "x", ""]),
    "bool": st.sampled_from(["true", "false"]),
    "list[str]": st.sampled_from(["[fedavg]", "[csv]", "[none]", "[comfedl,fedavg]", "[]"]),
    "list[int]": st.sampled_from(["[0]", "[0,1]", "[]", "[1,1]"]),
    "list[float]": st.sampled_from(["[0.1]", "[]"]),
}


@st.composite
def items(draw: st.DrawFn) -> str:
    key, kind = draw(st.sampled_from(KEYS))
    how = draw(st.sampled_from(["typed", "typed", "number", "word", "typo"]))
    if how == "typo":
        i = draw(st.integers(0, len(key) - 1))
        key = draw(
            st.sampled_from([key[:i] + key[i + 1 :], key + "x", "." + key, key.replace(".", "..")])
        )
    if how in ("typed", "typo"):
        value = draw(TYPED.get(kind, WORDS))
    elif how == "number":
        value = str(draw(NUMBERS))
    else:
        value = draw(WORDS)
    return f"{key}={value}"


class Accepted(Exception):
    """Raised where the recipe would start its processes: every check passed."""


@pytest.fixture
def stop_before_training(monkeypatch):
    def make_fabric(cfg, callbacks=None):  # type: ignore[no-untyped-def]
        raise Accepted

    monkeypatch.setattr(runner, "make_fabric", make_fabric)
    monkeypatch.setenv("WANDB_MODE", "disabled")


EXAMPLES = int(os.environ.get("LIT_FEDCO_CLI_EXAMPLES", "80"))
"""Bounded in CI; raise it to hunt (``LIT_FEDCO_CLI_EXAMPLES=2000``)."""
SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, suppress_health_check=SLOW_OK)
@given(recipe=st.sampled_from(RECIPES), argv=st.lists(items(), min_size=1, max_size=4))
def test_any_command_line_runs_or_is_one_line_with_exit_2(
    recipe, argv, stop_before_training, tmp_path_factory, capsys
):
    out = tmp_path_factory.mktemp("out") / "runs"
    defaults = importlib.import_module(f"lit_fedco.recipes.{recipe}").DEFAULTS
    given_keys = {a.partition("=")[0] for a in argv}
    quick = [f"out_dir={out}"] + [a for a in ("progress=false", "tracking=[none]")
                                  if a.partition("=")[0] not in given_keys]  # fmt: skip
    try:
        cli.run(recipe, defaults, [*argv, *quick])
    except Accepted:
        capsys.readouterr()
        return
    except SystemExit as stop:
        err = capsys.readouterr().err
        lines = err.splitlines()
        assert stop.code == 2, (argv, err[-2000:])
        assert len(lines) == 1 and re.match(r"lit_fedco: \S", lines[0]), (argv, err[-2000:])
        assert "Traceback" not in err
        assert not out.exists(), (argv, sorted(p.name for p in out.rglob("*")))
        return
    pytest.fail(f"{argv}: neither accepted nor refused")
