"""The batch flush in one PostgreSQL statement: the fenced run update, every pending step
and its trace event (see "Batched checkpoints" in ``docs/architecture.md``); the
transactional path beside it is ``StepBatch.flush``'s ``owner.write`` in
:mod:`durable.runtime.batching`, which writes the same rows through the ORM; both write
every column of the same unsaved steps (:mod:`durable.postgres.rows`)."""

from __future__ import annotations

import json
from typing import Any

from django.utils import timezone

from durable.models.events import TraceEvent
from durable.models.runs import Run
from durable.models.steps import Step
from durable.postgres import prepared_cursor, rows
from durable.values.fields import storable_json
from durable.vocabulary import EventKind


def flush_in_one_statement(owner: Any, batch: Any) -> list[Step] | None:
    """PostgreSQL: the fenced run update, every pending step and its event in one
    statement (one round trip, one commit). ``owner`` is the execution writing (a
    ``BatchOwner`` of :mod:`durable.runtime.batching`), ``batch`` its ``StepBatch``;
    this package sits below the runtime, so it names neither type. Returns the steps
    written, or None -- having written nothing -- when the fence does not hold."""
    pending = batch.pending
    # the unsaved steps the cursor holds (StepBatch.add made them of the same fields); they
    # get their pk below, once this statement wrote them
    held = owner.cursor.by_position
    steps = [
        step
        if (step := held.get(fields["position"])) is not None and step._state.adding
        else rows.unsaved(Step, **fields)
        for fields in pending
    ]
    now = timezone.now()
    # one array per column (unnest): the statement's text is the same for every batch
    # length, so it is prepared once per connection like the other hot statements
    by_column = [list(column) for column in zip(*map(rows.values, steps), strict=True)]
    event_data = [json.dumps(storable_json(event["data"])) for event in batch.events]
    assert len(event_data) == len(steps)  # unnest would pad a shorter array with NULLs
    params: list[Any] = [
        now,
        pending[-1]["position"] + 1,
        len(pending),
        batch.tokens,
        owner.cursor.run_id,
        owner.cursor.token,
        owner.cursor.status,
        *by_column,
        event_data,
        EventKind.STEP_EXECUTED.value,
        owner.cursor.worker_id,
    ]
    with prepared_cursor() as cursor:
        cursor.execute(_batch_sql(), params)
        ids = dict((position, pk) for pk, position in cursor.fetchall())
    if not ids:
        return None
    for step in steps:
        step.pk = ids[step.position]
        step._state.adding = False
    return steps


_SQL: dict[str, str] = {}


def _batch_sql() -> str:
    """The flush's statement, built once per process: the run's fenced update, then the
    steps and their events from one array parameter per column (``unnest``)."""
    if "batch" not in _SQL:
        columns = rows.columns(Step)
        names = [c.strip() for c in columns.split(",")]
        arrays = ", ".join(f"%b::{rows.cast_type(f)}[]" for f in rows.insert_fields(Step))
        _SQL["batch"] = f"""
        WITH r AS (
            UPDATE {Run._meta.db_table}
               SET updated_at = %s, cursor_position = %s,
                   steps_executed = steps_executed + %s, tokens_used = tokens_used + %s
             WHERE id = %s AND lease_token = %s AND status = %s
         RETURNING id),
        v AS (
            SELECT * FROM unnest({arrays}, %b::jsonb[]) AS v({columns}, event_data)),
        p AS (SELECT %s::varchar AS event_kind, %s::varchar AS actor),
        s AS (
            INSERT INTO {Step._meta.db_table} ({columns})
            SELECT {", ".join(f"v.{c}" for c in names)}
              FROM r, v ORDER BY v.position
         RETURNING id, position),
        e AS (
            INSERT INTO {TraceEvent._meta.db_table} (run_id, kind, step_id, message, data,
                   actor, created_at)
            SELECT r.id, p.event_kind, v.step_id, '', v.event_data, p.actor, v.finished_at
              FROM r, v, p ORDER BY v.position)
        SELECT id, position FROM s"""  # noqa: S608 - table and column names come from the models
    return _SQL["batch"]
