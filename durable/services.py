"""State transitions of runs and operations: one function each, one transaction each.

The dashboard, the admin, the management commands and the tests all call these
(docs/architecture.md#layers). Each re-reads its rows with ``select_for_update()``, raises
:class:`~durable.IllegalTransition` when the source state is wrong, writes a TraceEvent
naming who and why, and dispatches the run on commit where it should continue.
"""

from __future__ import annotations

from typing import Any, Literal

from django.db import transaction
from django.utils import timezone

from . import codec, mailbox, redaction, requesters, transitions
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
    run_lineage,
)
from .types import SignalResult
from .vocabulary import Classification, EventKind

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
    actor = _actor(by)
    now = timezone.now()
    with transaction.atomic():
        lookup = (
            {"pk": int(operation_id)}
            if str(operation_id).isdigit()
            else {"idempotency_key": str(operation_id)}
        )
        run_id = Operation.objects.filter(**lookup).values_list("run_id", flat=True).first()
        if run_id is None:
            raise OperationNotFound(operation_id)
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
        if outcome != "abort":
            dispatch_on_commit(run.id)
    return op


def _lock_run(run_id: str) -> Run:
    run = Run.objects.select_for_update().filter(pk=str(run_id)).first()
    if run is None:
        from .exceptions import RunNotFound

        raise RunNotFound(run_id)
    return run


def _event(run: Run, kind: EventKind, actor: str, message: str, **data: Any) -> None:
    TraceEvent.objects.create(run=run, kind=kind, actor=actor, message=message, data=data or None)


def run_cancel(*, run_id: str, by: Any = None, reason: str = "") -> Run:
    """Cancel a run: no new step starts after this commits; pending waits are cancelled.

    A step already executing finishes; its late result (or failure) is recorded but
    starts nothing. Completed effects stay (compensation is a separate action). Raises
    :class:`~durable.RunNotFound`, :class:`~durable.IllegalTransition`.
    """
    actor = _actor(by)
    now = timezone.now()
    with transaction.atomic():
        run = _lock_run(run_id)
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
                "type": "Cancelled",
                "classification": Classification.PERMANENT.value,
                "step_id": "",
                "message": f"cancelled by {actor}" + (f": {reason}" if reason else ""),
            },
            error_type="Cancelled",
        )
        run.save(update_fields=list(fields))
        from .waits import close_wait_txn

        for wait in Wait.objects.select_for_update().filter(run=run, status=WaitStatus.PENDING):
            close_wait_txn(
                wait,
                status=WaitStatus.CANCELLED,
                result=None,
                by=actor,
                now=now,
                reason="run cancelled",
            )
        _event(run, EventKind.CANCELLED, actor, run.error["message"], previous=previous)
        mailbox.note_unconsumed_txn(run.id, RunStatus.CANCELLED, actor=actor)
    return run


def _reopen_failed_steps_txn(run: Run, now, *, kind: str | None = None) -> list[str]:
    """Give failed steps (of ``kind``, if given) a fresh attempt budget (retrying, due now)."""
    from .models import Step, StepStatus

    reopened = []
    failed = Step.objects.select_for_update().filter(run=run, status=StepStatus.FAILED)
    if kind is not None:
        failed = failed.filter(kind=kind)
    for step in failed:
        step.status = StepStatus.RETRYING
        step.budget_base = step.attempts
        step.next_attempt_at = now
        step.finished_at = None
        step.save(update_fields=["status", "budget_base", "next_attempt_at", "finished_at"])
        reopened.append(step.step_id)
    return reopened


