"""Parking an execution at a wait: a timer, a signal, an approval or a child's end
reached by the workflow raises :class:`~durable.exceptions.Suspend` after the wait row
is written (:func:`durable.waits.closing.close_wait_txn` closes it later), or returns
what an already closed wait answered. See "Waits" in ``docs/architecture.md``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from durable import clock
from durable.dispatch import dispatch_on_commit
from durable.exceptions import InvalidDuration, RunStopped, Suspend
from durable.hooks import wait_created
from durable.models import transitions
from durable.models.events import TraceEvent
from durable.models.runs import Run
from durable.models.waits import Wait
from durable.runtime.checkpoint import Checkpoints
from durable.runtime.failures import fail_call_now
from durable.runtime.replay import ReplayCursor, StepCall
from durable.types import Decision
from durable.values import codec
from durable.values.redaction import check_identifier
from durable.vocabulary import EventKind, RunStatus, StepKind, WaitKind, WaitStatus
from durable.waits import child_ends


class WaitParking:
    """The waits of an execution: a timer, a signal or a decision reached by the workflow;
    a part of the execution over its ``cursor``, parking through its ``checkpoints``."""

    def __init__(self, cursor: ReplayCursor, checkpoints: Checkpoints) -> None:
        self.cursor = cursor
        self.checkpoints = checkpoints

    def approval(
        self,
        base: str,
        key: str,
        title: str,
        spec: dict[str, Any],
        *,
        invalid: InvalidDuration | None = None,
        call: StepCall | None = None,
    ) -> Decision:
        """Wait for people's decision on ``spec`` (an approval wait); returns it.

        ``call``: the wait's position, when already taken (a parallel group takes its
        calls' positions first); otherwise the next one."""
        value = self.wait(
            base,
            kind=WaitKind.APPROVAL,
            key=key,
            wake_in=spec.get("timeout"),
            title=title,
            spec=spec,
            invalid=invalid,
            call=call,
        )
        return Decision.from_dict(value or {})

    def approvals(
        self, items: list[tuple[str, str, str, dict[str, Any], InvalidDuration | None]]
    ) -> list[Decision]:
        """Wait for the decisions on several approvals ``(base, key, title, spec,
        invalid)`` asked together; returns them in order.

        All positions are taken first; every approval without an answer or a wait row
        gets its pending wait (and so its inbox entry) in one fenced transaction, before
        the run parks on the first one still pending."""
        calls = [self.cursor.next_call(item[0], kind=StepKind.WAIT) for item in items]
        fresh = [
            (call, item)
            for call, item in zip(calls, items, strict=True)
            if not call.succeeded and item[4] is None
        ]
        if len(fresh) > 1:
            self._announce(fresh)
        return [
            self.approval(base, key, title, spec, invalid=invalid, call=call)
            for call, (base, key, title, spec, invalid) in zip(calls, items, strict=True)
        ]

    def _announce(
        self, fresh: list[tuple[StepCall, tuple[str, str, str, dict[str, Any], Any]]]
    ) -> None:
        """Create the approval waits of ``fresh`` that have no row yet, without parking."""
        run_id = self.cursor.run_id

        def work() -> None:
            now = clock.now()
            existing = set(
                Wait.objects.filter(
                    run_id=run_id, wait_id__in=[c.step_id for c, _ in fresh]
                ).values_list("wait_id", flat=True)
            )
            for call, (_, key, title, spec, _invalid) in fresh:
                if call.step_id in existing:
                    continue
                timeout = spec.get("timeout")
                w = Wait.objects.create(
                    run_id=run_id,
                    wait_id=call.step_id,
                    position=call.position,
                    kind=WaitKind.APPROVAL,
                    key=key,
                    title=(title or "")[:300],
                    wake_at=now + timedelta(seconds=timeout) if timeout is not None else None,
                    created_at=now,
                    payload=codec.dumps_checked(spec, what="wait options", step_id=call.step_id),
                )
                wait_created.send(sender=Wait, wait=w, spec=spec)

        self.checkpoints.write({}, work, record_if_stopped=False)

    def wait(
        self,
        base: str,
        *,
        kind: str,
        key: str = "",
        wake_in: float | None = None,
        wake_at: datetime | None = None,
        title: str = "",
        spec: dict[str, Any] | None = None,
        invalid: InvalidDuration | None = None,
        call: StepCall | None = None,
    ) -> Any:
        """Return the wait's answer: recorded (replay), already there, or after parking."""
        kinds: dict[str, StepKind] = {
            WaitKind.TIMER: StepKind.SLEEP,
            WaitKind.SIGNAL: StepKind.SIGNAL,
        }
        step_kind = kinds.get(kind, StepKind.WAIT)
        check_identifier(key, "wait key")  # an explicit step_id leaves it out of `base`
        if call is None:
            call = self.cursor.next_call(base, kind=step_kind)
        if call.succeeded:
            assert call.recorded is not None
            return self.cursor.replay(call.recorded)
        if invalid is not None:
            fail_call_now(self.checkpoints, call, invalid)
        sid = call.step_id
        while True:
            wait = Wait.objects.filter(run_id=self.cursor.run_id, wait_id=sid).first()
            now = clock.now()
            if wait is not None:
                due_timer = (
                    wait.kind == WaitKind.TIMER
                    and wait.status == WaitStatus.PENDING
                    and wait.wake_at is not None
                    and wait.wake_at <= now
                )
                if wait.status in (WaitStatus.RESOLVED, WaitStatus.EXPIRED) or due_timer:
                    return self._finish_wait(call, wait, due_timer)
                if wait.status == WaitStatus.CANCELLED:
                    self.cursor.stopped = RunStatus.CANCELLED
                    raise RunStopped(RunStatus.CANCELLED)
            elif wake_at is None and wake_in is not None:
                wake_at = now + timedelta(seconds=wake_in)
            if wait is None and kind == WaitKind.TIMER and wake_at is not None and wake_at <= now:
                wait = self._park(
                    call,
                    None,
                    kind=kind,
                    key=key,
                    wake_at=wake_at,
                    title=title,
                    spec=spec,
                    park=False,
                )
                return self._finish_wait(call, wait, True)
            consumed = self._park(
                call, wait, kind=kind, key=key, wake_at=wake_at, title=title, spec=spec
            )
            if consumed is _ANSWERED_MEANWHILE:
                continue
            return self._finish_wait(call, consumed, False)

    def _park(
        self,
        call: StepCall,
        wait: Wait | None,
        *,
        kind: str,
        key: str,
        wake_at: datetime | None,
        title: str,
        spec: dict[str, Any] | None,
        park: bool = True,
    ) -> Any:
        """Create the wait (or re-check it) and suspend the run, in one fenced transaction.

        Returns the wait when it is already answered (a buffered signal),
        ``_ANSWERED_MEANWHILE`` when it was answered meanwhile, or raises
        :class:`Suspend` after parking the run.
        """
        sid, pos = call.step_id, call.position
        state: dict[str, Any] = {}

        def work() -> None:
            now = clock.now()
            created = wait is None
            if created:
                w = Wait.objects.create(
                    run_id=self.cursor.run_id,
                    wait_id=sid,
                    position=pos,
                    kind=kind,
                    key=key,
                    title=(title or "")[:300],
                    wake_at=wake_at,
                    created_at=now,
                    payload=codec.dumps_checked(spec, what="wait options", step_id=sid)
                    if spec
                    else None,
                )
            else:
                assert wait is not None
                w = Wait.objects.select_for_update().get(pk=wait.pk)
                if w.status != WaitStatus.PENDING:
                    raise _Answered()
            if not park:
                state["wait"] = w
                return
            if kind == WaitKind.SIGNAL:
                from durable.models.waits import Signal

                sig = (
                    Signal.objects.filter(run_id=self.cursor.run_id, name=key, wait__isnull=True)
                    .order_by("id")
                    .first()
                )
                if sig is not None:
                    Signal.objects.filter(pk=sig.pk).update(wait=w, consumed_at=now)
                    w.status = WaitStatus.RESOLVED
                    w.result = sig.payload
                    w.resolved_at = now
                    w.resolved_by = sig.sent_by or "signal"
                    w.save(update_fields=["status", "result", "resolved_at", "resolved_by"])
                    state["wait"] = w
                    return
            if kind == WaitKind.CHILD:  # lock order: this run (fenced above), then the child
                child = child_ends.ended_child_txn(self.cursor.run_id, key)
                if child is not None:  # it ended before the wait was reached
                    child_ends.resolve_wait_txn(w, child, now=now)
                    state["wait"] = w
                    return
            if created:
                wait_created.send(sender=Wait, wait=w, spec=spec or {})
            transitions.update(
                "park", Run.objects.filter(pk=self.cursor.run_id), source=self.cursor.status
            )
            TraceEvent.objects.create(
                run_id=self.cursor.run_id,
                kind=EventKind.WAITING,
                step_id=sid,
                actor=self.cursor.worker_id,
                message=f"waiting for {WaitKind(kind).label.lower()}"
                + (f" {key!r}" if key else "")
                + (f" until {wake_at.isoformat()}" if wake_at else ""),
            )
            if wake_at is not None:
                dispatch_on_commit(
                    self.cursor.run_id, countdown=max(0.0, (wake_at - now).total_seconds())
                )
            state["parked"] = w

        self.cursor.let_bodies_end()  # parking gives the lease back
        try:
            self.checkpoints.write({}, work, record_if_stopped=False)
        except _Answered:
            return _ANSWERED_MEANWHILE
        if "wait" in state:
            return state["wait"]
        self.cursor.stopped = RunStatus.WAITING
        raise Suspend(f"waiting on {sid}")

    def _finish_wait(self, call: StepCall, wait: Wait, fire_timer: bool) -> Any:
        if fire_timer and wait.status == WaitStatus.PENDING:
            Wait.objects.filter(pk=wait.pk, status=WaitStatus.PENDING).update(
                status=WaitStatus.RESOLVED, resolved_at=timezone.now(), resolved_by="timer"
            )
        value = codec.decode(wait.result) if wait.result else None
        if wait.kind == WaitKind.CHILD:
            value = child_ends.with_output(value, parent_id=self.cursor.run_id)
        return self.checkpoints.record_success(
            call, attempt=call.next_attempt, value=value, started_at=wait.created_at, ledger=None
        )


class _Answered(Exception):
    """A wait was answered between reading it and parking the run (rolls back)."""


#: returned by ``WaitParking._park`` when the wait was answered meanwhile: read it again
_ANSWERED_MEANWHILE = object()
