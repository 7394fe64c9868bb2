"""The one-statement PostgreSQL paths, and the one place that decides when they apply.

Each path here does in one statement (a data-modifying CTE, autocommitted) what the ORM
path beside its caller does in a transaction of several: a run's start, claim and
completion (``runs.py``); a step's checkpoint and a write's fenced ``started`` row
(``checkpoints.py``); a batch of steps (``batches.py``). The rows they insert are the
unsaved model instances the ORM path would save, every column of them (``rows.py``: one
column list, the model's). The engine's tests of the database vendor are here and nowhere
else (``tests/durable/postgres/test_available.py`` holds it to that): :func:`available`,
and for the replay check's reads :func:`read_only` and :func:`statement_savepoint`;
:func:`database_now` is the only read of the database's clock.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from durable import conf


def available() -> bool:
    """Whether a one-statement path may run now: the database is PostgreSQL and no
    transaction is open. Inside a caller's transaction the ORM paths run instead, since
    they keep its atomicity and savepoints; a one-statement path commits on its own."""
    db = connections[DEFAULT_DB_ALIAS]  # not the proxy: a thread-local lookup per attribute
    return db.vendor == "postgresql" and not db.in_atomic_block


def database_now(*, wall_clock: bool = False) -> datetime | None:
    """Now by PostgreSQL's clock, one clock for every machine (``statement_timestamp()``,
    or ``clock_timestamp()`` with ``wall_clock``: the time while a transaction goes on),
    or ``None`` on another database: SQLite is a file on this machine, whose clock the
    caller reads."""
    if connection.vendor != "postgresql":
        return None
    function = "clock_timestamp" if wall_clock else "statement_timestamp"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}()")
        (now,) = cursor.fetchone()
    return now


@contextmanager
def prepared_cursor(*, retried: bool = False) -> Iterator[Any]:
    """A cursor whose statements PostgreSQL parses and plans once per connection, then
    only executes: psycopg's prepared statements (server-side binding, ``prepare=True``),
    for the engine's hot statements (a run's start, claim and completion, a step's
    checkpoint, a write's ``started`` row). Planning the checkpoint's CTE took 0.7 ms of its 1.2 ms
    on the server (``bench/results/2026-12-05-prepared.md``). Django's own cursors stay
    client-side (Django's default). With ``DURABLE['PREPARED_STATEMENTS']`` false (a
    pooler that cannot keep a session's prepared statements) or while queries are
    logged, Django's cursor. Statements and errors go through Django's cursor wrapper as
    any query's (execute wrappers, ``django.db`` exceptions); psycopg keeps at most 100
    prepared per connection (``prepared_max``) and drops them with the connection.

    ``retried``: the caller runs the statement again on a fresh connection when this one
    turns out to be lost (the claim, through ``retry_db``); only then is a connection
    that ran a hot statement a moment ago not pinged first. A statement whose prepared
    plan a migration made stale ("cached plan must not change result type": a column it
    returns changed type) is prepared again and run once more."""
    # the connection of this thread, looked up once: each attribute of Django's
    # ``connection`` proxy is a lookup in a thread-local (~1 us each, several a step)
    db: Any = connections[DEFAULT_DB_ALIAS]  # health_check_done is missing from django-stubs
    if not conf.get("PREPARED_STATEMENTS") or db.queries_logged:
        # queries_logged: DEBUG, or a test capturing queries: Django's debug cursor logs
        # a statement's text, which a prepared one does not give back (Django's
        # last_executed_query reads it from a client-side cursor)
        with db.cursor() as cursor:
            yield cursor
        return
    if (
        retried
        and not db.health_check_done
        and time.monotonic() - getattr(db, "durable_used_at", -math.inf) < RECENTLY_USED_SECONDS
    ):
        # Django pings the server (CONN_HEALTH_CHECKS) before the first query after every
        # close_old_connections(), i.e. once per task or execution: a round trip of every
        # one-step run's four. A connection that ran a hot statement a moment ago is not
        # pinged before the claim, which is retried on a fresh one if it was lost
        # meanwhile (retry_db); a run's start is not retried, so it keeps Django's ping
        db.health_check_done = True
    if db.connection is None or not db.health_check_done:
        # both are no-ops on an open connection already checked (ensure_connection's
        # async-safety check alone costs ~1 us a statement)
        db.close_if_health_check_failed()
        db.ensure_connection()
    pg = db.connection
    if pg.prepare_threshold is None:
        # Django turns psycopg's preparing off (None) unless OPTIONS names a threshold; a
        # number lets prepare=True through, and as it is never reached no other
        # statement is prepared for having run often (Django's cursors never are)
        pg.prepare_threshold = NEVER_BY_COUNT
    # one psycopg cursor per connection, used again by every hot statement (a cursor is
    # not closed by running another statement; creating and wrapping one cost ~10 us)
    kept = getattr(db, "durable_cursor", None)
    if kept is None or kept[0] is not pg or kept[1].closed:
        with db.wrap_database_errors:
            kept = db.durable_cursor = (pg, db._prepare_cursor(_prepared_cursor_class()(pg)))
    yield kept[1]
    db.durable_used_at = time.monotonic()


#: seconds after a hot statement within which the connection is not health-checked again
RECENTLY_USED_SECONDS = 1.0


#: psycopg's ``prepare_threshold`` set where Django left none: prepare=True only
NEVER_BY_COUNT = 2**62


@functools.cache
def _prepared_cursor_class() -> type[Any]:
    """psycopg's server-side binding cursor, each statement prepared (psycopg is
    imported here: only a PostgreSQL database needs it)."""
    import psycopg
    from psycopg.errors import FeatureNotSupported
    from psycopg.pq import TransactionStatus

    class PreparedCursor(psycopg.Cursor):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", True)
            try:
                return super().execute(query, params, **kwargs)
            except FeatureNotSupported as exc:
                # another session's migration changed the type of a column this prepared
                # statement returns (the claim returns the run's): PostgreSQL refuses the
                # stale plan before running anything. Outside a transaction, forget this
                # session's prepared statements (psycopg forgets its own on DEALLOCATE
                # ALL) and run it once more, prepared again. Inside one the error stands:
                # the transaction is aborted, and its rollback clears them.
                idle = self.connection.info.transaction_status == TransactionStatus.IDLE
                if "cached plan must not change result type" not in str(exc) or not idle:
                    raise
                self.connection.execute("DEALLOCATE ALL")
                return super().execute(query, params, **kwargs)

    return PreparedCursor


#: seconds a client is told to wait (``Retry-After``) when the web's pool is exhausted
BUSY_RETRY_AFTER = 1


def pool_exhausted(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is psycopg's ``PoolTimeout``: a
    web request waited ``DATABASE_POOL_TIMEOUT`` seconds for one of the process's
    ``DATABASE_POOL_MAX_SIZE`` connections (docs/production.md#database-connections). The
    API and the dashboard answer it 503 with ``Retry-After``: the database is busy, not
    broken, and the request changed nothing."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "PoolTimeout" and type(exc).__module__.startswith("psycopg_pool"):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is the database failing to
    answer rather than refusing the request: Django's ``OperationalError`` or
    ``InterfaceError`` (a connection ended by a restart, a failover or an administrator, a
    statement cancelled, a deadlock), or the pool's timeout. The API and the dashboard
    answer it 503 with ``Retry-After`` instead of 500: the client may try again (the API's
    writes are idempotent by ``run_id`` or ``Idempotency-Key``)."""
    from django.db import InterfaceError, OperationalError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OperationalError | InterfaceError) or pool_exhausted(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextmanager
def read_only() -> Iterator[None]:
    """No write on this connection meanwhile: on PostgreSQL one ``READ ONLY`` transaction
    (inside a caller's, its mode is the caller's); on SQLite ``PRAGMA query_only`` (a
    transaction there is IMMEDIATE and would take the database's write lock)."""
    if connection.vendor == "postgresql":
        outermost = not connection.in_atomic_block  # inside a caller's, its mode is its own
        with transaction.atomic():
            if outermost:
                with connection.cursor() as cur:
                    cur.execute("SET TRANSACTION READ ONLY")
            yield
    elif connection.vendor == "sqlite":
        with connection.cursor() as cur:
            cur.execute("PRAGMA query_only = ON")
        try:
            yield
        finally:
            with connection.cursor() as cur:
                cur.execute("PRAGMA query_only = OFF")
    else:  # pragma: no cover - Durable runs on PostgreSQL and SQLite
        yield


@contextmanager
def statement_savepoint() -> Iterator[None]:
    """A savepoint on PostgreSQL, where a failed statement aborts the whole transaction
    (a workflow's own failing query must not end the replay check's chunk); nothing on
    SQLite, whose transactions are IMMEDIATE and would take the write lock."""
    if connection.vendor == "postgresql":
        with transaction.atomic():
            yield
    else:
        yield
