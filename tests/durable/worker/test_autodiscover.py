"""Which workflow modules a process imports (``DURABLE['AUTODISCOVER']``).

By default every installed app's ``workflows.py`` and ``DURABLE['WORKFLOW_MODULES']``;
with ``AUTODISCOVER`` False only the latter, so a worker that serves some workflows
boots without the libraries of the others (the example framework agents import
LangGraph, PydanticAI and the OpenAI Agents SDK: seconds of CPU per worker start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable import registry

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def imported(monkeypatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(registry, "_import", seen.append)
    return seen


def test_autodiscovery_imports_every_apps_workflows_then_the_listed_modules(settings, imported):
    settings.DURABLE = {**settings.DURABLE, "AUTODISCOVER": True, "WORKFLOW_MODULES": ["my.flows"]}
    registry.autodiscover()
    assert {"examples.workflows", "api.workflows"} <= set(imported)
    assert imported[-1] == "my.flows"


def test_without_autodiscovery_only_the_listed_modules_are_imported(settings, imported):
    settings.DURABLE = {
        **settings.DURABLE,
        "AUTODISCOVER": False,
        "WORKFLOW_MODULES": ["my.flows", "examples.workflows"],
    }
    registry.autodiscover()
    assert imported == ["my.flows", "examples.workflows"]


def _boot(**env: str) -> dict:
    """A fresh process's ``django.setup()``: which frameworks it imported, which of the
    example workflows it registered."""
    code = (
        "import json, sys, django; django.setup()\n"
        "from durable import registry\n"
        "names = {s.name for s in registry.workflows()}\n"
        "print(json.dumps({'frameworks': sorted(m for m in ('agents', 'pydantic_ai',"
        " 'langgraph') if m in sys.modules), 'workflows': sorted(n for n in names"
        " if n.startswith('examples.'))}))\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_process_that_lists_its_modules_boots_without_the_framework_libraries(tmp_path):
    lean = _boot(
        DURABLE_AUTODISCOVER="false",
        DURABLE_WORKFLOW_MODULES="examples.workflows",
        DURABLE_VAR_DIR=str(tmp_path),
    )
    assert lean["frameworks"] == []
    assert {"examples.support", "examples.invoice", "examples.procurement"} <= set(
        lean["workflows"]
    )
    assert "examples.refund_graph" not in lean["workflows"]
