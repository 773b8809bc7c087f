"""A Sphinx extension that writes the generated parts of the reference at build time, so that
they can never disagree with the code: the config keys from ``lit_fedco/config/schema.json``
(the catalog ``--help`` reads; ``docs/_generated/config_keys.md``, included by
``reference/config.md``) and the compositions each registered problem offers and each
registered updater accepts (``docs/_generated/compositions.md``, included by
``reference/hooks.md``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parents[2] / "lit_fedco" / "config" / "schema.json"

KINDS = (
    ("config", "Run-wide nodes"),
    ("updater", "Updaters' hyperparameters"),
    ("problem", "Problems' parameters"),
)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    shown = json.dumps(value, ensure_ascii=False)
    return f"`{shown}`" if shown not in ('""', "") else "`''`"


def _table(prefix: str, keys: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, key in keys.items():
        lines.append(
            f"| `{prefix}{name}` | {_cell(key['type'])} | {_cell(_default(key['default']))} "
            f"| {_cell(key['help'])} |"
        )
    return lines


def render(schema: dict[str, Any]) -> str:
    """The reference as Markdown: the run's keys, then each node's, grouped by kind."""
    out = [
        "<!-- generated from lit_fedco/config/schema.json by docs/_ext/config_keys.py -->",
        "",
        "## The run",
        "",
        schema["run"]["help"],
        "",
        *_table("", {k: v for k, v in schema["run"]["keys"].items()}),
    ]
    for kind, title in KINDS:
        nodes = {n: v for n, v in schema["nodes"].items() if v["kind"] == kind}
        if not nodes:
            continue
        out += ["", f"## {title}", ""]
        for name, node in nodes.items():
            out += [f"### `{name}`", "", node["help"], ""]
            if node.get("default_problem"):
                out += [f"Default problem: `{node['default_problem']}`.", ""]
            out += _table(f"{name}.", node["keys"]) if node["keys"] else ["No parameters."]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def compositions() -> str:
    """The registered problems with the compositions they offer, and the registered updaters
    with the compositions they accept (in their order of preference) and their default
    problem, as Markdown tables."""
    from lit_fedco.problems import Classification, available_problems, get_problem
    from lit_fedco.updaters import available_updaters, get_updater

    def names(items: Any) -> str:
        return ", ".join(f"`{c}`" for c in items or ()) or "(any)"

    out = ["| problem (`objective=`) | compositions it offers |", "|---|---|",
           f"| none (the default) | {names(Classification.known_offers())} |"]  # fmt: skip
    out += [f"| `{n}` | {names(get_problem(n).known_offers())} |" for n in available_problems()]
    out += ["", "| updater | compositions it trains | default problem |", "|---|---|---|"]
    for n in available_updaters():
        cls = get_updater(n)
        default = f"`{cls.default_problem}`" if cls.default_problem else "none"
        out.append(f"| `{n}` | {names(cls.compositions)} | {default} |")
    return "\n".join(out) + "\n"


def _write(app: Any) -> None:
    folder = Path(app.srcdir) / "_generated"
    folder.mkdir(exist_ok=True)
    pages = {
        "config_keys.md": render(json.loads(SCHEMA.read_text())),
        "compositions.md": compositions(),
    }
    for name, text in pages.items():
        target = folder / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _write)
    return {"version": "1", "parallel_read_safe": True}
