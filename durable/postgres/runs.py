"""PostgreSQL: a run's start, claim and completion, each one statement with its event.

A one-step run pays its start, its claim and its completion besides its step; each is
one data-modifying CTE here (one round trip, one commit in autocommit) instead of a
transaction of three to five round trips. Each writes exactly what the transactional
path writes (``api.start``, ``engine.claim``, ``Checkpoints.complete``) and the claim and
completion are fenced the same way: the claim only takes a PENDING run that no one holds
locked (``SKIP LOCKED``), the completion only while the lease token and status hold and
no signal is left unconsumed. When a statement does not apply it writes nothing and
returns None, and the caller takes its transactional path, which tells the cases apart.
Status changes come from ``durable.models.transitions``; values pass through the model fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Field, Model

from durable.models import transitions
from durable.models.events import TraceEvent
from durable.models.runs import Run
from durable.models.steps import Step
from durable.models.waits import Signal
from durable.postgres import prepared_cursor
from durable.vocabulary import EventKind, RunStatus

_SQL: dict[str, str] = {}


def _fields(model: type[Model], *, skip_pk: bool = False) -> list[Field]:
    return [
        f
        for f in model._meta.concrete_fields
        if not (skip_pk and f.primary_key) and isinstance(f, Field)
    ]


def _values(instance: Model, fields: list[Field]) -> list[Any]:
    return [f.get_db_prep_save(getattr(instance, f.attname), connection) for f in fields]


def start_in_one_statement(run: Run, event: TraceEvent) -> None:
    """Insert the new ``run`` (every column, as ``Run.objects.create`` would) and its
    ``created`` trace ``event`` in one statement. Raises ``IntegrityError`` (nothing
    written) when the run id is taken."""
    if "start" not in _SQL:
        run_cols = ", ".join(f.column for f in _fields(Run))
        run_marks = ", ".join(["%s"] * len(_fields(Run)))
        ev_fields = _fields(TraceEvent, skip_pk=True)
        ev_cols = ", ".join(f.column for f in ev_fields)
        ev_marks = ", ".join("r.id" if f.attname == "run_id" else "%s" for f in ev_fields)
        _SQL["start"] = f"""
        WITH r AS (
            INSERT INTO {Run._meta.db_table} ({run_cols}) VALUES ({run_marks}) RETURNING id)
        INSERT INTO {TraceEvent._meta.db_table} ({ev_cols}) SELECT {ev_marks} FROM r"""  # noqa: S608
    ev_fields = [f for f in _fields(TraceEvent, skip_pk=True) if f.attname != "run_id"]
    params = _values(run, _fields(Run)) + _values(event, ev_fields)
    with prepared_cursor() as cursor:
        cursor.execute(_SQL["start"], params)


def claim_in_one_statement(
    run_id: str, *, token: str, worker_id: str, lease_expires_at: datetime, now: datetime
) -> tuple[Run, bool] | None:
    """Claim a PENDING run that no one holds locked, with its ``claimed`` event.

    Returns ``(run, first_claim)`` -- the run as claimed; ``first_claim``: it was never
    claimed and has nothing recorded, so it has no steps to load -- or None, having
    written nothing, when the run is not PENDING or is locked (the transactional claim
    then decides).
    """
    changes = transitions.changes("claim", RunStatus.PENDING)
    names = sorted(changes)
    key = f"claim:{names}"
    if key not in _SQL:
        table = Run._meta.db_table
        sets = ", ".join(f"{Run._meta.get_field(n).column} = %s" for n in names)  # type: ignore[union-attr]
        cols = ", ".join(f"r.{f.column}" for f in _fields(Run))
        _SQL[key] = f"""
        WITH c AS (
            SELECT id, claims, cursor_position FROM {table}
             WHERE id = %s AND status = %s FOR UPDATE SKIP LOCKED),
        r AS (
            UPDATE {table} SET {sets}, lease_owner = %s, lease_token = %s,
                   lease_expires_at = %s, wake_at = NULL, claims = {table}.claims + 1,
                   started_at = COALESCE({table}.started_at, %s), updated_at = %s
              FROM c WHERE {table}.id = c.id
         RETURNING {table}.*),
        e AS (
            INSERT INTO {TraceEvent._meta.db_table} (run_id, kind, step_id, message, data,
                   actor, created_at)
            SELECT r.id, %s, '', '', jsonb_build_object('claim', r.claims), %s, %s FROM r)
        SELECT {cols}, c.claims = 0 AND c.cursor_position = 0
          FROM r JOIN c ON c.id = r.id"""  # noqa: S608 - table names come from the models
    params: list[Any] = [run_id, RunStatus.PENDING]
    params += [_prep(Run, n, changes[n]) for n in names]
    params += [worker_id[:200], token, lease_expires_at, now, now]
    params += [EventKind.CLAIMED, worker_id, now]
    with prepared_cursor(retried=True) as cursor:
        cursor.execute(_SQL[key], params)
        row = cursor.fetchone()
    if row is None:
        return None
    *values, first = row
    return _from_db(Run, values), bool(first)


def complete_in_one_statement(
    *,
    run_id: str,
    token: str,
    status: str,
    fields: dict[str, Any],
    replayed: list[int],
    event: TraceEvent,
) -> bool:
    """The run's completion (``fields``, plus ``steps_replayed`` + ``len(replayed)``),
    the replay counts of the ``replayed`` steps and the ``completed`` ``event``, fenced
    on ``token`` and ``status``, and only while no signal is left unconsumed (that run
    ends with one more event, written by the transactional path). Returns whether it
    was written (False: nothing written)."""
    names = sorted(fields)
    key = f"complete:{names}"
    if key not in _SQL:
        table = Run._meta.db_table
        sets = ", ".join(f"{Run._meta.get_field(n).column} = %s" for n in names)  # type: ignore[union-attr]
        ev_fields = [f for f in _fields(TraceEvent, skip_pk=True) if f.attname != "run_id"]
        ev_cols = ", ".join(f.column for f in ev_fields)
        _SQL[key] = f"""
        WITH r AS (
            UPDATE {table} SET {sets}, steps_replayed = steps_replayed + %s
             WHERE id = %s AND lease_token = %s AND status = %s
               AND NOT EXISTS (SELECT 1 FROM {Signal._meta.db_table}
                                WHERE run_id = %s AND wait_id IS NULL)
         RETURNING id),
        s AS (
            UPDATE {Step._meta.db_table} SET replay_count = replay_count + 1
              FROM r WHERE {Step._meta.db_table}.id = ANY(%s)),
        e AS (
            INSERT INTO {TraceEvent._meta.db_table} (run_id, {ev_cols})
            SELECT r.id, {", ".join(["%s"] * len(ev_fields))} FROM r)
        SELECT id FROM r"""  # noqa: S608 - table names come from the models
    ev_fields = [f for f in _fields(TraceEvent, skip_pk=True) if f.attname != "run_id"]
    params: list[Any] = [_prep(Run, n, fields[n]) for n in names]
    params += [len(replayed), run_id, token, status, run_id, list(replayed)]
    params += _values(event, ev_fields)
    with prepared_cursor() as cursor:
        cursor.execute(_SQL[key], params)
        return cursor.fetchone() is not None


def _from_db(model: type[Model], values: list[Any]) -> Any:
    """An instance of ``model`` from a row of every concrete column in the model's order,
    each value through its field's converters as a queryset's would be (Django's
    ``SQLCompiler.apply_converters``: the backend's, then the field's ``from_db_value``)."""
    fields, names, converters = _CONVERTERS.get(model) or _CONVERTERS.setdefault(
        model, _converters(model)
    )
    converted = []
    for field, value in zip(fields, values, strict=True):
        for convert in converters[field.attname]:
            value = convert(value, field, connection)
        converted.append(value)
    return model.from_db(connection.alias, names, converted)


def _converters(model: type[Model]) -> tuple[list[Field], list[str], dict[str, list[Any]]]:
    fields = _fields(model)
    converters = {}
    for field in fields:
        col = field.get_col(model._meta.db_table)
        converters[field.attname] = connection.ops.get_db_converters(col) + col.get_db_converters(
            connection
        )
    return fields, [f.attname for f in fields], converters


#: per model: its concrete fields, their attribute names and each one's converters
_CONVERTERS: dict[type[Model], tuple[list[Field], list[str], dict[str, list[Any]]]] = {}


def _prep(model: type[Model], name: str, value: Any) -> Any:
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    return field.get_db_prep_save(value, connection)
