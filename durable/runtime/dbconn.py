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
transaction such as a claim or a release (:func:`retry_db`), and the same retry for a
write whose commit's outcome a fault leaves unknown, read back before it is tried again
(:func:`retry_in_place`: a finished step's checkpoint, a failed try's record, a batch
flush). Any other fault stops the execution as on a lost lease and the run is released
(``durable.worker.engine``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import IntegrityError, InterfaceError, OperationalError, connection

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


def retry_in_place(
    write: Callable[[], T],
    committed: Callable[[], T | None],
    *,
    what: str,
    delays: tuple[float, ...] = RETRY_DELAYS,
) -> T:
    """Call ``write`` (one fenced transaction recording what this process holds, such as a
    finished step's result) through :func:`retry_db`: on a database fault, drop the
    connection, wait each of ``delays`` (seconds) in turn and, on a new connection,
    first ask ``committed()``
    whether the failed try's commit happened after all (it returns what ``write``
    would have, or None), then ``write`` again. So a short outage (a restart, a
    failover, a terminated backend) costs a reconnect, not a second call of the step's
    body -- a model asked again, a tool called again -- nor a release of the run.

    The last fault is raised, as is any fault inside an enclosing transaction (which
    cannot reconnect). A unique violation on a retry means the lost commit landed while
    the retry was written (the server had not seen the client go): ``committed()`` is
    asked again, and a fault while it reads is one more fault to ride out. ``write``
    must be fenced (it writes nothing once the lease is another worker's) and its rows
    unique to the step, as every checkpoint is. The rule is
    DBOS's (``db_retry`` in dbos-transact-py's ``dbos/_sys_db.py`` blocks the workflow
    and retries its system database's operation until the database is back), bounded
    here: past ``delays`` the execution stops and the run is released as before.
    """
    if connection.in_atomic_block:
        return write()
    tried = False

    def once() -> T:
        nonlocal tried
        again, tried = tried, True
        if again:  # after a fault: did that try commit?
            found = committed()
            if found is not None:
                return found
        try:
            return write()
        except IntegrityError:
            if not again:
                raise
            found = committed()  # the lost commit landed: read it back
            if found is None:
                raise
            return found

    return retry_db(once, what=what, delays=delays)
