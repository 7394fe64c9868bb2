"""Trial of the in-place ride-out of a database fault at a finished step's checkpoint
(commit 83a6e21), from public reports of the same fault in tools that do this job.

Each case injects the fault as ``tests/durable/worker/test_db_faults.py`` does
(``connection.execute_wrapper``: the chosen statement raises ``OperationalError``, or it
commits and its answer is lost) and checks what the report says went wrong there: a
body run again, a duplicate record, tokens counted twice, a cancel lost, a run released
for a fault it could have ridden out.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import IntegrityError, OperationalError, connection
from django.utils import timezone

import durable
from durable.models import Operation, OperationStatus, Run, RunStatus, Step, TraceEvent
from durable.runtime import dbconn, llm
from durable.testing import make_due
from durable.worker.engine import execute
from tests import dbfault_workflows as dw
from tests import trial_dbfault_inplace_workflows as tw
from tests.crash_workflows import read_jsonl
from tests.durable.runtime import compensation_workflows as cw
from tests.durable.worker import test_db_faults as base
from tests.durable.worker.test_db_faults import (
    calls_of,
    fail_once,
    fail_times,
    invocations,
    lose_the_answer_once,
    second_step_insert,
    step_events,
    step_insert,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

# the fixtures of test_db_faults.py: the bodies' log folder (autouse) and the in-place
# retries without their backoff
crash_dir = base.crash_dir
quick_retries = base.quick_retries


def flat(sql: str) -> str:
    return " ".join(sql.replace('"', "").split())


def step_rows(run_id: str) -> list[tuple[int, str]]:
    return list(
        Step.objects.filter(run_id=run_id).order_by("position").values_list("position", "step_id")
    )


# ---------------------------------------------------------------- an LLM step's tokens


@pytest.fixture
def fake_model(monkeypatch):
    cw.reset()
    monkeypatch.setattr(llm, "client", lambda timeout=60.0: cw.FakeClient())
    yield cw.LLM
    cw.reset()


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_an_llm_steps_tokens_are_counted_once_when_its_checkpoint_rode_out_a_fault(
    crash_dir, quick_retries, fake_model, fault
):
    """From hojinzs/github-symphony#147 "bug: totalTokens doubles on every
    error-triggered retry (cumulative token accounting bug)" and
    open-telemetry/semantic-conventions-genai#476 "should token/usage metrics count
    operations or attempts? (retry double-counting)": a retry after an error must not
    add a usage that was already counted.

    The model's answer (700 tokens) is checkpointed through a fault (the statement fails,
    or it commits and the answer is lost). The run's ``max_tokens`` is 1000: a second
    call (200 tokens) is allowed only if the first was counted once, in memory and in the
    database; the model is billed twice, never three times.
    """
    fake_model["replies"] = [(700, "T-7"), (200, "done")]
    run = durable.start("trial.llm_then_charge", {"n": 7}, max_tokens=1000)
    injected = fault(step_insert)  # the first step row: the model's answer
    with connection.execute_wrapper(injected):
        status = execute(run.id)
    assert injected.state["fired"], "the checkpoint was not attempted"
    row = Run.objects.get(pk=run.id)
    assert status == RunStatus.SUCCEEDED, (row.error, list(row.events.values_list("kind")))
    assert fake_model["billed"] == [700, 200]
    assert row.tokens_used == 900 and row.claims == 1
    assert row.output_value() == {"ticket": "T-7", "charge": "C-1", "summary": "done"}
    assert step_events(run.id) == Counter({"ask": 1, "dbf.charge": 1, "summary": 1})
    ask = TraceEvent.objects.get(run=run, kind="step_executed", step_id="ask")
    assert ask.data["tokens"] == 700
    assert dw.effect_counts(crash_dir)[("charges", f"{run.id}:dbf.charge")] == 1


# ------------------------------------------------- a step that needed in-process retries


def after_the_second_try(folder, label: str):
    """A match of the first write to ``durable_step`` once ``label``'s body ran twice
    (its success's checkpoint: an UPDATE of the row its failed try wrote)."""

    def match(sql: str) -> bool:
        if not sql.startswith(("UPDATE durable_step", "INSERT INTO durable_step", "WITH")):
            return False
        if "durable_step " not in sql and "durable_step(" not in sql.replace(" (", "("):
            return False
        path = folder / "invocations.jsonl"
        return path.exists() and sum(i["step"] == label for i in read_jsonl(path)) >= 2

    return match


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_a_step_that_succeeded_at_its_second_try_is_recorded_once_through_a_fault(
    crash_dir, quick_retries, fault
):
    """From dbos-inc/dbos-transact-py#260 "Workflow recovery failing when using a step
    with retries configured": a step with retries is the case where the recorded row is
    not new (its failed try wrote it) and its attempt count is not 1.

    The success of the second try is an update of that row; its checkpoint rides out a
    fault. The read-back must tell the failed try's row (RETRYING, 1 attempt) from the
    success (SUCCEEDED, 2): not take the first for the second, nor write the success
    twice (two events, ``steps_executed`` counted twice), nor run the body a third time.
    """
    tw.FLAKY["flaky"] = 1
    run = durable.start("trial.retried", None)
    injected = fault(after_the_second_try(crash_dir, "flaky"))
    with connection.execute_wrapper(injected):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert injected.state["fired"], "the success's checkpoint was not attempted"
    row = Run.objects.get(pk=run.id)
    assert row.output_value() == ["flaky", "next"] and row.claims == 1
    assert invocations(crash_dir, run.id) == Counter({"flaky": 2, "next": 1})
    assert row.steps_executed == 2
    assert step_events(run.id) == Counter({"flaky": 1, "next": 1})
    step = row.steps.get(step_id="flaky")
    assert step.status == "succeeded" and step.attempts == 2
    assert list(step.attempt_rows.values_list("attempt", flat=True)) == [1]
    assert step_rows(run.id) == [(0, "flaky"), (1, "next")]


# --------------------------------------------------------------------- a parallel group


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_a_fault_at_one_checkpoint_of_a_parallel_group_runs_no_call_again(
    crash_dir, quick_retries, fault
):
    """From JetBrains/koog#2051 "`parallel` nodes break sql checkpoint persistence
    (1.0.0)": the branches of a parallel node each checkpoint as they finish, and one
    failed write failed the run and cancelled its siblings.

    Three calls of one ``ctx.parallel`` group; the second call's checkpoint meets a
    fault. Every call ran once, each is recorded once at its own position, the group's
    results come back in list order, and the run was never released.
    """
    run = durable.start("trial.parallel", None)
    injected = fault(second_step_insert())
    with connection.execute_wrapper(injected):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert injected.state["fired"]
    row = Run.objects.get(pk=run.id)
    assert row.output_value() == ["p0", "p1", "p2", "last"] and row.claims == 1
    names = ["p0", "p1", "p2", "last"]
    assert invocations(crash_dir, run.id) == Counter(dict.fromkeys(names, 1))
    assert step_events(run.id) == Counter(dict.fromkeys(names, 1))
    assert [sid for _, sid in step_rows(run.id)] == names and row.steps_executed == 4
    assert not TraceEvent.objects.filter(run=run, kind="db_fault").exists()


# ------------------------------------------------------ a cancel during the outage


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_a_cancel_committed_during_the_outage_ends_the_run_after_the_step_is_recorded(
    crash_dir, quick_retries, fault
):
    """From dbos-inc/dbos-transact-py#767 "cancel_workflow() can be silently lost when
    it races workflow completion — no error, no indicator".

    The first step's checkpoint fails (or commits, its answer lost); while the database
    is away an operator cancels the run. The step ran, so it is recorded once (by the
    read-back or by the fenced write that finds the run stopped); the cancel is not
    lost: the run ends cancelled, and neither the plain step after it (no ledger row
    would stop it) nor the unsafe write is called.
    """
    run = durable.start("trial.plain_steps_then_charge", {"n": 8})
    injected = fault(step_insert)
    cancelled = {"done": False}

    def operator(execute_, sql, params, many, context):
        # the first statement after the fault (a new connection, outside a transaction)
        if (
            injected.state["fired"]
            and not cancelled["done"]
            and not context["connection"].in_atomic_block
        ):
            cancelled["done"] = True
            durable.cancel(run.id, reason="customer called during the outage")
        return execute_(sql, params, many, context)

    with connection.execute_wrapper(operator), connection.execute_wrapper(injected):
        execute(run.id)
    assert injected.state["fired"] and cancelled["done"]
    row = Run.objects.get(pk=run.id)
    assert row.status == RunStatus.CANCELLED, row.status
    assert invocations(crash_dir, run.id) == Counter({"first": 1})
    assert step_rows(run.id) == [(0, "first")]
    assert row.steps.get(step_id="first").status == "succeeded"
    assert step_events(run.id) == Counter({"first": 1})
    assert not Operation.objects.filter(run=run).exists()
    assert ("charges", f"{run.id}:dbf.charge") not in dw.effect_counts(crash_dir)
    assert execute(run.id) is None  # nothing runs after the cancel


# ---------------------------------------------- the read-back itself meets the fault


def test_a_fault_on_the_read_back_is_ridden_out_too(crash_dir, quick_retries):
    """From psycopg/psycopg2#435 "Possible wrong status after problems in connection."
    (a dropped connection's transaction status cannot be trusted; only the server can say
    what committed).

    The checkpoint commits and its answer is lost; the read-back that would say so
    then fails too (the server flaps). The next try reads it back on a third connection:
    the step is taken as recorded (its first event, no second row), the unsafe write after
    it runs once, the run is not released.
    """
    run = durable.start("dbf.two_steps", {"n": 9})
    lost = lose_the_answer_once(step_insert)
    read_back = fail_once(
        lambda sql: (
            bool(lost.state["fired"])
            and sql.startswith("SELECT")
            and "FROM durable_step " in sql
            and "durable_step.attempts = " in sql
        )  # the read-back's row, not a replay's read
    )
    with connection.execute_wrapper(lost), connection.execute_wrapper(read_back):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert lost.state["fired"] and read_back.state["fired"]
    row = Run.objects.get(pk=run.id)
    assert row.claims == 1 and row.steps_executed == 2
    assert invocations(crash_dir, run.id) == Counter({"first": 1, "dbf.charge": 1})
    assert step_events(run.id) == Counter({"first": 1, "dbf.charge": 1})
    assert step_rows(run.id) == [(0, "first"), (1, "dbf.charge")]
    assert not TraceEvent.objects.filter(run=run, kind="db_fault").exists()
    assert Operation.objects.get(run=run).status == OperationStatus.SUCCEEDED


# ---------------------------------------- a unique violation, then a fault, on a retry


def test_a_fault_while_reading_back_after_a_unique_violation_is_still_ridden_out(monkeypatch):
    """From cockroachdb/cockroach#7604 "sql: unexpected duplicate key violations" ("the
    result of retrying an operation that actually executed the first time").

    ``retry_in_place`` itself: the first try faults, the read-back finds nothing, the
    retry hits a unique violation (the lost commit landed late), and the read-back that
    follows meets another fault. Tries are left: the fault is ridden out and the next
    read-back finds the row, not raised (which would release the run).
    """
    monkeypatch.setattr(dbconn, "drop_connection", lambda: None)
    writes = [OperationalError("server closed the connection (injected)"), IntegrityError("dup")]
    reads = [None, OperationalError("terminating connection (injected)"), "recorded"]

    def write():
        raise writes.pop(0)

    def committed():
        answer = reads.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    got = dbconn.retry_in_place(write, committed, what="a test", delays=(0.0, 0.0, 0.0))
    assert got == "recorded" and not writes and not reads


def test_a_unique_violation_on_the_first_try_is_an_answer_not_a_fault():
    """The same report's other side: a duplicate on a first try (no fault before it) is
    not taken for a lost commit; it is raised as it is, nothing read back."""
    reads = []

    def write():
        raise IntegrityError("dup")

    with pytest.raises(IntegrityError):
        dbconn.retry_in_place(write, lambda: reads.append(1), what="a test", delays=(0.0,))
    assert reads == []


# ------------------------------------------------- batched steps with the sync step


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_pending_batched_steps_written_with_a_sync_checkpoint_ride_out_its_fault(
    crash_dir, quick_retries, batched, fault
):
    """From langchain-ai/langgraph#8039 "durability="sync": put_writes/put persistence
    order is unenforced, so post-crash recovery (replay vs re-execute) is
    host-dependent": pending writes and the checkpoint that carries them must be
    recorded together, or a node runs again.

    Two batched steps are still pending (fewer than ``BATCH_MAX_STEPS``) when the sync
    step's checkpoint writes them in its own transaction; that transaction meets the
    fault. The retry (or the read-back of the sync step) records all three, each once.
    """
    run = durable.start("dbf.batched", {"n": 2})
    injected = fault(step_insert)  # the first step insert: the pending batched rows
    with connection.execute_wrapper(injected):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert injected.state["fired"]
    names = ["b0", "b1", "last"]
    row = Run.objects.get(pk=run.id)
    assert row.output_value() == names and row.claims == 1 and row.steps_executed == 3
    assert invocations(crash_dir, run.id) == Counter(dict.fromkeys(names, 1))
    assert step_events(run.id) == Counter(dict.fromkeys(names, 1))
    assert [sid for _, sid in step_rows(run.id)] == names


def test_a_batch_flush_fault_that_outlasts_the_retries_releases_the_run(
    crash_dir, quick_retries, batched
):
    """From dbos-inc/dbos-transact-golang#93 "System DB retries" (a step's output not
    recorded when the connection is interrupted) and its PR #102 (retry only the
    connection-class errors, for a while): past the retries, the run is released.

    Every try of the first flush (four batched steps) fails: the run is released
    (``RETRYING``, a ``db_fault`` event), not failed; the next execution runs the four
    unrecorded steps again (batched steps may) and records every step once.
    """
    run = durable.start("dbf.batched", {"n": 6})
    injected = fail_times(lambda sql: "INSERT INTO durable_step" in sql, 3)
    with connection.execute_wrapper(injected):
        assert execute(run.id) == RunStatus.RETRYING
    assert injected.state["fired"] == 3
    row = Run.objects.get(pk=run.id)
    assert row.status == RunStatus.RETRYING and row.lease_token == "" and row.error is None
    assert not row.steps.exists() and row.steps_executed == 0
    assert TraceEvent.objects.filter(run=run, kind="db_fault").count() == 1
    assert not TraceEvent.objects.filter(run=run, kind="step_executed").exists()

    make_due(run.id)
    assert execute(run.id) == RunStatus.SUCCEEDED
    names = [f"b{i}" for i in range(6)] + ["last"]
    row = Run.objects.get(pk=run.id)
    assert row.output_value() == names and row.steps_executed == 7 and row.claims == 2
    assert [sid for _, sid in step_rows(run.id)] == names
    assert step_events(run.id) == Counter(dict.fromkeys(names, 1))
    # the unflushed four ran twice; the ones after the fault once
    assert invocations(crash_dir, run.id) == Counter(
        {"b0": 2, "b1": 2, "b2": 2, "b3": 2, "b4": 1, "b5": 1, "last": 1}
    )


# ------------------------------------- a lock error at the checkpoint's first statement


def lock_error(vendor: str) -> tuple[tuple[str, ...], str]:
    """Where a busy database refuses a checkpoint's transaction, and what it says."""
    if vendor == "sqlite":  # the write lock is taken when the transaction begins
        return ("BEGIN",), "database is locked"
    return ("UPDATE", "INSERT", "WITH"), "canceling statement due to lock timeout"


@pytest.mark.parametrize("times", [1, 2])
def test_a_lock_error_at_the_checkpoints_first_write_is_ridden_out_and_counted(
    crash_dir, quick_retries, times
):
    """From langchain-ai/langgraph#8136 "[Bug]: Potential sqlite3.OperationalError
    database is locked during highly concurrent aput operations" (and its PR #8135,
    BEGIN IMMEDIATE): on SQLite a checkpoint's first write inside its transaction is
    where a busy database says "database is locked" (its ``BEGIN IMMEDIATE``; on
    PostgreSQL a lock timeout at its first write).

    The first step's checkpoint gets that error there ``times`` times in a row; the
    step's event says how many faults its record rode out, the body ran once, the run
    was not released, and the next step's event carries no count.
    """
    run = durable.start("dbf.two_steps", {"n": 10})
    state = {"fired": 0, "sql": []}
    first_write, message = lock_error(connection.vendor)

    def busy(execute_, sql, params, many, context):
        text = flat(sql)
        armed = (crash_dir / "invocations.jsonl").exists()  # the first body ran
        if armed and state["fired"] < times and text.startswith(first_write):
            state["fired"] += 1
            state["sql"].append(text[:60])
            raise OperationalError(f"{message} (injected)")
        return execute_(sql, params, many, context)

    with connection.execute_wrapper(busy):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert state["fired"] == times, state
    assert all(sql.startswith(first_write) for sql in state["sql"])
    row = Run.objects.get(pk=run.id)
    assert row.claims == 1 and row.output_value()["ticket"] == "T-1"
    assert invocations(crash_dir, run.id) == Counter({"first": 1, "dbf.charge": 1})
    first = TraceEvent.objects.get(run=run, kind="step_executed", step_id="first")
    assert first.data["db_faults"] == times
    charge = TraceEvent.objects.get(run=run, kind="step_executed", step_id="dbf.charge")
    assert "db_faults" not in charge.data
    assert not TraceEvent.objects.filter(run=run, kind="db_fault").exists()


# ------------------------------- a real terminated backend at a checkpoint (PostgreSQL)


def test_a_really_terminated_backend_at_the_checkpoint_is_ridden_out(crash_dir, quick_retries):
    """From dbos-inc/dbos-transact-golang PR #102 "chore: add retry functionality in the
    systemDb connection" (the connection-class errors to retry: 57P01 admin_shutdown,
    08006 connection_failure, ...), here not injected but real: just before the unsafe
    write's checkpoint statement, this connection's backend is terminated with
    ``pg_terminate_backend``, so the statement fails as psycopg reports it after a
    restart. The checkpoint is written on a new backend; the charge happened once, its
    operation is recorded as the call returned, the run was never released.
    """
    if connection.vendor != "postgresql":
        pytest.skip("terminates a PostgreSQL backend; SQLite has no server connection")
    from tests.durable.worker.test_db_faults import terminate_my_backend

    run = durable.start("dbf.two_steps", {"n": 11})
    match, state = second_step_insert(), {"killed": [], "errors": []}

    def kill_before(execute_, sql, params, many, context):
        if not state["killed"] and match(flat(sql)):
            state["killed"].append(context["connection"].connection.info.backend_pid)
            terminate_my_backend()
        try:
            return execute_(sql, params, many, context)
        except Exception as exc:
            state["errors"].append(type(exc).__name__)
            raise

    with connection.execute_wrapper(kill_before):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert state["killed"] and state["errors"], state
    connection.ensure_connection()
    assert connection.connection.info.backend_pid != state["killed"][0]
    row = Run.objects.get(pk=run.id)
    assert row.claims == 1 and row.output_value()["charge"] == "C-1"
    assert invocations(crash_dir, run.id) == Counter({"first": 1, "dbf.charge": 1})
    assert dw.effect_counts(crash_dir)[("charges", f"{run.id}:dbf.charge")] == 1
    op = Operation.objects.get(run=run)
    assert op.status == OperationStatus.SUCCEEDED and op.resolution == ""
    event = TraceEvent.objects.get(run=run, kind="step_executed", step_id="dbf.charge")
    assert event.data["db_faults"] == 1


# ------------------------------------- a lease taken over at an unsafe write's checkpoint


def test_a_lease_lost_during_an_unsafe_writes_checkpoint_keeps_the_writes_result(
    crash_dir, quick_retries
):
    """From shenjianan97/persistent-agent-runtime PR #5 "Fix LangGraph checkpoint resume
    handling" ("validate lease ownership inside aput_writes() before persisting pending
    write rows so revoked leases do not leave stale write records behind").

    The charge happened; its checkpoint meets a fault, and while the database is away
    the lease expires and another worker claims the run. The read-back finds the lease
    gone: no step row is written under it, but the write's result is kept in the ledger
    (a late result, fenced by the operation's own token), so the next owner neither
    charges again nor has to ask the reconcile hook.
    """
    run = durable.start("dbf.two_steps", {"n": 12})
    match, state = second_step_insert(), {"fired": 0}

    def taken_over(execute_, sql, params, many, context):
        if state["fired"] == 1 and not context["connection"].in_atomic_block:
            state["fired"] = 2  # the fault's transaction is gone: another worker claims
            Run.objects.filter(pk=run.id).update(lease_token="another-worker")
        elif not state["fired"] and match(flat(sql)):
            state["fired"] = 1
            raise OperationalError("server closed the connection unexpectedly (injected)")
        return execute_(sql, params, many, context)

    with connection.execute_wrapper(taken_over):
        execute(run.id)
    assert state["fired"] == 2
    assert step_rows(run.id) == [(0, "first")]
    op = Operation.objects.get(run=run)
    assert op.status == OperationStatus.SUCCEEDED and op.resolution.startswith("late result")
    assert TraceEvent.objects.filter(run=run, kind="late_result").count() == 1

    # the other worker is gone too: the run is released and claimed again
    Run.objects.filter(pk=run.id).update(
        lease_token="", status=RunStatus.RETRYING, wake_at=timezone.now()
    )
    assert execute(run.id) == RunStatus.SUCCEEDED
    row = Run.objects.get(pk=run.id)
    assert row.output_value()["charge"] == "C-1"
    calls = calls_of(crash_dir, run.id)
    assert calls == Counter({("step", "first"): 1, ("step", "dbf.charge"): 1})
    assert dw.effect_counts(crash_dir)[("charges", f"{run.id}:dbf.charge")] == 1


# ----------------------------------------------------- a compensation's checkpoint


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_a_compensations_checkpoint_rides_out_a_fault_and_the_hook_runs_once(
    crash_dir, quick_retries, fault
):
    """From oxidecomputer/omicron#4730 "Nexus crashed after database connection EOF
    under extreme load; sagas wedged" (sagas left in ``undo_started``).

    A booking, then a step that fails for good; the operator compensates. The
    compensation hook (releasing the seat) runs and its record meets a fault: it is
    ridden out in place, so the hook is not run a second time, the run ends
    ``compensated`` in the same execution, and the event counts the fault.
    """
    run = durable.start("trial.book_then_fail", {"seat": "12A"})
    assert execute(run.id) == RunStatus.FAILED
    durable.compensate(run.id, reason="undo the booking")
    injected = fault(step_insert)  # the first step row of the compensation
    with connection.execute_wrapper(injected):
        status = execute(run.id)
    assert injected.state["fired"], "the compensation's checkpoint was not attempted"
    row = Run.objects.get(pk=run.id)
    assert status == RunStatus.COMPENSATED, (row.status, row.error)
    calls = calls_of(crash_dir, run.id)
    assert calls == Counter(
        {
            ("step", "trial.book_seat"): 1,
            ("step", "confirm"): 1,
            ("compensate", "compensate:trial.book_seat"): 1,
        }
    )
    assert row.claims == 2  # the workflow's execution, then the compensation's
    assert not TraceEvent.objects.filter(run=run, kind="db_fault").exists()
    assert step_events(run.id)["compensate:trial.book_seat"] == 1
    if fault is fail_once:  # the written record says what it rode out
        event = TraceEvent.objects.get(
            run=run, kind="step_executed", step_id="compensate:trial.book_seat"
        )
        assert event.data["db_faults"] == 1
