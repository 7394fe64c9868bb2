"""Workflow modules are imported at the registry's first lookup, not at start-up
(durable/registry.py ``discover_later`` / ``ensure_discovered``): a CLI command that
reads runs, a process that never looks a workflow up, do not pay seconds for the agent
frameworks the example workflows import; the first lookup imports them once, and a
thread that looks up meanwhile waits for it rather than seeing half a registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from durable import registry
from tests.harness import database_url

REPO = Path(__file__).resolve().parents[3]
FRAMEWORKS = ("agents", "pydantic_ai", "langgraph")
#: the worker's engine and replay check: only `durable mcp` and `durable replay-check` need them
ENGINE = ("durable.worker.engine", "durable.worker.dry")
#: the API's framework and the argument checks' pydantic: the web's and an edit's, not a CLI's
WEB = ("ninja", "pydantic")


def _process(code: str, tmp_path: Path, *args: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")} | env
    out = subprocess.run(
        [sys.executable, *(["-c", code] if code else []), *args],
        cwd=REPO,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", "DURABLE_VAR_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = (
    "import json, sys, django; django.setup()\n"
    f"def frameworks(): return sorted(m for m in {FRAMEWORKS} if m in sys.modules)\n"
    "before = frameworks()\n"
    "from durable import registry\n"
    "names = sorted(s.name for s in registry.workflows())\n"
    "print(json.dumps({'before': before, 'after': frameworks(),"
    " 'refund_graph': 'examples.refund_graph' in names,"
    " 'fastmcp': 'pydantic_ai.mcp' in sys.modules or 'fastmcp' in sys.modules}))\n"
)


def test_start_up_imports_no_workflow_module_and_the_first_lookup_imports_them(tmp_path):
    seen = _process(PROBE, tmp_path)
    assert seen["before"] == []  # django.setup() alone: none of the frameworks
    assert seen["after"] == sorted(FRAMEWORKS)  # the example agents, at the first lookup
    assert seen["refund_graph"]
    # no agent of the demo has an MCP server: FastMCP's client (2 s) is not imported
    assert not seen["fastmcp"]


@pytest.mark.django_db  # the command reads the test's database (migrated once, not here)
def test_a_cli_command_that_reads_runs_imports_no_framework(tmp_path):
    code = (
        "import json, sys\n"
        "from django.core.management import execute_from_command_line as run\n"
        "run(['manage.py', 'durable', 'runs'])\n"
        f"print(json.dumps(sorted(m for m in {FRAMEWORKS + ENGINE + WEB} if m in sys.modules)))\n"
    )
    assert _process(code, tmp_path, DATABASE_URL=database_url()) == []


@pytest.fixture
def pending(monkeypatch):
    """A registry whose discovery has not run, importing a module that takes its time."""
    monkeypatch.setattr(registry, "_discovery_pending", True)
    monkeypatch.setattr(registry, "_discovering", False)
    started, go_on = threading.Event(), threading.Event()

    def slow_autodiscover() -> None:
        started.set()
        assert go_on.wait(30)
        # the module registers itself, and looks the registry up while it is imported
        registry.workflow(name="lazy.flow", version="1")(lambda ctx, inp: inp)
        assert registry.get_workflow("lazy.flow").version == "1"

    monkeypatch.setattr(registry, "autodiscover", slow_autodiscover)
    yield types.SimpleNamespace(started=started, go_on=go_on)
    registry._workflows.pop("lazy.flow", None)


def test_a_lookup_during_discovery_waits_for_it_and_discovery_runs_once(pending, monkeypatch):
    calls = []
    inner = registry.autodiscover
    monkeypatch.setattr(registry, "autodiscover", lambda: (calls.append(1), inner())[1])
    found: dict[str, object] = {}

    def look(name: str) -> None:
        found[name] = registry.get_workflow("lazy.flow").name

    first = threading.Thread(target=look, args=("first",))
    first.start()
    assert pending.started.wait(30)  # the first lookup is importing
    second = threading.Thread(target=look, args=("second",))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # it waits for the discovery, not a half-filled registry
    pending.go_on.set()
    first.join(30)
    second.join(30)
    assert found == {"first": "lazy.flow", "second": "lazy.flow"}
    assert calls == [1]
    registry.get_workflow("lazy.flow")
    assert calls == [1]  # done: later lookups import nothing
