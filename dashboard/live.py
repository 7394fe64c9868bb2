"""Live updates: follow the append-only TraceEvent table and tell open pages to refresh.

The trace-event table is the change feed (docs/architecture.md#live-updates): every state
change writes an event in the same transaction. One :class:`Follower` task per ASGI
process polls ``TraceEvent.id > cursor`` every :data:`POLL_SECONDS` while at least one
websocket is open, and sends a ``refresh`` hint through the channel layer:

- to the group of every page that lists runs, with the ids of the runs that changed;
- to the group of each changed run's page.

A hint only says "look at the database now": the page re-fetches its fragment with
HTMX, so a lost or duplicated hint delays a refresh and never shows wrong data.

**Groups are per process.** Each process follows the table itself and notifies the
sockets it serves, so its groups carry a process-unique prefix. With a Redis channel
layer and N daphne processes this keeps one message per event and socket instead of N
(every process would otherwise broadcast each event to everyone). It works the same with
the default ``InMemoryChannelLayer``, where groups are per process anyway.

**Ids that commit out of order.** On PostgreSQL an event with a smaller id may commit
after a larger one was read. A missing id below the newest one seen is kept as a *gap*
for :data:`GAP_GRACE_SECONDS`; the cursor stays below it, so the event is picked up when
it commits (ids of rolled-back transactions simply expire).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

logger = logging.getLogger("dashboard.live")

POLL_SECONDS = 0.5
GAP_GRACE_SECONDS = 2.0
#: events read per poll
BATCH = 1000
#: a jump of ids larger than this is not tracked as gaps (e.g. a sequence restarted)
MAX_GAP_SPAN = 5000

PREFIX = f"dash-{uuid.uuid4().hex[:12]}"


def runs_group() -> str:
    """The group of pages that list runs (the runs list, the inbox, needs attention)."""
    return f"{PREFIX}.runs"


def run_group(run_id: str) -> str:
    """The group of one run's page (a digest: group names are short ASCII)."""
    digest = hashlib.sha256(str(run_id).encode()).hexdigest()[:32]
    return f"{PREFIX}.run.{digest}"


def _max_event_id() -> int:
    from durable.models import TraceEvent

    return TraceEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _events_after(cursor: int) -> list[tuple[int, str]]:
    from durable.models import TraceEvent

    return list(
        TraceEvent.objects.filter(id__gt=cursor).order_by("id").values_list("id", "run_id")[:BATCH]
    )


class Follower:
    """One polling task per process (and event loop), alive while sockets listen."""

    def __init__(self, poll_seconds: float = POLL_SECONDS) -> None:
        self.poll_seconds = poll_seconds
        self.cursor = 0
        self.seen: set[int] = set()
        self.gaps: dict[int, float] = {}
        self.subscribers = 0
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def subscribe(self) -> None:
        """A socket opened: start following (from the newest event) if not yet."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): forget the old one's state
            self._loop, self._task, self.subscribers = loop, None, 0
        self.subscribers += 1
        if self.running:
            return
        cursor = await database_sync_to_async(_max_event_id)()
        if self.running:  # another socket started it while we read
            return
        self.cursor, self.seen, self.gaps = cursor, set(), {}
        self._task = loop.create_task(self._run(), name="dashboard-live-follower")

    async def unsubscribe(self) -> None:
        """A socket closed: stop following when it was the last one."""
        if self._loop is not asyncio.get_running_loop():
            return
        self.subscribers = max(0, self.subscribers - 1)
        if self.subscribers == 0 and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        layer = get_channel_layer()
        while True:
            await asyncio.sleep(self.poll_seconds)
            try:
                await self.poll(layer)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("dashboard: could not follow trace events", exc_info=True)

    async def poll(self, layer: Any) -> list[str]:
        """Read new events once and send the hints; returns the changed run ids."""
        rows = await database_sync_to_async(_events_after)(self.cursor)
        changed: dict[str, None] = {}
        for event_id, run_id in rows:
            if event_id not in self.seen:
                self.seen.add(event_id)
                changed[run_id] = None
        self._advance([event_id for event_id, _ in rows])
        if changed and layer is not None:
            run_ids = list(changed)
            newest = max(event_id for event_id, _ in rows)
            await layer.group_send(
                runs_group(), {"type": "runs.changed", "runs": run_ids[:200], "last": newest}
            )
            for run_id in run_ids:
                await layer.group_send(
                    run_group(run_id), {"type": "run.changed", "run": run_id, "last": newest}
                )
        return list(changed)

    def _advance(self, ids: list[int]) -> None:
        """Move the cursor past every id read, but not past a gap younger than the grace."""
        now = time.monotonic()
        present = set(ids)
        top = max(ids, default=self.cursor)
        if top - self.cursor > MAX_GAP_SPAN:
            self.gaps.clear()
        else:
            for missing in range(self.cursor + 1, top):
                if missing not in present:
                    self.gaps.setdefault(missing, now)
        self.gaps = {
            i: t for i, t in self.gaps.items() if i not in present and now - t < GAP_GRACE_SECONDS
        }
        self.cursor = min(self.gaps) - 1 if self.gaps else max(self.cursor, top)
        self.seen = {i for i in self.seen if i > self.cursor}


follower = Follower()
