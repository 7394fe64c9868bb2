"""Fixtures of the acceptance tests: the suite's manual dispatch, plus this folder's fixture
workflows and the ones of the other suites it reuses, registered through
``DURABLE["WORKFLOW_MODULES"]`` as the other conftests do."""

from __future__ import annotations

import pytest

from tests.acceptance import workflows

EXTRA_MODULES = [
    "tests.acceptance.workflows",
    "tests.limit_workflows",
    "tests.durable.runtime.child_workflows",
]


@pytest.fixture(autouse=True)
def _manual_dispatch(_manual_dispatch, settings):
    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [*modules, *[m for m in EXTRA_MODULES if m not in modules]],
        "PRUNE_PAUSE_SECONDS": 0,
    }
    workflows.reset()
    yield
    workflows.reset()
