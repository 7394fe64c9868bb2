"""The LangGraph contrib's tests run only where LangGraph is importable.

Under ``pip install -e '.[test]'`` (``make test``, CI) it always is: the ``test`` extra
lists the ``langgraph`` extra's packages.
"""

from __future__ import annotations

import importlib.util

import pytest

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("langgraph") is None:  # pragma: no cover - lean installs only
    collect_ignore_glob.append("test_*.py")


@pytest.fixture
def lg_workflows(settings):
    """Register the graph workflows of ``tests.contrib.lg_workflows`` for in-process runs."""
    from tests.contrib import lg_workflows

    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [*settings.DURABLE["WORKFLOW_MODULES"], "tests.contrib.lg_workflows"],
    }
    lg_workflows.NODE_LOG.clear()
    lg_workflows.REFUNDS.clear()
    lg_workflows.FAIL_ONCE.clear()
    return lg_workflows
