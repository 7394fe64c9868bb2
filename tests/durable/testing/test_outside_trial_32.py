"""Outside trial 32: the testing kit (``durable_env``, ``durable_llm``) used as a user
would, on cases drawn from public bug reports about other durable-execution tools'
testing kits (Temporal's time-skipping environments, mocks and replayer; DBOS's reset
between tests). Each test's docstring cites the report it comes from."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import durable
from durable import RetryPolicy
from durable.models import RunStatus
from durable.services.export import export_run
from durable.testing import replay

#: what the real bodies of this module's tools did (a real body ran: the stub is gone)
REAL: list[str] = []


@pytest.fixture(autouse=True)
def _reset():
    REAL.clear()
    yield
    REAL.clear()


@durable.tool(name="trial32.check", safety="read_only", timeout=30)
def check(order: str) -> str:
    """The real check: in production, a call to a slow service (30 s per try)."""
    REAL.append(f"check:{order}")
    return f"real:{order}"


@durable.tool(name="trial32.notify", safety="idempotent_write", retry=RetryPolicy(max_attempts=1))
def notify(to: str, *, idempotency_key: str) -> dict[str, Any]:
    """The real notification: it takes ``to`` only."""
    REAL.append(f"notify:{to}")
    return {"sent": to}


@durable.workflow(name="trial32.check_later", version="1")
def check_later(ctx, data):
    """Waits 30 minutes, then calls the 30 s check (Temporal's PHP report's workflow)."""
    ctx.sleep(timedelta(minutes=30))
    return ctx.call_tool("trial32.check", {"order": data["order"]})


@durable.workflow(name="trial32.three_days", version="1")
def three_days(ctx, data):
    ctx.step("before", lambda: "before")
    ctx.sleep(timedelta(days=3))
    return ctx.step("after", lambda: "after")


@durable.workflow(name="trial32.sleeper", version="1")
def sleeper(ctx, data):
    ctx.sleep(timedelta(days=7))
    return ctx.step("woke", lambda: f"woke:{data['id']}")


@durable.workflow(name="trial32.parent", version="1")
def parent(ctx, data):
    """Starts children that each sleep 7 days, and waits for them."""
    handles = [ctx.start_child("trial32.sleeper", {"id": i}, f"c{i}") for i in range(2)]
    return [ctx.wait_child(h) for h in handles]


@durable.workflow(name="trial32.notify_with", version="1")
def notify_with(ctx, data):
    """Calls ``trial32.notify`` with what the model chose (here: the test's data)."""
    reply = ctx.call_tool("trial32.notify", data)
    if isinstance(reply, durable.ModelRecoverable):
        return {"recoverable": reply.error_type}
    return reply


#: a workflow and a tool of the same name (two registries, as Temporal's Go SDK has)
@durable.tool(name="trial32.same", safety="read_only")
def same_tool(n: int) -> int:
    REAL.append("same_tool")
    return n


@durable.workflow(name="trial32.same", version="1")
def same_workflow(ctx, data):
    return ctx.call_tool("trial32.same", {"n": data["n"]})


@durable.workflow(name="trial32.ask", version="1")
def ask(ctx, data):
    return ctx.llm([{"role": "user", "content": "hello"}])["content"]


@durable.workflow(name="trial32.lookup_then_wait", version="1")
def lookup_then_wait(ctx, data):
    found = ctx.call_tool("trial32.same", {"n": 1}, step_id="lookup")
    ctx.sleep(timedelta(days=1))
    return found


@durable.workflow(name="trial32.a_moment", version="1")
def a_moment(ctx, data):
    """Inngest's report's function: a one-second sleep, then a step."""
    ctx.sleep(1)
    return ctx.step("validate", lambda: "Hello world!")


@durable.workflow(name="trial32.two_steps", version="1")
def two_steps(ctx, data):
    a = ctx.step("a", lambda: "a")
    b = ctx.step("b", lambda: "b")
    ctx.sleep(timedelta(days=1))
    return [a, b]


# ---------------------------------------------------------------------- time skipping


def test_time_skipped_before_a_run_reaches_its_timer_does_not_shorten_it(durable_env):
    """https://github.com/temporalio/samples-dotnet/pull/95 (review: "are you sure you're
    not time skipping before the workflow is even waiting?") and
    https://github.com/temporalio/sdk-dotnet/issues/77: a skip must count from when the
    timer was set, not from when the test started. Five days pass before the run
    executes; its three-day sleep then still takes three days of skipped time."""
    run = durable_env.start("trial32.three_days")
    durable_env.clock.sleep(timedelta(days=5))  # time passes; nothing executes
    run = durable_env.run(run)
    assert run.status == RunStatus.WAITING  # the sleep starts now, not five days ago

    durable_env.advance(timedelta(days=2, hours=23))
    assert durable_env.run(run).status == RunStatus.WAITING
    durable_env.advance(timedelta(hours=1))
    run = durable_env.run(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == "after"


def test_children_started_by_a_run_have_their_timers_skipped_too(durable_env):
    """https://github.com/temporalio/sdk-java/issues/1565: a 7-day timer in a workflow
    started from another one was not unblocked by the time-skipping test server. Here a
    parent starts two children that sleep 7 days; one ``advance`` of 7 days fires both
    timers and the parent, waiting on them, finishes in the same pass."""
    run = durable_env.run(durable_env.start("trial32.parent"))
    assert run.status == RunStatus.WAITING
    durable_env.tick()  # the children start and reach their sleep
    assert durable_env.run(f"{run.id}.c0").status == RunStatus.WAITING

    durable_env.advance(timedelta(days=6, hours=23))
    assert durable_env.run(run).status == RunStatus.WAITING
    durable_env.advance(timedelta(hours=1))
    run = durable_env.run(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == ["woke:0", "woke:1"]


def test_a_stubbed_call_is_not_timed_out_by_the_skipped_clock(durable_env):
    """https://github.com/temporalio/sdk-php/issues/745: with an activity mocked, the
    virtual clock skipped through the activity's start-to-close timeout (30 s) before
    the mocked answer arrived, so a 30-minute timer then a mocked call failed. Here a
    run sleeps 30 minutes then calls a stubbed tool whose ``timeout`` is 30 s: skipping
    a whole hour leaves the stub's answer in place, on its first try."""
    durable_env.stub_tool("trial32.check", lambda order: f"stub:{order}")
    run = durable_env.run(durable_env.start("trial32.check_later", {"order": "o1"}))
    assert run.status == RunStatus.WAITING

    durable_env.advance(timedelta(hours=1))
    run = durable_env.run(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == "stub:o1"
    [call] = durable_env.tool_calls("trial32.check")
    assert call.outcome == "returned" and call.params == {"order": "o1"}
    assert REAL == []


def test_a_one_second_sleep_neither_hangs_nor_sleeps(durable_env, monkeypatch):
    """https://github.com/inngest/inngest-js/issues/801: the test engine hung on a
    ``step.sleep("1s")``. Here a run sleeping one second is executed with ``time.sleep``
    forbidden: it waits for its timer (or was skipped past it) and one second of
    ``advance`` finishes it."""
    import time

    def no_sleep(seconds):
        raise AssertionError(f"slept {seconds} s")

    monkeypatch.setattr(time, "sleep", no_sleep)
    run = durable_env.run(durable_env.start("trial32.a_moment"))
    assert run.status in (RunStatus.WAITING, RunStatus.SUCCEEDED), run.error
    durable_env.advance(1)
    run = durable_env.run(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == "Hello world!"


# ---------------------------------------------------------------------- stubs


def test_a_stub_does_not_accept_arguments_the_real_tool_refuses(durable_env):
    """https://github.com/temporalio/sdk-go/issues/982 and the mocking discussion of
    https://github.com/temporalio/sdk-python/issues/758: a mock replaces the body but
    must keep the activity's contract, or a test passes a call production refuses. Here
    a stub taking ``**kwargs`` is given an argument the real tool does not take: the
    call is refused as in production (a ModelRecoverable), the stub never entered."""
    entered: list[dict[str, Any]] = []

    def loose(**kwargs):
        entered.append(kwargs)
        return {"sent": "stub"}

    durable_env.stub_tool("trial32.notify", loose)
    run = durable_env.run(
        durable_env.start("trial32.notify_with", {"to": "ann@example.com", "cc": "bob"})
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert "recoverable" in run.output_value()
    assert entered == [] and durable_env.tool_calls("trial32.notify") == []


def test_a_tool_stubbed_under_a_workflows_name_leaves_the_workflow_alone(durable_env):
    """https://github.com/temporalio/sdk-go/issues/1273: registering a workflow and an
    activity of the same name and mocking the activity broke the test suite. Here the
    tool ``trial32.same`` is stubbed while the workflow ``trial32.same`` calls it: the
    workflow runs as itself and the stub answers the call."""
    durable_env.stub_tool("trial32.same", lambda n: n * 10)
    run = durable_env.run(durable_env.start("trial32.same", {"n": 4}))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == 40
    assert REAL == []


def test_a_stub_and_skipped_time_do_not_leak_into_the_next_test_part_1(durable_env, durable_llm):
    """https://github.com/dbos-inc/dbos-docs/pull/297 ("you must reset the DBOS runtime
    between each test"): state left by one test must not reach the next. This part stubs
    a tool, skips ten days and leaves a model reply unused; part 2 (next) sees none."""
    durable_env.stub_tool("trial32.same", lambda n: -1)
    durable_env.advance(timedelta(days=10))
    durable_llm.reply("left over")
    run = durable_env.run(durable_env.start("trial32.same", {"n": 1}))
    assert run.output_value() == -1


def test_a_stub_and_skipped_time_do_not_leak_into_the_next_test_part_2(durable_env, durable_llm):
    """https://github.com/dbos-inc/dbos-docs/pull/297: part 2 of the test above. The real
    body runs, the clock is today's, and the model has no reply queued."""
    from django.utils import timezone

    assert abs(durable_env.now() - timezone.now()) < timedelta(minutes=5)
    run = durable_env.run(durable_env.start("trial32.same", {"n": 2}))
    assert run.output_value() == 2
    assert REAL == ["same_tool"]
    asked = durable_env.run(durable_env.start("trial32.ask"))
    assert asked.status == RunStatus.FAILED  # nothing queued: the script is exhausted
    assert "ScriptExhausted" in str(asked.error)


# ---------------------------------------------------------------------- replay


def test_replay_finds_code_that_drops_a_recorded_step(durable_env):
    """https://github.com/temporalio/sdk-go/issues/983 (fixed by
    https://github.com/temporalio/sdk-go/pull/990): removing a call from a workflow was
    not reported as non-determinism by the replayer (a false negative). Here a waiting
    run has recorded steps ``a`` and ``b``; code that no longer calls ``a`` must not be
    reported compatible."""
    run = durable_env.run(durable_env.start("trial32.two_steps"))
    assert run.status == RunStatus.WAITING
    export = export_run(run.id)
    assert replay(export).compatible

    def without_a(ctx, data):
        b = ctx.step("b", lambda: "b")
        ctx.sleep(timedelta(days=1))
        return [b]

    assert not replay(export, workflow=without_a).compatible


def test_replay_finds_code_that_ends_before_its_recorded_wait(durable_env):
    """https://github.com/temporalio/sdk-go/issues/983: once the workflow function had
    returned, the replayer stopped comparing, so calls dropped at the end passed. Here
    code that returns after ``b``, without the recorded sleep, must not be reported
    compatible with a run waiting in that sleep."""
    run = durable_env.run(durable_env.start("trial32.two_steps"))
    export = export_run(run.id)

    def returns_early(ctx, data):
        return [ctx.step("a", lambda: "a"), ctx.step("b", lambda: "b")]

    assert not replay(export, workflow=returns_early).compatible


def test_replay_compares_what_a_recorded_call_was_not_only_its_place(durable_env):
    """https://github.com/Azure/durabletask/issues/443: the replay matched actions by
    their position only, not by their type, so a changed call replayed "successfully".
    Here a run recorded the tool ``trial32.same`` under the step id ``lookup``; code
    that calls another tool, or a plain step, under that id diverges (``tool_changed``,
    ``kind_changed``)."""
    run = durable_env.run(durable_env.start("trial32.lookup_then_wait"))
    assert run.status == RunStatus.WAITING
    export = export_run(run.id)
    assert replay(export).compatible

    def other_tool(ctx, data):
        found = ctx.call_tool("trial32.check", {"order": "o1"}, step_id="lookup")
        ctx.sleep(timedelta(days=1))
        return found

    def plain_step(ctx, data):
        found = ctx.step("lookup", lambda: 1)
        ctx.sleep(timedelta(days=1))
        return found

    report = replay(export, workflow=other_tool)
    assert not report.compatible and report.divergence.reason == "tool_changed"
    report = replay(export, workflow=plain_step)
    assert not report.compatible and report.divergence.reason == "kind_changed"
