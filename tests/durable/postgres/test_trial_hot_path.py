"""An outside tester's trial of the PostgreSQL hot write path (the shared prepared cursor
of ``durable.postgres.prepared_cursor``, the row shortcuts of ``durable.postgres.rows``,
the binary batch flush of ``durable.postgres.batches``), each case after a public bug
report of a tool that does the same job or uses the same mechanism."""

from __future__ import annotations

import contextlib
import threading

import pytest
from django.db import DatabaseError, connection, connections

import durable
import tests.workflows  # noqa: F401 - registers tests.add_twice
from durable.models import Run, RunStatus, Step, TraceEvent
from durable.testing import drive
from durable.worker.engine import execute
from tests.durable.postgres import trial_hot_path_workflows  # noqa: F401 - trial.*
from tests.durable.runtime import batching_workflows as bw
from tests.durable.runtime.test_batching import _written
from tests.durable.worker.test_db_faults import terminate_my_backend as _terminate_my_backend

pytestmark = pytest.mark.django_db(transaction=True)  # the one-statement paths run outside atomic

needs_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="PostgreSQL's server-side prepared statements and backends; SQLite has neither",
)


@pytest.fixture(autouse=True)
def _reset_batching_log():
    bw.reset()
    yield
    bw.reset()


def _one(n: int) -> str | None:
    return execute(durable.start("tests.add_twice", {"a": n, "b": 2}).id, worker_id="w")


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _ddl_from_another_session(*statements: str) -> None:
    """Run ``statements`` on a connection of their own (a deploy's ``migrate``), not on
    this thread's: psycopg forgets its own prepared statements when *its* connection
    runs an ALTER or DROP (``PrepareManager._should_discard``), which a migration run
    by another process does not tell it."""
    import psycopg

    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k in ("dbname", "user", "password", "host", "port") and v
    }
    with psycopg.connect(**params, autocommit=True) as other:
        for statement in statements:
            other.execute(statement)


# ------------------------------------------------------------ a terminated connection


@needs_postgres
def test_a_run_claimed_right_after_its_backend_was_terminated_succeeds():
    """psycopg2 #215 "OperationalError after postgresql restart"
    (https://github.com/psycopg/psycopg2/issues/215): a persistent Django connection
    whose server side ended fails its next query. Here the shared prepared cursor was
    used a moment ago (so no health-check ping), the backend is terminated, and the
    next execution's first statement is the claim: the engine must not reuse the dead
    cursor for ever; the run succeeds, on a new backend."""
    connection.close()
    assert _one(1) == RunStatus.SUCCEEDED
    waiting = durable.start("tests.add_twice", {"a": 5, "b": 6}).id
    old_pid = connection.connection.info.backend_pid
    _terminate_my_backend()
    assert execute(waiting, worker_id="w") == RunStatus.SUCCEEDED
    assert Run.objects.get(pk=waiting).output_value() == {"result": 17}
    assert _backend_pid() != old_pid
    assert connection.durable_cursor[0] is connection.connection  # a cursor of the new one


@needs_postgres
@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "not-prepared"])
def test_a_start_right_after_a_run_when_the_backend_was_terminated(prepared, settings):
    """redash #1868 "server closed the connection unexpectedly"
    (https://github.com/getredash/redash/issues/1868: a pool that does not check a
    connection is alive before using it fails the first request after a database
    restart) and Datateknologerna-vid-Abo-Akademi/date-website PR #1106
    (https://github.com/Datateknologerna-vid-Abo-Akademi/date-website/pull/1106:
    CONN_HEALTH_CHECKS "so persistent connections survive database restarts"). After
    close_old_connections(), Django pings a reused connection before its first query.
    The engine skips that ping for a connection whose hot statement ran less than a
    second ago; a run's start (``durable.start``, what the API calls) is such a hot
    statement, and unlike the claim it is not retried. Checked: a start right after an
    execution, on a terminated backend, succeeds as it would with Django's own health
    check (``not-prepared``, ``DURABLE['PREPARED_STATEMENTS']`` false: Django's own
    cursor and its ping, is the control)."""
    from django.db import close_old_connections

    settings.DURABLE = {**settings.DURABLE, "PREPARED_STATEMENTS": prepared}
    connection.close()
    assert _one(1) == RunStatus.SUCCEEDED  # ends with close_old_connections()
    close_old_connections()  # as Django does at the start of the next request
    _terminate_my_backend()
    try:
        run = durable.start("tests.add_twice", {"a": 1, "b": 1})
    finally:
        close_old_connections()  # a failed start leaves a dead connection: Django drops it
    assert Run.objects.filter(pk=run.id).exists()


