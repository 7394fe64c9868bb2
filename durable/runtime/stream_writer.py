"""Writing a run's live stream: a streamed call's events, batched, off the checkpoints.

Invariant: stream events are written in short transactions of their own, never inside a
checkpoint's (the stream is a view for readers; the step's record is the one result),
and a reply of a thousand tokens is a few dozen commits, not a thousand. A writer
buffers the events of one call and commits them at most every ``FLUSH_SECONDS`` or when
``MAX_PENDING`` are waiting, from a thread of its own, so a token that arrived before the
model paused is visible within ``FLUSH_SECONDS`` whatever the model does next; adjacent
text deltas are merged into one row. ``seq`` goes on from the run's last event: one
worker holds the run's lease, so one writer writes a run's stream at a time. See
docs/streaming.md.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, connection, connections, transaction
from django.db.models import Max
from django.utils import timezone

from durable.models.streams import StreamEvent
from durable.runtime.dbconn import RETRY_DELAYS, drop_connection, is_db_fault
from durable.values.redaction import redact_text
from durable.vocabulary import StreamKind

logger = logging.getLogger("durable.stream")

#: seconds between two commits of a call's events (at most)
FLUSH_SECONDS = 0.05
#: events waiting that make a commit at once
MAX_PENDING = 64
#: kinds whose adjacent events are merged (their ``delta`` texts joined)
MERGED = (StreamKind.TOKEN, StreamKind.REFUSAL, StreamKind.TOOL_CALL_DELTA)

INTERRUPTED_MESSAGE = {
    "worker_lost": "the worker was lost; the call is asked again",
    "failed": "the previous try failed; the call is asked again",
}


class StreamWriter:
    """The events of one streamed call of run ``run_id`` (step ``step_id``).

    :meth:`emit` never touches the database in the worker (a thread commits) and may be
    called from any thread; inside a transaction (a test's), there is no thread and
    :meth:`emit` commits when due on the thread that made the writer (the transaction's),
    else :meth:`close` does.
    :meth:`close` commits what is left. A database fault while writing is tried again
    on a new connection (``RETRY_DELAYS``, about 4 s), the events kept in order; a
    longer one, or any other failure, is logged and the stream goes on without the lost
    events. Neither stops the execution: the step's reply is recorded by its checkpoint,
    which rides a short fault out itself. ``live()`` false (the lease is lost): nothing
    more is written.
    """

    def __init__(
        self,
        run_id: str,
        step_id: str,
        *,
        live: Callable[[], bool] = lambda: True,
        flush_seconds: float = FLUSH_SECONDS,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.run_id = run_id
        self.step_id = step_id
        self.live = live
        self.flush_seconds = flush_seconds
        self.max_pending = max_pending
        self.pending: list[StreamEvent] = []
        self.next_seq: int | None = None
        self.last_flush = 0.0
        self.error: BaseException | None = None
        #: database faults in a row while writing, and when the next try is due
        #: (``time.monotonic()``; :meth:`_again`)
        self.faults = 0
        self.retry_at = 0.0
        #: events at the head of ``pending`` whose write faulted: its commit may have
        #: happened all the same (its answer lost), so they are not merged into and a
        #: try again first looks for them (:meth:`_skip_written`)
        self.unsure = 0
        self.closing = False
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.owner = threading.get_ident()
        if not connection.in_atomic_block:
            context = contextvars.copy_context()  # the secrets in scope, for redaction
            self.thread = threading.Thread(
                target=context.run, args=(self._loop,), name="durable-stream", daemon=True
            )
            self.thread.start()

    # ------------------------------------------------------------------ the caller's

    def interrupted_before(self) -> None:
        """Say so first when this step already streamed something (a lost worker, a
        failed try): what follows is the call asked again, not a continuation."""
        last = (
            StreamEvent.objects.filter(run_id=self.run_id, step_id=self.step_id)
            .order_by("-seq")
            .values("kind", "data")
            .first()
        )
        if last is None:
            return
        data = last["data"] or {}
        reason = (
            "failed"
            if last["kind"] == StreamKind.STEP_ENDED and "error" in data
            else ("worker_lost")
        )
        self.emit(
            StreamKind.INTERRUPTED, {"reason": reason, "message": INTERRUPTED_MESSAGE[reason]}
        )

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Queue one event (``kind`` a :class:`~durable.vocabulary.StreamKind`)."""
        now = timezone.now()
        with self.cond:
            last = self.pending[-1] if self.pending else None
            if (
                last is not None
                and len(self.pending) > self.unsure
                and kind in MERGED
                and last.kind == kind
                and last.data.get("index") == data.get("index")
            ):
                last.data = {**last.data, "delta": last.data["delta"] + data["delta"]}
                return
            self.pending.append(
                StreamEvent(
                    run_id=self.run_id,
                    step_id=self.step_id,
                    kind=str(kind),
                    data=dict(data),
                    created_at=now,
                )
            )
            if self.thread is not None:
                if len(self.pending) >= self.max_pending:
                    self.cond.notify()
                elif len(self.pending) == 1:
                    self.cond.notify()  # the flusher waits for a first event
                return
        if threading.get_ident() != self.owner:
            return  # another thread (an agent's event loop): the owner's close commits
        if (
            len(self.pending) >= self.max_pending
            or time.monotonic() - self.last_flush >= self.flush_seconds
        ):
            self._flush()

    def close(self) -> None:
        """Commit what is left. Never raises: a stream that could not be written is
        logged, and the step's checkpoint records the call's reply all the same."""
        if self.thread is not None:
            with self.cond:
                self.closing = True
                self.cond.notify()
            self.thread.join()
        else:
            self._flush()

    # ------------------------------------------------------------------ the writes

    def _loop(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.pending and not self.closing:
                        self.cond.wait()
                    if not self.pending:
                        return
                    # a fault's backoff holds however many events wait, and at the
                    # close too (:meth:`_again`)
                    due = max(self.last_flush + self.flush_seconds, self.retry_at)
                    while time.monotonic() < due and (
                        self.backing_off()
                        or (not self.closing and len(self.pending) < self.max_pending)
                    ):
                        self.cond.wait(due - time.monotonic())
                self._flush()
        finally:
            connections.close_all()  # this thread's own connection

    def _flush(self) -> None:
        with self.cond:
            batch, self.pending = self.pending, []
        self.last_flush = time.monotonic()
        if not batch or self.error is not None or not self.live():
            return
        for event in batch:  # as free text is everywhere (docs/security.md); a batch
            if "delta" in event.data:  # tried again is redacted again, to the same text
                event.data["delta"] = redact_text(event.data["delta"])
        try:
            self._write(batch)
            self.faults = self.unsure = 0
        except IntegrityError:
            # another writer took these numbers (a worker that lost its lease and does
            # not know it yet): go on after the last one
            self.next_seq = None
            try:
                self._write(batch)
            except Exception as exc:  # noqa: BLE001 - the stream is a view: logged
                self._failed(exc)
        except Exception as exc:  # noqa: BLE001 - the stream is a view: logged
            if is_db_fault(exc) and self.faults < len(RETRY_DELAYS):
                self._again(batch, exc)
            else:
                self._failed(exc)

    def _again(self, batch: list[StreamEvent], exc: BaseException) -> None:
        """A database fault (a restart, a failover): the events wait for the next flush,
        on a new connection, after the next of ``RETRY_DELAYS`` -- at close, at once
        after it. The step's reply is the call's one result, so a fault here never stops
        the execution (its checkpoint rides the fault out, or releases the run)."""
        delay = RETRY_DELAYS[self.faults]
        self.faults += 1
        logger.warning(
            "durable: the stream of run %s (step %s) could not be written (%s: %s); "
            "trying again in %.2f s on a new connection",
            self.run_id,
            self.step_id,
            type(exc).__name__,
            str(exc).strip()[:200],
            delay,
        )
        drop_connection()
        for event in batch:
            event.pk = None  # not written: the rolled-back insert's ids name nothing
        with self.cond:
            self.pending[:0] = batch
            self.unsure = len(batch)
        if self.closing or self.thread is None:
            time.sleep(delay)
            self._flush()
        else:
            self.retry_at = time.monotonic() + delay

    def backing_off(self) -> bool:
        return time.monotonic() < self.retry_at

    def _write(self, batch: list[StreamEvent]) -> None:
        with transaction.atomic():
            if self.next_seq is None:
                top = StreamEvent.objects.filter(run_id=self.run_id).aggregate(m=Max("seq"))["m"]
                self.next_seq = (top or 0) + 1
            if self.unsure:
                self._skip_written(batch)
            for offset, event in enumerate(batch):
                event.seq = self.next_seq + offset
            if batch:
                StreamEvent.objects.bulk_create(batch)
        self.next_seq += len(batch)

    def _skip_written(self, batch: list[StreamEvent]) -> None:
        """The faulted write of the first ``unsure`` events committed (a fault in the
        commit's answer): they are not written twice, the rest go on after them."""
        assert self.next_seq is not None  # set by _write before
        first = batch[0]
        if StreamEvent.objects.filter(
            run_id=self.run_id,
            seq=self.next_seq,
            step_id=first.step_id,
            kind=first.kind,
            created_at=first.created_at,
        ).exists():
            self.next_seq += self.unsure
            del batch[: self.unsure]
            self.unsure = 0

    def _failed(self, exc: BaseException) -> None:
        self.error = exc
        logger.warning(
            "durable: the stream of run %s (step %s) could not be written; its later "
            "events are dropped",
            self.run_id,
            self.step_id,
            exc_info=True,
        )
