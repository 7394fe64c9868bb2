"""Wait states (see "Waits" in docs/architecture.md): rows that suspend a run until resolved.

Approval waits, durable timers, signal waits and operator decisions are rows of
:class:`~durable.models.Wait`. A run that reaches a pending wait becomes WAITING and
frees its worker (:class:`WaitParking`, in the same fenced transaction that creates the
wait); closing the wait (a decision, a due timer, a signal, an expiry) makes the run
PENDING and dispatches it, and its replay picks the answer up. Suspend, wake and expire
live here together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from durable.dispatch import dispatch_on_commit
from durable.hooks import wait_closed
from durable.models import transitions
from durable.models.events import TraceEvent
from durable.models.runs import Run
from durable.models.waits import Wait
from durable.values import codec
from durable.vocabulary import EventKind, WaitKind, WaitStatus

logger = logging.getLogger("durable.waits")

#: kind -> fn(wait, now) that handles an expired wait inside the sweeper's transaction
#: and returns True when it closed the wait (False: it extended it, e.g. escalation)
_expiry_handlers: dict[str, Callable[[Wait, datetime], bool]] = {}


def register_expiry_handler(kind: str, handler: Callable[[Wait, datetime], bool]) -> None:
    """Let an upper layer (approvals) decide what an expired wait of ``kind`` means."""
    _expiry_handlers[kind] = handler


def close_wait_txn(
    wait: Wait,
    *,
    status: str,
    result: Any = None,
    by: str = "",
    now: datetime | None = None,
    reason: str = "",
) -> None:
    """Close a pending wait and wake its run. Call inside a transaction holding the row.

    ``status``: resolved, expired or cancelled; ``result``: the value the workflow
    receives (stored with the codec). A WAITING run becomes PENDING and is dispatched
    on commit (not for ``cancelled``, which the cancel service handles).
    """
    now = now or timezone.now()
    wait.status = status
    wait.result = codec.dumps_checked(result, what="wait result", step_id=wait.wait_id)
    wait.resolved_at = now
    wait.resolved_by = (by or "")[:200]
    wait.save(update_fields=["status", "result", "resolved_at", "resolved_by"])
    wait_closed.send(sender=Wait, wait=wait, reason=reason or status)
    if status != WaitStatus.CANCELLED:
        woken = transitions.update("wake", Run.objects.filter(pk=wait.run_id), updated_at=now)
        TraceEvent.objects.create(
            run_id=wait.run_id,
            kind=EventKind(f"wait_{status}"),
            step_id=wait.wait_id,
            actor=by or "",
            message=reason or f"{wait.kind} wait {status}",
        )
        if woken:
            dispatch_on_commit(wait.run_id)


def cancel_pending_waits_txn(run: Run, *, by: str, now: datetime, reason: str) -> None:
    """Close every pending wait of ``run`` as cancelled (``reason``, by ``by``), in the
    caller's transaction, once the run has ended: closing one then wakes nothing. Locks
    the waits after the run, as the lock order says."""
    for wait in Wait.objects.select_for_update().filter(run=run, status=WaitStatus.PENDING):
        close_wait_txn(
            wait, status=WaitStatus.CANCELLED, result=None, by=by, now=now, reason=reason
        )


def _expire_one(wait: Wait, now: datetime) -> bool:
    if wait.kind in (WaitKind.TIMER, WaitKind.LIMIT):
        by = "timer" if wait.kind == WaitKind.TIMER else "limit"
        reason = "timer fired" if wait.kind == WaitKind.TIMER else f"{wait.key}: try again"
        close_wait_txn(wait, status=WaitStatus.RESOLVED, result=None, by=by, now=now, reason=reason)
        return True
    if wait.kind == WaitKind.SIGNAL:
        spec = codec.decode(wait.payload) if wait.payload else {}
        close_wait_txn(
            wait,
            status=WaitStatus.EXPIRED,
            result=(spec or {}).get("default"),
            by="timeout",
            now=now,
            reason=f"no signal {wait.key!r} before the timeout",
        )
        return True
    handler = _expiry_handlers.get(wait.kind)
    if handler is not None:
        return handler(wait, now)
    close_wait_txn(
        wait,
        status=WaitStatus.EXPIRED,
        result={
            "approved": False,
            "expired": True,
            "decided_by": ["timeout"],
            "decided_at": now.isoformat(),
            "comment": "expired",
        },
        by="timeout",
        now=now,
        reason="expired",
    )
    return True


def _wake(qs, now: datetime) -> list[str]:
    woken: list[str] = []
    for wait_pk, run_id in list(qs.values_list("pk", "run_id")[:500]):
        with transaction.atomic():
            # lock order: the run first, then its wait (as run_cancel, run_signal and
            # approval_decide do), so expiring a wait cannot deadlock against them
            Run.objects.select_for_update().filter(pk=run_id).first()
            wait = (
                Wait.objects.select_for_update()
                .filter(pk=wait_pk, status=WaitStatus.PENDING, wake_at__lte=now)
                .first()
            )
            if wait is None:
                continue
            try:
                with transaction.atomic():  # a savepoint: a failure undoes only this wait
                    closed = _expire_one(wait, now)
            except Exception:  # noqa: BLE001 - one bad wait must not stop the sweep
                logger.exception("durable: could not expire wait %s of run %s", wait_pk, run_id)
                continue
            if closed:
                woken.append(run_id)
    return woken


def wake_due(now: datetime | None = None) -> list[str]:
    """Fire due timers and expire timed-out waits; return the ids of the woken runs."""
    now = now or timezone.now()
    return _wake(Wait.objects.due(now).order_by("wake_at"), now)


def wake_due_for_run(run_id: str, now: datetime | None = None) -> bool:
    """Fire the run's due waits (a timer's own countdown message); True if any closed."""
    now = now or timezone.now()
    return bool(_wake(Wait.objects.due(now).filter(run_id=run_id), now))
