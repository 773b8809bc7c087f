"""The configuration's catalog, ``lit_fedco/config/schema.json``: every config key with its type,
default and one-line description, read by the torch-free command line (:mod:`lit_fedco.cli`)
so that ``--help`` and a mistyped key answer before torch is imported.

The catalog is generated from the typed schema (:func:`lit_fedco.config.load.schema`: the run's
dataclasses, every registered updater's hyperparameters and every registered problem's
parameters, in that order) and the dataclasses' Google docstrings (their ``Attributes:``
sections; a field a subclass does not document takes its parent's description). Regenerate it
after changing any of them::

    python -m lit_fedco.config.schema --write

``tests/config/test_schema.py`` fails while the committed file is stale. This module imports
everything (torch included); only the generated file is read on the fast path.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).resolve().parent / "schema.json"
"""The committed catalog."""

WRITE_COMMAND = "python -m lit_fedco.config.schema --write"

TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "list[str]": list[str],
    "list[int]": list[int],
    "list[float]": list[float],
}
"""The field types a config node may have, by their names in the catalog."""
TYPE_NAMES: dict[Any, str] = {tp: name for name, tp in TYPES.items()}

_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``")
_ENTRY = re.compile(r"^(\w+(?:\s*/\s*\w+)*)\s*:\s+(.*)$")


def plain(text: str) -> str:
    """Docstring text as one plain line: reST roles and literals unwrapped, whitespace joined
    (``:class:`~a.b.C``` → ``C``, ````x=1```` → ``x=1``)."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return " ".join(_LITERAL.sub(r"\1", text).split())


def brief(text: str) -> str:
    """A text's first sentence: up to a full stop followed by a capital (``--help`` shows a
    key's first sentence, ``--help-all`` all of it)."""
    m = re.match(r"(.+?\.)\s+(?=[A-Z])", text)
    return m.group(1) if m else text


def first_sentence(doc: str | None) -> str:
    """The first sentence (:func:`brief`) of a docstring's first paragraph, as one plain line."""
    line = brief(plain(inspect.cleandoc(doc or "").split("\n\n", 1)[0]))
    return line.rstrip(":") + "." if line.endswith(":") else line


def attributes(doc: str | None) -> dict[str, str]:
    """Field name → description, parsed from a Google docstring's ``Attributes:`` section.

    An entry ``a / b / c: text`` documents each of the names; continuation lines (indented
    deeper than the entry) are joined to it.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    out: dict[str, str] = {}
    start = next((i for i, line in enumerate(lines) if line.strip() == "Attributes:"), None)
    if start is None:
        return out
    head_indent = len(lines[start]) - len(lines[start].lstrip())
    entry_indent: int | None = None
    names: list[str] = []
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= head_indent:
            break  # the next section
        if entry_indent is None:
            entry_indent = indent
        m = _ENTRY.match(line.strip())
        if indent == entry_indent and m:
            names = [n.strip() for n in m.group(1).split("/")]
            for name in names:
                out[name] = m.group(2)
        elif indent > entry_indent and names:
            for name in names:
                out[name] += " " + line.strip()
    return {k: plain(v) for k, v in out.items()}


def field_docs(cls: type) -> dict[str, str]:
    """Every documented field of dataclass ``cls``: its own docstring first, then its bases'."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        docs.update(attributes(klass.__dict__.get("__doc__")))
    return docs


