"""Lease heartbeats: one thread per process extends the leases of every run it executes.

A run's lease (ARCHITECTURE.md point 4) is extended every ``conf.heartbeat_seconds()``
while the run executes; checkpoints do not rewrite it, so their UPDATE of the run row
stays a HOT update on PostgreSQL. When an extension finds the lease gone (another
worker claimed the run after it expired), the handle's ``lost`` becomes True and the
workflow stops at its next durable call; the fencing token makes any write it still
attempts fail. One shared thread instead of one per execution: starting and joining a
thread per run was about a tenth of a one-step run's time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from . import conf

logger = logging.getLogger("durable.heartbeat")


class Heartbeat:
    """The lease of one execution, kept alive by the process's heartbeat thread."""

    def __init__(self, run_id: str, token: str) -> None:
        self.run_id = run_id
        self.token = token
        self.lost = False
        self.next_beat = time.monotonic() + conf.heartbeat_seconds()

    def start(self) -> Heartbeat:
        _service().register(self)
        return self

    def stop(self) -> None:
        _service().unregister(self)


class _Service:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.handles: set[Heartbeat] = set()
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="durable-heartbeat", daemon=True)
        self.thread.start()

    def register(self, handle: Heartbeat) -> None:
        with self.cond:
            self.handles.add(handle)
            self.cond.notify()

    def unregister(self, handle: Heartbeat) -> None:
        with self.cond:
            self.handles.discard(handle)

    def _due(self) -> tuple[list[Heartbeat], float]:
        now = time.monotonic()
        due = [h for h in self.handles if h.next_beat <= now]
        soonest = min((h.next_beat for h in self.handles), default=now + 60.0)
        return due, max(0.0, soonest - now)

    def _loop(self) -> None:
        while True:
            with self.cond:
                due, wait = self._due()
                if not due:
                    self.cond.wait(timeout=min(wait, 60.0))
                    continue
            try:
                for handle in due:
                    self._beat(handle)
            finally:
                # no connection lingers between beats (a test database must be droppable)
                connection.close()

    def _beat(self, handle: Heartbeat) -> None:
        from .models import Run

        interval = conf.heartbeat_seconds()
        try:
            updated = Run.objects.filter(pk=handle.run_id, lease_token=handle.token).update(
                lease_expires_at=timezone.now() + timedelta(seconds=conf.lease_seconds()))
        except Exception:  # noqa: BLE001 - a failed beat is tried again soon
            logger.warning("durable: heartbeat of run %s failed", handle.run_id, exc_info=True)
            handle.next_beat = time.monotonic() + min(interval, 1.0)
            return
        handle.next_beat = time.monotonic() + interval
        if not updated:
            handle.lost = True
            self.unregister(handle)


_lock = threading.Lock()
_instance: _Service | None = None


def _service() -> _Service:
    """The process's heartbeat thread (started anew in a forked child)."""
    global _instance
    with _lock:
        if _instance is None or _instance.pid != os.getpid() or not _instance.thread.is_alive():
            _instance = _Service()
        return _instance
