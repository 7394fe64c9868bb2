"""A run's deadline holds in every state (durable/waits/deadlines.py): the sweeper fails a
run past its ``deadline_at`` while it is parked on a limit, waiting on a signal or a
child, or retrying, with the deadline's error, and leaves no wait pending. The sweeps
here are given a clock past the deadline (``sweep(now=...)``), never a sleep."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from durable.models import Run, RunStatus, TraceEvent, Wait, WaitKind, WaitStatus
from durable.testing import drive
from durable.worker.sweeper import sweep
from tests import limit_workflows as lw
from tests import waits_workflows  # noqa: F401  (registers tests.signal)
from tests.durable import engine_workflows as ew
from tests.durable.runtime import child_workflows as cwf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _reset():
    lw.reset()
    cwf.reset()
    ew.reset()
    yield
    lw.reset()
    cwf.reset()
    ew.reset()


def past_deadline(run_id: str) -> dict:
    """Sweep with a clock one second past the run's deadline."""
    deadline = Run.objects.get(pk=run_id).deadline_at
    return sweep(now=deadline + timedelta(seconds=1))


def assert_ended_by_deadline(run_id: str, previous: str) -> Run:
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED, run.status
    assert run.error_type == "BudgetExceeded"
    assert "budget deadline=" in run.error["message"]
    assert f"while it was {previous}" in run.error["message"]
    assert not Wait.objects.filter(run_id=run_id, status=WaitStatus.PENDING).exists()
    event = TraceEvent.objects.filter(run_id=run_id, kind="budget_exceeded").get()
    assert event.actor == "sweeper" and event.data["previous"] == previous
    return run


def test_s34_a_run_parked_on_a_rate_limit_ends_at_its_deadline():
    assert drive(durable.start("limits.reads", {"name": "a", "n": 2}).id).status == (
        RunStatus.SUCCEEDED
    )
    run = durable.start("limits.reads", {"name": "b", "n": 1}, deadline_seconds=2)
    assert drive(run.id).status == RunStatus.WAITING
    limit = Wait.objects.get(run_id=run.id, kind=WaitKind.LIMIT)
    assert limit.wake_at > run.deadline_at + timedelta(seconds=30)  # admitted in a minute
    # before the deadline the sweeper leaves it parked
    assert sweep(now=run.deadline_at - timedelta(seconds=1))["deadlines"] == 0
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING
    assert past_deadline(run.id)["deadlines"] == 1
    assert_ended_by_deadline(run.id, "waiting")
    assert Wait.objects.get(pk=limit.pk).status == WaitStatus.CANCELLED
    assert [label for label, _ in lw.CALLS] == ["a-0", "a-1"]  # the tool was never called
    # swept again: nothing more
    assert past_deadline(run.id)["deadlines"] == 0


def test_a_run_waiting_on_a_signal_ends_at_its_deadline():
    run = durable.start("tests.signal", {}, deadline_seconds=5)
    assert drive(run.id).status == RunStatus.WAITING
    assert past_deadline(run.id)["deadlines"] == 1
    assert_ended_by_deadline(run.id, "waiting")
    with pytest.raises(durable.IllegalTransition):
        durable.signal(run.id, "go", {})


def test_a_retrying_run_ends_at_its_deadline_and_is_not_dispatched():
    ew.FAILS["later"] = [durable.TransientError("come back in a minute")]
    run = durable.start("eng.single", {"label": "later", "policy": "slow"}, deadline_seconds=5)
    assert drive(run.id, wait_for_retries=False).status == RunStatus.RETRYING
    report = past_deadline(run.id)
    assert report["deadlines"] == 1 and run.id not in report["run_ids"]
    assert_ended_by_deadline(run.id, "retrying")
    assert Run.objects.get(pk=run.id).wake_at is None


def test_a_parent_waiting_on_its_child_ends_at_its_deadline_and_cancels_the_child():
    run = durable.start(
        "tests.children.parent",
        {"items": [{"n": 1, "id": "x", "wait_signal": True}]},
        deadline_seconds=5,
    )
    assert drive(run.id).status == RunStatus.WAITING
    child_id = f"{run.id}.x"
    assert drive(child_id).status == RunStatus.WAITING
    assert past_deadline(run.id)["deadlines"] == 1
    assert_ended_by_deadline(run.id, "waiting")
    child = Run.objects.get(pk=child_id)  # the default parent-close policy: cancel
    assert child.status == RunStatus.CANCELLED
    assert f"its parent run {run.id} failed" in child.error["message"]


def test_a_child_past_its_deadline_wakes_its_waiting_parent_with_the_failure():
    run = durable.start("tests.children.catching_deadline", {})
    assert drive(run.id).status == RunStatus.WAITING
    child_id = f"{run.id}.slow"
    assert drive(child_id).status == RunStatus.WAITING
    assert past_deadline(child_id)["deadlines"] == 1
    assert_ended_by_deadline(child_id, "waiting")
    assert Run.objects.get(pk=run.id).status == RunStatus.PENDING  # woken
    parent = drive(run.id)
    assert parent.status == RunStatus.SUCCEEDED
    assert parent.output_value() == {"status": "failed", "type": "BudgetExceeded"}


def test_an_unfinished_run_without_a_deadline_is_never_ended():
    run = durable.start("tests.signal", {})
    assert drive(run.id).status == RunStatus.WAITING
    assert sweep(now=timezone.now() + timedelta(days=3650))["deadlines"] == 0
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING
