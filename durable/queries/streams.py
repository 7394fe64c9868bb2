"""Reading a run's live stream: what the SDK's ``durable.stream`` and the API's
server-sent events both read (docs/streaming.md#reading-a-stream).

Invariant: a reader that asks for the events after ``seq`` gets each event once, in
order, whatever it missed: the events are rows (``StreamEvent``), numbered per run, so a
reader that connects late gets the history and then the live part, and a reconnect
resumes where it stopped. A reader follows by polling the database every
``POLL_SECONDS``; it reads the run's status *before* its events, so when the status says
the run ended or parked, the events read after it are all there will be of this
execution (the worker writes a call's events before its checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from durable.exceptions import RunNotFound
from durable.models.runs import Run
from durable.models.streams import StreamEvent
from durable.vocabulary import RunStatus

#: seconds between two reads of a followed stream
POLL_SECONDS = 0.25
#: events read at once
PAGE = 500
#: the statuses in which a run may stream more; in any other (it ended, or it waits for
#: a person, a timer, a signal or a limit) a reader stops once it has read everything
FOLLOWED = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.RETRYING, RunStatus.COMPENSATING)


def event_out(event: StreamEvent) -> dict[str, Any]:
    """``{"seq", "step_id", "kind", "data", "created_at"}`` (``created_at`` ISO 8601)."""
    return {
        "seq": event.seq,
        "step_id": event.step_id,
        "kind": event.kind,
        "data": event.data,
        "created_at": event.created_at.isoformat(),
    }


def read(run_id: str, after: int = 0, limit: int = PAGE) -> tuple[str, list[dict[str, Any]]]:
    """The run's status, then its events with ``seq > after`` (at most ``limit``).

    Raises :class:`~durable.RunNotFound` for an unknown run."""
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    if status is None:
        raise RunNotFound(run_id)
    events = StreamEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit]
    return status, [event_out(e) for e in events]


def follow(
    run_id: str,
    after: int = 0,
    *,
    poll: float = POLL_SECONDS,
    timeout: float | None = None,
    sleep: Any = None,
    clock: Any = None,
) -> Iterator[dict[str, Any]]:
    """Yield the run's events after ``after``, then the new ones as they are written,
    until the run ends or parks and everything is read (see :func:`read`).

    ``timeout``: seconds to follow at most (``None``: until the run ends or parks); when
    they pass with the run still streaming, ``TimeoutError`` is raised (the events read
    until then were yielded: pass the last ``seq`` as ``after`` to go on)."""
    import time

    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    deadline = None if timeout is None else clock() + timeout
    while True:
        status, events = read(run_id, after)
        for event in events:
            after = event["seq"]
            yield event
        if len(events) == PAGE:
            continue
        if status not in FOLLOWED:
            return
        if deadline is not None and clock() >= deadline:
            raise TimeoutError(
                f"run {run_id} is still {status} after {timeout} s of its stream "
                f"(the last event read: seq {after}; pass after={after} to go on)"
            )
        sleep(poll)


def has_stream(run_id: str, status: str) -> bool:
    """Whether a reader of run ``run_id`` (in ``status``) may see anything: it streamed,
    or it may still stream (its status is one of ``FOLLOWED``)."""
    return status in FOLLOWED or StreamEvent.objects.filter(run_id=run_id).exists()
