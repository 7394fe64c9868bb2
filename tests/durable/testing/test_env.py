"""``durable_env``: runs in-process on the test database, time that skips for every reader
of it (timers, approval deadlines, retries, schedule slots, rate-limit windows), crashes
at a step's boundaries recovered the production way, signals and reconciles."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from durable import clock, postgres
from durable.models import Operation, Run, RunStatus, StepAttempt, TraceEvent, Wait, WaitKind
from durable.services import schedules
from durable.vocabulary import EventKind, OperationStatus
from tests.durable.testing import kit_workflows as kw


@pytest.fixture(autouse=True)
def _reset():
    kw.reset()
    yield
    kw.reset()


@pytest.fixture
def no_sleep(monkeypatch):
    """Nothing in the test may sleep: skipped time is skipped, not slept."""

    def sleep(seconds):
        raise AssertionError(f"slept {seconds} s")

    monkeypatch.setattr(time, "sleep", sleep)


def gaps(times: list) -> list:
    """The time between each two consecutive times."""
    return [b - a for a, b in itertools.pairwise(times)]


def ran(what: str) -> list:
    return [when for name, when in kw.SEEN if name == what]


def test_every_reader_of_time_sees_the_skipped_time(durable_env):
    before = clock.now()
    durable_env.advance(timedelta(days=3))
    three_days = timedelta(days=3)
    for reader in (clock.now, timezone.now, schedules.db_now, durable_env.now):
        assert reader() - before >= three_days, reader
    db_now = postgres.database_now()
    assert db_now is None or db_now - before >= three_days  # None: SQLite
    run = durable.start("kit.tick")
    assert run.created_at - before >= three_days
    event = TraceEvent.objects.create(run=run, kind=EventKind.RELEASED, message="a row's default")
    assert event.created_at - before >= three_days  # default=timezone.now


@pytest.mark.django_db  # on PostgreSQL the environment reads the database's clock
def test_the_clock_is_given_back_after_the_test():
    from durable.testing.env import DurableEnv

    with DurableEnv() as env:
        env.clock.sleep(timedelta(days=1))
        assert abs(timezone.now() - clock.now()) < timedelta(seconds=5)  # both skipped
        assert abs(env.now() - timezone.now()) < timedelta(seconds=5)
        skipped = timezone.now()
    assert skipped - timezone.now() > timedelta(hours=23)
    assert abs(clock.now() - timezone.now()) < timedelta(seconds=5)


def test_a_timer_of_three_days_fires_at_its_time_and_nothing_sleeps(durable_env, no_sleep):
    run = durable_env.run(durable_env.start("kit.three_days"))
    assert run.status == RunStatus.WAITING

    assert durable_env.advance(timedelta(days=2, hours=23)) == []
    assert Run.objects.get(pk=run.pk).status == RunStatus.WAITING
    assert durable_env.advance(timedelta(hours=2)) == [run.id]

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    [before], [after] = ran("before"), ran("after")
    assert timedelta(days=3) <= after - before < timedelta(days=3, minutes=1)  # at its time


def test_a_runs_deadline_fails_it_at_its_time(durable_env):
    run = durable_env.run(durable_env.start("kit.three_days", deadline_seconds=86400))
    durable_env.advance(timedelta(hours=23))
    assert Run.objects.get(pk=run.pk).status == RunStatus.WAITING

    durable_env.advance(timedelta(hours=2))

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error["type"] == "BudgetExceeded"
    assert ran("after") == []


def test_retries_stored_and_slept_in_place_are_skipped_to(durable_env, no_sleep):
    kw.FAILS["flaky_stored"] = [durable.TransientError("down"), durable.TransientError("down")]
    kw.FAILS["flaky_in_place"] = [durable.TransientError("blip")]

    run = durable_env.run(durable_env.start("kit.retries"))

    assert run.status == RunStatus.SUCCEEDED, run.error
    stored, in_place = ran("flaky_stored"), ran("flaky_in_place")
    assert [gap >= timedelta(seconds=600) for gap in gaps(stored)] == [True, True]
    assert in_place[1] - in_place[0] >= timedelta(seconds=2)
    assert StepAttempt.objects.filter(run=run).count() == 3  # the failed tries


def test_schedule_slots_start_one_run_each_as_time_passes(durable_env):
    durable.schedule("kit-hourly", "kit.tick", cron="0 * * * *")
    executed = durable_env.advance(timedelta(hours=3))

    slots = list(Run.objects.filter(workflow_name="kit.tick").order_by("created_at"))
    assert len(slots) == 3 and sorted(executed) == sorted(r.id for r in slots)
    assert {r.status for r in slots} == {RunStatus.SUCCEEDED}
    ticks = ran("tick")
    assert [timedelta(minutes=59) < gap < timedelta(minutes=61) for gap in gaps(ticks)] == [
        True,
        True,
    ]  # each slot at its time


def test_a_rate_limit_window_opens_when_the_time_comes(durable_env):
    run = durable_env.run(durable_env.start("kit.lookups"))
    assert run.status == RunStatus.WAITING  # the second lookup waits for the next hour
    assert Wait.objects.filter(run=run, kind=WaitKind.LIMIT, status="pending").exists()

    durable_env.advance(timedelta(hours=2))  # "1/h": lookup1 an hour after lookup0...
    assert Run.objects.get(pk=run.pk).status == RunStatus.WAITING
    assert ran("lookup2") == []

    durable_env.advance(timedelta(hours=1))  # ... and lookup2 an hour after lookup1

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [0, 1, 2]
    times = ran("lookup0") + ran("lookup1") + ran("lookup2")
    assert [gap >= timedelta(minutes=59) for gap in gaps(times)] == [True, True]


def test_an_approval_deadline_rejects_at_its_time(durable_env, durable_approvals):
    run = durable_env.run(durable_env.start("kit.approval"))
    durable_env.advance(timedelta(minutes=59))
    assert durable_approvals.pending(run)

    durable_env.advance(timedelta(minutes=2))

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"approved": False, "edited": None}
    assert durable_approvals.pending(run) == []


def test_an_approver_edits_and_rejects(durable_env, durable_approvals):
    edited = durable_env.run(durable_env.start("kit.approval"))
    durable_approvals.edit(edited, {"qty": 3}, comment="three")
    assert durable_env.run(edited).output_value() == {"approved": True, "edited": {"qty": 3}}

    rejected = durable_env.run(durable_env.start("kit.approval"))
    durable_approvals.reject(rejected, comment="no")
    assert durable_env.run(rejected).output_value() == {"approved": False, "edited": None}


def test_an_approval_that_needs_two_is_decided_by_two_approvers(durable_env, durable_approvals):
    run = durable_env.run(durable_env.start("kit.two_approvers"))
    durable_approvals.approve(run)
    assert durable_env.run(run).status == RunStatus.WAITING  # one of two
    durable_approvals.approve(run, by="second-approver")
    run = durable_env.run(run)
    assert run.output_value() == {
        "approved": True,
        "decided_by": ["test-approver", "second-approver"],
    }


def test_a_decision_after_the_deadline_is_refused_by_the_skipped_clock(
    durable_env, durable_approvals
):
    """The sweeper has not run yet: the decision itself reads the skipped clock."""
    from approvals.services import ApprovalExpired

    run = durable_env.run(durable_env.start("kit.approval"))
    durable_env.clock.sleep(timedelta(hours=2))  # time passes, nothing executes
    with pytest.raises(ApprovalExpired):
        durable_approvals.approve(run)


def test_a_signal_wakes_the_run_and_its_timeout_passes_without_one(durable_env):
    woken = durable_env.run(durable_env.start("kit.signal"))
    durable_env.signal(woken, "go", {"ok": True})
    assert durable_env.run(woken).output_value() == {"ok": True}

    idle = durable_env.run(durable_env.start("kit.signal"))
    durable_env.advance(timedelta(days=1, seconds=1))
    assert Run.objects.get(pk=idle.pk).output_value() == "timed out"


@pytest.mark.parametrize(
    ("point", "bodies", "payments"),
    [
        ("before", 1, 1),  # the started row is settled by reconcile: not found, so sent
        ("after_effect", 1, 1),  # reconcile finds it by its key: not sent again
        ("after_checkpoint", 1, 1),  # recorded: replayed
    ],
)
def test_a_crash_at_each_point_of_a_write_resumes_on_a_fresh_worker(
    durable_env, point, bodies, payments
):
    durable_env.crash_at("kit.pay", point)
    run = durable_env.run(durable_env.start("kit.pay_and_receipt", {"amount": 5}))

    assert run.status == RunStatus.SUCCEEDED, run.error
    [crash] = durable_env.crashes
    assert (crash.run_id, crash.step_id, crash.point) == (run.id, "kit.pay", point)
    assert len(kw.PAYMENTS) == payments
    assert len(durable_env.tool_calls("kit.pay")) == bodies
    assert durable_env.idempotency_keys("kit.pay") == [f"{run.id}:kit.pay"] * bodies
    # recovered the production way: the lease expired, another worker claimed the run
    assert TraceEvent.objects.filter(run=run, kind=EventKind.LEASE_EXPIRED).exists()
    claims = TraceEvent.objects.filter(run=run, kind=EventKind.CLAIMED).values_list(
        "actor", flat=True
    )
    assert len(set(claims)) == 2


def test_a_crash_before_a_writes_body_leaves_its_started_row_for_the_ledger(durable_env):
    durable_env.crash_at("kit.pay", "before")
    run = durable_env.run(durable_env.start("kit.pay_and_receipt", {"amount": 5}), recover=False)
    assert Operation.objects.get(run=run).status == OperationStatus.STARTED
    assert kw.PAYMENTS == [] and durable_env.tool_calls("kit.pay") == []  # never entered

    run = durable_env.run(run)  # reconcile finds nothing under the key: the write is made
    assert run.status == RunStatus.SUCCEEDED and len(kw.PAYMENTS) == 1


def test_a_crash_after_a_steps_effect_runs_the_step_again(durable_env):
    durable_env.crash_at("receipt", "after_effect")
    run = durable_env.run(durable_env.start("kit.pay_and_receipt", {"amount": 5}))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(ran("receipt")) == 2 and len(kw.PAYMENTS) == 1  # the payment was recorded


def test_without_recover_the_run_is_left_as_the_crash_left_it(durable_env):
    durable_env.crash_at("kit.pay", "after_effect")
    run = durable_env.run(durable_env.start("kit.pay_and_receipt", {"amount": 5}), recover=False)
    assert run.status == RunStatus.RUNNING and run.lease_token
    assert Operation.objects.get(run=run).status == OperationStatus.STARTED

    assert durable_env.run(run).status == RunStatus.SUCCEEDED
    assert len(kw.PAYMENTS) == 1


def test_an_unknown_write_waits_for_the_operators_reconcile(durable_env):
    run = durable_env.run(durable_env.start("kit.blind"))
    assert run.status == RunStatus.WAITING
    assert Operation.objects.get(run=run).status == OperationStatus.UNKNOWN

    durable_env.reconcile(run, "happened", result="done")

    assert durable_env.run(run).output_value() == "done"
    with pytest.raises(LookupError):
        durable_env.reconcile(run, "happened")


def test_crash_points_are_checked():
    from durable.testing.crash import Hooks

    with pytest.raises(ValueError, match="before, after_effect, after_checkpoint"):
        Hooks().arm("x", "during")
