"""The ``lit-fedco`` command: what is not a recipe (recipes run as
``python -m lit_fedco.recipes.NAME``).

::

    lit-fedco recipes                      the recipes and their presets
    lit-fedco plot RUN_DIR [RUN_DIR ...]   redraw a run's figures, or overlay several runs
    lit-fedco bench throughput [...]       the executors against a plain PyTorch loop
    lit-fedco bench cli [...]              the command line's start-up times

Only ``argparse`` is imported until a command runs, so ``lit-fedco --help`` and ``lit-fedco
recipes`` answer without importing torch.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
from pathlib import Path

from lit_fedco.core.version import VERSION

BENCHMARKS = {
    "throughput": ("lit_fedco.benchmarks.throughput", "the executors against a plain PyTorch loop"),
    "cli": ("lit_fedco.benchmarks.cli", "the command line's start-up times"),
}
"""``lit-fedco bench NAME``: the module whose ``main(argv)`` runs it, and a line about it."""

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


def recipes() -> list[tuple[str, str]]:
    """``(name, first line of its docstring)`` of every recipe, read without importing it."""
    out = []
    for path in sorted(RECIPES_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        out.append((path.stem, " ".join(doc.split("\n\n")[0].split())))
    return out


def _list_recipes(args: argparse.Namespace) -> int:
    from lit_fedco.config.parser import presets

    for name, about in recipes():
        print(f"{name}: {about}")
        print(f"    python -m lit_fedco.recipes.{name} [preset=NAME] [key=value ...]")
        for preset, summary in presets(name):
            print(f"    preset={preset}: {summary}" if summary else f"    preset={preset}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from lit_fedco.report.plot import main

    main([*map(str, args.runs), *(["--out", str(args.out)] if args.out else []),
          *(["--title", args.title] if args.title else [])])  # fmt: skip
    return 0


def _bench(args: argparse.Namespace) -> int:
    module, _ = BENCHMARKS[args.benchmark]
    importlib.import_module(module).main(args.args)
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line of ``lit-fedco``."""
    p = argparse.ArgumentParser(
        prog="lit-fedco",
        description="lit_fedco's commands besides the recipes "
        "(run a recipe with python -m lit_fedco.recipes.NAME; list them with lit-fedco recipes).",
    )
    p.add_argument("--version", action="version", version=f"lit_fedco {VERSION}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    r = sub.add_parser("recipes", help="list the recipes and their presets",
                       description="The recipes and the presets each takes.")  # fmt: skip
    r.set_defaults(run=_list_recipes)
    plot = sub.add_parser(
        "plot", help="redraw a run's figures, or overlay several runs",
        description="Redraw the figures of finished runs from what they recorded "
        "(python -m lit_fedco.report.plot).",
    )  # fmt: skip
    plot.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                      help="run folders (<out_dir>/<recipe>/<run>)")  # fmt: skip
    plot.add_argument("--out", type=Path, help="where to write (default: the run's figures/, "
                      "or ./figures-overlay for several runs)")  # fmt: skip
    plot.add_argument("--title", default="", help="figure title (default: the recipe)")
    plot.set_defaults(run=_plot)
    bench = sub.add_parser(
        "bench", help="run a benchmark: " + ", ".join(BENCHMARKS),
        description="Benchmarks: " + "; ".join(f"{k}, {v[1]}" for k, v in BENCHMARKS.items())
        + ". Arguments after the name go to the benchmark (lit-fedco bench NAME --help).",
    )  # fmt: skip
    bench.add_argument("benchmark", choices=sorted(BENCHMARKS))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    bench.set_defaults(run=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``lit-fedco`` with ``argv`` (``sys.argv[1:]`` by default); the exit code."""
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except BrokenPipeError:  # the reader left early (lit-fedco recipes | head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
