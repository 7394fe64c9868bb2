"""A parent's end reaches its unfinished children, by each child's parent-close policy.

Invariant: in the transaction that ends a run (it succeeds, fails or is cancelled), each
of its unfinished children whose ``parent_close_policy`` is ``cancel`` or ``wait`` is
cancelled, and theirs by their own policies; an ``abandon`` child runs on. Temporal's
ParentClosePolicy, adapted: a run cannot terminate a child in the middle of a step, so
"terminate" is this engine's cancel (it stops at its next fence, no write starts after
it). Lock order: the parent (held by the caller) before its children. This module sits
below the services and the checkpoint (both call it): models and wait helpers only.
See docs/children.md#when-the-parent-ends.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from durable.models import transitions
from durable.models.events import TraceEvent
from durable.models.runs import Run
from durable.models.transitions import ACTIVE
from durable.vocabulary import (
    CANCELLED_ERROR_TYPE,
    TERMINAL,
    Classification,
    EventKind,
    ParentClosePolicy,
    RunStatus,
)
from durable.waits import child_ends, mailbox
from durable.waits.closing import cancel_pending_waits_txn


def cancel_txn(run: Run, *, actor: str, reason: str, now: datetime) -> None:
    """Cancel ``run`` (locked), close its pending waits, wake a parent waiting on it and
    apply the parent-close policy of its unfinished children, recursively."""
    previous = run.status
    # the lease stays with a worker that is executing, so its late result is fenced
    # in as "recorded, starts nothing"; an idle run has no lease to keep
    fields = transitions.apply(
        "cancel",
        run,
        finished_at=now,
        updated_at=now,
        wake_at=None,
        error={
            "type": CANCELLED_ERROR_TYPE,
            "classification": Classification.PERMANENT.value,
            "step_id": "",
            "message": f"cancelled by {actor}" + (f": {reason}" if reason else ""),
        },
        error_type=CANCELLED_ERROR_TYPE,
    )
    run.save(update_fields=list(fields))
    cancel_pending_waits_txn(run, by=actor, now=now, reason="run cancelled")
    TraceEvent.objects.create(
        run=run,
        kind=EventKind.CANCELLED,
        actor=actor,
        message=run.error["message"],
        data={"previous": previous},
    )
    mailbox.note_unconsumed_txn(run.id, RunStatus.CANCELLED, actor=actor)
    child_ends.child_ended_txn(run.parent_run_id, run.id, actor=actor)
    parent_closed_txn(run.id, RunStatus.CANCELLED, actor=actor, now=now)


def parent_closed_txn(parent_id: str, status: str, *, actor: str, now: datetime) -> list[str]:
    """Apply the parent-close policy of ``parent_id``'s unfinished children now that it
    ended with ``status`` (the caller holds the parent locked). Returns the ids of the
    children cancelled (not counting theirs)."""
    # lock order: the parent (held) before its children
    children = (
        Run.objects.select_for_update()
        .filter(parent_run_id=parent_id, status__in=ACTIVE)
        .exclude(parent_close_policy=ParentClosePolicy.ABANDON)
        .order_by("created_at", "id")
    )
    cancelled = []
    for child in children:
        cancel_txn(
            child,
            actor=actor,
            reason=f"its parent run {parent_id} "
            + ("was cancelled" if status == RunStatus.CANCELLED else str(status))
            + f" (parent close policy: {child.parent_close_policy})",
            now=now,
        )
        cancelled.append(child.id)
    return cancelled


def run_ended_txn(parent_id: str | None, cursor: Any, status: Any) -> None:
    """After a fenced write of an execution (``cursor``: its replay cursor) moved its run
    to ``status``: when that ends the run, wake a parent waiting on it and apply its
    children's parent-close policy (no query for a run that started no child)."""
    child_ends.child_ended_txn(parent_id, cursor.run_id, actor=cursor.worker_id)
    if status in TERMINAL and cursor.started_children:
        parent_closed_txn(cursor.run_id, status, actor=cursor.worker_id, now=timezone.now())


__all__ = ["cancel_txn", "parent_closed_txn", "run_ended_txn"]
