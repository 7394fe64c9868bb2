"""Lease heartbeats: one thread per process extends the leases of every run it executes.

A run's lease (docs/architecture.md#leases) is extended every ``conf.heartbeat_seconds()``
while the run executes; checkpoints do not rewrite it, so their UPDATE of the run row
stays a HOT update on PostgreSQL. When an extension finds the lease gone (another
worker claimed the run after it expired), the handle's ``lost`` becomes True and the
workflow stops at its next durable call; the fencing token makes any write it still
attempts fail. One shared thread instead of one per execution: starting and joining a
thread per run was about a tenth of a one-step run's time.

The same thread proves that the *process* is alive: while it holds at least one lease
it upserts its :class:`~durable.models.WorkerProcess` row every
``conf.worker_beat_seconds()`` (2 s). A process that was SIGKILLed stops beating, and
the sweeper releases its leases once it has been silent for
``conf.worker_dead_after_seconds()`` (6 s), instead of after the full lease (30 s).
One small write per process, not per run: the lease stays long (a slow database or a
long pause of the thread costs less), and the dead are found quickly.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta

from django.db import connection

from durable import clock, conf

logger = logging.getLogger("durable.worker.heartbeat")


def process_key() -> str:
    """``host:pid`` of this process: its ``WorkerProcess`` id, the prefix of its leases."""
    return f"{socket.gethostname()}:{os.getpid()}"


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
        self.started_at = clock.now()
        # the first liveness beat waits one interval: a short execution never writes one
        # (the sweeper never presumes dead a run claimed less than WORKER_DEAD_AFTER ago)
        self.next_process_beat = 0.0
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="durable-heartbeat", daemon=True)
        self.thread.start()

    def register(self, handle: Heartbeat) -> None:
        with self.cond:
            if not self.handles:
                self.next_process_beat = max(
                    self.next_process_beat, time.monotonic() + conf.worker_beat_seconds()
                )
            self.handles.add(handle)
            self.cond.notify()

    def unregister(self, handle: Heartbeat) -> None:
        with self.cond:
            self.handles.discard(handle)

    def _due(self) -> tuple[list[Heartbeat], bool, float]:
        now = time.monotonic()
        due = [h for h in self.handles if h.next_beat <= now]
        soonest = min((h.next_beat for h in self.handles), default=now + 60.0)
        process_due = bool(self.handles) and self.next_process_beat <= now
        if self.handles:
            soonest = min(soonest, self.next_process_beat)
        return due, process_due, max(0.0, soonest - now)

    def _loop(self) -> None:
        while True:
            with self.cond:
                due, process_due, wait = self._due()
                if not due and not process_due:
                    self.cond.wait(timeout=min(wait, 60.0))
                    continue
            try:
                if process_due:
                    self._beat_process()
                for handle in due:
                    self._beat(handle)
            finally:
                # no connection lingers between beats (a test database must be droppable);
                # the next beat opens a new one, so a terminated connection costs one beat
                connection.close()

    def _beat_process(self) -> None:
        interval = conf.worker_beat_seconds()
        try:
            beat_process(self.started_at)
        except Exception:  # noqa: BLE001 - tried again soon; the lease is the safety net
            logger.warning(
                "durable: liveness beat of process %s failed", process_key(), exc_info=True
            )
            self.next_process_beat = time.monotonic() + min(interval, 1.0)
            return
        self.next_process_beat = time.monotonic() + interval

    def _beat(self, handle: Heartbeat) -> None:
        from durable.models import Run

        interval = conf.heartbeat_seconds()
        try:
            updated = Run.objects.filter(pk=handle.run_id, lease_token=handle.token).update(
                lease_expires_at=clock.now() + timedelta(seconds=conf.lease_seconds())
            )
        except Exception:  # noqa: BLE001 - a failed beat is tried again soon
            logger.warning("durable: heartbeat of run %s failed", handle.run_id, exc_info=True)
            handle.next_beat = time.monotonic() + min(interval, 1.0)
            return
        handle.next_beat = time.monotonic() + interval
        if not updated:
            handle.lost = True
            self.unregister(handle)


def beat_process(started_at=None) -> None:
    """Upsert this process's :class:`~durable.models.WorkerProcess` row (one statement).

    The heartbeat thread calls it every ``conf.worker_beat_seconds()`` while the process
    holds leases; a worker calls it once when it starts (``durable/worker/tasks.py``), so that a
    process that dies right after its first claim is already known.
    """
    from durable.models import WorkerProcess

    key = process_key()
    host, _, pid = key.rpartition(":")
    now = clock.now()
    WorkerProcess.objects.bulk_create(
        [
            WorkerProcess(
                id=key, hostname=host[:200], pid=int(pid), started_at=started_at or now, beat_at=now
            )
        ],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["beat_at"],
    )


_lock = threading.Lock()
_instance: _Service | None = None


def _service() -> _Service:
    """The process's heartbeat thread (started anew in a forked child)."""
    global _instance
    with _lock:
        if _instance is None or _instance.pid != os.getpid() or not _instance.thread.is_alive():
            _instance = _Service()
        return _instance
