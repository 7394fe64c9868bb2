"""A run's deadline holds in every state, not only at its next step.

Invariant: a run past its ``deadline_at`` does not stay pending, retrying or waiting
(on a signal, an approval, a timer, a child, or parked on a rate or concurrency limit):
the sweeper fails it with the deadline's ``BudgetExceeded`` error, cancels its pending
waits (none is left pending), wakes a parent waiting on it and applies its children's
parent-close policy, in one transaction per run. A running run is failed by its own
worker at its next step (``ReplayCursor.check_budgets``), since only the lease holder
may end an execution mid-step. Lock order: the parent, then the run, then its waits (as
the engine and the services). See docs/architecture.md#budgets-and-deadlines.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from durable.exceptions import BudgetExceeded
from durable.models import transitions
from durable.models.events import TraceEvent
from durable.models.runs import Run
from durable.retry import explain
from durable.vocabulary import Classification, EventKind, RunStatus
from durable.waits import child_ends, mailbox, parent_close
from durable.waits.closing import cancel_pending_waits_txn

#: the statuses the sweeper ends at the deadline (the "exceed_deadline" transition)
IDLE = (RunStatus.PENDING, RunStatus.RETRYING, RunStatus.WAITING)
#: runs ended per sweep
BATCH = 200
ACTOR = "sweeper"


def expire_deadlines(now: datetime) -> list[str]:
    """Fail the idle runs whose deadline has passed; returns their ids (at most
    :data:`BATCH` a sweep; the next sweep takes the rest)."""
    overdue = list(
        Run.objects.filter(status__in=IDLE, deadline_at__lt=now)
        .order_by()
        .values_list("pk", "parent_run_id")[:BATCH]
    )
    ended = []
    for run_id, parent_id in overdue:
        with transaction.atomic():
            if parent_id:  # lock order: the parent before its child
                Run.objects.select_for_update().filter(pk=parent_id).first()
            run = (
                Run.objects.select_for_update()
                .filter(pk=run_id, status__in=IDLE, deadline_at__lt=now)
                .first()
            )
            if run is not None:  # else it was claimed, resumed or ended meanwhile
                exceed_deadline_txn(run, now=now)
                ended.append(run_id)
    return ended


def exceed_deadline_txn(run: Run, *, now: datetime) -> None:
    """Fail ``run`` (locked, idle, past its deadline) with the deadline's error."""
    assert run.deadline_at is not None
    previous = run.status
    exc = BudgetExceeded(run_id=run.pk, budget="deadline", limit=run.deadline_at.isoformat())
    message = f"{exc} while it was {previous}"
    reason = explain(exc).rule  # as the worker's own budget failure says it (S35)
    fields = transitions.apply(
        "exceed_deadline",
        run,
        finished_at=now,
        updated_at=now,
        wake_at=None,
        error={
            "type": type(exc).__name__,
            "classification": Classification.PERMANENT.value,
            "step_id": "",
            "message": message,
            "reason": reason,
        },
        error_type=type(exc).__name__,
    )
    run.save(update_fields=list(fields))
    # the run is failed first: closing a wait then wakes nothing
    cancel_pending_waits_txn(run, by=ACTOR, now=now, reason="the run's deadline passed")
    TraceEvent.objects.create(
        run=run,
        kind=EventKind.BUDGET_EXCEEDED,
        actor=ACTOR,
        message=f"{reason}: {message}",
        data={"budget": "deadline", "previous": previous},
    )
    mailbox.note_unconsumed_txn(run.pk, RunStatus.FAILED, actor=ACTOR)
    child_ends.child_ended_txn(run.parent_run_id, run.pk, actor=ACTOR)
    parent_close.parent_closed_txn(run.pk, RunStatus.FAILED, actor=ACTOR, now=now)


__all__ = ["IDLE", "exceed_deadline_txn", "expire_deadlines"]
