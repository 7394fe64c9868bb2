"""The engine's hot statements are prepared on PostgreSQL (``durable.postgres.
prepared_cursor``): parsed and planned once per connection, then only executed -- and
not with ``DURABLE['PREPARED_STATEMENTS']`` false (a pooler that cannot keep them)."""

from __future__ import annotations

import pytest
from django.db import connection

import durable
import tests.workflows  # noqa: F401 - registers tests.add_twice
from durable.testing import drive

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the one-statement paths run outside atomic
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="PostgreSQL's prepared statements"
    ),
]


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_runs_start_checkpoints_and_completion_are_prepared_once():
    connection.close()  # a fresh session: nothing prepared yet
    first = drive(durable.start("tests.add_twice", {"a": 1, "b": 2}).id)
    second = drive(durable.start("tests.add_twice", {"a": 3, "b": 4}).id)
    assert first.status == second.status == "succeeded", (first.error, second.error)
    statements = _prepared()
    checkpoints = [s for s in statements if "steps_executed = steps_executed + 1" in s]
    starts = [s for s in statements if s.lstrip().startswith("WITH r AS (\n            INSERT")]
    assert len(checkpoints) == 1, statements  # two runs, four steps: one statement
    assert len(starts) == 1, statements
    assert any("finished_at" in s and "UPDATE" in s for s in statements), statements


def test_none_is_prepared_when_the_setting_says_so(settings):
    settings.DURABLE = {**settings.DURABLE, "PREPARED_STATEMENTS": False}
    connection.close()
    run = drive(durable.start("tests.add_twice", {"a": 1, "b": 2}).id)
    assert run.status == "succeeded", run.error
    assert _prepared() == []


def test_the_claim_is_prepared_and_gives_the_run_as_the_orm_reads_it():
    from durable.models.runs import Run
    from durable.worker import engine

    connection.close()
    run = durable.start(
        "tests.add_twice", {"a": 1, "b": "ünï", "nested": [1, {"x": None}]}, tags=["t"]
    )
    claimed, steps = engine.claim(run.id, token="tok-1", worker_id="w-1")
    assert steps == []
    fresh = Run.objects.get(pk=run.id)
    for field in Run._meta.concrete_fields:
        assert getattr(claimed, field.attname) == getattr(fresh, field.attname), field.name
    assert claimed.input_value()["b"] == "ünï" and claimed.tags == ["t"]
    assert not claimed._state.adding and claimed._state.db == "default"
    claims = [s for s in _prepared() if "FOR UPDATE SKIP LOCKED" in s]
    assert len(claims) == 1, _prepared()


def test_a_connection_used_a_moment_ago_is_not_pinged_again(monkeypatch):
    """Django's health check pings before the first query after close_old_connections()
    (every execution calls it, before and after): a claim right after another run, as a
    busy worker makes them, pays no ping (it is retried on a fresh connection if this
    one was lost); a claim after the connection sat idle does, and a run's start, which
    is not retried, always keeps Django's ping."""
    from django.db import close_old_connections

    from durable import postgres
    from durable.worker.engine import execute

    wrapper = type(connection._connections[connection._alias])
    original = wrapper.is_usable
    pings = []

    def is_usable(self):
        pings.append(1)
        return original(self)

    monkeypatch.setattr(wrapper, "is_usable", is_usable)

    ids = [durable.start("tests.add_twice", {"a": n, "b": 2}).id for n in range(4)]
    assert execute(ids[0], worker_id="w") == "succeeded"
    pings.clear()
    assert [execute(i, worker_id="w") for i in ids[1:3]] == ["succeeded", "succeeded"]
    assert pings == []  # two claims, each after close_old_connections(): no ping
    close_old_connections()
    connection.durable_used_at -= postgres.RECENTLY_USED_SECONDS  # idle since
    assert execute(ids[3], worker_id="w") == "succeeded" and len(pings) == 1
    pings.clear()
    close_old_connections()  # used a moment ago, but a start is not retried: pinged
    durable.start("tests.add_twice", {"a": 9, "b": 2})
    assert len(pings) == 1


def test_batches_of_any_length_share_one_prepared_statement(settings):
    """The batch flush takes one array per column (``unnest``), so its text does not
    vary with the batch's length: prepared once, and every step and event written."""
    from durable.models import Step, TraceEvent
    from durable.worker.engine import execute
    from tests.durable.runtime import batching_workflows  # noqa: F401 - batch.ops

    settings.DURABLE = {**settings.DURABLE, "BATCH_MAX_STEPS": 3, "BATCH_MAX_DELAY_MS": 60_000}
    connection.close()
    run_ids = []
    for ops in (["step_b"] * 7 + ["step"], ["step_b"] * 5 + ["step"]):  # flushes of 3, 3, 2
        run_id = durable.start("batch.ops", {"ops": ops}).id
        assert execute(run_id, worker_id="w") == "succeeded"
        run_ids.append((run_id, len(ops)))
    batches = [s for s in _prepared() if "unnest(" in s]
    assert len(batches) == 1, _prepared()
    for run_id, n in run_ids:
        steps = list(Step.objects.filter(run_id=run_id).order_by("position"))
        assert [s.position for s in steps] == list(range(n))
        assert all(s.status == "succeeded" and s.output for s in steps)
        events = TraceEvent.objects.filter(run_id=run_id, kind="step_executed")
        assert sorted(e.step_id for e in events) == sorted(s.step_id for s in steps)


def test_the_hot_statements_share_one_cursor_per_connection():
    from durable import postgres

    connection.close()
    with postgres.prepared_cursor() as first:
        first.execute("SELECT 1")
        assert first.fetchone() == (1,)
    with postgres.prepared_cursor() as again:
        again.execute("SELECT 2")
        assert again.fetchone() == (2,)
    assert again is first and not first.closed
    connection.close()  # a new connection gets a cursor of its own, on it
    with postgres.prepared_cursor() as fresh:
        fresh.execute("SELECT 3")
        assert fresh.fetchone() == (3,)
    assert fresh is not first
    assert fresh.cursor.connection is connection.connection


def test_a_failed_hot_statement_leaves_the_shared_cursor_usable():
    from django.db import DatabaseError

    from durable import postgres

    connection.close()
    with pytest.raises(DatabaseError), postgres.prepared_cursor() as cursor:
        cursor.execute("SELECT 1 / 0")
    with postgres.prepared_cursor() as again:
        again.execute("SELECT 4")
        assert again.fetchone() == (4,)
