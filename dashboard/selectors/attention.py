"""The "needs attention" page: writes with an unknown outcome and failed runs.

Both lists are bounded (:data:`ATTENTION_LIMIT`); the runs list's "needs attention"
filter shows every such run.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef

from durable.models import Operation, Run, RunStatus, Wait, WaitKind, WaitStatus

from .payloads import Payload, payload

ATTENTION_LIMIT = 200
#: failed runs listed on the "needs attention" page (the newest; the runs list has all)
FAILED_SHOWN = 50


def unknown_operations(limit: int = ATTENTION_LIMIT) -> list[Operation]:
    """Writes with an unknown outcome that nobody decided, oldest first; each with
    ``awaiting`` (its run waits for the decision)."""
    awaiting = Exists(
        Wait.objects.filter(
            operation=OuterRef("pk"), kind=WaitKind.RECONCILE, status=WaitStatus.PENDING
        )
    )
    return list(
        Operation.objects.needs_attention()
        .filter(resolution="")
        .select_related("run")
        .annotate(awaiting=awaiting)
        .order_by("updated_at", "id")[:limit]
    )


def failed_runs(limit: int = ATTENTION_LIMIT) -> list[Run]:
    """Failed runs (and failed compensations) waiting for someone to resume or
    compensate them, newest first."""
    return list(
        Run.objects.filter(status__in=(RunStatus.FAILED, RunStatus.COMPENSATION_FAILED))
        .select_related("started_by")
        .order_by("-finished_at", "-id")[:limit]
    )


def operation_payloads(operations: list[Operation]) -> dict[int, Payload]:
    return {op.pk: payload(op.params) for op in operations}
