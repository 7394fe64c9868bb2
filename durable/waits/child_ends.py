"""A child run's end reaches its parent in the transaction that ends the child.

Invariant: a parent waiting on a child (a pending ``child`` wait keyed on the child's run
id) is woken by the same commit that makes the child terminal -- completed, failed,
cancelled or compensated -- and dispatched on that commit; a parent that reaches the
wait after the child ended finds it ended while it parks (the park locks the child row).
Lock order: the parent run before its child, in every path (a child's end, a cascading
cancel, a parent parking), so the two can never deadlock. This module sits below
``checkpoint.py`` (which calls it at a run's end): it imports models and helpers only.
See docs/children.md.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from durable.dispatch import dispatch_on_commit
from durable.exceptions import ChildRunMissing
from durable.hooks import wait_closed
from durable.models import transitions
from durable.models.events import TraceEvent
from durable.models.runs import Run, run_lineage
from durable.models.waits import Wait
from durable.values import codec
from durable.vocabulary import TERMINAL, EventKind, RunStatus, WaitKind, WaitStatus


def lock_parent_txn(run: Run, status: Any) -> str | None:
    """Before a fenced write moves ``run`` to ``status``: when that ends a child run,
    lock its parent first (lock order: the parent before its child) and return the
    parent's id; else None (no query)."""
    if not run.parent_run_id or status not in TERMINAL:
        return None
    Run.objects.select_for_update().filter(pk=run.parent_run_id).first()
    return str(run.parent_run_id)


def outcome(run: Run) -> dict[str, Any]:
    """What the parent's wait records of an ended child: ``{"run_id", "status",
    "error"}`` (the output is read from the child when the wait's step is recorded)."""
    return {"run_id": run.id, "status": run.status, "error": run.error or None}


def child_ended_txn(parent_id: str | None, child_id: str, *, actor: str = "") -> bool:
    """Resolve the pending waits on ``child_id`` and wake the runs that wait: its parent
    (which the caller holds locked, before the child) and, rarely, a fork of the parent
    that reused the start (a deadlock with that fork is retried as a database fault).
    Returns whether a wait closed."""
    if not parent_id:
        return False
    pending = list(
        Wait.objects.select_for_update()
        .filter(kind=WaitKind.CHILD, key=child_id, status=WaitStatus.PENDING)
        .order_by("run_id", "position")
    )
    if not pending:
        return False
    child = Run.objects.get(pk=child_id)
    now = timezone.now()
    for wait in pending:
        resolve_wait_txn(wait, child, now=now)
    for run_id in sorted({w.run_id for w in pending}):
        woken = transitions.update("wake", Run.objects.filter(pk=run_id), updated_at=now)
        TraceEvent.objects.create(
            run_id=run_id,
            kind=EventKind.WAIT_RESOLVED,
            step_id=next(w.wait_id for w in pending if w.run_id == run_id),
            actor=actor,
            message=f"child run {child_id} {child.status}",
            data={"child": child_id, "status": child.status},
        )
        if woken:
            dispatch_on_commit(run_id)
    return True


def resolve_wait_txn(wait: Wait, child: Run, *, now: Any = None) -> None:
    """Record ``child``'s end on the parent's ``wait`` (no wake: the caller decides)."""
    wait.status = WaitStatus.RESOLVED
    wait.result = codec.dumps_checked(outcome(child), what="wait result", step_id=wait.wait_id)
    wait.resolved_at = now or timezone.now()
    wait.resolved_by = f"child {child.id}"[:200]
    wait.save(update_fields=["status", "result", "resolved_at", "resolved_by"])
    wait_closed.send(sender=Wait, wait=wait, reason=f"child run {child.status}")


def ended_child_txn(parent_id: str, child_id: str) -> Run | None:
    """The child, locked, if it has ended (a parent about to park on it); None while it
    runs. Raises ``ValueError`` when ``child_id`` is not a child of ``parent_id`` (or of a
    run it was forked from), :class:`~durable.exceptions.ChildRunMissing` when this run
    started it but its row is gone."""
    child = Run.objects.select_for_update().filter(pk=child_id).first()
    if child is None and _started_by(parent_id, child_id):
        raise ChildRunMissing(run_id=child_id, parent_id=parent_id)
    # a fork reuses its source's recorded start: the child of a run it was forked from
    if child is None or child.parent_run_id not in run_lineage(parent_id):
        raise ValueError(
            f"ctx.wait_child: run {child_id} is not a child of run {parent_id}; wait on a "
            "handle that ctx.start_child returned in this run"
        )
    return child if child.status in TERMINAL else None


def _started_by(parent_id: str, child_id: str) -> bool:
    """Whether ``parent_id`` (or a run it was forked from) recorded the start of ``child_id``:
    a child run's id is its parent's id, a ``.`` and a suffix."""
    return any(child_id.startswith(f"{run_id}.") for run_id in run_lineage(parent_id))


def with_output(value: Any, *, parent_id: str = "") -> Any:
    """The recorded answer of a child wait: its outcome plus, for a succeeded child, the
    child's output (read now, so the parent's history holds it). Raises
    :class:`~durable.exceptions.ChildRunMissing` when the child's row is gone: a parent
    never receives ``None`` for a child that vanished."""
    if isinstance(value, dict) and value.get("status") == RunStatus.SUCCEEDED:
        row = Run.objects.filter(pk=value.get("run_id")).values("output").first()
        if row is None:
            raise ChildRunMissing(run_id=str(value.get("run_id")), parent_id=parent_id)
        return {**value, "output": codec.decode(row["output"]) if row["output"] else None}
    return value


__all__ = ["child_ended_txn", "ended_child_txn", "lock_parent_txn", "outcome", "with_output"]
