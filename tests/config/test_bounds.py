"""Every range a shipped updater or problem declares (:class:`lit_fedco.core.ranges.Bound`) is
refused before torch is imported, in the line its dataclass gives when it is built: for each
bound of the catalog, a value just past it is checked both ways and the lines compared."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from lit_fedco.config import catalog
from lit_fedco.config.early import check_values
from lit_fedco.config.load import load, node_params
from lit_fedco.config.parser import parse
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.ranges import declared_bounds
from lit_fedco.problems import available_problems, get_problem
from lit_fedco.updaters import available_updaters, get_updater

DEFAULTS = importlib.import_module("lit_fedco.recipes.comfedl_dro").DEFAULTS
CATALOG = catalog.load()
NODES = {n: "updater" for n in available_updaters()} | {n: "problem" for n in available_problems()}
BOUNDED = sorted(k for k in CATALOG["checks"] if k.split(".")[0] in NODES)


def _past(check: dict[str, Any], kind: str) -> Any:
    """A value just outside a catalog range check, of the key's type."""
    step = 1 if kind == "int" else 0.5
    if "gt" in check:
        return check["gt"]
    if "ge" in check:
        return check["ge"] - step
    if "lt" in check:
        return check["lt"]
    return check["le"] + step


def _message(call) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    return str(err.value)


def test_every_declared_bound_of_a_shipped_node_is_in_the_catalog():
    declared = set()
    for name in NODES:
        cls = get_updater(name).hparams_cls if NODES[name] == "updater" else (
            get_problem(name).params_cls)  # fmt: skip
        declared |= {f"{name}.{key}" for key in declared_bounds(cls)}
    assert declared == set(BOUNDED)
    assert len(BOUNDED) > 60  # every updater's lr and local_steps, and the rest


@pytest.mark.parametrize("dotted", BOUNDED)
def test_a_value_past_a_bound_is_refused_early_in_the_dataclass_line(dotted):
    node, key = dotted.split(".")
    check = CATALOG["checks"][dotted]
    kind = CATALOG["nodes"][node]["keys"][key]["type"]
    cfg = load(parse([f"{dotted}={_past(check, kind)}"], DEFAULTS))
    early = _message(lambda: check_values(cfg, CATALOG))
    assert early == _message(lambda: node_params(cfg, node))
    assert early.startswith(f"{dotted}: got ")
    variant = load(parse([f"variants=[{dotted}={_past(check, kind)}]"], DEFAULTS))
    assert _message(lambda: check_values(variant, CATALOG)) == (
        f"{early} (in variant '{dotted}={_past(check, kind)}')"
    )


def test_the_limits_themselves_pass_both_ways():
    argv = []
    for dotted in BOUNDED:
        check = CATALOG["checks"][dotted]
        edge = check.get("ge", check.get("le"))
        if edge is not None and dotted.split(".")[0] in ("comfedl", "client_dro", "maml", "fedavg"):
            argv.append(f"{dotted}={edge}")
    assert len(argv) >= 4
    cfg = load(parse(argv, DEFAULTS))
    check_values(cfg, CATALOG)
    for node in ("comfedl", "client_dro", "maml", "fedavg"):
        node_params(cfg, node)
