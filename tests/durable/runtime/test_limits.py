"""Rate and concurrency limits in-process (docs/limits.md): the parser, the shared
state's admissions, slots freed at the end of a call and when a lease expires, parking
a run that must wait (its worker given back) and waking it on time, a 429's Retry-After
slowing every run, and the settings' check."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from durable.checks import check_durable
from durable.exceptions import DurableConfigurationError
from durable.limits import Limits, Rate, check_llm_limits, llm_limits, parse_rate
from durable.models import (
    Limit,
    LimitSlot,
    Operation,
    Run,
    RunStatus,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
)
from durable.runtime import limit_store
from durable.runtime import llm as llm_module
from durable.testing import drive
from durable.waits.closing import wake_due
from tests import limit_workflows as lw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    lw.reset()
    yield
    lw.reset()


def _start(workflow: str, data: dict) -> str:
    return durable.start(workflow, data).id


def _running_run(lease_seconds: float = 30.0) -> tuple[str, str]:
    """A run row holding a lease (the holder of a slot), as a claim leaves it."""
    token = uuid.uuid4().hex
    run = Run.objects.create(
        id=uuid.uuid4().hex,
        workflow_name="limits.reads",
        workflow_version="1",
        status=RunStatus.RUNNING,
        input="{}",
        input_hash="h",
        lease_owner="test",
        lease_token=token,
        lease_expires_at=timezone.now() + timedelta(seconds=lease_seconds),
    )
    return run.id, token


# --- the parser ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,calls,period",
    [
        ("60/m", 60, 60.0),
        ("10/s", 10, 1.0),
        ("5/h", 5, 3600.0),
        (" 10 / second ", 10, 1.0),
        ("3/minute", 3, 60.0),
        ("7/Hour", 7, 3600.0),
        ("1000/min", 1000, 60.0),
    ],
)
def test_rates_parse(text, calls, period):
    assert parse_rate(text, where="t") == Rate(calls, period)


@pytest.mark.parametrize(
    "bad", ["60", "60/d", "0/s", "-1/s", "1.5/s", "ten/s", "1001/s", "/m", 60, ["1/s"]]
)
def test_bad_rates_are_refused_at_declaration_naming_the_tool(bad):
    with pytest.raises(DurableConfigurationError, match="bad_tool"):

        @durable.tool(name="bad_tool", safety="read_only", rate_limit=bad)
        def bad_tool() -> None:  # pragma: no cover - never registered
            pass


@pytest.mark.parametrize("bad", [0, -1, 1.5, "5", True])
def test_bad_concurrency_is_refused(bad):
    with pytest.raises(DurableConfigurationError, match="concurrency"):

        @durable.tool(name="bad_tool2", safety="read_only", concurrency=bad)
        def bad_tool2() -> None:  # pragma: no cover
            pass

    with pytest.raises(DurableConfigurationError, match="max_concurrent_runs"):

        @durable.workflow(name="limits.bad", max_concurrent_runs=bad)
        def bad_wf(ctx, data):  # pragma: no cover
            pass


def test_llm_limits_setting_is_checked(settings):
    assert check_llm_limits({"m": {"rate_limit": "5/s"}, "*": {"concurrency": 2}}) == {
        "m": (Rate(5, 1.0), None),
        "*": (None, 2),
    }
    settings.DURABLE = {**settings.DURABLE, "LLM_LIMITS": {"m": {"rate": "5/s"}}}
    assert [m.id for m in check_durable() if m.id == "durable.E007"] == ["durable.E007"]
    settings.DURABLE = {**settings.DURABLE, "LLM_LIMITS": {"m": {"rate_limit": "5/s"}, "*": {}}}
    assert not [m for m in check_durable() if m.id == "durable.E007"]
    assert llm_limits("m") == Limits("llm:m", Rate(5, 1.0), None)
    assert llm_limits("other") is None  # "*" with nothing set limits nothing


# --- the shared state ----------------------------------------------------------------


def test_a_rate_admits_n_per_period_and_says_when_the_next_fits():
    run_id, token = _running_run()
    limits = Limits("tool:t", Rate(3, 60.0))
    verdicts = [limit_store.acquire(limits, run_id=run_id, token=token)[0] for _ in range(4)]
    assert [v.admitted for v in verdicts] == [True, True, True, False]
    refused = verdicts[3]
    assert refused.reason == "rate"
    assert 59.0 < refused.delay <= 60.0 + limit_store.GUARD_SECONDS
    # once the oldest admission has left the window, one more fits (and only one)
    row = Limit.objects.get(key="tool:t")
    row.admitted = [t - 61 if i == 0 else t for i, t in enumerate(row.admitted)]
    row.save()
    assert limit_store.acquire(limits, run_id=run_id, token=token)[0].admitted
    assert not limit_store.acquire(limits, run_id=run_id, token=token)[0].admitted


def _parked(run_id: str, key: str, *, since_seconds: float, wake_in: float, **fields) -> Wait:
    """A ``limit`` wait of ``run_id`` on ``key``: first asked ``since_seconds`` ago."""
    now = timezone.now()
    return Wait.objects.create(
        run_id=run_id,
        wait_id="limit:s1",
        position=0,
        kind=WaitKind.LIMIT,
        key=key,
        status=fields.pop("status", WaitStatus.PENDING),
        wake_at=now + timedelta(seconds=wake_in),
        created_at=now - timedelta(seconds=since_seconds),
        **fields,
    )


def test_a_call_arriving_now_queues_behind_the_runs_parked_before_it():
    """First come, first served: a free place of the rate goes to the run parked first,
    not to a call that asks now; woken, that run is admitted and leaves the queue."""
    limits = Limits("tool:q", Rate(2, 60.0))
    early, early_token = _running_run()
    late, late_token = _running_run()
    first = _parked(early, "tool:q", since_seconds=10, wake_in=5)
    assert limit_store.acquire(limits, run_id=late, token=late_token)[0].admitted  # 1 of 2
    refused, _ = limit_store.acquire(limits, run_id=late, token=late_token)
    assert not refused.admitted and refused.reason == "rate"  # the last place is early's
    # a waiter whose wake time passed more than the grace ago lost its turn (not its place)
    Wait.objects.filter(pk=first.pk).update(
        wake_at=timezone.now() - timedelta(seconds=limit_store.QUEUE_GRACE_SECONDS + 1)
    )
    assert limit_store.queued_ahead("tool:q", run_id=late, since=None) == 0
    Wait.objects.filter(pk=first.pk).update(
        status=WaitStatus.RESOLVED, resolved_by=limit_store.WOKEN_BY, resolved_at=timezone.now()
    )
    assert limit_store.queued_ahead("tool:q", run_id=late, since=None) == 1  # woken: on its way
    verdict, _ = limit_store.acquire(
        limits, run_id=early, token=early_token, since=first.created_at, wait_id="limit:s1"
    )
    assert verdict.admitted
    first.refresh_from_db()
    assert first.resolved_by == limit_store.ADMITTED_BY
    assert limit_store.queued_ahead("tool:q", run_id=late, since=None) == 0


def test_a_concurrency_slot_freed_goes_to_the_first_in_the_queue():
    limits = Limits("tool:cq", None, 1)
    early, _ = _running_run()
    late, late_token = _running_run()
    _parked(early, "tool:cq", since_seconds=3, wake_in=2, title="waiting for concurrency")
    refused, slot = limit_store.acquire(limits, run_id=late, token=late_token)
    assert not refused.admitted and refused.reason == "concurrency" and slot is None
    # the queue is ordered: a call that asked before the parked run goes first
    ahead = limit_store.queued_ahead(
        "tool:cq", run_id=late, since=timezone.now() - timedelta(seconds=4)
    )
    assert ahead == 0


def test_concurrency_slots_are_freed_on_completion_and_on_lease_expiry():
    limits = Limits("tool:c", None, 1)
    a, a_token = _running_run()
    b, b_token = _running_run()
    verdict, slot = limit_store.acquire(limits, run_id=a, token=a_token)
    assert verdict.admitted and slot is not None
    refused, _ = limit_store.acquire(limits, run_id=b, token=b_token)
    assert not refused.admitted and refused.reason == "concurrency"
    assert refused.delay <= limit_store.CONCURRENCY_RECHECK_SECONDS
    limit_store.release("tool:c", slot)  # completion frees it
    verdict, slot_b = limit_store.acquire(limits, run_id=b, token=b_token)
    assert verdict.admitted
    # b's worker dies: its lease expires, and the slot with it
    assert not limit_store.acquire(limits, run_id=a, token=a_token)[0].admitted
    Run.objects.filter(pk=b).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert limit_store.acquire(limits, run_id=a, token=a_token)[0].admitted
    assert not LimitSlot.objects.filter(pk=slot_b).exists()  # the dead slot was removed


def test_runs_further_back_in_a_concurrency_queue_recheck_less_often():
    """A freed slot wakes the first in line at once; the others' rechecks are a fallback,
    spaced by their place, so a long queue does not wake every waiter every 2 s."""
    limits = Limits("tool:long", None, 1)
    holder, holder_token = _running_run()
    assert limit_store.acquire(limits, run_id=holder, token=holder_token)[0].admitted
    for i in range(9):
        parked, _ = _running_run()
        _parked(parked, "tool:long", since_seconds=60 - i, wake_in=2, title="concurrency")
    first, first_token = _running_run(lease_seconds=30)
    late, late_token = _running_run()
    step = limit_store.CONCURRENCY_RECHECK_SECONDS
    # queued behind the nine: the tenth in line checks again after ten rounds
    refused, _ = limit_store.acquire(limits, run_id=late, token=late_token)
    assert refused.reason == "concurrency"
    assert 10 * step - 1 < refused.delay <= 10 * step
    # the first in line checks at the holder's lease expiry or the recheck, whichever first
    Wait.objects.filter(key="tool:long").update(status=WaitStatus.RESOLVED, resolved_by="x")
    Run.objects.filter(pk=holder).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
    refused, _ = limit_store.acquire(limits, run_id=first, token=first_token)
    assert refused.delay <= 1.0
    # far back, at most MAX_RECHECK_SECONDS
    for i in range(40):
        parked, _ = _running_run()
        _parked(parked, "tool:long", since_seconds=120 - i, wake_in=2, title="concurrency")
    refused, _ = limit_store.acquire(limits, run_id=late, token=late_token)
    assert refused.delay <= limit_store.MAX_RECHECK_SECONDS


def test_a_slot_of_a_lease_that_was_taken_over_does_not_count():
    limits = Limits("tool:c2", None, 1)
    a, a_token = _running_run()
    assert limit_store.acquire(limits, run_id=a, token=a_token)[0].admitted
    Run.objects.filter(pk=a).update(lease_token=uuid.uuid4().hex)  # another claim
    b, b_token = _running_run()
    assert limit_store.acquire(limits, run_id=b, token=b_token)[0].admitted


# --- parking a run -------------------------------------------------------------------


def test_a_call_over_the_rate_parks_the_run_and_wakes_on_time():
    first = _start("limits.reads", {"name": "a", "n": 2})
    assert drive(first).status == RunStatus.SUCCEEDED
    second = _start("limits.reads", {"name": "b", "n": 1})
    before = timezone.now()
    run = drive(second)
    # parked, not running: the lease (so the worker) is given back
    assert run.status == RunStatus.WAITING and run.lease_token == ""
    wait = Wait.objects.get(run_id=second, kind=WaitKind.LIMIT)
    assert wait.status == WaitStatus.PENDING and wait.key == "tool:limited_read"
    assert wait.title == "waiting for rate limit of tool:limited_read"
    assert before + timedelta(seconds=58) < wait.wake_at < before + timedelta(seconds=61)
    assert len(lw.CALLS) == 2  # the third call did not reach the tool
    event = TraceEvent.objects.filter(run_id=second, kind="waiting").last()
    assert "rate limit of tool:limited_read (2/m)" in event.message
    # not early: the sweeper leaves it until its wake time
    assert wake_due(wait.wake_at - timedelta(seconds=1)) == []
    # the window moves on (as if a minute passed), then the timer fires
    row = Limit.objects.get(key="tool:limited_read")
    row.admitted = [t - 61 for t in row.admitted]
    row.save()
    assert wake_due(wait.wake_at) == [second]
    run = drive(second)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == ["b-0"]
    assert [label for label, _ in lw.CALLS] == ["a-0", "a-1", "b-0"]


def test_a_short_wait_is_slept_in_the_worker():
    limits = Limits("tool:limited_read", Rate(2, 60.0))
    run_id, token = _running_run()
    limit_store.acquire(limits, run_id=run_id, token=token)
    limit_store.acquire(limits, run_id=run_id, token=token)
    row = Limit.objects.get(key="tool:limited_read")
    row.admitted = [row.admitted[0] - 59.6, row.admitted[1]]  # one leaves in ~0.45 s
    row.save()
    run = drive(_start("limits.reads", {"name": "c", "n": 1}))
    assert run.status == RunStatus.SUCCEEDED
    assert not Wait.objects.filter(run=run, kind=WaitKind.LIMIT).exists()


def test_a_write_waits_before_its_ledger_row():
    run_id = _start("limits.writes", {"n": 3})
    run = drive(run_id)
    assert run.status == RunStatus.WAITING
    # the third write has no `started` operation: after the wake it is a plain first try
    assert Operation.objects.filter(run_id=run_id).count() == 2
    row = Limit.objects.get(key="tool:limited_write")
    row.admitted = []
    row.save()
    wake_due(timezone.now() + timedelta(seconds=120))
    run = drive(run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert Operation.objects.filter(run_id=run_id, status="succeeded").count() == 3


def test_a_429_with_retry_after_slows_the_other_runs():
    lw.FAILS["p-0"] = [durable.TransientError("429", retry_after=30)]
    first = _start("limits.reads", {"name": "p", "n": 1, "tool": "provider"})
    run = drive(first, wait_for_retries=False)
    # its own retry waits 30 s: stored, the run released until then
    assert run.status == RunStatus.RETRYING
    row = Limit.objects.get(key="tool:provider")
    assert row.slowed_until is not None
    assert timezone.now() + timedelta(seconds=28) < row.slowed_until
    other = _start("limits.reads", {"name": "q", "n": 1, "tool": "provider"})
    run = drive(other)
    assert run.status == RunStatus.WAITING
    wait = Wait.objects.get(run_id=other, kind=WaitKind.LIMIT)
    assert "slowed down by a 429" in wait.title
    assert abs((wait.wake_at - row.slowed_until).total_seconds()) < 1.0
    assert [label for label, _ in lw.CALLS] == ["p-0"]  # q never reached the provider


def test_llm_limits_apply_per_model(settings, monkeypatch):
    settings.DURABLE = {**settings.DURABLE, "LLM_LIMITS": {"*": {"rate_limit": "1/h"}}}

    def fake_chat(messages, **kw):
        lw.CALLS.append(("llm", 0.0))
        return {"content": "ok", "tool_calls": [], "usage": {}, "model": "m1"}

    monkeypatch.setattr(llm_module, "chat", fake_chat)
    run = drive(_start("limits.llm", {"n": 2}))
    assert run.status == RunStatus.WAITING
    wait = Wait.objects.get(run=run, kind=WaitKind.LIMIT)
    assert wait.key == "llm:m1" and len(lw.CALLS) == 1


def test_the_admin_override_of_a_tools_limits_wins(settings):
    from durable.models import Tool

    Tool.objects.update_or_create(
        name="limited_read", defaults={"safety": "read_only", "rate_limit": "1/h"}
    )
    run = drive(_start("limits.reads", {"name": "o", "n": 2}))
    assert run.status == RunStatus.WAITING
    assert len(lw.CALLS) == 1