@needs_postgres
def test_after_a_failed_start_on_a_dead_backend_the_next_start_succeeds():
    """The same report as above, the weaker promise: whatever the first statement on a
    dead backend does, the shared cursor of the dead connection is not reused and the
    next start and run succeed (no error loop on a kept cursor)."""
    from django.db import close_old_connections

    connection.close()
    assert _one(1) == RunStatus.SUCCEEDED
    close_old_connections()
    _terminate_my_backend()
    try:
        durable.start("tests.add_twice", {"a": 1, "b": 1})
    except DatabaseError:
        close_old_connections()  # Django does this at the end of the failed request
    run = durable.start("tests.add_twice", {"a": 2, "b": 2})
    assert drive(run.id).status == RunStatus.SUCCEEDED


# ------------------------------------------------------- a migration between two runs


def _ddl(session: str, *statements: str) -> None:
    if session == "other":
        _ddl_from_another_session(*statements)
        return
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


@needs_postgres
@pytest.mark.parametrize("session", ["same", "other"])
def test_a_column_added_to_the_steps_table_between_two_runs(session):
    """GreptimeDB #5815 "Re-prepare sql after alter table"
    (https://github.com/GreptimeTeam/greptimedb/issues/5815) and lib/pq #1151
    (https://github.com/lib/pq/issues/1151): a statement prepared before an ALTER TABLE
    of its table. A migration adding a nullable column to ``durable_step`` and
    ``durable_run`` runs (on the worker's own connection, or from another session as a
    deploy's ``migrate`` does) while the worker's connection holds the prepared start,
    claim, checkpoint and completion: the next runs on that connection succeed."""
    connection.close()
    assert _one(1) == RunStatus.SUCCEEDED
    pid = _backend_pid()
    try:
        _ddl(
            session,
            "ALTER TABLE durable_step ADD COLUMN trial_extra integer NULL",
            "ALTER TABLE durable_run ADD COLUMN trial_extra integer NULL",
        )
        assert _backend_pid() == pid  # the same session, its statements prepared
        assert _one(2) == RunStatus.SUCCEEDED
        assert _one(3) == RunStatus.SUCCEEDED
    finally:
        connection.close()
        _ddl_from_another_session(
            "ALTER TABLE durable_step DROP COLUMN IF EXISTS trial_extra",
            "ALTER TABLE durable_run DROP COLUMN IF EXISTS trial_extra",
        )


@needs_postgres
@pytest.mark.parametrize("session", ["same", "other"])
def test_a_run_column_widened_between_two_runs(session):
    """r2dbc-postgresql #382 "cached plan must not change result type"
    (https://github.com/pgjdbc/r2dbc-postgresql/issues/382): a column's type changed from
    VARCHAR(55) to VARCHAR(70) and every later execution of a statement prepared before
    it fails with SQLSTATE 0A000 on that connection. Django's usual migration of a
    ``max_length`` (here ``Run.workflow_name``, 200 -> 255, as a deploy's ``migrate``
    does while old workers run) changes the type of a column the prepared claim returns
    (``SELECT r.workflow_name, ...``): the next runs on the worker's connection must
    still be claimed and run, not fail claim after claim."""
    connection.close()
    assert _one(1) == RunStatus.SUCCEEDED
    pid = _backend_pid()
    try:
        _ddl(session, "ALTER TABLE durable_run ALTER COLUMN workflow_name TYPE varchar(255)")
        assert _backend_pid() == pid  # the same session, its statements prepared
        outcomes = []
        for n in range(3):
            try:
                outcomes.append(_one(n))
            except DatabaseError as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}".strip())
        assert outcomes == [RunStatus.SUCCEEDED] * 3, outcomes
    finally:
        connection.close()  # the prepared statements of this session go with it
        _ddl_from_another_session(
            "ALTER TABLE durable_run ALTER COLUMN workflow_name TYPE varchar(200)"
        )


# --------------------------------------------------- a failed statement, then another


