"""PostgreSQL: a step's checkpoint as one statement (the fence, the step, its event).

The common checkpoint -- a first success with no ledger, no lost tries and no tag to
add -- needs one round trip and one commit on PostgreSQL: a data-modifying CTE updates
the run only while the lease token and status hold, and inserts the step and its trace
event from that update's row. When the fence does not hold, nothing is written and the
caller's transactional path (``checkpoint.py``) tells which case it is and acts.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connection

from .fields import storable_json
from .models import Run, Step, StepStatus, TraceEvent

if TYPE_CHECKING:
    from .replay import StepCall


def checkpoint_in_one_statement(
    *,
    run_id: str,
    token: str,
    status: str,
    worker_id: str,
    call: StepCall,
    output: str,
    error: dict[str, Any] | None,
    attempt: int,
    budget_base: int,
    started_at: datetime,
    now: datetime,
    tokens: int,
    event_data: dict[str, Any],
) -> Step | None:
    """The fenced run update, the step and its event in one statement.

    One round trip and one commit, no ORM work (the benchmark's checkpoint path).
    Returns the step written, or None -- having written nothing -- when the fence does
    not hold (lease lost, run cancelled).
    """
    sid, pos = call.step_id, call.position
    run_table = Run._meta.db_table
    step_table = Step._meta.db_table
    event_table = TraceEvent._meta.db_table
    sql = f"""
        WITH r AS (
            UPDATE {run_table}
               SET updated_at = %s, cursor_position = %s, cursor_lost = 0,
                   steps_executed = steps_executed + 1, tokens_used = tokens_used + %s
             WHERE id = %s AND lease_token = %s AND status = %s
         RETURNING id),
        s AS (
            INSERT INTO {step_table} (run_id, step_id, position, kind, tool_name, status,
                   input, output, error, attempts, budget_base, next_attempt_at,
                   started_at, finished_at, replay_count)
            SELECT r.id, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, NULL, %s, %s, 0
              FROM r
         RETURNING id),
        e AS (
            INSERT INTO {event_table} (run_id, kind, step_id, message, data, actor,
                   created_at)
            SELECT r.id, 'step_executed', %s, '', %s::jsonb, %s, %s FROM r)
        SELECT id FROM s"""  # noqa: S608 - table names come from the models
    params: list[Any] = [
        now,
        pos + 1,
        tokens,
        run_id,
        token,
        status,
        sid,
        pos,
        call.kind,
        call.tool_name,
        StepStatus.SUCCEEDED,
        call.input_text,
        output,
        json.dumps(storable_json(error)) if error is not None else None,
        attempt,
        budget_base,
        started_at,
        now,
        sid,
        json.dumps(storable_json(event_data)),
        worker_id,
        now,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    return Step(
        pk=row[0],
        run_id=run_id,
        step_id=sid,
        position=pos,
        kind=call.kind,
        tool_name=call.tool_name,
        status=StepStatus.SUCCEEDED,
        input=call.input_text,
        output=output,
        error=error,
        attempts=attempt,
        budget_base=budget_base,
        started_at=started_at,
        finished_at=now,
    )
