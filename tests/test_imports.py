"""No import cycles inside lit_fedco, checked statically.

lit_fedco's layers (``LAYERS`` below) each import only the layers below them. A cycle is easy to
hide: an import moved into a function body runs late enough that Python never trips over it, yet the
modules
still depend on each other and can no longer be read, tested or replaced one at a time. So
this test parses every module with ``ast`` and counts *every* import statement — at module
level, inside functions, under ``if TYPE_CHECKING`` — then looks for strongly connected
components (Tarjan) in the graph of modules of the package.

Resolution: ``import a.b.c`` depends on ``a.b.c`` (the most specific module of the package
that it names); ``from a.b import c`` depends on the module ``a.b.c`` where ``c`` is one, else
on ``a.b`` (``c`` is a name defined there); relative imports are resolved against the
importing module's package. A package's implicit import of its parent ``__init__`` is not an
edge: Python initialises the parent first, and counting it would make every package whose
``__init__`` re-exports its submodules look cyclic.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "lit_fedco"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` file under the package ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _package_of(module: str, path: Path) -> str:
    """The package a relative import in ``module`` is resolved against."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _most_specific(name: str, modules: set[str]) -> str | None:
    """The longest prefix of dotted ``name`` that is a module of the package."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its source."""
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _most_specific(alias.name, modules)
                if target is not None:
                    deps.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module, path)
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in modules else _most_specific(base, modules)
                if target is not None:
                    deps.add(target)
    deps.discard(module)
    return deps


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports."""
    files = module_files(root)
    names = set(files)
    return {m: imports_of(m, p, names) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm,
    iterative so that a deep import chain cannot hit the recursion limit), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_lit_fedco_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "lit_fedco.data.build" in graph and "lit_fedco.core.seeding" in graph
    found = cycles(graph)
    assert not found, "import cycles in lit_fedco:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_data_layers_import_only_downwards():
    """The data package's layers (lit_fedco/data/__init__.py): readers and partitions know
    nothing of clients' containers, samplers or builders; only ``build`` knows them all."""
    graph = import_graph(PACKAGE)
    data = {m: {d for d in deps if d.startswith("lit_fedco.data")} for m, deps in graph.items()}
    names = "lit_fedco.data.names"  # plain tuples, at the bottom
    below = {
        names: set(),
        "lit_fedco.data.cifar": set(),
        "lit_fedco.data.omniglot": set(),
        "lit_fedco.data.sources": {"lit_fedco.data.cifar", names},
        "lit_fedco.data.pools": set(),
        "lit_fedco.data.readers": {"lit_fedco.data.pools"},
        "lit_fedco.data.user": {"lit_fedco.data.pools"},
        "lit_fedco.data.partition": {names},
        "lit_fedco.data.partition_skews": {"lit_fedco.data.partition"},
        "lit_fedco.data.container": {"lit_fedco.data.partition"},
        "lit_fedco.data.samplers": {"lit_fedco.data.container"},
        "lit_fedco.data.specs": {"lit_fedco.data.partition", names, "lit_fedco.data.user"},
    }
    for module, allowed in below.items():
        assert data[module] <= allowed, f"{module} imports {sorted(data[module] - allowed)}"
    assert graph["lit_fedco.core.seeding"] == set()


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import f\n",
            "pkg/a.py": "def f():\n    from pkg.sub import b\n    return b\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": "from ..a import f\n",
            "pkg/c.py": "import pkg.sub.b\nfrom pkg import a\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg.c"] == {"pkg.sub.b", "pkg.a"}
    assert graph["pkg.sub.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_checker_resolves_names_and_relative_imports_without_false_cycles(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import f\nfrom .b import g\n",
            "pkg/a.py": "from pkg import b\n",  # the module pkg.b, not pkg/__init__
            "pkg/b.py": "import os\nfrom typing import TYPE_CHECKING\n",
            "pkg/d.py": "from pkg import f\n",  # a name of pkg/__init__
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.a", "pkg.b"}
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == set()
    assert graph["pkg.d"] == {"pkg"}
    assert cycles(graph) == []


LAYERS = {
    "core": 0,  # errors, pytree state, seeded streams, the round's vocabulary, models, metrics
    "process": 1,  # forking, the jobs worker pool and its workers, stop requests, fail points
    "data": 1,
    "store": 2,  # atomic files, the run folder's lock, checkpoints, the per-round record
    "objectives": 2,
    "problems": 3,
    "updaters": 4,
    "engine": 5,  # communication, client store, executors, the round, the loop, evaluation
    "config": 6,  # the command line (torch-free), the catalog, the typed config
    "report": 6,  # tracking, figures
    "experiment": 7,  # run folders, plans, sub-runs, the runner
    "cli": 8,  # the one entry point
    "recipes": 9,
    "benchmarks": 9,
    "examples": 9,
    "worker": 9,  # a jobs=N worker process: runs recipes through the entry point
    "testing": 9,  # the plug-in contract's checks (check_updater)
    "console": 10,  # the lit-fedco command: recipes, figures, benchmarks
}
"""Each subpackage of lit_fedco (a top-level module counts as one) and its layer: a module may
import its own subpackage and the layers below it, never a layer above or beside it (the
package ``lit_fedco`` itself, whose names are the public API, is imported from nowhere inside)."""


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_belongs_to_a_layer():
    graph = import_graph(PACKAGE)
    unplaced = sorted({_layer(m) for m in graph if m != "lit_fedco"} - set(LAYERS))
    assert not unplaced, f"modules outside the layers of LAYERS: {unplaced}"


def test_layers_import_only_downwards():
    graph = import_graph(PACKAGE)
    wrong = []
    for module, deps in sorted(graph.items()):
        if module == "lit_fedco":
            continue
        mine = _layer(module)
        for dep in sorted(deps):
            if dep == "lit_fedco":
                wrong.append(f"{module} imports the public package lit_fedco")
                continue
            theirs = _layer(dep)
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                wrong.append(f"{module} ({mine}) imports {dep} ({theirs})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)