def run_resume(
    *,
    run_id: str,
    by: Any = None,
    reason: str = "",
    extra_steps: int = 0,
    deadline_seconds: float | None = None,
) -> Run:
    """Retry a failed run from its failed step with a fresh attempt budget.

    Completed steps replay; the failed step runs again (its attempt count goes on, its
    budget restarts). ``extra_steps`` raises the step budget and ``deadline_seconds``
    sets a new deadline from now, for runs that failed on a budget. An unknown outcome
    that an operator aborted is opened for a decision again.
    """
    from datetime import timedelta

    if deadline_seconds:
        from .durations import check_duration

        check_duration(deadline_seconds, call="run_resume(deadline_seconds=...)", positive=True)
    actor = _actor(by)
    now = timezone.now()
    with transaction.atomic():
        run = _lock_run(run_id)
        transitions.check("resume", run)
        reopened = _reopen_failed_steps_txn(run, now)
        Operation.objects.filter(run=run, status=OperationStatus.UNKNOWN).update(
            resolution="", resolved_by="", updated_at=now
        )
        transitions.apply(
            "resume",
            run,
            error=None,
            error_type="",
            finished_at=None,
            updated_at=now,
            cursor_lost=0,
        )
        if extra_steps:
            run.max_steps += int(extra_steps)
        if deadline_seconds:
            run.deadline_at = now + timedelta(seconds=float(deadline_seconds))
        run.save(
            update_fields=[
                "status",
                "error",
                "error_type",
                "finished_at",
                "updated_at",
                "cursor_lost",
                "max_steps",
                "deadline_at",
            ]
        )
        _event(
            run,
            EventKind.RESUMED,
            actor,
            f"resumed by {actor}" + (f": {reason}" if reason else ""),
            steps=reopened,
        )
        dispatch_on_commit(run.id)
    return run


def run_compensate(*, run_id: str, by: Any = None, reason: str = "") -> Run:
    """Undo a failed or cancelled run's completed writes (newest first), durably.

    From COMPENSATION_FAILED it retries the failed compensation with a fresh budget.
    """
    actor = _actor(by)
    now = timezone.now()
    with transaction.atomic():
        run = _lock_run(run_id)
        transitions.check("compensate", run)
        if run.status == RunStatus.COMPENSATION_FAILED:
            # only the failed compensation is retried; the workflow's own failed step
            # stays failed (it is not re-run by compensation)
            from .models import StepKind

            _reopen_failed_steps_txn(run, now, kind=StepKind.COMPENSATION)
        previous = run.status
        in_flight = bool(
            run.lease_token and run.lease_expires_at is not None and run.lease_expires_at > now
        )
        transitions.apply(
            "compensate",
            run,
            finished_at=None,
            updated_at=now,
            **({} if in_flight else transitions.LEASE_RELEASED),
        )
        # else a worker is still executing a step of the cancelled run: it keeps the
        # lease, records that step's late result (a write's outcome goes to the ledger)
        # and then hands the run to the compensation; if it dies, its lease expires and
        # the compensation settles the write through reconcile (docs/compensation.md)
        # a write an operator aborted on is put to a decision again
        Operation.objects.filter(run=run, status=OperationStatus.UNKNOWN).exclude(
            resolution=""
        ).update(resolution="", resolved_by="", updated_at=now)
        run.save(
            update_fields=[
                "status",
                "finished_at",
                "updated_at",
                "lease_token",
                "lease_owner",
                "lease_expires_at",
            ]
        )
        _event(
            run,
            EventKind.COMPENSATING,
            actor,
            f"compensation requested by {actor}"
            + (f": {reason}" if reason else "")
            + ("; it starts when the step in flight has finished" if in_flight else ""),
            previous=previous,
            in_flight=in_flight,
        )
        dispatch_on_commit(run.id)
    return run


