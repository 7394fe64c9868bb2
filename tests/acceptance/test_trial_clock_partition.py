"""An outside tester's cases for one clock across workers (durable/clock.py,
docs/production.md#clocks) and for a run row locked by a silent session, each from a
real bug report of another engine (named in the test's docstring).

A worker "whose clock is off" is this process with ``django.utils.timezone.now`` skewed
by an offset, as ``examples/clock_skew.py`` skews a worker (monotonic clocks left
alone); the database's clock stays right. Those cases run on PostgreSQL only: on the
embedded default every process shares the one machine that holds the SQLite file, so
its wall clock *is* the shared clock. The row-lock case is PostgreSQL only too (SQLite
has no row locks).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

import durable
from durable import RetryPolicy, clock
from durable.models import Run, RunStatus, Wait, WaitKind, WaitStatus
from durable.postgres import database_now
from durable.runtime import limit_store
from durable.testing import drive
from durable.worker.sweeper import sweep

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

HOUR = 3600


class Boom(Exception):
    pass


@durable.workflow(name="trial.sleeper", version="1")
def sleeper(ctx, data):
    ctx.sleep(data["seconds"])
    return ctx.step("after", lambda: "woke")


@durable.workflow(name="trial.flaky", version="1")
def flaky(ctx, data):
    def fail():
        raise Boom("the service said 503")

    return ctx.step(
        "call",
        fail,
        retry=RetryPolicy(max_attempts=3, initial_interval=120, max_interval=600, jitter=False),
    )


@durable.workflow(name="trial.two_steps", version="1")
def two_steps(ctx, data):
    first = ctx.step("first", lambda: 1)
    return ctx.step("second", lambda: first + 1)


@durable.workflow(name="trial.signal", version="1")
def signal_flow(ctx, data):
    return {"got": ctx.wait_for_signal("go")}


def db_now() -> datetime:
    now = database_now(wall_clock=True)
    assert now is not None
    return now


@pytest.fixture
def skew(monkeypatch):
    """``skew(seconds)``: this process's wall clock is ``seconds`` off from now on (the
    database's is not); ``skew(0)`` sets it right again."""
    if connection.vendor != "postgresql":
        pytest.skip("the embedded default's processes share one machine, and its one clock")
    real_now = timezone.now

    def set_offset(seconds: float) -> None:
        monkeypatch.setattr(
            timezone, "now", lambda: real_now() + timedelta(seconds=seconds), raising=True
        )
        clock.forget()

    yield set_offset
    clock.forget()


def seconds_from_db_now(when: datetime | None) -> float:
    assert when is not None
    return (when - db_now()).total_seconds()


@pytest.mark.parametrize("offset", [-HOUR, HOUR], ids=["behind", "ahead"])
def test_a_timer_set_on_a_worker_whose_clock_is_off_wakes_by_the_database_clock(skew, offset):
    """celery/celery#2306 "ETA does not work": with the worker's idea of the time an hour
    off (its time zone there), a task retried "in 3 minutes" ran at once, and one with a
    countdown of 10 s ran immediately. Here a ``ctx.sleep(120)`` reached on a worker
    whose wall clock is an hour behind (or ahead) must be due in 120 s by the database's
    clock: not at once (an hour in the past), not in an hour and two minutes."""
    run = durable.start("trial.sleeper", {"seconds": 120})
    skew(offset)
    assert drive(run.id).status == RunStatus.WAITING
    skew(0)
    timer = Wait.objects.get(run_id=run.id, kind=WaitKind.TIMER)
    assert 90 < seconds_from_db_now(timer.wake_at) <= 121, timer.wake_at
    assert sweep()["timers"] == 0  # a sweep at the right time does not wake it early
    assert Wait.objects.get(pk=timer.pk).status == WaitStatus.PENDING


@pytest.mark.parametrize("offset", [-HOUR, HOUR], ids=["behind", "ahead"])
def test_a_retry_backoff_written_by_a_worker_whose_clock_is_off_is_due_by_the_database_clock(
    skew, offset
):
    """celery/celery#1004 "Celery can't properly work if CELERY_TIMEZONE != system
    timezone": a task queued with countdown X ran at X minus three hours, the worker
    comparing an ETA written by one clock against another. Here a step's retry in 120 s,
    recorded by a worker an hour behind (or ahead), must be due in 120 s by the
    database's clock, and a sweep at the right time must not dispatch it early."""
    run = durable.start("trial.flaky", {})
    skew(offset)
    row = drive(run.id, wait_for_retries=False)
    skew(0)
    assert row.status == RunStatus.RETRYING, (row.status, row.error)
    assert 90 < seconds_from_db_now(row.wake_at) <= 121, row.wake_at
    assert sweep()["due"] == 0
    assert Run.objects.get(pk=run.id).status == RunStatus.RETRYING


