"""PostgreSQL: the hot path's fenced writes, each one statement (one round trip, one commit).

A step's checkpoint -- a first success with no lost tries and no tag to add, and for a
write its operation's result -- is one data-modifying CTE: it updates the run only while
the lease token and status hold, and writes the step, its trace event (and the
operation's result) from that update's row. A write's ``started`` ledger row is one
statement fenced the same way, so no write starts after a cancel committed. When a fence
does not hold, nothing is written and the caller's transactional path (``checkpoint.py``,
``ledger.py``) tells which case it is and acts. The SQL text is built once per process;
values are passed through the model fields (their storable forms), no model instance is
saved through the ORM.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from django.db.models import Field

from durable.models.events import TraceEvent
from durable.models.operations import Operation
from durable.models.runs import Run
from durable.models.steps import Step
from durable.observability import metrics
from durable.postgres import prepared_cursor, rows
from durable.values.fields import storable_json

_SQL: dict[str, str] = {}


def checkpoint_in_one_statement(
    *,
    run_id: str,
    token: str,
    status: str,
    worker_id: str,
    step: Step,
    tokens: int,
    event_data: dict[str, Any],
    operation: tuple[int, dict[str, Any]] | None = None,
) -> Step | None:
    """The fenced run update, the step and its event in one statement.

    ``step``: the unsaved step row, as the ORM path (``Checkpoints.save_step_txn``) would
    create it; every column of it is written (:mod:`durable.postgres.rows`).
    ``operation``: ``(pk, {column: value})`` of a write's operation row, updated in the
    same statement (its result). One round trip and one commit, no ORM work. Returns
    ``step`` with its pk, or None -- having written nothing -- when the fence does not
    hold (lease lost, run cancelled).
    """
    sql = _checkpoint_sql()
    op_params: list[Any] = []
    if operation is not None:
        pk, fields = operation
        names = sorted(fields)
        sql = _SQL.get(f"op:{names}") or _SQL.setdefault(f"op:{names}", _with_operation(sql, names))
        op_params = [rows.prepared(Operation, n, fields[n]) for n in names] + [pk]
    now = step.finished_at
    params: list[Any] = [
        now,
        step.position + 1,
        tokens,
        run_id,
        token,
        status,
        *rows.values(step),
        step.step_id,
        json.dumps(storable_json(event_data)),
        worker_id,
        now,
        *op_params,
    ]
    started = time.perf_counter()
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    metrics.checkpoint_committed("one_statement", time.perf_counter() - started)
    if row is None:
        return None
    metrics.step_executed(step.kind)
    step.pk = row[0]
    step._state.adding = False
    return step


def _checkpoint_sql() -> str:
    if "checkpoint" not in _SQL:
        run_table = Run._meta.db_table
        step_table = Step._meta.db_table
        event_table = TraceEvent._meta.db_table
        _SQL["checkpoint"] = f"""
        WITH r AS (
            UPDATE {run_table}
               SET updated_at = %s, cursor_position = %s, cursor_lost = 0,
                   steps_executed = steps_executed + 1, tokens_used = tokens_used + %s
             WHERE id = %s AND lease_token = %s AND status = %s
         RETURNING id),
        s AS (
            INSERT INTO {step_table} ({rows.columns(Step)})
            SELECT {rows.typed_marks(Step)} FROM r
         RETURNING id),
        e AS (
            INSERT INTO {event_table} (run_id, kind, step_id, message, data, actor,
                   created_at)
            SELECT r.id, 'step_executed', %s, '', %s::jsonb, %s, %s FROM r)
        SELECT id FROM s"""  # noqa: S608 - table names come from the models
    return _SQL["checkpoint"]


def _with_operation(sql: str, names: list[str]) -> str:
    """``sql`` with one more CTE: the operation's update, only if the fence held."""
    table = Operation._meta.db_table
    sets = ", ".join(f"{_column(Operation, n)} = %s" for n in names)
    extra = f"""
        o AS (
            UPDATE {table} SET {sets} FROM r WHERE {table}.id = %s)"""  # noqa: S608
    head, tail = sql.rsplit("SELECT id FROM s", 1)
    return head.rstrip() + "," + extra + "\n        SELECT id FROM s" + tail


def _column(model: Any, name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    return field.column


def started_in_one_statement(
    *, run_id: str, token: str, status: str, position: int, op: Operation, now: datetime
) -> int | None:
    """A write's ``started`` operation row, fenced on the run, in one statement.

    Updates the run (``cursor_position``: ``position``) only while ``token`` and
    ``status`` hold, and inserts ``op`` only then, unless its idempotency key is taken.
    Returns the new row's pk (``op.pk`` is set), ``0`` when the fence held but the key
    was taken (the operation row is left as it was), or ``None`` -- nothing written --
    when the fence does not hold (lease lost, run cancelled or stopped).
    """
    # every column but the id, as Operation.objects.create would write them
    if "started" not in _SQL:
        run_table = Run._meta.db_table
        table = Operation._meta.db_table
        columns = rows.columns(Operation)
        marks = rows.typed_marks(Operation)
        _SQL["started"] = f"""
        WITH r AS (
            UPDATE {run_table} SET updated_at = %s, cursor_position = %s
             WHERE id = %s AND lease_token = %s AND status = %s
         RETURNING id),
        o AS (
            INSERT INTO {table} ({columns}) SELECT {marks} FROM r
            ON CONFLICT (idempotency_key) DO NOTHING
         RETURNING id)
        SELECT (SELECT id FROM r), (SELECT id FROM o)"""  # noqa: S608
    params: list[Any] = [now, position, run_id, token, status]
    params += rows.values(op)
    with prepared_cursor() as cursor:
        cursor.execute(_SQL["started"], params)
        fenced, pk = cursor.fetchone()
    if fenced is None:
        return None
    if pk is None:
        return 0
    op.pk = pk
    return int(pk)