def run_fork(
    *, run_id: str, from_step: str, by: Any = None, reason: str = "", new_run_id: str | None = None
) -> Run:
    """Start a new run of the same workflow and input that reuses the recorded results
    of every step before ``from_step`` (which, and everything after it, executes anew).

    The fork is started by ``by`` (the forker); its four-eyes requesters are the forker
    followed by the source run's requesters (its starter, and so on up the fork chain),
    so nobody who asked for the source run can approve the fork's writes either.

    Raises :class:`~durable.IllegalTransition` (run not finished), ``ValueError``
    (``from_step`` is not a step of the run).
    """
    from .models import Step, StepStatus

    actor = _actor(by)
    forker, principal = requesters.resolve(by)
    now = timezone.now()
    with transaction.atomic():
        source = _lock_run(run_id)
        transitions.check("fork", source)
        pivot = Step.objects.filter(run=source, step_id=from_step).first()
        if pivot is None:
            known = list(
                Step.objects.filter(run=source)
                .order_by("position")
                .values_list("step_id", flat=True)[:20]
            )
            raise ValueError(
                f"run {source.id} has no step {from_step!r}; its steps: "
                f"{', '.join(known) or 'none'}"
            )
        kwargs: dict[str, Any] = {}
        if new_run_id:
            kwargs["id"] = new_run_id
        fork = Run.objects.create(
            workflow_name=source.workflow_name,
            workflow_version=source.workflow_version,
            input=source.input,
            input_hash=source.input_hash,
            status=RunStatus.PENDING,
            max_steps=source.max_steps,
            tags=list(source.tags or []),
            started_by=forker,
            started_by_name=principal["name"],
            requesters=requesters.chain(principal, source.requesters or [requesters.UNKNOWN]),
            forked_from=source,
            created_at=now,
            updated_at=now,
            **kwargs,
        )
        copied = [
            Step(
                run=fork,
                step_id=s.step_id,
                position=s.position,
                kind=s.kind,
                tool_name=s.tool_name,
                status=StepStatus.SUCCEEDED,
                input=s.input,
                output=s.output,
                error=s.error,
                attempts=s.attempts,
                started_at=s.started_at,
                finished_at=s.finished_at,
            )
            for s in Step.objects.filter(
                run=source, position__lt=pivot.position, status=StepStatus.SUCCEEDED
            ).order_by("position")
        ]
        Step.objects.bulk_create(copied)
        fork.cursor_position = len(copied)
        fork.save(update_fields=["cursor_position"])
        _event(
            fork,
            EventKind.CREATED,
            actor,
            f"forked from {source.id} at step {from_step!r} by "
            f"{actor}" + (f": {reason}" if reason else ""),
            forked_from=source.id,
            reused_steps=len(copied),
            requesters=[requesters.label(p) for p in fork.requesters],
        )
        _adopt_writes_txn(source, fork, [s.step_id for s in copied], actor, now)
        _event(
            source,
            EventKind.FORKED,
            actor,
            f"forked into {fork.id} at step {from_step!r}",
            fork=fork.id,
        )
        dispatch_on_commit(fork.id)
    return fork


#: an owner in one of these statuses has given up its result: a fork may adopt its writes
GAVE_UP = (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATION_FAILED)


def _adopt_writes_txn(source: Run, fork: Run, step_ids: list[str], actor: str, now) -> None:
    """The fork adopts the writes it reuses, when their owner gave its result up.

    Rule (docs/compensation.md, "Forks own what they reuse"): ownership passes only from
    a run that failed, was cancelled or failed to compensate, and only for a write that
    was not undone yet. A succeeded or live owner keeps it (so of two forks, the first
    that is live or succeeded keeps a write; a later fork reuses it without owning it),
    and a compensated owner has undone it already.
    """
    from .models import Step, StepStatus

    if not step_ids:
        return
    ops = list(
        Operation.objects.select_for_update()
        .filter(
            run_id__in=run_lineage(source.id),
            step_id__in=step_ids,
            status=OperationStatus.SUCCEEDED,
        )
        .exclude(step_id__startswith="compensate:")
        .order_by("created_at", "id")
    )
    owners = {r.id: r for r in Run.objects.filter(pk__in={op.owner_id for op in ops})}
    undone = set(
        Step.objects.filter(
            run_id__in=list(owners),
            status=StepStatus.SUCCEEDED,
            step_id__in=[f"compensate:{op.step_id}" for op in ops],
        ).values_list("run_id", "step_id")
    )
    for op in ops:
        owner = owners.get(op.owner_id)
        if (
            owner is not None
            and owner.status in GAVE_UP
            and (owner.id, f"compensate:{op.step_id}") not in undone
        ):
            op.owners = [
                *(op.owners or []),
                {"run": fork.id, "from": owner.id, "at": now.isoformat(), "by": actor},
            ]
            op.owner_run = fork
            op.updated_at = now
            op.save(update_fields=["owner_run", "owners", "updated_at"])
            _event(
                fork,
                EventKind.OPERATION_ADOPTED,
                actor,
                f"adopted {op.tool_name} ({op.idempotency_key}) from run {owner.id}: "
                "compensating this run undoes it",
                operation=op.pk,
                owner_was=owner.id,
            )
            if owner.id != fork.id:
                _event(
                    owner,
                    EventKind.OPERATION_HANDED_OVER,
                    actor,
                    f"{op.tool_name} ({op.idempotency_key}) now belongs to fork {fork.id}: "
                    "compensating this run leaves it",
                    operation=op.pk,
                    owner=fork.id,
                )
        else:
            why = (
                "it was undone already"
                if owner is not None and (owner.id, f"compensate:{op.step_id}") in undone
                else f"that run is {owner.status if owner is not None else 'gone'}"
            )
            _event(
                fork,
                EventKind.OPERATION_REUSED,
                actor,
                f"reuses {op.tool_name} ({op.idempotency_key}) owned by run {op.owner_id} "
                f"({why}): compensating this run leaves it",
                operation=op.pk,
                owner=op.owner_id,
            )


