"""A clock a test can move forward: every reader of time sees the same skipped time.

Durable reads time in these places, and a skip must move them all or a test passes for
the wrong reason (a timer fired by the sweeper's clock, but an approval decided by a
clock three days behind it):

- ``django.utils.timezone.now()``: rows' times, approval deadlines at a decision, the
  clock of SQLite (:func:`durable.clock.now` returns it there);
- :func:`durable.postgres.database_now`: the database's clock on PostgreSQL, which
  :func:`durable.clock.now` (leases, the sweeper, wake-up times), schedule ticks and
  the rate-limit windows read;
- a model field's ``default=timezone.now`` (a row's ``created_at``), which holds the
  function itself and so is not reached by replacing it in its module;
- :meth:`durable.runtime.replay.ReplayCursor.pause`: the short waits a worker sleeps in
  place (a retry's backoff under ``INPROCESS_RETRY_MAX_SECONDS``, a rate limit that
  admits within a second).

:class:`SkippingClock` adds one offset to the first three and turns the last into a skip
of the same length, so "three days later" is three days later for every reader, and
nothing sleeps. Real time still flows underneath (the offset is added to it), as on
Temporal's time-skipping test server. Times are never moved backwards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from durable import clock, postgres
from durable.runtime import replay

__all__ = ["SkippingClock"]


class SkippingClock:
    """Time that a test moves forward (:meth:`advance`); install it with :meth:`install`
    and take it out with :meth:`uninstall` (the ``durable_env`` fixture does both).

    ``offset``: the time skipped so far (a ``timedelta``, never negative).
    """

    def __init__(self) -> None:
        self.offset = timedelta(0)
        self._lock = threading.Lock()
        self._saved: list[tuple[Any, str, Any]] = []
        self._defaults: list[tuple[Any, Any]] = []

    # ------------------------------------------------------------------ installing

    def install(self) -> SkippingClock:
        """Route every reader of time through this clock (see the module). Raises
        ``RuntimeError`` when already installed."""
        if self._saved:
            raise RuntimeError("this SkippingClock is already installed")
        real_now: Callable[[], datetime] = timezone.now
        real_database_now = postgres.database_now
        skipping = self

        def now() -> datetime:
            return real_now() + skipping.offset

        def database_now(*, wall_clock: bool = False) -> datetime | None:
            found = real_database_now(wall_clock=wall_clock)
            return None if found is None else found + skipping.offset

        def pause(cursor: replay.ReplayCursor, seconds: float) -> None:
            cursor.waited = True  # what a pause means to the cursor: read the run again
            skipping.sleep(seconds)

        for owner, name, value in (
            (timezone, "now", now),
            (postgres, "database_now", database_now),
            (replay.ReplayCursor, "pause", pause),
        ):
            self._saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, value)
        self._defaults = _swap_defaults(real_now, now)  # rows' ``default=timezone.now``
        clock.forget()  # the shared clock's anchor is read again, with the offset
        return self

    def uninstall(self) -> None:
        """Give every reader its real clock back (the offset is forgotten)."""
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)
        for field, default in self._defaults:
            _set_default(field, default)
        self._defaults = []
        clock.forget()

    def __enter__(self) -> SkippingClock:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # ------------------------------------------------------------------ time

    def now(self) -> datetime:
        """Now by the shared clock (:func:`durable.clock.now`), the skipped time included."""
        return clock.now()

    def sleep(self, duration: float | timedelta) -> None:
        """Skip ``duration`` (seconds or a ``timedelta``; 0 or less: nothing) without
        sleeping. Nothing is executed: see ``DurableEnv.advance`` for a skip that fires
        what falls due on the way."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        if seconds > 0:
            with self._lock:
                self.offset += timedelta(seconds=seconds)
            clock.forget()

    def move_to(self, when: datetime) -> None:
        """Skip forward until :meth:`now` is ``when`` (an aware datetime); a time
        already past changes nothing (the clock never goes back)."""
        self.sleep((when - self.now()).total_seconds())


def _set_default(field: Any, default: Any) -> None:
    field.default = default
    field.__dict__.pop("_get_default", None)  # Django caches the callable it returns


def _swap_defaults(real: Any, skipping: Any) -> list[tuple[Any, Any]]:
    """Give every field of the installed models whose default is ``real`` the default
    ``skipping``; returns ``[(field, its default before)]``."""
    from django.apps import apps

    swapped = []
    for model in apps.get_models():
        for field in model._meta.concrete_fields:
            if field.default is real:
                swapped.append((field, field.default))
                _set_default(field, skipping)
    return swapped
