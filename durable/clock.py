"""The clock of leases, liveness beats and wake-up times: one clock for every worker.

A lease written by one worker is judged by others: "expired" means its
``lease_expires_at`` is in the past by the judge's clock. If each worker read its own
wall clock, one host whose clock steps (NTP correcting a drift, a VM resumed, an operator
setting the date) would see every other lease as expired and take runs that are still
running, or write leases and beats an hour ahead that no one takes over when it dies.

:func:`now` is therefore, on PostgreSQL, the database's clock (``clock_timestamp()``, one
clock for every machine, as Temporal's server and DBOS's database keep time for their
workers), read once per :data:`RESYNC_SECONDS` and carried forward between reads by
this process's *monotonic* clock, which a wall-clock step does not move. On SQLite every
process is on the one machine that holds the file, so its wall clock is the shared one
and :func:`now` is ``django.utils.timezone.now()``.

Used where a time is written for another process to compare, or compared with one: the
claim and the lease's extensions, the process beat, the sweeper, run deadlines (written
at the start or a resume, judged at each step and by the sweeper), and the wake-up
times of retries, timers and limit waits. Times shown to people (``created_at``,
``updated_at``) keep the writer's clock.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.utils import timezone

from durable import postgres

#: seconds between two reads of the database's clock (the monotonic clock drifts far
#: less than a second in this time)
RESYNC_SECONDS = 30.0

_lock = threading.Lock()
#: (database time, this process's monotonic time) at the last read
_anchor: tuple[datetime, float] | None = None


def now() -> datetime:
    """Now, as an aware UTC datetime, by the clock every worker shares (see the module).

    Never raises for the clock itself: if the database cannot be read, the last reading
    carried forward, or this machine's clock when there is none yet.
    """
    anchor = _anchor
    if anchor is None or time.monotonic() - anchor[1] >= RESYNC_SECONDS:
        anchor = _resync(anchor)
    if anchor is None:  # SQLite, or no reading yet: this machine's clock is the shared one
        return timezone.now()
    return anchor[0] + timedelta(seconds=time.monotonic() - anchor[1])


def _resync(anchor: tuple[datetime, float] | None) -> tuple[datetime, float] | None:
    """A fresh (database now, monotonic) anchor, kept for the next :func:`now`; ``anchor``
    unchanged when the database cannot be read or has no clock to read (SQLite)."""
    global _anchor
    try:
        db_now = postgres.database_now(wall_clock=True)
    except DatabaseError:
        return anchor
    if db_now is None:
        return anchor
    fresh = (db_now, time.monotonic())
    with _lock:
        _anchor = fresh
    return fresh


def forget() -> None:
    """Read the database's clock again at the next :func:`now` (tests; a new database)."""
    global _anchor
    with _lock:
        _anchor = None
