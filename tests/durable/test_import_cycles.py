"""No import cycle inside the ``durable`` package, function-local imports included.

A cycle hidden behind a function-local import still couples the modules: neither can be
read, tested or moved without the other. So the graph counts every ``import`` and
``from ... import`` anywhere in a module (top level, in functions, under ``if``), and a
strongly connected component of more than one module fails the test, naming its modules.
Standard library only (``ast``): the modules are parsed, never imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "durable"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (``durable`` for its ``__init__``)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(
    module: str,
    source: str,
    modules: set[str],
    *,
    is_package: bool = False,
    type_imports: bool = True,
) -> set[str]:
    """The modules of ``modules`` that ``source`` (the text of ``module``) imports,
    anywhere in it. ``from X import y`` is the module ``X.y`` when there is one, else
    ``X``; relative imports are resolved against ``module``'s package. With
    ``type_imports=False`` the imports under ``if TYPE_CHECKING:`` are left out (they load
    nothing at run time)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(source)
    if not type_imports:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph(*, type_imports: bool = True) -> dict[str, set[str]]:
    """``{module: the package's modules it imports}`` for every module of ``durable/``."""
    files = module_files()
    return {
        module: imports_of(
            module,
            path.read_text(encoding="utf-8"),
            set(files),
            is_package=path.name == "__init__.py",
            type_imports=type_imports,
        )
        for module, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_graph_counts_every_import_anywhere_in_a_module():
    modules = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d"}
    source = (
        "from . import a\n"
        "from .b import thing\n"
        "import pkg.c\n"
        "def later():\n"
        "    from .sub.d import other\n"
        "    if True:\n"
        "        from pkg import helper\n"
    )
    assert imports_of("pkg.x", source, modules) == {"pkg.a", "pkg.b", "pkg.c", "pkg.sub.d", "pkg"}
    assert imports_of(
        "pkg.sub", "from . import d\nfrom .. import a\n", modules, is_package=True
    ) == {"pkg.sub.d", "pkg.a"}
    graph = import_graph()
    assert {"durable", "durable.worker.engine", "durable.models"} <= set(graph)
    assert "durable.models" in graph["durable.worker.engine"]


def test_cycles_are_the_strongly_connected_components_of_two_or_more():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_durable():
    found = cycles(import_graph())
    assert found == [], f"import cycles inside durable/ (strongly connected components): {found}"


APPS = ("durable", "approvals", "dashboard", "api")
#: the longest chain of imports across the apps, in modules, counting what loads at run
#: time (an import under ``if TYPE_CHECKING:`` loads nothing): 24 before the engine moved
#: into packages, 14 since (the architecture's bound); it may only go down
MAX_CHAIN = 14
#: the same chain with the type-only imports counted as edges: a module named in an
#: annotation is still read with the module that names it; it may only go down
MAX_CHAIN_WITH_TYPES = 18


def app_graph(*, type_imports: bool = True) -> dict[str, set[str]]:
    """The import graph of every module of the apps (``APPS``), migrations left out
    (``type_imports`` as in :func:`imports_of`)."""
    files: dict[str, Path] = {}
    for app in APPS:
        for path in sorted((ROOT.parent / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return {
        module: imports_of(
            module,
            path.read_text(encoding="utf-8"),
            set(files),
            is_package=path.name == "__init__.py",
            type_imports=type_imports,
        )
        for module, path in files.items()
    }


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of imports (``a`` imports ``b`` imports ...) in an acyclic graph."""
    best: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in best:
            tails = [chain(succ) for succ in sorted(graph.get(node, ()))]
            best[node] = [node, *max(tails, key=len, default=[])]
        return best[node]

    return max((chain(node) for node in sorted(graph)), key=len, default=[])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The engine's graph with each subpackage (``durable.runtime``...) as one node."""

    def node(module: str) -> str:
        parts = module.split(".")
        is_package = (ROOT / Path(*parts[1:2]) / "__init__.py").exists()
        return ".".join(parts[:2]) if len(parts) > 1 and is_package else module

    collapsed: dict[str, set[str]] = {}
    for module, targets in graph.items():
        collapsed.setdefault(node(module), set()).update(node(t) for t in targets)
    return {name: targets - {name} for name, targets in collapsed.items()}


def test_longest_chain_and_package_graph_on_a_small_graph():
    assert longest_chain({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == ["a", "b", "c"]
    graph = import_graph()
    packages = package_graph(graph)
    assert "durable.runtime" in packages and "durable.runtime.replay" not in packages
    assert "durable.models" in packages["durable.worker"]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    assert imports_of("pkg.x", source, {"pkg.a"}) == {"pkg.a"}
    assert imports_of("pkg.x", source, {"pkg.a"}, type_imports=False) == set()


def test_no_import_cycle_between_the_engines_packages():
    """The packages are layers: a cycle between two of them, through any modules, fails.
    A type-only import (under ``if TYPE_CHECKING:``) is not an edge here: the runtime's
    compensation names the ``Execution`` it is handed, and the one-statement step write
    names the ``StepCall`` it reads, without loading either."""
    found = cycles(package_graph(import_graph(type_imports=False)))
    assert found == [], f"import cycles between durable/'s packages: {found}"


def test_the_longest_import_chain_across_the_apps():
    """A module imports its own layer and the layers below; a chain of 14 is a module on
    top of at most 13 others. Function-local imports count: they load when called."""
    graph = app_graph(type_imports=False)
    found = cycles(graph)  # a cycle has no longest chain: name it instead
    assert found == [], f"import cycles across the apps: {found}"
    chain = longest_chain(graph)
    assert len(chain) <= MAX_CHAIN, (
        f"an import chain of {len(chain)} modules (at most {MAX_CHAIN}): " + " -> ".join(chain)
    )
    typed = longest_chain(app_graph())
    assert len(typed) <= MAX_CHAIN_WITH_TYPES, (
        f"an import chain of {len(typed)} modules, type-only imports counted (at most "
        f"{MAX_CHAIN_WITH_TYPES}): " + " -> ".join(typed)
    )
