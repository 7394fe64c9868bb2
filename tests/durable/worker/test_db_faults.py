"""Database faults inside one process: a finished step's checkpoint rides out a short
one in place (read back, then written again); a longer one, or one elsewhere, stops the
execution, the run is released, the ledger settles what happened. (Real workers and
terminated backends: tests/processes.)

A fault is injected with ``connection.execute_wrapper``: the chosen statement raises
``OperationalError`` instead of running, as a statement on a terminated connection does.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import OperationalError, connection

import durable
from durable.models import Operation, OperationStatus, Run, RunStatus, TraceEvent
from durable.testing import make_due
from durable.worker.engine import execute
from tests import dbfault_workflows as dw
from tests.crash_workflows import read_jsonl

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def crash_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CRASH_TEST_DIR", str(tmp_path))
    return tmp_path


def fail_once(match):
    """An execute wrapper: the first statement for which ``match(sql)`` is true raises,
    as on a terminated connection (:func:`fail_times` once)."""
    return fail_times(match, 1, "terminating connection due to administrator command")


def step_insert(sql: str) -> bool:
    return "INSERT INTO durable_step" in sql


def calls_of(folder, run_id: str) -> Counter:
    """``{(kind, step): n}``: the bodies (``step``) and reconcile hooks of ``run_id``."""
    return Counter(
        (i["kind"], i["step"])
        for i in read_jsonl(folder / "invocations.jsonl")
        if i["run"] == run_id
    )


def invocations(folder, run_id: str) -> Counter:
    return Counter(
        i["step"]
        for i in read_jsonl(folder / "invocations.jsonl")
        if i["run"] == run_id and i["kind"] == "step"
    )


def fail_times(match, times: int, message: str = "could not connect to server"):
    """An execute wrapper: the first ``times`` statements for which ``match(sql)`` is
    true raise ``OperationalError(message)``, as on a database away that long; the
    wrapper's ``state`` counts them (``fired``) and keeps the last one's ``sql``."""
    state = {"fired": 0, "sql": ""}

    def wrapper(execute_, sql, params, many, context):
        if state["fired"] < times and match(" ".join(sql.replace('"', "").split())):
            state["fired"] += 1
            state["sql"] = sql
            raise OperationalError(f"{message} (injected)")
        return execute_(sql, params, many, context)

    wrapper.state = state
    return wrapper


def lose_the_answer_once(match):
    """An execute wrapper: the first statement for which ``match(sql)`` is true runs and
    commits, then its answer is lost (``OperationalError``), as when the connection
    drops after the server committed. Inside a transaction it is the commit's answer
    that is lost."""
    state = {"fired": 0}

    def wrapper(execute_, sql, params, many, context):
        result = execute_(sql, params, many, context)
        if not state["fired"] and match(" ".join(sql.replace('"', "").split())):
            state["fired"] = 1
            conn = context["connection"]
            if not conn.in_atomic_block:
                raise OperationalError("server closed the connection unexpectedly (injected)")
            real = conn.commit

            def commit_then_lose():
                del conn.commit
                real()
                raise OperationalError("server closed the connection unexpectedly (injected)")

            conn.commit = commit_then_lose
        return result

    wrapper.state = state
    return wrapper


@pytest.fixture
def quick_retries(monkeypatch):
    """The in-place retries of a checkpoint without their backoff: three tries in all."""
    from durable.runtime import dbconn

    monkeypatch.setitem(dbconn.retry_in_place.__kwdefaults__, "delays", (0.0, 0.0))


def step_events(run_id: str) -> Counter:
    return Counter(
        TraceEvent.objects.filter(run_id=run_id, kind="step_executed").values_list(
            "step_id", flat=True
        )
    )


def test_a_checkpoint_fault_is_ridden_out_in_place_without_calling_the_body_again(
    crash_dir, quick_retries
):
    """A database that drops the connection while a finished step is recorded (a
    restart, a failover): the checkpoint is written again on a new connection; the body
    (a model's answer, a tool's call) is not asked again and the run is not released."""
    run = durable.start("dbf.two_steps", {"n": 1})
    fault = fail_once(step_insert)
    with connection.execute_wrapper(fault):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert fault.state["fired"], "the checkpoint was not attempted"
    row = Run.objects.get(pk=run.id)
    assert row.output_value()["ticket"] == "T-1" and row.claims == 1
    assert invocations(crash_dir, run.id) == Counter({"first": 1, "dbf.charge": 1})
    assert not TraceEvent.objects.filter(run=run, kind="db_fault").exists()
    assert row.steps_executed == 2 and step_events(run.id) == Counter({"first": 1, "dbf.charge": 1})
    # the trace says what the step's record rode out
    event = TraceEvent.objects.get(run=run, kind="step_executed", step_id="first")
    assert event.data["db_faults"] == 1


def test_a_checkpoint_whose_commit_answer_was_lost_is_read_back_not_written_twice(
    crash_dir, quick_retries
):
    """The statement committed, then the connection dropped before its answer came: the
    retry reads the step back and goes on; no second row, event or count."""
    run = durable.start("dbf.two_steps", {"n": 4})
    fault = lose_the_answer_once(step_insert)
    with connection.execute_wrapper(fault):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert fault.state["fired"]
    row = Run.objects.get(pk=run.id)
    assert invocations(crash_dir, run.id) == Counter({"first": 1, "dbf.charge": 1})
    assert row.steps_executed == 2 and row.claims == 1
    assert step_events(run.id) == Counter({"first": 1, "dbf.charge": 1})
    assert list(row.steps.order_by("position").values_list("step_id", flat=True)) == [
        "first",
        "dbf.charge",
    ]


def test_a_checkpoint_fault_that_outlasts_the_retries_releases_the_run(crash_dir, quick_retries):
    run = durable.start("dbf.two_steps", {"n": 1})
    fault = fail_times(step_insert, 3)
    with connection.execute_wrapper(fault):
        status = execute(run.id)
    assert fault.state["fired"] == 3
    assert status == RunStatus.RETRYING
    row = Run.objects.get(pk=run.id)
    assert row.status == RunStatus.RETRYING and row.lease_token == "" and row.wake_at
    assert row.error is None and row.cursor_lost == 0
    event = TraceEvent.objects.get(run=run, kind="db_fault")
    assert "OperationalError" in event.message and "released" in event.message
    # it names the step that was in progress (its checkpoint failing)
    assert event.step_id == "first" and "during step 'first'" in event.message
    assert not TraceEvent.objects.filter(run=run, kind="failed").exists()

    assert execute(run.id) is None  # not due yet: a hint that comes early does nothing
    make_due(run.id)
    assert execute(run.id) == RunStatus.SUCCEEDED
    run = Run.objects.get(pk=run.id)
    assert run.output_value()["ticket"] == "T-1"
    # the body ran again (its checkpoint was lost), its effect did not happen again
    assert invocations(crash_dir, run.id) == Counter({"first": 2, "dbf.charge": 1})
    assert dw.effect_counts(crash_dir) == {
        ("tickets", f"{run.id}:first"): 1,
        ("charges", f"{run.id}:dbf.charge"): 1,
    }
    assert run.claims == 2
    # a database fault is not a lost worker: no worker_lost attempt, no poison counting
    assert not run.steps.filter(attempts__gt=1).exists()


def test_a_lease_taken_over_during_the_outage_writes_nothing_more(crash_dir, quick_retries):
    """While the database was away the lease expired and another worker claimed the
    run: the read-back finds the lease gone and the execution stops, writing nothing."""
    run = durable.start("dbf.two_steps", {"n": 5})

    def taken_over(execute_, sql, params, many, context):
        if taken_over.fired == 1 and not context["connection"].in_atomic_block:
            # the fault's transaction is gone: another worker claims the run now
            taken_over.fired = 2
            Run.objects.filter(pk=run.id).update(lease_token="another-worker")
        elif step_insert(" ".join(sql.replace('"', "").split())) and not taken_over.fired:
            taken_over.fired = 1
            raise OperationalError("server closed the connection unexpectedly (injected)")
        return execute_(sql, params, many, context)

    taken_over.fired = 0
    with connection.execute_wrapper(taken_over):
        execute(run.id)
    assert taken_over.fired == 2
    row = Run.objects.get(pk=run.id)
    assert row.lease_token == "another-worker" and row.status == RunStatus.RUNNING
    assert not row.steps.exists() and row.steps_executed == 0
    assert not TraceEvent.objects.filter(run=run, kind="step_executed").exists()


def test_lost_tries_are_written_once_when_their_checkpoint_is_retried(crash_dir, quick_retries):
    """A step a lost worker interrupted carries that try to its next checkpoint; a fault
    there rolls it back, and the retry writes it again (not zero times, not twice)."""
    run = durable.start("dbf.two_steps", {"n": 6})
    Run.objects.filter(pk=run.id).update(cursor_lost=1)
    seen = {"lost": False}

    def after_the_lost_try(sql: str) -> bool:  # the step's event, after its lost try's row
        seen["lost"] = seen["lost"] or "INSERT INTO durable_stepattempt" in sql
        return seen["lost"] and "INSERT INTO durable_traceevent" in sql

    fault = fail_once(after_the_lost_try)
    with connection.execute_wrapper(fault):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert fault.state["fired"]
    first = Run.objects.get(pk=run.id).steps.get(step_id="first")
    assert list(first.attempt_rows.values_list("outcome", flat=True)) == ["worker_lost"]
    assert first.attempts == 2


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_a_batch_flush_fault_is_ridden_out_in_place(crash_dir, quick_retries, batched, fault):
    """Batched steps may run again after a crash, but a database fault at their flush
    is no crash: they are written (or read back) on a new connection, each once."""
    run = durable.start("dbf.batched", {"n": 6})
    injected = fault(lambda sql: "INSERT INTO durable_step" in sql)  # the first: a flush
    with connection.execute_wrapper(injected):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert injected.state["fired"]
    names = [f"b{i}" for i in range(6)] + ["last"]
    assert Run.objects.get(pk=run.id).output_value() == names
    assert invocations(crash_dir, run.id) == Counter(dict.fromkeys(names, 1))
    assert step_events(run.id) == Counter(dict.fromkeys(names, 1))
    assert Run.objects.get(pk=run.id).steps_executed == 7


def test_workflow_code_cannot_swallow_a_checkpoint_fault(crash_dir, quick_retries):
    run = durable.start("dbf.swallow", None)
    with connection.execute_wrapper(fail_times(step_insert, 3)):
        assert execute(run.id) == RunStatus.RETRYING
    row = Run.objects.get(pk=run.id)
    assert row.status == RunStatus.RETRYING and row.output is None
    make_due(run.id)
    assert execute(run.id) == RunStatus.SUCCEEDED
    assert Run.objects.get(pk=run.id).output_value() == "recorded"


def second_step_insert():
    """A match of the write's checkpoint: the step row of dbf.charge (the second step
    insert, and the inserts that try it again)."""
    seen = {"inserts": 0}

    def match(sql: str) -> bool:
        if step_insert(sql):
            seen["inserts"] += 1
            return seen["inserts"] >= 2
        return False

    return match


def test_a_fault_at_an_unsafe_writes_checkpoint_records_its_result_in_place(
    crash_dir, quick_retries
):
    """The write happened and its result is in hand: a short fault at its checkpoint is
    ridden out, the operation recorded as the call returned (no reconcile needed)."""
    run = durable.start("dbf.two_steps", {"n": 2})
    with connection.execute_wrapper(fail_once(second_step_insert())):
        assert execute(run.id) == RunStatus.SUCCEEDED
    op = Operation.objects.get(run=run)
    assert op.status == OperationStatus.SUCCEEDED and op.resolution == ""
    assert "C-" in op.result
    calls = calls_of(crash_dir, run.id)
    assert calls == Counter({("step", "first"): 1, ("step", "dbf.charge"): 1})
    assert dw.effect_counts(crash_dir)[("charges", f"{run.id}:dbf.charge")] == 1


def test_fault_after_an_unsafe_write_is_settled_by_reconcile_not_repeated(crash_dir, quick_retries):
    """A fault that outlasts the in-place retries: the run is released with the write's
    operation ``started``, and the next execution reconciles it."""
    run = durable.start("dbf.two_steps", {"n": 2})
    with connection.execute_wrapper(fail_times(second_step_insert(), 3)):
        assert execute(run.id) == RunStatus.RETRYING
    op = Operation.objects.get(run=run)
    assert op.status == OperationStatus.STARTED  # called; its result not recorded
    assert dw.effect_counts(crash_dir)[("charges", f"{run.id}:dbf.charge")] == 1

    make_due(run.id)
    assert execute(run.id) == RunStatus.SUCCEEDED
    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED and op.resolution == "reconciled: happened"
    calls = calls_of(crash_dir, run.id)
    assert calls == Counter(
        {("step", "first"): 1, ("step", "dbf.charge"): 1, ("reconcile", "dbf.charge"): 1}
    )
    assert dw.effect_counts(crash_dir)[("charges", f"{run.id}:dbf.charge")] == 1


def test_claim_fault_is_retried_on_a_fresh_connection(crash_dir):
    run = durable.start("dbf.two_steps", {"n": 3})
    # the claim reads the run row first: a SELECT, or on PostgreSQL the claim's statement
    fault = fail_once(lambda sql: sql.startswith(("SELECT", "WITH")) and "FROM durable_run" in sql)
    with connection.execute_wrapper(fault):
        assert execute(run.id) == RunStatus.SUCCEEDED
    assert "FOR UPDATE" in fault.state["sql"] or connection.vendor == "sqlite"
    assert fault.state["fired"]
    assert Run.objects.get(pk=run.id).claims == 1
    assert not TraceEvent.objects.filter(run=run, kind="db_fault").exists()


def test_a_step_body_database_error_is_the_steps_failure_not_a_fault(crash_dir):
    """Only the engine's own database work is a fault: a body's error is retried."""
    from tests.durable import engine_workflows as ew

    ew.reset()
    ew.FAILS["flaky"] = [OperationalError("the body's own query failed")]
    run = durable.start("eng.single", {"label": "flaky", "value": 7})
    assert execute(run.id) == RunStatus.SUCCEEDED
    assert Run.objects.get(pk=run.id).output_value() == 7
    assert ew.CALLS["flaky"] == 2
    assert not TraceEvent.objects.filter(run=run, kind="db_fault").exists()


# ------------------------------------------------- a connection terminated between tasks


def terminate_my_backend() -> None:
    """Terminate this thread's PostgreSQL backend from a second connection and wait."""
    import psycopg

    pid = connection.connection.info.backend_pid
    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k in ("dbname", "user", "password", "host", "port") and v
    }
    with psycopg.connect(**params, autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


class _Task:
    class request:  # the shape of a Celery task's request
        is_eager = False


def test_a_sweep_after_the_connection_was_terminated_runs_on_a_new_connection():
    """The task_prerun hook drops the dead connection before the next task's first
    query: a terminated connection must not fail every later task, sweeps included."""
    if connection.vendor != "postgresql":
        pytest.skip("terminates a PostgreSQL backend; SQLite has no server connection")
    from celery.signals import task_postrun, task_prerun

    from durable.worker.sweeper import sweep
    from durable.worker.tasks import _drop_broken_connections

    sweep()  # a first task used the connection
    _drop_broken_connections(task=_Task, signal=task_postrun)
    terminate_my_backend()
    for _ in range(3):  # every later task
        _drop_broken_connections(task=_Task, signal=task_prerun)
        assert sweep()["run_ids"] == []
        _drop_broken_connections(task=_Task, signal=task_postrun)


def test_without_the_hook_the_dead_connection_fails_the_next_sweep():
    """What the hook prevents (and what Celery's fix-up does not do with
    CELERY_DB_REUSE_MAX): the first query after the termination fails."""
    if connection.vendor != "postgresql":
        pytest.skip("terminates a PostgreSQL backend; SQLite has no server connection")
    from durable.worker.sweeper import sweep

    sweep()
    terminate_my_backend()
    with pytest.raises(OperationalError):
        sweep()
    connection.close()


def test_a_sweep_task_whose_connection_dies_under_it_is_tried_again_on_a_new_one(
    monkeypatch,
):
    """The hook above checks the connection before a task, but a backend terminated a
    moment later (pg_terminate_backend is asynchronous; a failover) fails the sweep's first
    query: the task tries the idempotent sweep again on a fresh connection instead of
    raising (S28 saw it under CI load). The schedules' tick does the same."""
    from durable.runtime import dbconn
    from durable.worker import tasks

    monkeypatch.setitem(dbconn.retry_db.__kwdefaults__, "delays", (0.0,))  # no backoff
    fault = fail_once(lambda sql: sql.startswith("SELECT") and "FROM durable_run" in sql)
    with connection.execute_wrapper(fault):
        result = tasks.sweep()
    assert fault.state["fired"] and result["run_ids"] == []
    fault = fail_once(lambda sql: sql.startswith("SELECT") and "durable_schedule" in sql)
    with connection.execute_wrapper(fault):
        assert tasks.tick_schedules() == 0
    assert fault.state["fired"]


def test_a_fault_at_the_runs_end_names_no_step(crash_dir):
    """Every step recorded, the completion fails: the ``db_fault`` event names no step
    (none was in progress), and the retry replays to the end without a body."""
    run = durable.start("dbf.two_steps", {"n": 7})
    fired = []

    def completion(execute_, sql, params, many, context):
        # the statement that writes the run's output ({"n", "ticket", "charge"})
        if not fired and any(isinstance(p, str) and '"charge":' in p for p in params or ()):
            fired.append(sql)
            raise OperationalError("terminating connection due to administrator command (inj)")
        return execute_(sql, params, many, context)

    with connection.execute_wrapper(completion):
        assert execute(run.id) == RunStatus.RETRYING
    assert fired and "durable_run" in fired[0]
    event = TraceEvent.objects.get(run=run, kind="db_fault")
    assert event.step_id == "" and "during step" not in event.message
    make_due(run.id)
    assert execute(run.id) == RunStatus.SUCCEEDED
    assert invocations(crash_dir, run.id) == Counter({"first": 1, "dbf.charge": 1})


# ----------------------------------------- a failed try's record rides a fault out too


def attempt_insert(sql: str) -> bool:
    return "INSERT INTO durable_stepattempt" in sql


def fail_a_step(label: str, exc: Exception, fault, **data) -> tuple[Run, Counter]:
    """Run ``eng.single`` whose step ``label`` raises ``exc`` at its first try, with
    ``fault`` (``fail_once``, ``lose_the_answer_once``) at its attempt row; returns the
    run after its execution and the step bodies' calls."""
    from tests.durable import engine_workflows as ew

    ew.reset()
    ew.FAILS[label] = [exc]
    run = durable.start("eng.single", {"label": label, "value": 7, **data})
    injected = fault(attempt_insert)
    with connection.execute_wrapper(injected):
        execute(run.id)
    assert injected.state["fired"]
    return Run.objects.get(pk=run.id), ew.CALLS


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_a_failed_trys_record_rides_out_a_fault_and_the_try_is_not_run_again(
    crash_dir, quick_retries, fault
):
    """A transient failure retried in process: its record (the step ``retrying``, the
    attempt row) meets a fault; the try is recorded once and not run again for it."""
    row, calls = fail_a_step("flaky", durable.TransientError("503 from upstream"), fault)
    assert calls["flaky"] == 2  # the failed try and the retry: no third
    assert row.status == RunStatus.SUCCEEDED and row.output_value() == 7 and row.claims == 1
    step = row.steps.get()
    assert step.attempts == 2 and step.attempt_rows.count() == 1
    assert not TraceEvent.objects.filter(run=row, kind="db_fault").exists()


@pytest.mark.parametrize("fault", [fail_once, lose_the_answer_once])
def test_a_failure_for_good_rides_out_a_fault_and_fails_the_run_once(
    crash_dir, quick_retries, fault
):
    row, calls = fail_a_step("broken", durable.PermanentError("401 from upstream"), fault)
    assert calls["broken"] == 1
    assert row.status == RunStatus.FAILED and row.error["type"] == "PermanentError"
    assert row.steps.get().attempt_rows.count() == 1
    assert TraceEvent.objects.filter(run=row, kind="failed").count() == 1
    assert not TraceEvent.objects.filter(run=row, kind="db_fault").exists()


def test_a_later_retrys_record_rides_out_a_fault_and_the_run_waits_for_it(crash_dir, quick_retries):
    """A retry far enough to release the run: its record gives the lease back; the
    read-back of a lost answer finds the row and the run is left retrying, once."""
    error = durable.TransientError("503 from upstream")
    row, calls = fail_a_step("later", error, lose_the_answer_once, policy="slow")
    assert calls["later"] == 1
    assert row.status == RunStatus.RETRYING and row.lease_token == "" and row.wake_at
    assert row.steps.get().attempt_rows.count() == 1
    assert TraceEvent.objects.filter(run=row, kind="retry_scheduled").count() == 1
    make_due(row.id)
    assert execute(row.id) == RunStatus.SUCCEEDED and calls["later"] == 2
