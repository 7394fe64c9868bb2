"""Database faults: telling them from workflow failures, and starting afresh after one.

Reconnecting is Django's own machinery, used as Django uses it per request:

- ``close_old_connections()`` runs before and after every Celery task
  (``durable/worker/tasks.py``) and around each execution (``durable/worker/engine.py``). It drops a
  connection on which an error occurred, or that outlived ``CONN_MAX_AGE``;
- ``CONN_HEALTH_CHECKS`` (on in ``config/settings.py``) pings a reused connection
  before its first query in each task, so a connection the server terminated while the
  worker was idle is replaced before it fails a query;
- the heartbeat thread closes its connection after every round of beats, and
  ``channels.db.database_sync_to_async`` (the dashboard's live follower) calls
  ``close_old_connections()`` around each call.

What this module adds is the engine's side: which errors mean "the database work
failed" rather than "the workflow failed" (:func:`is_db_fault`), dropping the broken
connection (:func:`drop_connection`), and a short bounded retry of one self-contained
transaction such as a claim or a release (:func:`retry_db`). A checkpoint that fails
this way is never retried in place (its commit may have happened); the execution stops
as on a lost lease and the run is released (``durable.worker.engine``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection

logger = logging.getLogger("durable.engine")

T = TypeVar("T")

#: seconds between the tries of :func:`retry_db` (four retries, about 4 s in all)
RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)


def is_db_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a database error of the operational kind.

    The connection was terminated or cannot be used (``InterfaceError``, PostgreSQL's
    ``admin_shutdown``, "the connection is closed", a network error), or the server
    gave up on the statement for a reason outside the workflow (lock or statement
    timeout, deadlock, SQLite's "database is locked"). Integrity and data errors are
    not faults: they are answers.
    """
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    database = getattr(connection, "Database", None)  # the driver, for unwrapped errors
    driver = tuple(
        cls
        for cls in (
            getattr(database, "OperationalError", None),
            getattr(database, "InterfaceError", None),
        )
        if isinstance(cls, type)
    )
    return bool(driver) and isinstance(exc, driver)


def drop_connection() -> None:
    """Close this thread's default connection so that the next query opens a new one.

    Outside a transaction only (inside one, Django refuses to reconnect until it is
    rolled back). Never raises: closing a broken connection may fail and does not
    matter.
    """
    if connection.in_atomic_block:
        return
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - the connection is gone either way
        connection.connection = None


def retry_db(fn: Callable[[], T], *, what: str, delays: tuple[float, ...] = RETRY_DELAYS) -> T:
    """Call ``fn`` (one self-contained transaction); on a database fault, drop the
    connection and try again after each of ``delays`` (seconds); the last fault is
    raised. ``fn`` must be safe to repeat when its commit's outcome is unknown.
    """
    for delay in (*delays, None):
        try:
            return fn()
        except BaseException as exc:
            if delay is None or not is_db_fault(exc):
                raise
            logger.warning(
                "durable: %s failed (%s: %s); reconnecting and trying again in %.2f s",
                what,
                type(exc).__name__,
                str(exc).strip()[:200],
                delay,
            )
            drop_connection()
            time.sleep(delay)
    raise AssertionError("unreachable")
