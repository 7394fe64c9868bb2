from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _manual_dispatch(settings):
    """In-process tests drive runs themselves; process tests override this."""
    settings.DURABLE = {
        **settings.DURABLE,
        "DISPATCH": "manual",
        "WORKFLOW_MODULES": ["tests.workflows", "tests.waits_workflows"],
    }
