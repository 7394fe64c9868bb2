"""State transitions of runs and operations: one function each, one transaction each.

The dashboard, the admin, the management commands and the tests all call these
(ARCHITECTURE.md, "Layers"). Each re-reads its rows with ``select_for_update()``, raises
:class:`~durable.IllegalTransition` when the source state is wrong, writes a TraceEvent
naming who and why, and dispatches the run on commit where it should continue.
"""

from __future__ import annotations

from typing import Any, Literal

from django.db import transaction
from django.utils import timezone

from . import codec
from .dispatch import dispatch_on_commit
from .exceptions import DurableError, IllegalTransition
from .models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
)

ReconcileOutcome = Literal["happened", "not_happened", "abort"]


class OperationNotFound(DurableError):
    def __init__(self, operation_id: Any):
        self.operation_id = operation_id
        super().__init__(f"operation {operation_id} does not exist")


def _actor(by: Any) -> str:
    if by is None or by == "":
        return "system"
    if hasattr(by, "get_username"):
        return by.get_username()
    return str(by)


def operation_reconcile(*, operation_id: int | str, outcome: ReconcileOutcome,
                        result: Any = None, external_id: str = "", by: Any = None,
                        reason: str = "") -> Operation:
    """An operator's decision on a write whose outcome is unknown.

    - ``"happened"``: the write took effect; ``result`` (JSON-able) becomes the step's
      result and ``external_id`` the external system's id. The run continues.
    - ``"not_happened"``: it did not; the run continues and calls the tool again with
      the same idempotency key.
    - ``"abort"``: the run fails; the operation stays ``unknown`` with the decision noted.

    ``operation_id`` is the Operation's primary key or its idempotency key. Raises
    :class:`OperationNotFound`, :class:`~durable.IllegalTransition` (the operation's
    outcome is not unknown, or its run is not waiting for this decision).
    """
    if outcome not in ("happened", "not_happened", "abort"):
        raise ValueError(f"outcome must be happened, not_happened or abort, got {outcome!r}")
    actor = _actor(by)
    now = timezone.now()
    with transaction.atomic():
        qs = Operation.objects.select_for_update()
        op = (qs.filter(pk=int(operation_id)).first() if str(operation_id).isdigit()
              else qs.filter(idempotency_key=str(operation_id)).first())
        if op is None:
            raise OperationNotFound(operation_id)
        if op.status != OperationStatus.UNKNOWN or op.resolution:
            raise IllegalTransition(
                f"operation {op.pk} ({op.idempotency_key}) is {op.status}"
                + (f", already decided: {op.resolution} by {op.resolved_by}" if op.resolution
                   else "") + "; only an unknown outcome can be reconciled",
                current=op.status)
        run = Run.objects.select_for_update().get(pk=op.run_id)
        wait = Wait.objects.select_for_update().filter(
            operation=op, kind=WaitKind.RECONCILE, status=WaitStatus.PENDING).first()
        if run.status != RunStatus.WAITING or wait is None:
            raise IllegalTransition(
                f"run {run.id} is {run.status}, not waiting for a decision on operation "
                f"{op.pk}", current=run.status)
        note = f"operator: {outcome.replace('_', ' ')}" + (f" ({reason})" if reason else "")
        fields: dict[str, Any] = {"resolved_by": actor, "resolution": note[:200],
                                  "updated_at": now}
        if outcome == "happened":
            fields.update(status=OperationStatus.SUCCEEDED,
                          result=codec.dumps_checked(result, what="operation result",
                                                     step_id=op.step_id),
                          external_id=str(external_id or "")[:400])
        elif outcome == "not_happened":
            fields.update(status=OperationStatus.FAILED)
        for name, value in fields.items():
            setattr(op, name, value)
        op.save(update_fields=list(fields))
        wait.status = WaitStatus.RESOLVED if outcome != "abort" else WaitStatus.CANCELLED
        wait.resolved_at = now
        wait.resolved_by = actor
        wait.result = codec.encode({"outcome": outcome, "reason": reason})
        wait.save(update_fields=["status", "resolved_at", "resolved_by", "result"])
        if outcome == "abort":
            run.status = RunStatus.FAILED
            run.finished_at = now
            run.error = {"type": "AbortedByOperator", "classification": "ambiguous",
                         "step_id": op.step_id,
                         "message": f"{actor} aborted the run at the unknown outcome of "
                                    f"{op.tool_name} ({op.idempotency_key})"
                                    + (f": {reason}" if reason else "")}
            run.error_type = "AbortedByOperator"
        else:
            run.status = RunStatus.PENDING
        run.updated_at = now
        run.save(update_fields=["status", "finished_at", "error", "error_type", "updated_at"])
        TraceEvent.objects.create(run=run, kind="operation_reconciled", step_id=op.step_id,
                                  actor=actor, message=note,
                                  data={"operation": op.pk, "outcome": outcome})
        if outcome != "abort":
            dispatch_on_commit(run.id)
    return op