def test_a_worker_whose_clock_is_ahead_does_not_fail_a_run_before_its_deadline(skew):
    """temporalio/documentation#2050 "Time Skew Deadline Exceeded": a worker's clock off
    from the cluster's by more than an activity's start-to-close timeout makes the
    activity fail with "deadline exceeded" although it ran in time. Here a run with a
    ten-minute deadline is executed by a worker whose clock is an hour ahead, a second
    after it started: it must succeed, not fail with BudgetExceeded."""
    run = durable.start("trial.two_steps", {}, deadline_seconds=600)
    skew(HOUR)
    row = drive(run.id)
    skew(0)
    assert row.status == RunStatus.SUCCEEDED, (row.status, row.error)


def test_a_run_started_by_a_process_whose_clock_is_behind_keeps_its_whole_deadline(skew):
    """temporalio/features#616 "Warn when the server-provided task start time is fairly
    different than time SDK begins processes task" (clock skew between the server and
    the worker). Here the web process that starts a run has its clock an hour behind;
    the run's ten-minute deadline is then judged by the sweeper with the database's
    clock: a run waiting for a signal must still be waiting after a sweep a second
    later, not failed by its deadline."""
    skew(-HOUR)
    run = durable.start("trial.signal", {}, deadline_seconds=600)
    skew(0)
    assert drive(run.id).status == RunStatus.WAITING
    assert 500 < seconds_from_db_now(Run.objects.get(pk=run.id).deadline_at) <= 601
    assert sweep()["deadlines"] == 0
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING


def test_a_concurrency_slot_released_by_a_worker_whose_clock_is_ahead_wakes_the_next_run(skew):
    """margince/margince#1346 "capture sync-state schedules from the app clock and is read
    against the database's": a time written by one clock and compared with another makes
    a worker off by X shift every wake-up by X. Here a run parked on a concurrency limit
    (its wake time by the database's clock, a recheck a few seconds away) must be made
    due at once when a worker whose clock is an hour ahead releases a slot of that key."""
    key = f"trial-{uuid.uuid4().hex[:8]}"
    run = durable.start("trial.signal", {})
    wait = Wait.objects.create(
        run_id=run.id,
        wait_id="limit",
        position=0,
        kind=WaitKind.LIMIT,
        key=key,
        title=f"waiting for concurrency of {key}",
        status=WaitStatus.PENDING,
        wake_at=clock.now() + timedelta(seconds=limit_store.CONCURRENCY_RECHECK_SECONDS + 30),
    )
    skew(HOUR)
    limit_store.wake_waiters(key, 1)
    skew(0)
    assert seconds_from_db_now(Wait.objects.get(pk=wait.pk).wake_at) <= 1


def test_a_run_row_locked_by_an_idle_in_transaction_session_neither_hangs_nor_forks_the_claim(
    other_session,
):
    """pikkujs/pikku#1360 "hold the workflow run lock on a session, not a transaction": a
    session left "idle in transaction" holding a run's lock made every redispatch queue
    behind it until the pool was gone. Here another session (a worker host cut off in
    the middle of a transaction) holds the run's row lock: a worker's claim of the run
    must return promptly without executing it (not wait on the lock), and once that
    session ends the run is claimed and succeeds once."""
    run = durable.start("trial.two_steps", {})
    other_session.execute(f"SELECT id FROM {Run._meta.db_table} WHERE id = %s FOR UPDATE", [run.id])
    with connection.cursor() as cursor:  # a claim that waited would fail here, not hang
        cursor.execute("SET lock_timeout = '5s'")
    try:
        row = drive(run.id, max_executions=1)
    except RuntimeError:  # drive gave up after one execution that did not run it
        row = Run.objects.get(pk=run.id)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert row.status == RunStatus.PENDING, (row.status, row.error)
    assert not row.steps.exists()
    other_session.rollback()  # the server ended the silent session
    row = drive(run.id)
    assert row.status == RunStatus.SUCCEEDED, (row.status, row.error)
    assert sorted(row.steps.values_list("step_id", flat=True)) == ["first", "second"]
    assert row.claims == 1, row.claims  # the blocked try claimed nothing
