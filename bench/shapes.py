"""Diagnosis: what one Durable checkpoint costs by SQL shape, on Durable's own schema.

``python -m bench.shapes --steps N`` (environment: ``DATABASE_URL`` of a scratch
PostgreSQL database) migrates, creates a running run, and records N no-op step
checkpoints with raw psycopg in several shapes, interleaved over 3 repetitions:

- ``orm``: the engine's own checkpoint path (``Checkpoints.record_success``: on
  PostgreSQL one prepared, fenced statement; the name is the diagnosis's first shape);
- ``raw4``: the same four statements with raw psycopg (no ORM): the ORM's share;
- ``cte``: one statement in autocommit (``WITH r AS (UPDATE ... RETURNING) INSERT step
  ... FROM r, INSERT event ... FROM r``): fenced the same way, one round trip;
- ``cte_hot``: ``cte`` without re-writing the indexed ``lease_expires_at`` (the heartbeat
  extends the lease) on a ``fillfactor=85`` run table, so the run UPDATE can be HOT;
- ``cte_hot_noevent``: ``cte_hot`` without the per-step trace event row;
- ``share``: the fence as a read (``SELECT ... FOR SHARE`` of the run: its lease token
  and status) instead of the run's UPDATE, then the step and its event (the run's
  counters would be derived from its steps: a data-model change, measured here only);
- ``share_noevent``: ``share`` without the trace event row;
- ``step_only``: the step's INSERT alone, unfenced: the least a checkpoint can write.

It reports ms/step, HOT updates of ``durable_run`` and bytes of the tables per step.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from datetime import timedelta
from typing import Any

from .common import emit, setup_django, summary

STEP_COLS = (
    "run_id, step_id, position, kind, tool_name, status, input, output, error, "
    "attempts, budget_base, next_attempt_at, started_at, finished_at, replay_count"
)
EVENT_COLS = "run_id, kind, step_id, message, data, actor, created_at"


def _new_run(token: str) -> str:
    from django.utils import timezone

    from durable.models import Run, RunStatus

    now = timezone.now()
    run = Run.objects.create(
        workflow_name="bench.noop",
        workflow_version="1",
        input="{}",
        input_hash="0" * 64,
        status=RunStatus.RUNNING,
        lease_owner="bench",
        lease_token=token,
        lease_expires_at=now + timedelta(seconds=30),
        started_at=now,
    )
    return run.id


def _orm(n: int, token: str) -> None:
    """The engine's own checkpoint path (``Execution.record_success``) without the workflow."""
    from django.utils import timezone

    from durable import registry
    from durable.models import Run, StepStatus
    from durable.runtime.execution import Execution

    from . import workflows as _workflows  # noqa: F401 - registers bench.noop

    run = Run.objects.get(pk=_new_run(token))
    execution = Execution(
        run=run, token=token, steps=[], spec=registry.get_workflow("bench.noop"), worker_id="bench"
    )
    cursor = execution.cursor
    for _ in range(n):
        call = cursor.next_call("s")
        execution.checkpoints.record_success(
            call, attempt=1, value=None, started_at=timezone.now(), ledger=None
        )
    assert cursor.by_position[n - 1].status == StepStatus.SUCCEEDED


def _raw4(conn: Any, n: int, token: str, run_id: str) -> None:
    from datetime import UTC, datetime

    for pos in range(n):
        now = datetime.now(UTC)
        with conn.transaction():
            cur = conn.execute(
                "UPDATE durable_run SET lease_expires_at = %s, updated_at = %s, "
                "cursor_position = %s, cursor_lost = 0, steps_executed = steps_executed + 1 "
                "WHERE id = %s AND lease_token = %s AND status = 'running'",
                (now + timedelta(seconds=30), now, pos + 1, run_id, token),
            )
            if cur.rowcount != 1:
                raise RuntimeError("lease lost")
            conn.execute(
                f"INSERT INTO durable_step ({STEP_COLS}) VALUES (%s, %s, %s, 'step', '', "
                "'succeeded', NULL, 'null', NULL, 1, 0, NULL, %s, %s, 0) RETURNING id",
                (run_id, f"s#{pos + 1}", pos, now, now),
            )
            conn.execute(
                f"INSERT INTO durable_traceevent ({EVENT_COLS}) VALUES (%s, "
                "'step_executed', %s, '', %s, 'bench', %s)",
                (run_id, f"s#{pos + 1}", json.dumps({"attempt": 1}), now),
            )