def node_entry(
    cls: type, kind: str, help_text: str, strict: bool = True, **extra: Any
) -> dict[str, Any]:
    """The catalog entry of one config node: dataclass ``cls``'s fields, typed and described.

    Raises:
        ValueError: (``strict``) a field without a description in any docstring of ``cls``'s
            classes.
        TypeError: (``strict``) a field type the catalog does not know.
    """
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    keys: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        where = f"{cls.__module__}.{cls.__qualname__}.{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            continue  # a child node, listed on its own
        if f.name not in docs and strict:
            raise ValueError(
                f"{where} has no description: document it in the class's docstring "
                f"(Attributes: {f.name}: ...), then run {WRITE_COMMAND}"
            )
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise ValueError(f"{where} has no default")
        tp = hints[f.name]
        if tp not in TYPE_NAMES and strict:
            raise TypeError(f"{where}: type {tp!r} is not one of {sorted(TYPE_NAMES.values())}")
        name = TYPE_NAMES.get(tp) or getattr(tp, "__name__", str(tp))
        keys[f.name] = {"type": name, "default": default, "help": docs.get(f.name, "")}
    entry: dict[str, Any] = {"kind": kind, "class": f"{cls.__module__}.{cls.__qualname__}"}
    entry.update(extra)
    frozen = bool(cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]
    entry.update(help=help_text, frozen=frozen, keys=keys)
    return entry


def updater_entry(name: str, strict: bool = True) -> dict[str, Any]:
    """The catalog entry of registered updater ``name`` (its hyperparameters). Not ``strict``
    (an updater registered at run time, for ``--help``): undocumented fields are allowed."""
    from lit_fedco.updaters import get_updater

    cls = get_updater(name)
    line = first_sentence(cls.__doc__)
    if strict and not line:
        raise ValueError(
            f"{cls.__module__}.{cls.__qualname__} (updater {name!r}) has no docstring: its first "
            f"sentence is the updater's line in --help; write one, then run {WRITE_COMMAND}"
        )
    return node_entry(cls.hparams_cls, "updater", line, strict,
                      default_problem=cls.default_problem,
                      compositions=list(cls.compositions))  # fmt: skip


def problem_entry(name: str, strict: bool = True) -> dict[str, Any]:
    """The catalog entry of registered problem ``name`` (its parameters)."""
    from lit_fedco.problems import get_problem

    cls = get_problem(name)
    offers = cls.known_offers()
    return node_entry(cls.params_cls, "problem", first_sentence(cls.params_cls.__doc__), strict,
                      offers=list(offers) if offers is not None else None)  # fmt: skip


def build() -> dict[str, Any]:
    """The catalog: the run's keys, then one node per config section in the order of
    :func:`lit_fedco.config.load.schema` (data, model, failures, the updaters, the problems)."""
    from omegaconf import DictConfig

    from lit_fedco.config.fields import RunConfig, schema
    from lit_fedco.problems import available_problems
    from lit_fedco.updaters import available_updaters

    run = node_entry(RunConfig, "run", first_sentence(RunConfig.__doc__))
    nodes: dict[str, Any] = {}
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        child = hints[f.name]
        if dataclasses.is_dataclass(child):
            assert isinstance(child, type)
            nodes[f.name] = node_entry(child, "config", first_sentence(child.__doc__))
    updaters = available_updaters()
    problems = available_problems()
    for name in updaters:
        nodes[name] = updater_entry(name)
    for name in problems:
        nodes[name] = problem_entry(name)
    cfg = schema()  # the catalog's keys are the schema's, node by node
    fields = [f.name for f in dataclasses.fields(RunConfig)]
    layout = [*fields, *updaters, *problems]
    assert [str(k) for k in cfg] == layout, "config.schema() changed its layout"
    for name, node in nodes.items():
        sub = cfg[name]
        assert isinstance(sub, DictConfig)
        assert list(node["keys"]) == [str(k) for k in sub], name
    return {
        "about": f"Generated by `{WRITE_COMMAND}` from lit_fedco's dataclasses; do not edit.",
        "fields": fields,
        "run": run,
        "nodes": nodes,
        "checks": value_checks(),
    }