def run_signal(
    *, run_id: str, name: str, payload: Any = None, dedupe_key: str | None = None, by: Any = None
) -> SignalResult:
    """Send a signal to a run: delivered to its ``wait_for_signal(name)``, now or later.

    Kept in the run's mailbox until a wait consumes it (so it may arrive before the wait
    exists); a repeated ``dedupe_key`` is stored and delivered once. Returns a
    :class:`~durable.SignalResult`: delivered or kept, the names the run waits and has
    waited on, and a message for the sender that points out a name the run never waited
    on (:mod:`durable.mailbox`). It still reads like the stored
    :class:`~durable.models.Signal` (``.pk``, ``.wait``, ...). Raises
    :class:`~durable.RunNotFound`, :class:`~durable.IllegalTransition` (the run has
    finished), ``ValueError`` (bad name; :class:`~durable.exceptions.SecretInIdentifier` for a
    name that looks like a secret), :class:`~durable.PayloadError` (payload not
    storable).
    """
    from .models import Signal
    from .waits import close_wait_txn

    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError("signal name must be a string of 1-200 characters")
    redaction.check_identifier(name, "signal name")  # stored and shown in clear
    actor = _actor(by)
    payload_text = codec.dumps_checked(payload, what="signal payload")
    now = timezone.now()
    with transaction.atomic():
        run = _lock_run(run_id)
        transitions.check("signal", run)
        waiting_on, waited_on = mailbox.signal_names(run.id)
        if dedupe_key:
            existing = Signal.objects.filter(run=run, dedupe_key=dedupe_key).first()
            if existing is not None:
                return mailbox.result_txn(
                    existing,
                    delivered=existing.wait_id is not None,
                    waiting_on=waiting_on,
                    waited_on=waited_on,
                    duplicate=True,
                )
        signal = Signal.objects.create(
            run=run,
            name=name,
            payload=payload_text,
            dedupe_key=dedupe_key or "",
            sent_by=actor,
            created_at=now,
        )
        wait = (
            Wait.objects.select_for_update()
            .filter(run=run, kind=WaitKind.SIGNAL, key=name, status=WaitStatus.PENDING)
            .order_by("position")
            .first()
        )
        result = mailbox.result_txn(
            signal, delivered=wait is not None, waiting_on=waiting_on, waited_on=waited_on
        )
        _event(
            run,
            EventKind.SIGNAL_RECEIVED,
            actor,
            result.message,
            signal=signal.pk,
            delivery=result.delivery.value,
            misaddressed=result.misaddressed,
        )
        if wait is not None:
            signal.wait = wait
            signal.consumed_at = now
            signal.save(update_fields=["wait", "consumed_at"])
            close_wait_txn(
                wait,
                status=WaitStatus.RESOLVED,
                result=payload,
                by=actor,
                now=now,
                reason=f"signal {name!r} received",
            )
    return result
