"""Durable timers (ctx.sleep, ctx.sleep_until) and signals (ctx.wait_for_signal)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

import durable
from durable.exceptions import IllegalTransition, RunNotFound
from durable.models import Run, RunStatus, Signal, Step, StepStatus, TraceEvent, Wait, WaitStatus
from durable.testing import drive
from durable.values import codec
from durable.worker.engine import execute
from durable.worker.sweeper import sweep
from tests.approvals import approval_workflows as flows

pytestmark = pytest.mark.django_db(transaction=True)


# ------------------------------------------------------------------------- timers


def test_sleep_never_wakes_early():
    run = drive(durable.start("apf.sleep", {"seconds": 60}).id)
    assert run.status == RunStatus.WAITING
    wait = Wait.objects.get(run=run, wait_id="sleep")
    assert wait.kind == "timer" and wait.status == WaitStatus.PENDING
    assert timedelta(seconds=58) < wait.wake_at - timezone.now() <= timedelta(seconds=60)

    # the sweeper just before the due time, and an early "look at run X" message
    assert sweep(now=wait.wake_at - timedelta(milliseconds=1))["timers"] == 0
    assert execute(run.id) is None
    assert drive(run.id).status == RunStatus.WAITING
    assert Wait.objects.get(pk=wait.pk).status == WaitStatus.PENDING
    assert flows.calls("b", run.id) == 0

    result = sweep(now=wait.wake_at)
    assert result["timers"] == 1
    assert Run.objects.get(pk=run.id).status == RunStatus.PENDING
    assert Wait.objects.get(pk=wait.pk).status == WaitStatus.RESOLVED
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert flows.calls("a", run.id) == 1 and flows.calls("b", run.id) == 1


def test_timer_that_fell_due_without_a_worker_fires_once():
    run = drive(durable.start("apf.sleep", {"seconds": 30}).id)
    wait = Wait.objects.get(run=run, wait_id="sleep")
    # no worker was up when the timer fell due: it is long overdue now
    Wait.objects.filter(pk=wait.pk).update(wake_at=timezone.now() - timedelta(hours=1))
    first, second = sweep(), sweep()
    assert first["timers"] == 1 and second["timers"] == 0
    assert TraceEvent.objects.filter(run=run, kind="wait_resolved").count() == 1
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sweep()["timers"] == 0
    assert execute(run.id) is None  # a duplicate hint finds nothing to do
    assert flows.calls("a", run.id) == 1 and flows.calls("b", run.id) == 1
    assert Step.objects.get(run=run, step_id="b").attempts == 1


def test_due_timer_fires_from_its_own_message_without_the_sweeper():
    run = drive(durable.start("apf.sleep", {"seconds": 30}).id)
    Wait.objects.filter(run=run, wait_id="sleep").update(
        wake_at=timezone.now() - timedelta(seconds=1)
    )
    assert execute(run.id) == RunStatus.SUCCEEDED  # the countdown message arrives
    assert sweep()["timers"] == 0
    assert flows.calls("b", run.id) == 1


def test_sleep_until_an_aware_datetime():
    when = timezone.now() + timedelta(hours=1)
    run = drive(durable.start("apf.sleep_until", {"when": when}).id)
    assert run.status == RunStatus.WAITING
    wait = Wait.objects.get(run=run, wait_id="sleep")
    assert wait.wake_at == when
    assert sweep(now=when - timedelta(seconds=1))["timers"] == 0
    assert sweep(now=when)["timers"] == 1
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert flows.calls("b", run.id) == 1


def test_sleep_until_a_past_datetime_returns_at_once():
    when = timezone.now() - timedelta(minutes=5)
    run = drive(durable.start("apf.sleep_until", {"when": when}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.get(run=run, step_id="sleep").status == StepStatus.SUCCEEDED
    assert TraceEvent.objects.filter(run=run, kind="waiting").count() == 0


def test_sleep_until_a_naive_datetime_is_a_value_error():
    run = drive(durable.start("apf.sleep_naive", {"when": datetime(2030, 1, 1, 12, 0)}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["error"] == "ValueError" and "aware datetime" in out["message"]
    assert not Wait.objects.filter(run=run).exists()


def test_negative_sleep_fails_the_timer_step_for_good():
    run = drive(durable.start("apf.sleep", {"seconds": -1}).id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "InvalidDuration"
    assert run.error["message"].startswith("ctx.sleep: -1 is not a duration")


def test_sleep_in_a_loop_gets_distinct_ids():
    run = drive(durable.start("apf.sleep_loop", {"n": 3, "seconds": 30}).id)
    for expected in ("sleep", "sleep#2", "sleep#3"):
        assert run.status == RunStatus.WAITING
        pending = Wait.objects.get(run=run, status=WaitStatus.PENDING)
        assert pending.wait_id == expected
        sweep(now=pending.wake_at)
        run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert list(
        Wait.objects.filter(run=run).order_by("position").values_list("wait_id", "status")
    ) == [("sleep", "resolved"), ("sleep#2", "resolved"), ("sleep#3", "resolved")]
    assert list(
        Step.objects.filter(run=run).order_by("position").values_list("step_id", flat=True)
    ) == ["sleep", "tick", "sleep#2", "tick#2", "sleep#3", "tick#3"]
    assert flows.calls("tick", run.id) == 3


def test_zero_sleeps_in_a_loop_complete_without_parking():
    run = drive(durable.start("apf.sleep_loop", {"n": 2, "seconds": 0}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sorted(Wait.objects.filter(run=run).values_list("wait_id", flat=True)) == [
        "sleep",
        "sleep#2",
    ]


# ------------------------------------------------------------------------ signals


def test_s08_signal_sent_right_after_start_is_never_dropped():
    """A signal sent right after the start, before the wait exists, is kept and delivered
    (S08, in-process): 100 trials of start + immediate signal + drive."""
    failures = []
    for i in range(100):
        run = durable.start("apf.signal", {})
        durable.signal(run.id, "go", {"trial": i})
        run = drive(run.id)
        if run.status != RunStatus.SUCCEEDED or run.output_value() != {"got": {"trial": i}}:
            failures.append((i, run.status, run.error))
    assert failures == []
    assert Signal.objects.filter(wait__isnull=True).count() == 0


def test_signal_while_waiting_resumes_the_run():
    run = drive(durable.start("apf.signal", {}).id)
    assert run.status == RunStatus.WAITING
    sig = durable.signal(run.id, "go", {"n": 7}, by="tester")
    assert sig.wait is not None and sig.wait.wait_id == "signal:go"
    assert Run.objects.get(pk=run.id).status == RunStatus.PENDING
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == {"got": {"n": 7}}


def test_signal_with_another_name_does_not_resume_the_wait():
    run = drive(durable.start("apf.signal", {}).id)
    durable.signal(run.id, "stop", "nope")
    assert drive(run.id).status == RunStatus.WAITING
    assert Signal.objects.get(run=run, name="stop").wait is None


def test_dedupe_key_delivers_once():
    run = durable.start("apf.signal_loop", {"n": 2})
    first = durable.signal(run.id, "go", "pay #1", dedupe_key="webhook-1")
    again = durable.signal(run.id, "go", "pay #1", dedupe_key="webhook-1")
    assert again.pk == first.pk
    assert Signal.objects.filter(run=run).count() == 1
    run = drive(run.id)
    assert run.status == RunStatus.WAITING  # the second wait did not get the duplicate
    assert list(
        Wait.objects.filter(run=run).order_by("position").values_list("wait_id", "status")
    ) == [("signal:go", "resolved"), ("signal:go#2", "pending")]
    durable.signal(run.id, "go", "pay #1", dedupe_key="webhook-1")  # a late redelivery
    assert drive(run.id).status == RunStatus.WAITING
    durable.signal(run.id, "go", "pay #2", dedupe_key="webhook-2")
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == ["pay #1", "pay #2"]


def test_wait_for_signal_timeout_returns_the_default():
    run = drive(durable.start("apf.signal", {"timeout": 60}).id)
    wait = Wait.objects.get(run=run, wait_id="signal:go")
    assert sweep(now=wait.wake_at - timedelta(seconds=1))["timers"] == 0
    assert sweep(now=wait.wake_at)["timers"] == 1
    assert Wait.objects.get(pk=wait.pk).status == WaitStatus.EXPIRED
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == {"got": "timed out"}
    with pytest.raises(IllegalTransition):
        durable.signal(run.id, "go", "too late")


def test_signal_to_an_unknown_run_is_run_not_found():
    with pytest.raises(RunNotFound, match="no-such-run"):
        durable.signal("no-such-run", "go", 1)
    assert not Signal.objects.exists()


def test_signal_to_a_finished_run_is_an_illegal_transition():
    run = durable.start("apf.signal", {})
    durable.signal(run.id, "go", 1)
    assert drive(run.id).status == RunStatus.SUCCEEDED
    with pytest.raises(IllegalTransition, match="signals are accepted only by runs that have"):
        durable.signal(run.id, "go", 2)
    assert Signal.objects.filter(run=run).count() == 1


def test_signal_with_a_bad_name_is_a_value_error():
    run = durable.start("apf.signal", {})
    with pytest.raises(ValueError):
        durable.signal(run.id, "", 1)


def test_signals_in_a_loop_are_each_consumed_by_exactly_one_wait():
    run = durable.start("apf.signal_loop", {"n": 3})
    durable.signal(run.id, "go", 1)  # before any wait exists
    durable.signal(run.id, "go", 2)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING
    durable.signal(run.id, "go", 3)  # to the third, pending wait
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == [1, 2, 3]
    waits = list(Wait.objects.filter(run=run).order_by("position"))
    assert [w.wait_id for w in waits] == ["signal:go", "signal:go#2", "signal:go#3"]
    signals = list(Signal.objects.filter(run=run).order_by("id"))
    assert [s.wait_id for s in signals] == [w.pk for w in waits]
    assert all(s.consumed_at is not None for s in signals)


def test_extra_signal_stays_in_the_mailbox():
    run = durable.start("apf.signal_loop", {"n": 1})
    durable.signal(run.id, "go", "a")
    durable.signal(run.id, "go", "b")
    run = drive(run.id)
    assert run.output_value() == ["a"]
    left = Signal.objects.get(run=run, wait__isnull=True)
    assert codec.decode(left.payload) == "b" and left.consumed_at is None
