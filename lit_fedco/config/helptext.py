"""A recipe's ``--help`` and ``--help-all``, written from the catalog
(:mod:`lit_fedco.config.catalog`) and the config the command line would run with; no torch.

``--help``: the usage, the recipe's summary, the keys the recipe sets, the hyperparameters of
its updaters and the parameters of its problem (with the values it would run with and a line
each), its presets, and the names of every other key. ``--help-all``: every key of every node.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import sys
import textwrap
from typing import Any

from lit_fedco.config import catalog
from lit_fedco.config.parser import flat_keys, presets
from lit_fedco.config.schema import brief


def width() -> int:
    """The text width: the terminal's, kept within 72-100 columns."""
    return max(72, min(100, shutil.get_terminal_size((100, 24)).columns))


def _recipe_spec(recipe: str) -> Any:
    """The module spec of ``lit_fedco.recipes.<recipe>``, or None (a script's own recipe)."""
    try:
        return importlib.util.find_spec(f"lit_fedco.recipes.{recipe}")
    except (ImportError, ValueError):
        return None


def recipe_doc(recipe: str) -> str:
    """The first paragraph of recipe ``recipe``'s module docstring, read from its source
    (nothing is imported); else of the ``__main__`` module's (a script's own recipe)."""
    doc: str | None = None
    spec = _recipe_spec(recipe)
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        with open(spec.origin, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read()))
    if doc is None:
        doc = getattr(sys.modules.get("__main__"), "__doc__", None)
    return " ".join((doc or "").strip().split("\n\n", 1)[0].split())


def prog_of(recipe: str) -> str:
    """How the recipe is started: ``python -m lit_fedco.recipes.<recipe>``, or for a script's
    own recipe the command that started this process (``python my_fedprox.py``,
    ``python -m my_lab.run``)."""
    if _recipe_spec(recipe) is not None:
        return f"python -m lit_fedco.recipes.{recipe}"
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        return f"python -m {spec.name}"
    script = sys.argv[0] if sys.argv and sys.argv[0] else "SCRIPT"
    return f"python {script}"


def show(value: Any) -> str:
    """A value as it is written on the command line (``[a,b]``, ``true``, quoted if needed)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(show(v) for v in value) + "]"
    if isinstance(value, str):
        plain = value and not any(c in value for c in " ,[]{}'\"=$:#")
        return value if plain else json.dumps(value, ensure_ascii=False)
    return str(value)


class Writer:
    """Lines of help text: headings, wrapped paragraphs and two-column ``key=value  text``."""

    def __init__(self, cols: int) -> None:
        self.cols = cols
        self.lines: list[str] = []

    def blank(self) -> None:
        if self.lines and self.lines[-1]:
            self.lines.append("")

    def para(self, text: str, indent: str = "") -> None:
        self.lines += textwrap.wrap(text, self.cols, initial_indent=indent,
                                    subsequent_indent=indent) or [""]  # fmt: skip

    def heading(self, text: str) -> None:
        self.blank()
        self.para(text)

    def cell(self, text: str) -> list[str]:
        """A ``key=value`` wider than the text, broken after commas (a long list)."""
        lines = [""]
        for piece in re.split(r"(?<=,)", text):
            if lines[-1].strip() and len(lines[-1]) + len(piece) > self.cols:
                lines.append("      ")
            lines[-1] += piece
        return lines

    def rows(self, rows: list[tuple[str, str]], col: int = 30) -> None:
        """``  key=value   description`` rows, the descriptions from column ``col``; a key
        too wide for it gets its description on the next line."""
        for key, text in rows:
            text = text or "(no description)"
            body = textwrap.wrap(text, self.cols - col) or [""]
            first = f"  {key}"
            if len(first) + 2 > col:
                self.lines += self.cell(first)
                self.lines += [" " * col + line for line in body]
            else:
                self.lines.append(first.ljust(col) + body[0])
                self.lines += [" " * col + line for line in body[1:]]


def _key_rows(
    node: dict[str, Any],
    values: dict[str, Any],
    prefix: str,
    short: bool,
    only: set[str] | None = None,
) -> list[tuple[str, str]]:
    """``prefix.key=value`` and its description (``short``: its first sentence), for every key
    of ``node``, or (``only``) for those among ``only`` or that differ from their defaults."""
    rows = []
    for key, spec in node["keys"].items():
        value = values.get(key, spec["default"])
        if only is None or f"{prefix}{key}" in only or value != spec["default"]:
            text = brief(spec["help"]) if short else spec["help"]
            rows.append((f"{prefix}{key}={show(value)}", text))
    return rows


def _problems(nodes: dict[str, Any], updaters: list[str], objective: str) -> dict[str, str]:
    """The problems a run trains on → why: its ``objective``, else its updaters' defaults."""
    if objective:
        return {objective: "objective"}
    out: dict[str, list[str]] = {}
    for u in updaters:
        problem = nodes.get(u, {}).get("default_problem", "")
        if problem:
            out.setdefault(problem, []).append(u)
    return {p: f"the problem of {', '.join(us)}" for p, us in out.items()}


def trains_note(nodes: dict[str, Any], updater: str, objective: str) -> str:
    """`` (trains distributed)``: the composition updater ``updater`` trains in a run with
    ``objective`` (the first of its ``compositions`` the problem offers), and the problem's
    own where it is another (`` (trains erm, not sample_dro's own distributed)``); empty
    where the catalog does not say (a problem that does not declare its ``offers``)."""
    node = nodes.get(updater, {})
    problem = objective or node.get("default_problem", "")
    offers = nodes.get(problem, {}).get("offers") if problem else ["erm"]
    compositions = node.get("compositions")
    if not offers or not compositions:
        return ""
    found = next((c for c in compositions if c in offers), None)
    if found is None:
        return f" (trains none of what {problem} offers: {', '.join(offers)})"
    if found == offers[0]:
        return f" (trains {found})"
    return f" (trains {found}, not {problem or 'classification'}'s own {offers[0]})"


def render(
    recipe: str,
    defaults: dict[str, Any],
    values: dict[str, Any],
    everything: bool = False,
    cols: int | None = None,
) -> str:
    """The help text of ``recipe``.

    Args:
        recipe: the recipe's name (``lit_fedco.recipes.<recipe>``).
        defaults: the recipe's defaults (which keys it sets).
        values: the config the command line would run with, as plain containers.
        everything: ``--help-all``: every key of every node, each with its whole description.
        cols: the text width (default :func:`width`).
    """
    cat = catalog.current()
    nodes: dict[str, Any] = cat["nodes"]
    run: dict[str, Any] = cat["run"]
    sections = {k: nodes[k] for k in cat["fields"] if k in nodes}  # data, model, failures
    w = Writer(cols or width())
    _usage(w, recipe)
    listed = _run_keys(w, run, sections, nodes, defaults, values, everything)
    others = _node_keys(w, nodes, sections, values, everything)
    found = presets(recipe)
    w.heading("Presets (preset=NAME; YAML files shipped with lit_fedco, from recipes/):"
              if found else "Presets: none.")  # fmt: skip
    w.rows(found, col=min(40, 4 + max((len(name) for name, _ in found), default=0)))
    if not everything:
        rest = [k for k in run["keys"] if k not in listed]
        w.heading("Every other key, with a line each: --help-all.")
        w.para(f"Run keys: {', '.join(rest)}.", indent="  ")
        w.para(f"Nodes: {', '.join(f'{s}.*' for s in sections)}; other updaters and problems: "
               f"{', '.join(others)}.", indent="  ")  # fmt: skip
    return "\n".join(w.lines).rstrip() + "\n"


def _usage(w: Writer, recipe: str) -> None:
    """The usage lines and the recipe's summary."""
    prog = prog_of(recipe)
    w.lines.append(f"usage: {prog} [preset=NAME] [key=value ...]")
    w.lines.append(f"       {prog} --help | --help-all")
    w.lines.append(f"       {prog} --list-sub-runs")
    doc = recipe_doc(recipe)
    if doc:
        w.blank()
        w.para(doc)


def _run_keys(
    w: Writer,
    run: dict[str, Any],
    sections: dict[str, Any],
    nodes: dict[str, Any],
    defaults: dict[str, Any],
    values: dict[str, Any],
    everything: bool,
) -> set[str]:
    """The run's keys and those of its sections (``data.*``, ``model.*``, ...): every one
    (``--help-all``), else those the recipe sets or that differ from their defaults; returns
    the run keys listed."""
    own = {k: v for k, v in defaults.items() if k not in nodes or k in sections}
    only = None if everything else set(flat_keys(own))
    w.heading(f"{'Run' if everything else 'Recipe'} keys (values as this command runs them):")
    rows = _key_rows(run, values, "", not everything, only)
    w.rows(rows)
    for name, node in sections.items():
        if everything:
            w.heading(f"{name}.*: {node['help']}")
        w.rows(_key_rows(node, values.get(name, {}), f"{name}.", not everything, only))
    return {row.split("=", 1)[0] for row, _ in rows}


def _node_keys(
    w: Writer,
    nodes: dict[str, Any],
    sections: dict[str, Any],
    values: dict[str, Any],
    everything: bool,
) -> list[str]:
    """The keys of the run's updaters and problems (``--help-all``: of every other one too);
    the names of the updaters and problems the run does not use."""
    updaters = [str(u) for u in values.get("updaters", [])]
    objective = str(values.get("objective") or "")
    problems = _problems(nodes, updaters, objective)
    shown = [u for u in updaters if u in nodes] + [p for p in problems if p in nodes]
    others = [k for k in nodes if k not in sections and k not in shown]
    for name in shown + (others if everything else []):
        node = nodes[name]
        if node["kind"] == "problem":
            note = f" ({problems[name]})" if name in problems else f" (objective={name})"
        else:
            note = trains_note(nodes, name, objective) if name in updaters else " (not in this run)"
        w.heading(f"{name}{note}: {node['help']}")
        w.rows(_key_rows(node, values.get(name, {}), f"{name}.", not everything))
    return others
