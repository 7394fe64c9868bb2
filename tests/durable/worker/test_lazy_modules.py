"""Workflow modules declared with ``durable.registry.lazy_module``: imported at the first
lookup of one of their names or the first listing, once, not at discovery, so a worker on
the demo's configuration forks its children without the agent frameworks; a module that
fails, or that does not register what it declared, is reported as a failed import."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import pytest

from durable import registry
from durable.exceptions import DurableConfigurationError, WorkflowNotFound
from tests.durable.worker.test_lazy_discovery import FRAMEWORKS, _process


@pytest.fixture
def lazy(monkeypatch, tmp_path):
    """``make(body) -> module name``: a module in ``tmp_path`` importable by name; the
    registry's lazy tables, workflows, tools and errors are restored afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    for table in ("_lazy_workflows", "_lazy_tools"):  # name -> {module: None}
        monkeypatch.setattr(
            registry, table, {k: dict(v) for k, v in getattr(registry, table).items()}
        )
    for table in ("_lazy_declared", "load_errors"):
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    monkeypatch.setattr(registry, "_importing", set(registry._importing))
    monkeypatch.setattr(registry, "_workflows", dict(registry._workflows))
    monkeypatch.setattr(registry, "_tools", dict(registry._tools))
    made: list[str] = []

    def make(body: str) -> str:
        name = f"lazy_mod_{len(made)}_{id(made)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")
        made.append(name)
        return name

    yield make
    for name in made:
        sys.modules.pop(name, None)


GRAPH = """
    import durable
    IMPORTS = [0]

    @durable.workflow(name="lazy.graph")
    def graph(ctx, data):
        return data

    @durable.tool(name="lazy.refund", safety="read_only")
    def refund(order: str) -> str:
        return order
"""


def test_a_lookup_imports_the_module_once_and_finds_its_names(lazy):
    module = lazy(GRAPH)
    registry.lazy_module(module, workflows=["lazy.graph"], tools=["lazy.refund"])
    assert module not in sys.modules  # declared, not imported
    assert registry.get_workflow("lazy.graph").fn(None, 7) == 7
    assert module in sys.modules
    first = sys.modules[module]
    assert registry.get_tool("lazy.refund").fn("A-1") == "A-1"
    assert sys.modules[module] is first  # imported once
    assert module not in registry.import_errors()


def test_a_listing_imports_every_declared_module(lazy):
    module = lazy(GRAPH)
    registry.lazy_module(module, workflows=["lazy.graph"], tools=["lazy.refund"])
    assert "lazy.refund" in {spec.name for spec in registry.tools()}
    assert module in sys.modules


def test_a_declared_name_the_module_does_not_register_is_a_failed_import(lazy):
    module = lazy(GRAPH)
    registry.lazy_module(module, workflows=["lazy.graph", "lazy.typo"])
    with pytest.raises(WorkflowNotFound):
        registry.get_workflow("lazy.typo")
    error = registry.import_errors()[module]
    assert "'lazy.typo'" in error and "did not register" in error
    assert registry.get_workflow("lazy.graph").name == "lazy.graph"  # the rest still loads


def test_a_module_that_fails_to_import_is_reported_and_its_names_are_not_found(lazy):
    module = lazy("raise RuntimeError('no API key for the framework')\n")
    registry.lazy_module(module, workflows=["lazy.broken"])
    with pytest.raises(WorkflowNotFound):
        registry.get_workflow("lazy.broken")
    assert "no API key for the framework" in registry.import_errors()[module]


def test_threads_looking_up_at_once_import_the_module_once(lazy):
    module = lazy(GRAPH.replace("IMPORTS = [0]", "import time; time.sleep(0.2)"))
    registry.lazy_module(module, workflows=["lazy.graph"])
    found, errors = [], []

    def look() -> None:
        try:
            found.append(registry.get_workflow("lazy.graph").fn)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=look) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == [] and len(found) == 4 and len(set(found)) == 1


@pytest.mark.parametrize("bad", ["", "has space", 7])
def test_a_declared_name_that_is_no_name_is_refused(lazy, bad):
    with pytest.raises(DurableConfigurationError, match="lazy_module"):
        registry.lazy_module("anything", workflows=[bad])


def test_the_demo_discovery_imports_no_framework_and_a_lookup_only_its_own(tmp_path: Path):
    """What a worker does before it forks (``ensure_discovered``) imports none of the
    frameworks; the first run of the LangGraph agent imports LangGraph alone."""
    code = (
        "import json, sys, django; django.setup()\n"
        "from durable import registry\n"
        f"def frameworks(): return sorted(m for m in {FRAMEWORKS} if m in sys.modules)\n"
        "registry.ensure_discovered()\n"
        "discovered = frameworks()\n"
        "registry.get_workflow('examples.refund_graph')\n"
        "graph = frameworks()\n"
        "registry.get_tool('examples.orders.refund')\n"
        "print(json.dumps({'discovered': discovered, 'graph': graph, 'all': frameworks(),"
        " 'errors': sorted(registry.import_errors())}))\n"
    )
    seen = _process(code, tmp_path)
    assert seen["discovered"] == []
    assert seen["graph"] == ["langgraph"]
    assert seen["all"] == sorted(FRAMEWORKS)
    assert seen["errors"] == []