def value_checks() -> dict[str, Any]:
    """The checks :func:`lit_fedco.config.early.check_values` makes before torch is imported,
    by dotted key: ``one_of`` (the names the key accepts, read from the modules that define
    them; ``refs``: a ``MODULE:NAME`` is accepted too, and checked when it is imported) or a
    range (:class:`~lit_fedco.core.ranges.Bound`'s limits: the run's ints, and every range the
    shipped updaters and problems declare), each with the full check's ``expected`` and
    ``example``."""
    from lit_fedco.core.models import MODEL_BUFFERS, MODELS
    from lit_fedco.core.ranges import Bound, declared_bounds
    from lit_fedco.data import names
    from lit_fedco.engine.executors import AUTO, EXECUTORS
    from lit_fedco.engine.schedule import ACCELERATORS, DTYPES, STRATEGIES, STRATEGY_NOTE

    sources = (*names.BUILTIN_SOURCES, *names.OTHER_SOURCES)
    partitions = (*names.PARTITIONS, "classes")  # classes: the few-shot split's own
    executors = sorted([AUTO, *EXECUTORS])

    def one_of(values: Any, expected: str, example: str, refs: bool = False) -> dict[str, Any]:
        out = {"one_of": list(values), "expected": expected, "example": example}
        return {**out, "refs": True} if refs else out

    def at_least(low: int, expected: str, example: str) -> dict[str, Any]:
        return Bound(expected, example, ge=low).as_check()

    checks: dict[str, Any] = {
        "model.name": one_of(MODELS, f"one of {MODELS} or MODULE:NAME", "logreg", refs=True),
        "data.name": one_of(
            [*sources, *names.FILE_READERS],
            f"one of {sources}, a reader of your own files {names.FILE_READERS} (with "
            "data.data_dir), or a function of your own, MODULE:FUNCTION",
            "digits",
            refs=True,
        ),
        "data.partition": one_of(partitions, f"one of {partitions}", "quantity"),
        "executor": one_of(executors, f"one of {executors}", AUTO),
        "dtype": one_of(sorted(DTYPES), f"one of {sorted(DTYPES)}", "float32"),
        "model.buffers": one_of(MODEL_BUFFERS, f"one of {MODEL_BUFFERS}", "local"),
        "accelerator": one_of(ACCELERATORS, f"one of {ACCELERATORS}", "cpu"),
        "strategy": one_of(STRATEGIES, f"one of {STRATEGIES}{STRATEGY_NOTE}", "auto"),
    }
    for key in ("rounds", "local_steps", "batch_size", "eval_every"):
        checks[key] = at_least(1, "an int >= 1", "5")  # the loop's own (LoopConfig.validate)
    for key in ("devices", "num_nodes"):
        checks[key] = at_least(1, "an int >= 1", "1")
    checks["data.num_clients"] = at_least(1, "an int >= 1", "10")
    checks["checkpoint_every"] = at_least(0, "an int >= 0 (0: only at the end)", "10")
    checks["checkpoint_keep"] = at_least(1, "an int >= 1", "3")
    checks["chunk_size"] = at_least(0, "an int >= 0 (0: no chunks)", "256")
    checks["seed"] = at_least(0, "an int >= 0 (numpy's seeds)", "0")
    from lit_fedco.problems import available_problems, get_problem
    from lit_fedco.updaters import available_updaters, get_updater

    nodes: dict[str, type] = {n: get_updater(n).hparams_cls for n in available_updaters()}
    nodes.update({name: get_problem(name).params_cls for name in available_problems()})
    for name, cls in nodes.items():  # as the dataclass checks them when it is built
        for key, bound in declared_bounds(cls).items():
            checks[f"{name}.{key}"] = bound.as_check()
    return checks


def dumps(catalog: dict[str, Any]) -> str:
    """The catalog as the committed file's text."""
    return json.dumps(catalog, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``--write`` regenerates :data:`SCHEMA_FILE`; without it, the check: exit code 1 when it is
    stale."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lit_fedco.config.schema", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite {SCHEMA_FILE.name}")
    args = parser.parse_args(argv)
    text = dumps(build())
    if SCHEMA_FILE.is_file() and SCHEMA_FILE.read_text() == text:
        print(f"{SCHEMA_FILE} is up to date")
    elif args.write:
        SCHEMA_FILE.write_text(text)
        print(f"wrote {SCHEMA_FILE}")
    else:
        print(f"{SCHEMA_FILE} is stale: run {WRITE_COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
