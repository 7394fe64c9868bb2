"""The test helpers of ``durable.testing``: ``make_due`` brings a run's scheduled times
forward, and only the ones it has."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable import clock
from durable.models import Run, RunStatus, Step, StepStatus, Wait, WaitKind, WaitStatus
from durable.testing import drive, make_due
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    ew.reset()
    yield
    ew.reset()


def test_make_due_brings_a_stored_retry_and_its_steps_next_attempt_forward():
    ew.FAILS["three"] = [durable.TransientError("later")]
    run = drive(durable.start("eng.three_steps", {"policy": "slow"}).id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING
    assert not Run.objects.due(clock.now()).filter(pk=run.id).exists()

    assert make_due(run.id) == 2  # the run's wake_at and step three's next_attempt_at

    assert Run.objects.due(clock.now()).filter(pk=run.id).exists()
    retrying = Step.objects.get(run_id=run.id, status=StepStatus.RETRYING)
    assert retrying.next_attempt_at <= clock.now()
    # a step that succeeded is given no next attempt
    assert not Step.objects.filter(
        run_id=run.id, status=StepStatus.SUCCEEDED, next_attempt_at__isnull=False
    ).exists()
    assert drive(run.id).status == RunStatus.SUCCEEDED


def test_make_due_moves_pending_waits_with_a_time_and_gives_none_a_time():
    run = durable.start("eng.three_steps", None)  # pending, never executed: no wake_at
    later = clock.now() + timedelta(hours=1)
    timer = Wait.objects.create(
        run_id=run.id, wait_id="t", position=0, kind=WaitKind.TIMER, wake_at=later
    )
    untimed = Wait.objects.create(
        run_id=run.id, wait_id="s", position=1, kind=WaitKind.SIGNAL, key="go"
    )
    closed = Wait.objects.create(
        run_id=run.id,
        wait_id="r",
        position=2,
        kind=WaitKind.SIGNAL,
        key="done",
        status=WaitStatus.RESOLVED,
        wake_at=later,
    )

    assert make_due(run.id) == 1

    assert Wait.objects.due(clock.now()).filter(pk=timer.pk).exists()
    assert Wait.objects.get(pk=untimed.pk).wake_at is None  # no timeout given
    assert Wait.objects.get(pk=closed.pk).wake_at == later  # a closed wait is left alone
    assert Run.objects.get(pk=run.id).wake_at is None
    assert make_due("no-such-run") == 0
