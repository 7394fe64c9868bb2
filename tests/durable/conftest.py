"""Fixtures shared by the engine's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def batched(settings):
    """Batched checkpoints flushed every 4 steps, never by time within a test (a flush
    then falls at a known step)."""
    settings.DURABLE = {**settings.DURABLE, "BATCH_MAX_STEPS": 4, "BATCH_MAX_DELAY_MS": 60_000}