@needs_postgres
@pytest.mark.parametrize("durability", ["sync", "batched"])
def test_a_checkpoint_refused_by_the_database_leaves_the_connection_usable(durability, batched):
    """psycopg #1151 "Prepared statements unexpected behavior with psycopg and
    PgBouncer" (https://github.com/psycopg/psycopg/issues/1151) and asyncpg #945
    (https://github.com/MagicStack/asyncpg/issues/945), where a prepared statement's
    state outlived what it belonged to: here a hot statement fails on the server
    (a step id longer than ``Step.step_id``'s 255 characters: "value too long", in
    the checkpoint or in the batch flush's binary arrays). Whatever the engine does
    with that run, the next run on the same thread's connection succeeds."""
    connection.close()
    assert _one(1) == RunStatus.SUCCEEDED
    bad = durable.start("trial.long_id", {"durability": durability}).id
    with contextlib.suppress(Exception):  # the bad run's fate is not what is checked
        execute(bad, worker_id="w")
    assert not Step.objects.filter(run_id=bad, step_id__startswith="x" * 256).exists()
    for n in range(2, 4):
        assert _one(n) == RunStatus.SUCCEEDED
    batched = durable.start("batch.ops", {"ops": ["step_b"] * 5 + ["step"]}).id
    assert execute(batched, worker_id="w") == RunStatus.SUCCEEDED
    assert Step.objects.filter(run_id=batched).count() == 6


# ------------------------------------------------------- awkward values in a flush


AWKWARD_VALUES = [
    None,
    "",
    "x" * 300_000,  # a long text: one array element of ~300 KB
    {"k\x00ey": "v\x00al", "surrogate \udc80 key": ["\ud83d", None]},
    {"nested": [[], {}, [[None]], "NULL", "{,}", '"', "\\"]},
    [2**63, -(2**63) - 1, 10**40],  # integers no bigint holds
    1.5e308,
    True,
    "\t\n\r\x1b\x7f\u2028\ufeff",
    {"": ""},
]


def test_a_flush_of_awkward_values_writes_what_the_orm_path_writes(batched, monkeypatch):
    """LangGraph #1878 "AsyncPostgresSaver - unsupported Unicode escape sequence"
    (https://github.com/langchain-ai/langgraph/issues/1878): a checkpointer's JSON
    carrying NUL failed on PostgreSQL. The one-statement flush sends every column
    as a binary array; values the existing test does not try (NUL and a lone surrogate
    in a dict *key*, a 300 KB text, None, integers beyond 64 bits, a float near its
    limit, control characters, empty keys) reach the steps and the events as the ORM
    path writes them, and read back as they were returned."""
    from durable import postgres
    from durable.postgres import batches

    flushes: list[int] = []
    one_statement = batches.flush_in_one_statement

    def counted(owner, batch):
        flushes.append(len(batch.pending))
        return one_statement(owner, batch)

    monkeypatch.setattr(batches, "flush_in_one_statement", counted)
    fast = drive(durable.start("trial.batched_values", {"values": AWKWARD_VALUES}).id)
    assert fast.status == RunStatus.SUCCEEDED, fast.error
    if postgres.available():
        assert flushes[:2] == [4, 4]  # the one-statement flush wrote them
    monkeypatch.setattr(postgres, "available", lambda: False)
    orm = drive(durable.start("trial.batched_values", {"values": AWKWARD_VALUES}).id)
    assert orm.status == RunStatus.SUCCEEDED, orm.error
    assert _written(fast.id) == _written(orm.id)
    assert fast.output_value() == orm.output_value()
    steps = list(Step.objects.filter(run_id=fast.id).order_by("position"))
    assert [s.durability for s in steps] == ["batched"] * len(AWKWARD_VALUES) + ["sync"]
    assert [s.output_value() for s in steps[:-1]] == [
        s.output_value() for s in Step.objects.filter(run_id=orm.id).order_by("position")[:10]
    ]


# ------------------------------------------------ pgbouncer: no prepared statements


