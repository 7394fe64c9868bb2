"""The operator's decision on a write whose outcome is unknown: it happened, it did not,
or abort.

A decision settles a row of the operation ledger and, when a run waits for it, moves
the run on; for a finished run it only records the fact, so the run's compensation knows
what to undo (docs/architecture.md#the-operation-ledger). It has a module of its own as
the one service that starts from an operation, not a run: its checks follow the ledger.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from django.db import transaction
from django.utils import timezone

from durable.dispatch import dispatch_on_commit
from durable.exceptions import DurableError, IllegalTransition, ToolNotFound
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
    transitions,
)
from durable.runtime.failures import safe_str
from durable.services.base import actor_of, lock_parent_of
from durable.types import NOT_FOUND
from durable.values import codec
from durable.values.redaction import redact_text
from durable.vocabulary import Classification, EventKind
from durable.waits import child_ends, mailbox, parent_close

logger = logging.getLogger(__name__)

ReconcileOutcome = Literal["happened", "not_happened", "abort"]


class OperationNotFound(DurableError):
    def __init__(self, operation_id: Any):
        self.operation_id = operation_id
        super().__init__(f"operation {operation_id} does not exist")


def operation_reconcile(
    *,
    operation_id: int | str,
    outcome: ReconcileOutcome,
    result: Any = None,
    external_id: str = "",
    by: Any = None,
    reason: str = "",
) -> Operation:
    """An operator's decision on a write whose outcome is unknown.

    - ``"happened"``: the write took effect; ``result`` (JSON-able) becomes the step's
      result and ``external_id`` the external system's id. The run continues.
    - ``"not_happened"``: it did not; the run continues and calls the tool again with
      the same idempotency key.
    - ``"abort"``: the run fails; the operation stays ``unknown`` with the decision noted.

    A compensating run that waits for this decision stays COMPENSATING and goes on
    (``"abort"``: COMPENSATION_FAILED). For a run that has finished (cancelled, failed, a
    failed compensation...) ``"happened"`` / ``"not_happened"`` record the fact in the
    ledger and leave the run as it is, so its compensation knows what to undo
    (docs/compensation.md).

    ``operation_id`` is the Operation's primary key or its idempotency key. Raises
    :class:`OperationNotFound`, :class:`~durable.IllegalTransition` (the operation's
    outcome is not unknown, or its run is not waiting for this decision and has not
    finished, or ``"abort"`` for a run that is not waiting).
    """
    if outcome not in ("happened", "not_happened", "abort"):
        raise ValueError(f"outcome must be happened, not_happened or abort, got {outcome!r}")
    actor = actor_of(by)
    now = timezone.now()
    with transaction.atomic():
        lookup: dict[str, Any] = (
            {"pk": int(operation_id)}
            if str(operation_id).isdigit()
            else {"idempotency_key": str(operation_id)}
        )
        run_id = Operation.objects.filter(**lookup).values_list("run_id", flat=True).first()
        if run_id is None:
            raise OperationNotFound(operation_id)
        lock_parent_of(run_id)  # a child's parent before it (an abort ends the child)
        # lock order: the run first, then its rows (as the engine and the other services)
        run = Run.objects.select_for_update().get(pk=run_id)
        op = Operation.objects.select_for_update().get(**lookup)
        if op.status != OperationStatus.UNKNOWN or op.resolution:
            raise IllegalTransition(
                f"operation {op.pk} ({op.idempotency_key}) is {op.status}"
                + (
                    f", already decided: {op.resolution} by {op.resolved_by}"
                    if op.resolution
                    else ""
                )
                + "; only an unknown outcome can be reconciled",
                current=op.status,
            )
        wait = (
            Wait.objects.select_for_update()
            .filter(operation=op, kind=WaitKind.RECONCILE, status=WaitStatus.PENDING)
            .first()
        )
        # the row of the table: a WAITING run waits for this decision ("reconcile"); a
        # compensating run that waits for it goes on, and for a finished run the decision
        # only records in the ledger what happened ("settle")
        action = "reconcile" if run.status == RunStatus.WAITING else "settle"
        compensating = run.status == RunStatus.COMPENSATING
        record_only = action == "settle" and not compensating
        if not transitions.can(action, run) or (wait is None and not record_only):
            raise IllegalTransition(
                f"run {run.id} is {run.status}, not waiting for a decision on operation {op.pk}",
                current=run.status,
            )
        if record_only and outcome == "abort":
            raise IllegalTransition(
                f"run {run.id} is {run.status}: there is nothing to abort; record whether "
                f"operation {op.pk} happened or not",
                current=run.status,
            )
        note = f"operator: {outcome.replace('_', ' ')}" + (f" ({reason})" if reason else "")
        fields: dict[str, Any] = {"resolved_by": actor, "resolution": note[:200], "updated_at": now}
        if outcome == "happened":
            fields.update(
                status=OperationStatus.SUCCEEDED,
                result=codec.dumps_checked(result, what="operation result", step_id=op.step_id),
                external_id=str(external_id or "")[:400],
            )
        elif outcome == "not_happened":
            fields.update(status=OperationStatus.FAILED)
        for name, value in fields.items():
            setattr(op, name, value)
        op.save(update_fields=list(fields))
        if record_only:
            if wait is not None:  # a finished run left it open: the question is answered
                wait.status = WaitStatus.RESOLVED
                wait.resolved_at = now
                wait.resolved_by = actor
                wait.result = codec.encode({"outcome": outcome, "reason": reason})
                wait.save(update_fields=["status", "resolved_at", "resolved_by", "result"])
            TraceEvent.objects.create(
                run=run,
                kind=EventKind.OPERATION_RECONCILED,
                step_id=op.step_id,
                actor=actor,
                message=f"{note} (run {run.status}: recorded in the ledger)",
                data={"operation": op.pk, "outcome": outcome},
            )
            return op
        assert wait is not None
        wait.status = WaitStatus.RESOLVED if outcome != "abort" else WaitStatus.CANCELLED
        wait.resolved_at = now
        wait.resolved_by = actor
        wait.result = codec.encode({"outcome": outcome, "reason": reason})
        wait.save(update_fields=["status", "resolved_at", "resolved_by", "result"])
        if outcome == "abort":
            # a compensation that waited for this write stops; a run stops
            what = "stopped the compensation" if compensating else "aborted the run"
            transitions.apply(
                "abort",
                run,
                finished_at=now,
                error_type="AbortedByOperator",
                error={
                    "type": "AbortedByOperator",
                    "classification": Classification.AMBIGUOUS.value,
                    "step_id": op.step_id,
                    "message": f"{actor} {what} at the unknown outcome of "
                    f"{op.tool_name} ({op.idempotency_key})" + (f": {reason}" if reason else ""),
                },
            )
        else:  # a compensation that waited for this write goes on as it is
            transitions.apply(action, run)
        run.updated_at = now
        run.save(update_fields=["status", "finished_at", "error", "error_type", "updated_at"])
        TraceEvent.objects.create(
            run=run,
            kind=EventKind.OPERATION_RECONCILED,
            step_id=op.step_id,
            actor=actor,
            message=note,
            data={"operation": op.pk, "outcome": outcome},
        )
        if outcome == "abort":
            mailbox.note_unconsumed_txn(run.id, RunStatus.FAILED, actor=actor)
            child_ends.child_ended_txn(run.parent_run_id, run.id, actor=actor)
            parent_close.parent_closed_txn(run.id, run.status, actor=actor, now=now)
        if outcome != "abort":
            dispatch_on_commit(run.id)
    return op


@dataclass(frozen=True)
class Lookup:
    """What a tool's ``reconcile`` hook answered, asked again by an operator.

    ``found``: ``True`` (the write happened: ``result`` is what the hook returned,
    ``external_id`` the tool's ``external_id`` of it, or ``""``), ``False`` (the hook
    says it did not happen) or ``None`` (it cannot tell: ``error`` says why -- no hook,
    the tool is not registered in this process, or the hook raised).
    """

    operation_id: int
    tool_name: str
    found: bool | None
    result: Any = None
    external_id: str = ""
    error: str = ""


def operation_lookup(*, operation_id: int | str) -> Lookup:
    """Ask the tool's ``reconcile`` hook again whether an unknown write happened.

    Changes nothing: an operator reads the answer and decides with
    :func:`operation_reconcile` (the engine asks the same hook itself before it parks a
    run for an operator; the external system may know more now). The hook runs in this
    process, with the operation's recorded parameters and idempotency key.

    Raises :class:`OperationNotFound`, :class:`~durable.IllegalTransition` when the
    operation's outcome is not unknown or is already decided.
    """
    from durable import registry
    from durable.models import Tool as ToolRow

    lookup: dict[str, Any] = (
        {"pk": int(operation_id)}
        if str(operation_id).isdigit()
        else {"idempotency_key": str(operation_id)}
    )
    op = Operation.objects.filter(**lookup).first()
    if op is None:
        raise OperationNotFound(operation_id)
    if op.status != OperationStatus.UNKNOWN or op.resolution:
        raise IllegalTransition(
            f"operation {op.pk} ({op.idempotency_key}) is {op.status}"
            + (f", already decided: {op.resolution}" if op.resolution else "")
            + "; only an unknown outcome is looked up",
            current=op.status,
        )
    answer = partial(Lookup, op.pk, op.tool_name)
    try:
        spec = registry.effective_tool(
            registry.get_tool(op.tool_name), ToolRow.objects.filter(name=op.tool_name).first()
        )
    except ToolNotFound:
        return answer(None, error=f"the tool {op.tool_name} is not registered in this process")
    if spec.reconcile is None:
        return answer(
            None,
            error=f"the tool {op.tool_name} has no reconcile hook: check the external "
            "system yourself",
        )
    try:
        found = spec.reconcile(codec.decode(op.params) or {}, idempotency_key=op.idempotency_key)
    except Exception as exc:  # noqa: BLE001 - the operator reads why and decides
        logger.warning("lookup of %s failed: %s", op.idempotency_key, redact_text(safe_str(exc)))
        return answer(
            None,
            error=f"the reconcile hook raised {type(exc).__name__}: "
            f"{redact_text(safe_str(exc))[:500]}",
        )
    if found is None or found is NOT_FOUND:
        return answer(False)
    external = ""
    if spec.external_id is not None:
        try:
            external = str(spec.external_id(found) or "")[:400]
        except Exception:  # noqa: BLE001 - an id is a convenience; the result stands
            external = ""
    return answer(True, result=found, external_id=external)
