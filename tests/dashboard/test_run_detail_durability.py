"""The run page says how a run's checkpoints are committed: the workflow's durability in
the header, and a "batched" marker on each step whose checkpoint was group-committed
(docs/architecture.md#batched-checkpoints)."""

from __future__ import annotations

import re

import pytest

import durable
from durable.models import Step
from durable.testing import drive
from tests.durable.runtime import batching_workflows as bw

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = '<span class="batched"'


@pytest.fixture(autouse=True)
def _reset():
    bw.reset()
    yield
    bw.reset()


def _step_block(page: str, step: Step) -> str:
    return page.split(f'id="step-{step.pk}"', 1)[1].split("</li>", 1)[0]


def _durability(page: str) -> str:
    found = re.search(r'<dt>Durability</dt><dd class="durability">(.*?)</dd>', page)
    assert found, "the header shows no durability"
    return found.group(1)


def test_batched_steps_are_marked_and_the_header_names_the_durability(viewer_client):
    run = drive(durable.start("batch.ops", {"ops": ["read", "read_sync", "step_b"]}).id)
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()

    assert _durability(page).startswith("batched")
    steps = {s.step_id: s for s in Step.objects.filter(run=run)}
    assert MARKER in _step_block(page, steps["read0"])
    assert MARKER not in _step_block(page, steps["read_sync1"])
    assert MARKER in _step_block(page, steps["step_b2"])
    assert page.count(MARKER) == 2


def test_a_sync_run_shows_sync_and_no_marker(viewer_client):
    run = drive(durable.start("batch.ops_sync", {"ops": ["read", "step"]}).id)
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()

    assert _durability(page) == "sync"
    assert MARKER not in page