@needs_postgres
def test_without_prepared_statements_a_batched_run_writes_the_same_rows(batched, settings):
    """psycopg #280 "prepared statement _pg3_10 does not exist"
    (https://github.com/psycopg/psycopg/issues/280): behind pgbouncer in transaction
    mode prepared statements must be off. With ``DURABLE['PREPARED_STATEMENTS']``
    false, a batched run's flushes (binary ``%b`` arrays through Django's own cursor),
    a checkpoint and a completion prepare nothing on the server, and write the rows a
    run with prepared statements writes."""

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in cursor.fetchall()]

    ops = {"ops": ["step_b"] * 6 + ["step", "step_b", "step_b"]}
    connection.close()
    on = drive(durable.start("batch.ops", ops).id)
    assert on.status == RunStatus.SUCCEEDED, on.error
    assert any("unnest(" in s for s in prepared())
    settings.DURABLE = {**settings.DURABLE, "PREPARED_STATEMENTS": False}
    connection.close()
    off = drive(durable.start("batch.ops", ops).id)
    assert off.status == RunStatus.SUCCEEDED, off.error
    assert prepared() == []
    ignore = {"idempotency_key"}  # carries the run's id

    def rows(run_id: str) -> list[dict]:
        return [{k: v for k, v in s.items() if k not in ignore} for s in _written(run_id)["steps"]]

    assert rows(on.id) == rows(off.id)
    assert on.output_value() == off.output_value()
    assert len(rows(off.id)) == 9


# --------------------------------------------- a cancel seen at the run's end flush


def test_a_cancel_during_the_last_batched_step_records_it_and_ends_cancelled(batched):
    """gensx #169 "Cleanly terminate checkpoints for cancelled workflows"
    (https://github.com/gensx-inc/gensx/issues/169) and DBOS dbos-transact-ts PR #1303
    "Fix durable recording of workflow cancellation as step result"
    (https://github.com/dbos-inc/dbos-transact-ts/pull/1303): what a cancelled run's
    last checkpoint records. Here the engine's promise is that "a run's end flushes
    what is pending in its one statement and then ends in its
    own"): every step is batched and the last one cancels its run. The completion's
    flush records the pending steps, the run ends CANCELLED, not SUCCEEDED, and has
    no output."""
    bw.ACTIONS["step_b2"] = "cancel"
    run = drive(durable.start("batch.ops", {"ops": ["step_b", "step_b", "step_b"]}).id)
    assert run.status == RunStatus.CANCELLED
    rows = list(
        Step.objects.filter(run_id=run.id).order_by("position").values_list("position", "status")
    )
    assert rows == [(0, "succeeded"), (1, "succeeded"), (2, "succeeded")]
    assert run.output_value() is None
    assert not TraceEvent.objects.filter(
        run_id=run.id, kind="completed", message__icontains="succeeded"
    ).exists()


# ---------------------------------------------------------- many threads, one each


@needs_postgres
def test_threads_each_running_executions_get_a_cursor_of_their_own():
    """psycopg2 #829 "server closed the connection unexpectedly"
    (https://github.com/psycopg/psycopg2/issues/829), a cursor kept on an object shared
    between a thread and a process: here four threads each run five executions at once;
    each thread's connection keeps its own shared cursor (never another thread's), and
    every run succeeds with its own result."""
    results: dict[int, list] = {}
    cursors: dict[int, tuple] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(t: int) -> None:
        try:
            barrier.wait(timeout=30)
            out = []
            for n in range(5):
                run = durable.start("tests.add_twice", {"a": t * 100 + n, "b": 1})
                out.append((run.id, execute(run.id, worker_id=f"w{t}")))
            results[t] = out
            db = connections["default"]
            cursors[t] = (id(db), db.durable_cursor[0], db.durable_cursor[1])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    assert sorted(results) == [0, 1, 2, 3]
    assert len({c[0] for c in cursors.values()}) == 4  # four wrappers
    assert len({id(c[1]) for c in cursors.values()}) == 4  # four psycopg connections
    assert len({id(c[2]) for c in cursors.values()}) == 4  # four shared cursors
    for t, out in results.items():
        for n, (run_id, status) in enumerate(out):
            assert status == RunStatus.SUCCEEDED
            assert Run.objects.get(pk=run_id).output_value() == {"result": t * 100 + n + 2}


# ------------------------------------------- OpenTelemetry with no SDK installed


