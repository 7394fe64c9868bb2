"""The token budget counts what the provider billed, stored or not (S27)."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run, RunStatus, Step, StepStatus
from durable.runtime import llm
from durable.testing import drive
from tests.durable.runtime import compensation_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 20_000


@pytest.fixture(autouse=True)
def fake_provider(settings, monkeypatch):
    cw.reset()
    settings.DURABLE = {**settings.DURABLE, "MAX_PAYLOAD_BYTES": LIMIT}
    monkeypatch.setattr(llm, "client", lambda timeout=60.0: cw.FakeClient())
    yield cw.LLM
    cw.reset()


def test_s27_a_reply_too_large_to_store_is_counted_at_once_and_after_resume(fake_provider):
    fake_provider["replies"] = [(1000, "x" * (LIMIT + 1))] + [(600, "ok")] * 5
    run = drive(durable.start("comp.s27", {"n": 5}, max_tokens=1500).id)

    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "PayloadError"
    assert run.tokens_used == 1000  # billed, so counted, though the step failed to store
    assert Step.objects.get(run=run, step_id="ask").status == StepStatus.FAILED

    durable.resume(run.id)
    run = drive(run.id)

    # 1000 + 600 passes 1500 after the resumed call: the next one is refused
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "BudgetExceeded", run.error
    assert fake_provider["billed"] == [1000, 600]
    assert run.tokens_used == 1600
    assert Run.objects.get(pk=run.id).events.filter(kind="budget_exceeded").count() == 1


def test_a_billed_reply_without_choices_is_counted_before_the_next_call(fake_provider):
    fake_provider["replies"] = [(1200, None), (600, "ok"), (600, "ok")]
    run = drive(durable.start("comp.s27", {"n": 2}, max_tokens=1500).id)

    assert run.status == RunStatus.FAILED and run.error["type"] == "PermanentError"
    assert run.tokens_used == 1200

    durable.resume(run.id)
    run = drive(run.id)
    assert run.error["type"] == "BudgetExceeded", run.error
    assert fake_provider["billed"] == [1200, 600]
    assert run.tokens_used == 1800


def test_within_the_budget_every_reply_is_counted_once(fake_provider):
    fake_provider["replies"] = [(100, "a"), (200, "b")]
    run = drive(durable.start("comp.s27", {"n": 2}, max_tokens=1500).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.tokens_used == 300
    assert drive(run.id).tokens_used == 300  # a replay bills nothing
