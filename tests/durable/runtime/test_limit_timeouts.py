"""A step's timeout holds while the step is parked on its tool's limits
(durable/runtime/limit_gate.py): the park wakes at the timeout at the latest, and a try
whose time ran out before the limit admitted it ends with ``StepTimeout`` without
calling the tool; its retry policy then decides, as for any timeout."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from durable.models import Run, RunStatus, Step, StepAttempt, Wait, WaitKind, WaitStatus
from durable.testing import drive
from durable.values import codec
from durable.waits.closing import wake_due
from tests import limit_workflows as lw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    lw.reset()
    yield
    lw.reset()


def age_the_ask(wait: Wait, seconds: float) -> None:
    """As if the try had asked for its limit ``seconds`` earlier (time passing)."""
    asked = codec.decode(wait.payload)
    asked["asked_at"] = (timezone.now() - timedelta(seconds=seconds)).isoformat()
    Wait.objects.filter(pk=wait.pk).update(payload=codec.encode(asked))


def test_a_step_timeout_holds_while_the_step_is_parked_on_its_rate_limit():
    first = durable.start("limits.reads", {"name": "a", "n": 1, "tool": "timed_read"})
    assert drive(first.id).status == RunStatus.SUCCEEDED  # the hour's one call
    run = durable.start("limits.reads", {"name": "b", "n": 1, "tool": "timed_read"})
    before = timezone.now()
    assert drive(run.id).status == RunStatus.WAITING
    wait = Wait.objects.get(run_id=run.id, kind=WaitKind.LIMIT)
    # woken at the step's timeout (5 s), not when the rate admits it (an hour)
    assert wait.wake_at <= before + timedelta(seconds=6)
    assert codec.decode(wait.payload)["attempt"] == 1

    age_the_ask(wait, 6)
    assert wake_due(wait.wake_at) == [run.id]
    run = drive(run.id)
    # the first try timed out unmade; the second (max_attempts=2) parks again, afresh
    assert run.status == RunStatus.WAITING
    attempt = StepAttempt.objects.get(run_id=run.id)
    assert attempt.error_type == "StepTimeout"
    assert "did not start within its timeout of 5 s" in attempt.message
    wait = Wait.objects.get(run_id=run.id, kind=WaitKind.LIMIT)
    assert wait.status == WaitStatus.PENDING and codec.decode(wait.payload)["attempt"] == 2

    age_the_ask(wait, 6)
    assert wake_due(wait.wake_at) == [run.id]
    run = drive(run.id)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "StepTimeout"
    step = Step.objects.get(run_id=run.id)
    assert step.attempts == 2
    assert [label for label, _ in lw.CALLS] == ["a-0"]  # never called for run b
    assert Run.objects.get(pk=first.id).status == RunStatus.SUCCEEDED
