"""State transitions of runs and operations: one function each, one transaction each.

The dashboard, the admin, the management commands and the tests all call these
(docs/architecture.md#layers). Each re-reads its rows with ``select_for_update()``, raises
:class:`~durable.IllegalTransition` when the source state is wrong, writes a TraceEvent
naming who and why, and dispatches the run on commit where it should continue.
An operator's decision on an unknown outcome (:mod:`durable.services.reconcile`) and a fork
(:mod:`durable.services.forks`) have modules of their own; they are importable from here too.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from durable import clock, idempotency
from durable.dispatch import dispatch_on_commit
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Wait,
    WaitKind,
    WaitStatus,
    transitions,
)
from durable.models.transitions import ACTIVE
from durable.services.base import actor_of, lock_parent_of, lock_run, record_event
from durable.services.forks import GAVE_UP, run_fork, run_fork_or_get
from durable.services.reconcile import (
    Lookup,
    OperationNotFound,
    ReconcileOutcome,
    operation_lookup,
    operation_reconcile,
)
from durable.types import SignalResult
from durable.values import codec, redaction
from durable.vocabulary import EventKind
from durable.waits import mailbox, parent_close

__all__ = [
    "GAVE_UP",
    "Lookup",
    "OperationNotFound",
    "ReconcileOutcome",
    "operation_lookup",
    "operation_reconcile",
    "run_cancel",
    "run_compensate",
    "run_fork",
    "run_fork_or_get",
    "run_resume",
    "run_signal",
]


def run_cancel(*, run_id: str, by: Any = None, reason: str = "") -> Run:
    """Cancel a run: it stops at its next fence; pending waits are cancelled.

    The worker does not read the status before each step; the claim, every checkpoint
    and every write's ledger row commit only while the run is live
    (docs/architecture.md#replay). So no write starts after this commits; a plain
    step, LLM call or read-only tool already decided (its previous checkpoint committed
    first) may run once more, and its result is recorded. A step already executing
    finishes; its late result (or failure) is recorded but starts nothing. Completed
    effects stay (compensation is a separate action). The run's unfinished child runs
    (``ctx.start_child``) are cancelled too, their children as well, in the same
    transaction, except those whose parent-close policy is ``abandon``; a cancelled
    child wakes a parent waiting on it (docs/children.md).
    Raises :class:`~durable.RunNotFound`, :class:`~durable.IllegalTransition`.
    """
    actor = actor_of(by)
    now = timezone.now()
    with transaction.atomic():
        lock_parent_of(run_id)  # lock order: the parent before its child
        run = lock_run(run_id)
        _cancel_txn(run, actor=actor, reason=reason, now=now)
    return run


def _cancel_txn(run: Run, *, actor: str, reason: str, now) -> None:
    """Cancel ``run`` (locked), close its pending waits, wake a parent waiting on it and
    cancel its unfinished children by their parent-close policy, recursively."""
    parent_close.cancel_txn(run, actor=actor, reason=reason, now=now)


def _reopen_failed_steps_txn(run: Run, now, *, kind: str | None = None) -> list[str]:
    """Give failed steps (of ``kind``, if given) a fresh attempt budget (retrying, due now)."""
    from durable.models import Step, StepStatus

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
        from durable.durations import check_duration

        check_duration(deadline_seconds, call="run_resume(deadline_seconds=...)", positive=True)
    actor = actor_of(by)
    now = timezone.now()
    with transaction.atomic():
        run = lock_run(run_id)
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
            run.deadline_at = clock.now() + timedelta(seconds=float(deadline_seconds))
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
        record_event(
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
    The run's child runs (``ctx.start_child``) that wrote are compensated too, each its
    own writes, alongside (a child still running is cancelled first; a succeeded one is
    compensated as well), and so are theirs (docs/children.md). Raises
    :class:`~durable.RunNotFound`, :class:`~durable.IllegalTransition`.
    """
    actor = actor_of(by)
    now = timezone.now()
    with transaction.atomic():
        run = lock_run(run_id)
        transitions.check("compensate", run)
        run_compensate_txn(run, action="compensate", actor=actor, reason=reason, now=now)
        _compensate_children_txn(run, actor=actor, now=now)
    return run


def _compensate_children_txn(run: Run, *, actor: str, now) -> None:
    """Compensate ``run``'s children that wrote, recursively (``run`` is held locked)."""
    # lock order: the parent (held) before its children
    children = Run.objects.select_for_update().filter(parent_run=run).order_by("created_at", "id")
    for child in children:
        why = f"its parent run {run.id} is compensated"
        if child.status in ACTIVE:
            _cancel_txn(child, actor=actor, reason=why, now=now)
        wrote = Operation.objects.owned_by(child.id).exists()
        if wrote and transitions.can("compensate_child", child):
            run_compensate_txn(child, action="compensate_child", actor=actor, reason=why, now=now)
        _compensate_children_txn(child, actor=actor, now=now)


def run_compensate_txn(run: Run, *, action: str, actor: str, reason: str, now) -> None:
    """Move ``run`` (locked by the caller) to COMPENSATING by ``action`` (``compensate``,
    or ``compensate_child`` for a parent's child) and dispatch it on commit. Raises
    :class:`~durable.IllegalTransition` (nothing written) from another status."""
    transitions.check(action, run)
    if run.status == RunStatus.COMPENSATION_FAILED:
        # only the failed compensation is retried; the workflow's own failed step
        # stays failed (it is not re-run by compensation)
        from durable.models import StepKind

        _reopen_failed_steps_txn(run, now, kind=StepKind.COMPENSATION)
    previous = run.status
    in_flight = bool(
        run.lease_token and run.lease_expires_at is not None and run.lease_expires_at > now
    )
    transitions.apply(
        action,
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
    Operation.objects.filter(run=run, status=OperationStatus.UNKNOWN).exclude(resolution="").update(
        resolution="", resolved_by="", updated_at=now
    )
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
    record_event(
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


def run_signal(
    *, run_id: str, name: str, payload: Any = None, dedupe_key: str | None = None, by: Any = None
) -> SignalResult:
    """Send a signal to a run: delivered to its ``wait_for_signal(name)``, now or later.

    Kept in the run's mailbox until a wait consumes it (so it may arrive before the wait
    exists); a repeated ``dedupe_key`` with the same name and payload is stored and
    delivered once, and answers as the first did (``duplicate``); with another name or
    payload it raises :class:`~durable.KeyConflict` naming the key (Stripe's idempotency
    rule, docs/requesters-and-signals.md#a-key-names-one-request). Returns a
    :class:`~durable.SignalResult`: delivered or kept, the names the run waits and has
    waited on, and a message for the sender that points out a name the run never waited
    on (:mod:`durable.waits.mailbox`). It still reads like the stored
    :class:`~durable.models.Signal` (``.pk``, ``.wait``, ...). Raises
    :class:`~durable.RunNotFound`, :class:`~durable.IllegalTransition` (the run has
    finished), ``ValueError`` (bad name; :class:`~durable.exceptions.SecretInIdentifier` for a
    name that looks like a secret), :class:`~durable.PayloadError` (payload not
    storable), :class:`~durable.KeyConflict` (the dedupe key was used with other content).
    """
    from durable.models import Signal
    from durable.waits.closing import close_wait_txn

    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError("signal name must be a string of 1-200 characters")
    redaction.check_identifier(name, "signal name")  # stored and shown in clear
    actor = actor_of(by)
    payload_text = codec.dumps_checked(payload, what="signal payload")
    now = timezone.now()
    with transaction.atomic():
        run = lock_run(run_id)
        transitions.check("signal", run)
        waiting_on, waited_on = mailbox.signal_names(run.id)
        if dedupe_key:
            existing = Signal.objects.filter(run=run, dedupe_key=dedupe_key).first()
            if existing is not None:
                # the key names one signal: other content is refused, not dropped
                idempotency.check_same(
                    "signal dedupe key",
                    dedupe_key,
                    {
                        "name": existing.name,
                        "payload": idempotency.stored_fingerprint(existing.payload),
                    },
                    {"name": name, "payload": codec.fingerprint(payload)},
                )
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
        record_event(
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
