"""A Sphinx extension that writes the config-key reference from ``lit_fedco/config/schema.json``
at build time (into ``docs/_generated/config_keys.md``, which ``reference/config.md`` includes),
so that the page can never disagree with the catalog ``--help`` reads."""

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


def _write(app: Any) -> None:
    target = Path(app.srcdir) / "_generated" / "config_keys.md"
    target.parent.mkdir(exist_ok=True)
    text = render(json.loads(SCHEMA.read_text()))
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _write)
    return {"version": "1", "parallel_read_safe": True}
