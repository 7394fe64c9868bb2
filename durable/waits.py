"""Wait states (ARCHITECTURE.md point 3): rows that suspend a run until resolved."""

from __future__ import annotations

from django.db import transaction

from .models import Run, RunStatus, Wait, WaitKind, WaitStatus


def wake_due(now) -> list[str]:
    """Resolve timer waits that are due; return the ids of the runs to dispatch."""
    woken: list[str] = []
    due = list(Wait.objects.due(now).filter(kind=WaitKind.TIMER)
               .values_list("pk", "run_id")[:500])
    for wait_pk, run_id in due:
        with transaction.atomic():
            updated = Wait.objects.filter(pk=wait_pk, status=WaitStatus.PENDING).update(
                status=WaitStatus.RESOLVED, resolved_at=now, resolved_by="timer")
            if updated:
                Run.objects.filter(pk=run_id, status=RunStatus.WAITING).update(
                    status=RunStatus.PENDING, updated_at=now)
                woken.append(run_id)
    return woken