def _cte(
    conn: Any, n: int, token: str, run_id: str, *, lease: bool, event: bool, fence: str = "update"
) -> None:
    """``fence``: ``"update"`` (the run's UPDATE ... RETURNING), ``"share"`` (a ``FOR
    SHARE`` read of the run) or ``"none"`` (the step's INSERT alone)."""
    from datetime import UTC, datetime

    sets = (
        "updated_at = %(now)s, cursor_position = %(next)s, cursor_lost = 0, "
        "steps_executed = steps_executed + 1"
    )
    if lease:
        sets = "lease_expires_at = %(lease)s, " + sets
    event_sql = (
        f", e AS (INSERT INTO durable_traceevent ({EVENT_COLS}) SELECT r.id, "
        "'step_executed', %(sid)s, '', %(data)s, 'bench', %(now)s FROM r)"
        if event
        else ""
    )
    where = "WHERE id = %(run)s AND lease_token = %(token)s AND status = 'running'"
    r_sql = {
        "update": f"UPDATE durable_run SET {sets} {where} RETURNING id",
        "share": f"SELECT id FROM durable_run {where} FOR SHARE",
        "none": "SELECT %(run)s::varchar AS id",
    }[fence]
    sql = (
        f"WITH r AS ({r_sql}), "
        f"s AS (INSERT INTO durable_step ({STEP_COLS}) SELECT r.id, %(sid)s, %(pos)s, 'step', "
        "'', 'succeeded', NULL, 'null', NULL, 1, 0, NULL, %(now)s, %(now)s, 0 FROM r "
        f"RETURNING id){event_sql} SELECT id FROM s"
    )
    data = json.dumps({"attempt": 1})
    for pos in range(n):
        now = datetime.now(UTC)
        row = conn.execute(
            sql,
            {
                "now": now,
                "lease": now + timedelta(seconds=30),
                "next": pos + 1,
                "run": run_id,
                "token": token,
                "sid": f"s#{pos + 1}",
                "pos": pos,
                "data": data,
            },
        ).fetchone()
        if row is None:
            raise RuntimeError("lease lost")


def _stat(conn: Any) -> dict[str, int]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'durable_run'"
    ).fetchone()
    size = conn.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE "
        "c.relkind = 'r' AND c.relname IN ('durable_run', 'durable_step', "
        "'durable_traceevent')"
    ).fetchone()[0]
    return {"upd": int(row[0]), "hot": int(row[1]), "bytes": int(size)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.shapes")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    setup_django()
    import psycopg
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    sd = settings.DATABASES["default"]
    conn = psycopg.connect(
        host=sd["HOST"] or "127.0.0.1",
        port=sd["PORT"] or 5432,
        user=sd["USER"],
        password=sd["PASSWORD"] or None,
        dbname=sd["NAME"],
        autocommit=True,
    )
    shapes = [
        "orm",
        "raw4",
        "cte",
        "cte_hot",
        "cte_hot_noevent",
        "share",
        "share_noevent",
        "step_only",
    ]
    times: dict[str, list[float]] = {s: [] for s in shapes}
    stats: dict[str, dict[str, float]] = {}
    for rep in range(args.reps):
        for shape in shapes[rep % len(shapes) :] + shapes[: rep % len(shapes)]:
            token = uuid.uuid4().hex
            ff = 85 if shape.startswith("cte_hot") else 100
            conn.execute(f"ALTER TABLE durable_run SET (fillfactor = {ff})")
            run_id = _new_run(token) if shape != "orm" else ""
            connection.close()
            before = _stat(conn)
            t = time.perf_counter()
            if shape == "orm":
                _orm(args.steps, token)
                connection.close()
            elif shape == "raw4":
                _raw4(conn, args.steps, token, run_id)
            else:
                _cte(
                    conn,
                    args.steps,
                    token,
                    run_id,
                    lease=shape == "cte",
                    event=not shape.endswith("noevent") and shape != "step_only",
                    fence={"share": "share", "share_noevent": "share", "step_only": "none"}.get(
                        shape, "update"
                    ),
                )
            times[shape].append((time.perf_counter() - t) / args.steps * 1000)
            after = _stat(conn)
            if rep == args.reps - 1:
                upd = after["upd"] - before["upd"]
                stats[shape] = {
                    "hot_share": (after["hot"] - before["hot"]) / upd if upd else 0,
                    "bytes_per_step": (after["bytes"] - before["bytes"]) / args.steps,
                }
    conn.execute("ALTER TABLE durable_run SET (fillfactor = 100)")
    conn.close()
    emit(
        {
            "steps": args.steps,
            "reps": args.reps,
            "shapes": {s: {"ms": summary(times[s]), **stats.get(s, {})} for s in shapes},
        }
    )


if __name__ == "__main__":
    main()