def test_without_a_recording_sdk_a_step_keeps_the_callers_trace_and_its_log_context(
    monkeypatch,
):
    """opentelemetry-go #1893 "Incorrect API behavior in absence of SDK"
    (https://github.com/open-telemetry/opentelemetry-go/issues/1893), after the
    specification's "Behavior of the API in the absence of an installed SDK": a span
    context given by a propagator must still reach ``inject`` through every span made
    with no SDK. A step attempt now opens no span without a recording SDK (only the log
    context): a step body, sync or batched, run in an incoming request's trace, still
    sends that trace's id on its own outgoing calls, and its log lines carry the run,
    the step and the attempt. The API's own no-op tracer is used here (the suite's
    fixture that keeps tracing off outside ``otel_support.tracing()`` is undone)."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    from durable.observability import telemetry
    from tests.durable.postgres import trial_hot_path_workflows as tw

    # the API's no-op provider, as without an SDK: an SDK installed by an earlier test
    # of the process (the suite's in-memory exporter) stays global, so it is named here
    no_sdk = trace.NoOpTracerProvider()
    monkeypatch.setattr(telemetry, "_tracer", lambda: no_sdk.get_tracer(telemetry.TRACER_NAME))
    monkeypatch.setattr(telemetry, "_recording", lambda: False)
    tw.SEEN.clear()
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    parent = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=trace_id,
            span_id=0xB7AD6B7169203331,
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    )
    run = durable.start("trial.observe", {})
    token = otel_context.attach(trace.set_span_in_context(parent))
    try:
        assert execute(run.id, worker_id="w") == RunStatus.SUCCEEDED
    finally:
        otel_context.detach(token)
    assert [s["log"].get("step_id") for s in tw.SEEN] == ["sync_look", "batched_look"]
    assert all(s["log"].get("run_id") == run.id for s in tw.SEEN), tw.SEEN
    assert all(s["log"].get("attempt") == 1 for s in tw.SEEN), tw.SEEN
    assert [s["traceparent"] for s in tw.SEEN] == [f"00-{trace_id:032x}-b7ad6b7169203331-01"] * 2


# ------------------------------------------ the flush while Django logs its queries


def test_a_flush_of_awkward_values_while_queries_are_logged(batched):
    """Django #35021 "Debug query capturing on psycopg3 disregards execute wrappers"
    (https://github.com/django/django/pull/17810, and psycopg #696,
    https://github.com/psycopg/psycopg/issues/696): what Django's debug cursor logs is
    built from psycopg's client-side query. While queries are logged (DEBUG, or a test
    capturing them) ``prepared_cursor`` hands the hot statements Django's cursor
    instead of the prepared one; the batch flush's binary ``%b`` arrays, with NUL,
    surrogates and quotes in them, then go through that client-side cursor: the run
    succeeds, its steps read back as they were returned, and the flush is logged."""
    from django.test.utils import CaptureQueriesContext

    values = AWKWARD_VALUES[3:6] + ["it's", 'say "hi"']
    with CaptureQueriesContext(connection) as captured:
        run = drive(durable.start("trial.batched_values", {"values": values}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    steps = list(Step.objects.filter(run_id=run.id).order_by("position"))
    assert [s.output_value() for s in steps[:-1]] == values
    if connection.vendor == "postgresql":
        assert any("unnest(" in q["sql"] for q in captured.captured_queries)


# ------------------------------------------ a lease lost before the run's end flush


def test_a_lease_lost_in_the_last_batched_step_writes_nothing_at_the_end(batched):
    """Altinn altinn-studio PR #18507 "fence stale-worker writes with a lease token"
    (https://github.com/Altinn/altinn-studio/pull/18507) and pikku PR #1545
    (https://github.com/pikkujs/pikku/pull/1545: "a regression test for stale refresh
    and stale completion after reclaim"). Every step is batched and the last body
    finds its lease taken by another worker: the run's end, which now flushes the
    pending steps in a statement of its own before the completion's, writes none of
    them, and does not complete the run the worker no longer holds."""
    bw.ACTIONS["step_b2"] = "steal"
    run_id = durable.start("batch.ops", {"ops": ["step_b", "step_b", "step_b"]}).id
    execute(run_id, worker_id="w")
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING and run.lease_token == "thief-token"
    assert run.output_value() is None and run.finished_at is None
    assert not Step.objects.filter(run_id=run_id).exists()
    assert not TraceEvent.objects.filter(run_id=run_id, kind="step_executed").exists()
    assert not TraceEvent.objects.filter(run_id=run_id, kind="completed").exists()
