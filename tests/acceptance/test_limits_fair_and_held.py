"""Capabilities 2, 3 and 8: fair (first come, first served) admission of runs parked on a
limit, end to end through ``drive`` (docs/limits.md "Waiting for a limit"); a timed-out
call's concurrency slot held against *another run* until its body ended
(docs/limits.md "A timed-out call keeps what it holds"); and a cancel committed while a
call sleeps in place for its limit stops the call before its body starts
(docs/architecture.md "A cancel stops the run at the next fence")."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import durable
from durable.models import Limit, LimitSlot, Run, RunStatus, Wait, WaitKind, WaitStatus
from durable.testing import drive, make_due
from durable.waits.closing import wake_due, wake_due_for_run
from tests import limit_workflows as lw
from tests.acceptance import workflows as tw

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]


@pytest.fixture(autouse=True)
def _reset_limits():
    lw.reset()
    yield
    lw.reset()


def _labels() -> list[str]:
    return [label for label, _ in lw.CALLS]


def _free_admission(key: str, index: int) -> None:
    """Move the ``index``-th admission of ``key`` out of its window (as if a minute passed
    for it alone): exactly one more call fits."""
    row = Limit.objects.get(key=key)
    admitted = sorted(float(t) for t in row.admitted)
    admitted[index] -= 61
    row.admitted = admitted
    row.save()


def test_a_run_woken_out_of_turn_does_not_take_the_place_of_the_run_parked_before_it():
    """ASP.NET Core "ConcurrencyLimiter uses LIFO queue which causes queued requests to
    not be processed" (https://github.com/dotnet/aspnetcore/issues/29910) and Sidekiq
    "Leaky Bucket Starvation" (https://github.com/sidekiq/sidekiq/issues/5315).

    A rate of 2/m is used up by run A; B parks, then C parks. One place frees; both are
    woken, and C's worker gets there first: C must park again (B is ahead), B is
    admitted. Then another place frees and a new run D asks before C is woken: D must
    queue behind C (C kept its place across its re-park), and C is admitted next."""
    key = "tool:limited_read"
    a = drive(durable.start("limits.reads", {"name": "a", "n": 2}).id)
    assert a.status == RunStatus.SUCCEEDED
    b = drive(durable.start("limits.reads", {"name": "b", "n": 1}).id)
    c = drive(durable.start("limits.reads", {"name": "c", "n": 1}).id)
    assert b.status == c.status == RunStatus.WAITING
    wait_b = Wait.objects.get(run_id=b.id, kind=WaitKind.LIMIT)
    wait_c = Wait.objects.get(run_id=c.id, kind=WaitKind.LIMIT)
    assert wait_b.created_at < wait_c.created_at
    assert wait_b.wake_at <= wait_c.wake_at

    _free_admission(key, 0)  # one place
    assert set(wake_due(max(wait_b.wake_at, wait_c.wake_at))) == {b.id, c.id}
    assert drive(c.id).status == RunStatus.WAITING, "C took B's place"
    assert drive(b.id).status == RunStatus.SUCCEEDED
    assert _labels() == ["a-0", "a-1", "b-0"]

    _free_admission(key, 1)  # a-1 leaves the window too: one place again
    d = drive(durable.start("limits.reads", {"name": "d", "n": 1}).id)
    assert d.status == RunStatus.WAITING, "D, arriving now, took the place of C parked before it"
    assert _labels() == ["a-0", "a-1", "b-0"]
    assert wake_due_for_run(c.id, timezone.now() + timedelta(hours=1))
    assert drive(c.id).status == RunStatus.SUCCEEDED
    assert _labels() == ["a-0", "a-1", "b-0", "c-0"]
    assert Run.objects.get(pk=d.id).status == RunStatus.WAITING


def test_another_runs_call_waits_for_the_timed_out_body_that_holds_the_slot():
    """Prefect "Timed out tasks do not release concurrency slot"
    (https://github.com/PrefectHQ/prefect/issues/7752) and its fix "release slots after
    a timeout" (https://github.com/PrefectHQ/prefect/pull/14787) -- done right means
    the slot is released when the body really ended, not at the timeout. A tool of
    ``concurrency=1`` and ``timeout=0.3``: run A's body takes 1.2 s, its try times out
    and its retry is stored for a minute. Run B calls the same tool while A's body still
    runs: B's body must not start before A's ended (never two bodies at once)."""
    a = durable.start("acceptance.slow_one", {"label": "A", "seconds": 1.2})
    b = durable.start("acceptance.slow_one", {"label": "B", "seconds": 0.0})
    outcome: dict[str, object] = {}

    def run_a() -> None:
        try:
            outcome["a"] = drive(a.id, wait_for_retries=False).status
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["a"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run_a)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while "A" not in tw.BODIES and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "A" in tw.BODIES, "A's body never started"
        time.sleep(0.45)  # A's try has timed out; its body goes on until ~1.2 s
        assert not tw.ENDED.is_set()
        status = drive(b.id, wait_for_retries=False).status
        for _ in range(20):  # parked behind the slot: woken when it frees
            if status != RunStatus.WAITING:
                break
            time.sleep(0.25)
            wake_due_for_run(b.id, timezone.now() + timedelta(seconds=5))
            status = drive(b.id, wait_for_retries=False).status
    finally:
        thread.join(timeout=30)
    assert outcome.get("a") == RunStatus.RETRYING, outcome
    assert tw.STATE["peak"] == 1, "two bodies of a concurrency=1 tool ran at once"
    if status == RunStatus.RETRYING:
        # B's try timed out waiting for the slot (the timeout counts from the first ask,
        # docs/limits.md): bring its stored retry forward; A's body has ended by now
        assert tw.ENDED.is_set()
        make_due(b.id)
        status = drive(b.id).status
    assert status == RunStatus.SUCCEEDED, status
    assert tw.STATE["peak"] == 1, "two bodies of a concurrency=1 tool ran at once"
    assert tw.BODIES[:2] == ["A", "B"]
    assert not LimitSlot.objects.filter(run_id=b.id).exists()


def test_a_cancel_while_a_call_sleeps_in_place_for_its_rate_stops_it_before_its_body(
    monkeypatch,
):
    """Hatchet "CANCEL_IN_PROGRESS leaves superseded retry-backoff work runnable"
    (https://github.com/hatchet-dev/hatchet/issues/4900) and Airbyte "Attempts in
    Backoff can be canceled" (https://github.com/airbytehq/airbyte/issues/28536): work
    that waited must ask again before it starts. Here the wait is a limit's short
    in-place sleep (under 1 s, docs/limits.md): an operator cancels the run during it;
    the tool body must not start, and the run ends cancelled."""
    now = timezone.now().timestamp()
    Limit.objects.create(key="tool:acc_rated", admitted=[now - 0.8, now - 0.8])
    run = durable.start("acceptance.rated", {"labels": ["only"]})
    box = {"run": run.id}
    sleep = time.sleep

    def sleeping(seconds: float) -> None:
        if "run" in box and 0 < seconds <= 1.0:
            durable.cancel(box.pop("run"), reason="while it waited for the rate")
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleeping)
    final = drive(run.id)
    monkeypatch.setattr(time, "sleep", sleep)
    assert "run" not in box, "the call never slept in place (the test's premise)"
    assert final.status == RunStatus.CANCELLED, (final.status, final.error)
    assert tw.BODIES == [], "the body started after the cancel committed"
    assert not Wait.objects.filter(run_id=run.id, status=WaitStatus.PENDING).exists()


def test_a_freed_max_concurrent_runs_slot_goes_to_the_run_parked_first():
    """Windmill "What are the actual rules for concurrency limits?"
    (https://github.com/windmill-labs/windmill/issues/1924: FIFO order fixed by
    sorting on created_at) and cqlite "gate slot is acquired non-FIFO, so the oldest
    waiter can be starved" (https://github.com/pmcfadin/cqlite/issues/3924). The one
    slot of ``acceptance.exclusive`` (max_concurrent_runs=1) is held; B parks, then C. The
    slot frees, both are woken and C's worker comes first: C must wait, B runs."""
    import uuid

    from durable.limits import Limits
    from durable.runtime import limit_store

    holder = Run.objects.create(
        id=f"holder-{uuid.uuid4().hex[:8]}",
        workflow_name="acceptance.exclusive",
        workflow_version="1",
        status=RunStatus.RUNNING,
        input="{}",
        input_hash="h",
        lease_owner="elsewhere",
        lease_token=uuid.uuid4().hex,
        lease_expires_at=timezone.now() + timedelta(minutes=10),
    )
    key = "workflow:acceptance.exclusive"
    verdict, slot = limit_store.acquire(
        Limits(key, None, 1), run_id=holder.id, token=holder.lease_token
    )
    assert verdict.admitted and slot is not None
    b = drive(durable.start("acceptance.exclusive", {"who": "b"}).id)
    c = drive(durable.start("acceptance.exclusive", {"who": "c"}).id)
    assert b.status == c.status == RunStatus.WAITING
    wait_b = Wait.objects.get(run_id=b.id, kind=WaitKind.LIMIT)
    wait_c = Wait.objects.get(run_id=c.id, kind=WaitKind.LIMIT)
    assert wait_b.created_at < wait_c.created_at
    limit_store.release(key, slot)  # the holder's execution ended
    wake_due(timezone.now() + timedelta(minutes=5))
    assert Run.objects.get(pk=c.id).status == RunStatus.PENDING
    assert drive(c.id).status == RunStatus.WAITING, "C took the slot B waited for first"
    assert drive(b.id).status == RunStatus.SUCCEEDED
    wake_due(timezone.now() + timedelta(minutes=5))
    assert drive(c.id).status == RunStatus.SUCCEEDED


@pytest.mark.parametrize("how", ["parallel", "run_tool_calls"])
def test_a_group_gives_its_lease_back_only_after_its_timed_out_pooled_body_ended(how):
    """Hatchet "make retries with exp backoff atomic ... when timeouts occur, step runs
    are placed in a CANCELLING state" (https://github.com/hatchet-dev/hatchet/pull/1132)
    and Prefect #7752 (https://github.com/PrefectHQ/prefect/issues/7752): a timed-out
    body keeps what it holds. Here the body runs on a parallel group's pool thread (a
    ``ctx.parallel`` call / a model turn's read) with ``timeout=0.2`` and takes 1 s;
    its retry is stored for a minute. The execution must give the run's lease back
    (RETRYING, lease cleared) only after that body ended (docs/limits.md: "an
    execution gives its lease back ... only after its timed-out bodies have ended")."""
    run = durable.start("acceptance.parallel_timeout", {"how": how, "seconds": 1.0})
    final = drive(run.id, wait_for_retries=False)
    ended_at_return = tw.ENDED.is_set()
    assert final.status == RunStatus.RETRYING, (final.status, final.error)
    assert final.lease_token == ""
    assert tw.BODIES == ["slow"]
    assert ended_at_return, "the lease was given back while the timed-out body still ran"
