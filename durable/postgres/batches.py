"""The batch flush in one PostgreSQL statement: the fenced run update, every pending step
and its trace event (see "Batched checkpoints" in ``docs/architecture.md``); the
transactional path beside it is ``StepBatch.flush``'s ``owner.write`` in
:mod:`durable.runtime.batching`, which writes the same rows through the ORM."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from django.utils import timezone

from durable.models import Run, Step, StepStatus, TraceEvent
from durable.values.fields import storable_json
from durable.vocabulary import Durability, EventKind


def flush_in_one_statement(owner: Any, batch: Any) -> list[Step] | None:
    """PostgreSQL: the fenced run update, every pending step and its event in one
    statement (one round trip, one commit). ``owner`` is the execution writing (a
    ``BatchOwner`` of :mod:`durable.runtime.batching`), ``batch`` its ``StepBatch``;
    this package sits below the runtime, so it names neither type. Returns the steps
    written, or None -- having written nothing -- when the fence does not hold."""
    pending = batch.pending
    now = timezone.now()
    rows: list[str] = []
    params: list[Any] = [
        now,
        pending[-1]["position"] + 1,
        len(pending),
        batch.tokens,
        owner.run_id,
        owner.token,
        owner.status,
    ]
    for fields, event in zip(pending, batch.events, strict=True):
        rows.append(
            "(%s::varchar, %s::int, %s::varchar, %s::varchar, %s::text, %s::text, "
            "%s::jsonb, %s::int, %s::int, %s::timestamptz, %s::timestamptz, %s::jsonb)"
        )
        error = fields["error"]
        params += [
            fields["step_id"],
            fields["position"],
            fields["kind"],
            fields["tool_name"],
            fields["input"],
            fields["output"],
            json.dumps(storable_json(error)) if error is not None else None,
            fields["attempts"],
            fields["budget_base"],
            fields["started_at"],
            fields["finished_at"],
            json.dumps(storable_json(event["data"])),
        ]
    params += [StepStatus.SUCCEEDED, Durability.BATCHED, EventKind.STEP_EXECUTED.value]
    params.append(owner.worker_id)
    sql = f"""
        WITH r AS (
            UPDATE {Run._meta.db_table}
               SET updated_at = %s, cursor_position = %s,
                   steps_executed = steps_executed + %s, tokens_used = tokens_used + %s
             WHERE id = %s AND lease_token = %s AND status = %s
         RETURNING id),
        v (step_id, position, kind, tool_name, input, output, error, attempts, budget_base,
           started_at, finished_at, data) AS (VALUES {", ".join(rows)}),
        p AS (SELECT %s::varchar AS status, %s::varchar AS durability,
                     %s::varchar AS event_kind, %s::varchar AS actor),
        s AS (
            INSERT INTO {Step._meta.db_table} (run_id, step_id, position, kind, tool_name,
                   status, input, output, error, attempts, budget_base, next_attempt_at,
                   started_at, finished_at, replay_count, durability)
            SELECT r.id, v.step_id, v.position, v.kind, v.tool_name, p.status, v.input,
                   v.output, v.error, v.attempts, v.budget_base, NULL, v.started_at,
                   v.finished_at, 0, p.durability
              FROM r, v, p ORDER BY v.position
         RETURNING id, position),
        e AS (
            INSERT INTO {TraceEvent._meta.db_table} (run_id, kind, step_id, message, data,
                   actor, created_at)
            SELECT r.id, p.event_kind, v.step_id, '', v.data, p.actor, v.finished_at
              FROM r, v, p ORDER BY v.position)
        SELECT id, position FROM s"""  # noqa: S608 - table names come from the models
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = dict((position, pk) for pk, position in cursor.fetchall())
    if not ids:
        return None
    return [Step(pk=ids[fields["position"]], **fields) for fields in pending]
