"""Compensation (docs/compensation.md): undo a failed or cancelled run's completed writes.

The declared ``compensate`` hooks of the writes the run owns run newest first, each as a
durable step of the run (``compensate:<step_id>``, with its own idempotency key
``"{run_id}:compensate:<step_id>"``), so a crash in the middle resumes without undoing
anything twice. The run ends COMPENSATED, or COMPENSATION_FAILED with the failing step
visible; compensating again retries from there.

Every write is covered (docs/compensation.md). Before anything is undone, each write the
run owns whose outcome is not known (``started`` by a worker that is gone, or
``unknown``) is settled: the tool's ``reconcile`` hook is asked, else an operator
decides while the run waits in COMPENSATING (no lease, a pending reconcile wait). So a
run never ends COMPENSATED while one of its operations is ``started`` or ``unknown``.
A write a fork adopted is the fork's to undo: it is listed under ``owned_by``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from durable.exceptions import Suspend, ToolNotFound
from durable.models import transitions
from durable.models.operations import Operation
from durable.models.runs import run_lineage
from durable.models.steps import Step
from durable.models.waits import Wait
from durable.retry import AMBIGUOUS, DEFAULT_POLICY
from durable.types import NOT_FOUND
from durable.values import codec
from durable.values.redaction import redact_text
from durable.vocabulary import EventKind, OperationStatus, RunStatus, StepKind, WaitKind, WaitStatus

if TYPE_CHECKING:
    from durable.runtime.execution import Execution

logger = logging.getLogger("durable.engine")

#: operations whose outcome is not known yet
UNSETTLED = (OperationStatus.STARTED, OperationStatus.UNKNOWN)


def compensations(run_id: str) -> list[Operation]:
    """The completed writes the run owns, newest first (the order they are undone in)."""
    return list(
        Operation.objects.owned_by(run_id)
        .filter(status=OperationStatus.SUCCEEDED)
        .exclude(step_id__startswith="compensate:")
        .order_by("-created_at", "-id")
    )


def unsettled(run_id: str) -> list[Operation]:
    """The writes the run owns whose outcome is not known, newest first."""
    return list(
        Operation.objects.owned_by(run_id)
        .filter(status__in=UNSETTLED)
        .exclude(step_id__startswith="compensate:")
        .order_by("-created_at", "-id")
    )


def owned_elsewhere(run_id: str) -> list[dict[str, str]]:
    """Writes of the run's steps that another run answers for, newest first:
    ``[{"step_id", "owner"}]`` -- its own writes a fork adopted, and (for a fork) the
    reused writes it did not adopt. Compensating the run leaves them."""
    step_ids = (
        Step.objects.filter(run_id=run_id)
        .exclude(kind=StepKind.COMPENSATION)
        .values_list("step_id", flat=True)
    )
    lineage = run_lineage(run_id)
    nearest: dict[str, Operation] = {}  # per step, the write of the nearest run in the lineage
    for op in Operation.objects.filter(run_id__in=lineage, step_id__in=step_ids):
        known = nearest.get(op.step_id)
        if known is None or lineage.index(op.run_id) < lineage.index(known.run_id):
            nearest[op.step_id] = op
    ops = sorted(
        (op for op in nearest.values() if op.owner_id != run_id),
        key=lambda op: (op.created_at, op.pk),
        reverse=True,
    )
    return [{"step_id": op.step_id, "owner": op.owner_id} for op in ops]


def run_compensation(execution: Execution) -> dict[str, Any]:
    """Execute the compensation of ``execution``'s run; returns a summary (its recorded
    output).

    ``{"compensated": [step_id], "nothing_to_undo": [step_id], "did_not_happen":
    [step_id], "owned_by": [{"step_id", "owner"}]}``. Raises :class:`Suspend` (the run
    stays COMPENSATING, without a lease) while an operator must decide on a write.
    """
    not_happened = _settle(execution)
    # compensation steps keep the position they were first recorded at, and new ones go
    # after every recorded step: the set of writes to undo may change between executions
    # (a write settled by an operator, a write a fork adopted)
    next_position = execution.cursor.next_free_position()
    undone: list[str] = []
    skipped: list[str] = []
    for op in compensations(execution.cursor.run_id):
        try:
            spec = execution.attempts.tool_spec(op.tool_name)
        except ToolNotFound:
            spec = None
        if spec is None or spec.compensate is None:
            skipped.append(op.step_id)
            continue
        params = codec.decode(op.params) or {}
        result = codec.decode(op.result)
        hook = spec.compensate

        def undo(*, idempotency_key: str, hook=hook, params=params, result=result) -> Any:
            return hook(params, result, idempotency_key=idempotency_key)

        sid = f"compensate:{op.step_id}"
        recorded = execution.cursor.recorded_position(sid)
        execution.cursor.move_to(recorded if recorded is not None else next_position)
        if recorded is None:
            next_position += 1
        execution.attempts.compensation_step(sid, undo, op.tool_name, spec.retry or DEFAULT_POLICY)
        undone.append(op.step_id)
    return {
        "compensated": undone,
        "nothing_to_undo": skipped,
        "did_not_happen": not_happened,
        "owned_by": owned_elsewhere(execution.cursor.run_id),
    }


def _settle(execution: Execution) -> list[str]:
    """Settle every write of the run whose outcome is not known; returns the step ids of
    the ones that did not happen. Parks the run for an operator if one stays unknown."""
    undecided: list[Operation] = []
    for op in unsettled(execution.cursor.run_id):
        found = _ask_reconcile(execution, op) if op.status == OperationStatus.STARTED else _UNKNOWN
        if found is _UNKNOWN:
            undecided.append(op)
            continue
        _record_reconciled(execution, op, found)
    if undecided:
        _wait_for_operator(execution, undecided)
    # failed: known not to have happened (refused, reconciled, or an operator said so)
    owned = Operation.objects.owned_by(execution.cursor.run_id)
    return list(
        owned.filter(status=OperationStatus.FAILED)
        .exclude(step_id__startswith="compensate:")
        .order_by("-created_at", "-id")
        .values_list("step_id", flat=True)
    )


_UNKNOWN = object()


def _ask_reconcile(execution: Execution, op: Operation) -> Any:
    """The tool's reconcile hook's answer: a result, ``NOT_FOUND``, or ``_UNKNOWN``."""
    try:
        spec = execution.attempts.tool_spec(op.tool_name)
    except ToolNotFound:
        return _UNKNOWN
    if spec.reconcile is None:
        return _UNKNOWN
    try:
        found = spec.reconcile(codec.decode(op.params) or {}, idempotency_key=op.idempotency_key)
    except Exception as exc:  # noqa: BLE001 - an operator decides instead
        logger.warning(
            "reconcile of %s failed: %s", op.idempotency_key, redact_text(str(exc))[:500]
        )
        return _UNKNOWN
    return NOT_FOUND if found is None else found


def _record_reconciled(execution: Execution, op: Operation, found: Any) -> None:
    now = timezone.now()
    if found is NOT_FOUND:
        fields: dict[str, Any] = {
            "status": OperationStatus.FAILED,
            "resolution": "reconciled: did not happen",
        }
    else:
        fields = {
            "status": OperationStatus.SUCCEEDED,
            "result": codec.dumps_checked(found, what="operation result", step_id=op.step_id),
            "resolution": "reconciled: happened",
        }

    def work() -> None:
        Operation.objects.filter(pk=op.pk, status__in=UNSETTLED).update(updated_at=now, **fields)

    execution.checkpoints.write(
        {},
        work,
        record_if_stopped=False,
        events=[
            execution.checkpoints.event(
                EventKind.OPERATION_RECONCILED,
                op.step_id,
                f"{op.tool_name}: {fields['resolution']} (before compensating)",
                {"operation": op.pk},
            )
        ],
    )


def _wait_for_operator(execution: Execution, ops: list[Operation]) -> None:
    """Mark ``ops`` unknown, open a reconcile wait for each, release the run; suspend."""
    now = timezone.now()
    next_position = execution.cursor.next_free_position()

    def work() -> None:
        for op in ops:
            info = (
                op.error
                if op.status == OperationStatus.UNKNOWN and op.error
                else {
                    "type": "UnknownOutcome",
                    "classification": AMBIGUOUS,
                    "step_id": op.step_id,
                    "message": "the worker that sent this write stopped before its result was "
                    "recorded; compensation waits for the outcome",
                }
            )
            Operation.objects.filter(pk=op.pk, status__in=UNSETTLED).update(
                status=OperationStatus.UNKNOWN, error=info, updated_at=now
            )
            wait = Wait.objects.filter(
                run_id=execution.cursor.run_id, wait_id=f"reconcile:{op.step_id}"
            ).first()
            if wait is not None and wait.status == WaitStatus.PENDING:
                continue
            Wait.objects.update_or_create(
                run_id=execution.cursor.run_id,
                wait_id=f"reconcile:{op.step_id}",
                defaults={
                    "position": wait.position if wait is not None else next_position,
                    "kind": WaitKind.RECONCILE,
                    "status": WaitStatus.PENDING,
                    "operation": op,
                    "title": f"Did {op.tool_name} happen? ({op.idempotency_key})",
                    "payload": op.params,
                    "created_at": now,
                    "resolved_at": None,
                    "resolved_by": "",
                    "result": None,
                },
            )

    names = ", ".join(f"{op.tool_name} ({op.pk})" for op in ops)
    execution.checkpoints.write(
        transitions.changes("release", RunStatus.COMPENSATING),
        work,
        record_if_stopped=False,
        events=[
            execution.checkpoints.event(
                EventKind.COMPENSATION_WAITING,
                message=f"compensation waits until the outcome "
                f"of {names} is known: an operator must decide (manage.py durable "
                f"reconcile {ops[0].pk} --happened/--not-happened)",
                data={"operations": [op.pk for op in ops]},
            )
        ],
    )
    execution.checkpoints.stop(RunStatus.COMPENSATING)
    raise Suspend(f"compensation of {execution.cursor.run_id} waits for an operator")


__all__ = ["compensations", "owned_elsewhere", "run_compensation", "unsettled"]
