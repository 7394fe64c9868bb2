"""Executing a run: claim it under a lease, replay its workflow, release it.

``execute(run_id)`` is what a Celery task calls. It claims the run with one fenced
transaction (see "Leases" in docs/architecture.md), loads the run's recorded steps in
one query, runs the workflow function with a :class:`~durable.context.WorkflowContext`
over a private :class:`~durable.runtime.execution.Execution`, and keeps the lease alive with a
heartbeat thread while it runs.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from durable import clock, conf, postgres, registry
from durable.context import WorkflowContext
from durable.dispatch import dispatch_on_commit
from durable.exceptions import (
    DatabaseUnavailable,
    LeaseLost,
    NonDeterminismError,
    RunStopped,
    StepFailed,
    Suspend,
    WorkflowNotFound,
)
from durable.models import Run, RunStatus, Step, TraceEvent, transitions
from durable.observability import metrics, telemetry
from durable.postgres import runs as run_pg
from durable.retry import PERMANENT
from durable.runtime.batching import flush_at_stop
from durable.runtime.compensation import run_compensation
from durable.runtime.dbconn import drop_connection, is_db_fault, retry_db
from durable.runtime.execution import Execution
from durable.runtime.failures import error_info, safe_traceback
from durable.values.redaction import secrets_in, secrets_scope
from durable.vocabulary import EventKind
from durable.waits.closing import wake_due_for_run
from durable.worker.heartbeat import Heartbeat, process_key

logger = logging.getLogger("durable.engine")


def worker_identity() -> str:
    """``host:pid:thread`` of this executor, written as the lease owner (it starts with
    :func:`~durable.worker.heartbeat.process_key`, which the sweeper's liveness check uses)."""
    return f"{process_key()}:{threading.get_ident() % 100000}"


def _claimable(run: Run, now, token: str = "") -> bool:
    if token and run.lease_token == token:
        # our own claim, tried again because its commit's outcome was unknown
        return run.status in (RunStatus.RUNNING, RunStatus.COMPENSATING)
    if run.status == RunStatus.PENDING:
        return True
    if run.status == RunStatus.RETRYING:
        return run.wake_at is None or run.wake_at <= now
    if run.status == RunStatus.COMPENSATING and not run.lease_token:
        # a compensation whose retry is scheduled is claimable once due
        return run.wake_at is None or run.wake_at <= now
    if run.status in (RunStatus.RUNNING, RunStatus.COMPENSATING):
        return not run.lease_token or run.lease_expires_at is None or run.lease_expires_at < now
    return False


def claim(run_id: str, *, token: str, worker_id: str) -> tuple[Run, list[Step]] | None:
    """Take the run's lease if it is claimable; return it with its recorded steps.

    One transaction: lock the row (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's
    IMMEDIATE transaction holds the write lock), check, update, load the steps.
    Returns ``None`` when the run is not claimable (another worker holds it, it is
    finished, or waiting). Safe to call again with the same ``token`` when a database
    fault left the first call's commit unknown: a run that this token holds is claimed.
    """
    now = clock.now()
    if postgres.available():  # the common claim of a pending run: one statement
        fast = run_pg.claim_in_one_statement(
            run_id,
            token=token,
            worker_id=worker_id,
            lease_expires_at=now + timedelta(seconds=conf.lease_seconds()),
            now=now,
        )
        if fast is not None:
            claimed, first_claim = fast
            if first_claim:  # nothing recorded yet: no step query
                return claimed, []
            return claimed, list(Step.objects.filter(run_id=run_id).order_by("position"))
    with transaction.atomic():
        qs = Run.objects.filter(pk=run_id)
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        run = qs.first()
        if run is None or not _claimable(run, now, token):
            return None
        if run.lease_token == token:  # this claim committed already: load the steps
            return run, list(Step.objects.filter(run_id=run.id).order_by("position"))
        recovering = run.status in (RunStatus.RUNNING, RunStatus.COMPENSATING) and bool(
            run.lease_token
        )
        first_claim = run.claims == 0 and run.cursor_position == 0  # nothing recorded yet
        events = []
        if recovering:
            run.cursor_lost += 1
            events.append(
                TraceEvent(
                    run_id=run.id,
                    kind=EventKind.RECOVERED,
                    actor=worker_id,
                    message=f"lease of {run.lease_owner or 'a worker'} expired at "
                    f"{run.lease_expires_at.isoformat() if run.lease_expires_at else '?'}; "
                    "resuming from the last checkpoint",
                )
            )
        transitions.apply(
            "claim",
            run,
            lease_owner=worker_id[:200],
            lease_token=token,
            lease_expires_at=now + timedelta(seconds=conf.lease_seconds()),
            wake_at=None,
            claims=run.claims + 1,
            started_at=run.started_at or now,
            updated_at=now,
        )
        run.save(
            update_fields=[
                "status",
                "lease_owner",
                "lease_token",
                "lease_expires_at",
                "wake_at",
                "claims",
                "started_at",
                "updated_at",
                "cursor_lost",
            ]
        )
        events.append(
            TraceEvent(
                run_id=run.id, kind=EventKind.CLAIMED, actor=worker_id, data={"claim": run.claims}
            )
        )
        TraceEvent.objects.bulk_create(events)
        metrics.count_events(events)  # a recovery
        steps = [] if first_claim else list(Step.objects.filter(run_id=run.id).order_by("position"))
    return run, steps


def release(
    run_id: str, token: str, *, action: str = "release_stopped", source: str | None = None
) -> int:
    """Give the lease back (only if we still hold it), by ``action`` of the transitions
    table; returns how many rows moved (1: released, 0: not ours or not in a source).

    ``"release_stopped"`` (the default): a run that is still running keeps its lease
    until it expires: the worker stopped mid-run (an exception escaped the engine), so
    recovery must count the interrupted attempt, and a running run without a lease would
    have no owner (the ``run_running_has_lease`` constraint refuses it). ``"release"``
    gives back a claimed run unfinished (``source``: only from that status).
    """
    return transitions.update(
        action,
        Run.objects.filter(pk=run_id, lease_token=token),
        source=source,
        updated_at=timezone.now(),
    )


@telemetry.execution  # logs bound to the run, its span (docs/observability.md)
def execute(run_id: str, *, worker_id: str | None = None) -> str | None:
    """Claim and execute ``run_id`` until it finishes, waits, or is released.

    Returns the run's status afterwards, or ``None`` when it could not be claimed.
    Never raises for a workflow's failure: failures are recorded on the run.
    """
    worker_id = worker_id or worker_identity()
    close_old_connections()  # as Django does per request: drop broken or too-old connections
    token = uuid.uuid4().hex

    def claim_it() -> tuple[Run, list[Step]] | None:
        return claim(run_id, token=token, worker_id=worker_id)

    claimed = retry_db(claim_it, what=f"the claim of run {run_id}")
    if claimed is None:
        # a timer's own countdown message: fire the run's due waits, then try again
        if not wake_due_for_run(run_id):
            return None
        claimed = retry_db(claim_it, what=f"the claim of run {run_id}")
        if claimed is None:
            return None
    run, steps = claimed
    compensating = run.status == RunStatus.COMPENSATING
    try:
        spec = (
            None if compensating else registry.get_workflow(run.workflow_name, run.workflow_version)
        )
    except WorkflowNotFound:
        # another worker may have this version; leave the run pending for it
        logger.warning(
            "durable: run %s needs workflow %s version %s, not registered in this worker; released",
            run.id,
            run.workflow_name,
            run.workflow_version,
        )
        with transaction.atomic():
            release(run.id, token, action="release", source=RunStatus.RUNNING)
            TraceEvent.objects.create(
                run_id=run.id,
                kind=EventKind.VERSION_UNAVAILABLE,
                actor=worker_id,
                message=f"worker {worker_id} does not have {run.workflow_name} version "
                f"{run.workflow_version}; released for another worker",
            )
        return RunStatus.PENDING

    heartbeat = Heartbeat(run.id, token).start()
    execution = Execution(
        run=run, token=token, steps=steps, spec=spec, worker_id=worker_id, heartbeat=heartbeat
    )
    fault: DatabaseUnavailable | None = None
    released = False
    try:
        try:
            workflow_input = run.input_value()
        except Exception as exc:  # noqa: BLE001 - e.g. the encryption key was changed
            _fail_unless_stopped(execution, exc)
        else:
            with secrets_scope(secrets_in(workflow_input)):
                _run_workflow(execution, spec, workflow_input, compensating)
    except DatabaseUnavailable as exc:
        fault = exc
    finally:
        # bodies that outlived their timeout keep the lease (and their slots) to the end
        execution.cursor.let_bodies_end()
        heartbeat.stop()
        if fault is not None:
            logger.warning(
                "durable: run %s stopped on worker %s because its database work "
                "failed (%s); releasing it for a retry from its last checkpoint",
                run.id,
                worker_id,
                fault,
            )
            released = release_after_db_fault(
                run.id,
                token,
                worker_id=worker_id,
                error=fault.error,
                step_id=execution.cursor.in_progress(),
            )
        elif execution.cursor.stopped in (RunStatus.CANCELLED, None):
            try:
                retry_db(lambda: release(run.id, token), what=f"the release of run {run.id}")
            except Exception as exc:  # noqa: BLE001 - the lease then expires into recovery
                if not is_db_fault(exc):
                    raise
                logger.warning(
                    "durable: could not release run %s (%s); its lease expires", run.id, exc
                )
        if (
            fault is None
            and not compensating
            and execution.cursor.stopped in (RunStatus.CANCELLED, RunStatus.COMPENSATING)
        ):
            # compensation requested while this worker still held the lease (possibly
            # between its stop and its release above)
            _hand_over_to_compensation(run.id, token, worker_id)
        _free_limit_slots(execution)
        close_old_connections()
    if fault is not None:
        # released: retrying; not released: the failed statement may have committed the
        # run's end, or the database is still away (the lease then expires)
        return RunStatus.RETRYING if released else None
    return execution.cursor.stopped or run.status


def _free_limit_slots(execution: Execution) -> None:
    """Free the concurrency slots the execution still holds (its workflow's, or a call's
    cut short) and wake the runs waiting for them; no query when it holds none. A slot
    left behind counts only while this lease holds, so a failure here only delays the
    waiters (docs/limits.md)."""
    try:
        execution.limits.release_slots()
    except Exception as exc:  # noqa: BLE001 - the slots die with the lease anyway
        if not is_db_fault(exc):
            raise
        logger.warning(
            "durable: could not free the limit slots of run %s (%s)", execution.cursor.run_id, exc
        )


def _hand_over_to_compensation(run_id: str, token: str, worker_id: str) -> None:
    """The run was cancelled and compensated while this worker executed a step: that
    step's outcome is recorded now, so give the lease back for the compensation."""
    with transaction.atomic():
        if Run.objects.filter(pk=run_id, lease_token=token, status=RunStatus.COMPENSATING).exists():
            release(run_id, token, action="release", source=RunStatus.COMPENSATING)
            TraceEvent.objects.create(
                run_id=run_id,
                kind=EventKind.RELEASED,
                actor=worker_id,
                message="the step in flight has finished and is recorded; the compensation "
                "can start",
            )
            dispatch_on_commit(run_id)


#: seconds after which a run released by a database fault is dispatched again
DB_FAULT_RETRY_SECONDS = 1.0


def release_after_db_fault(
    run_id: str, token: str, *, worker_id: str, error: BaseException, step_id: str = ""
) -> bool:
    """Give back a run whose execution stopped on a database fault, for a retry.

    Only if this execution still holds the lease (the failed statement may have
    committed a completion, or another worker may have taken over). A running run
    becomes RETRYING, due in :data:`DB_FAULT_RETRY_SECONDS`, and is dispatched again
    on commit; a compensating run stays COMPENSATING without a lease. This is a retry
    of the *execution*, not of a step: it does not count as a lost worker (a database
    restart is not a poison step) and uses none of the step's attempts. The step that
    was in progress runs again from the top, unless it was recorded; a write whose
    operation was started is settled by the ledger (reconcile, repeat with the same
    key, or an operator's decision). Returns whether the run was released; when the
    database stays unreachable (about 4 s of retries), the lease expires and the
    sweeper recovers the run as for a lost worker. ``step_id``: the step in progress
    (without a record of its success), named by the ``db_fault`` event; ``""``: none.
    """
    during = f" during step {step_id!r}" if step_id else ""
    message = (
        f"database fault on worker {worker_id}{during}: {type(error).__name__}: "
        f"{str(error).strip()[:300]}; released, retrying from the last checkpoint"
    )

    def release_txn() -> bool:
        now = clock.now()
        with transaction.atomic():
            mine = Run.objects.filter(pk=run_id, lease_token=token)
            released = transitions.update(
                "schedule_retry",
                mine,
                source=RunStatus.RUNNING,
                updated_at=now,
                wake_at=now + timedelta(seconds=DB_FAULT_RETRY_SECONDS),
            )
            released = released or transitions.update(
                "release", mine, source=RunStatus.COMPENSATING, updated_at=now
            )
            if released:
                TraceEvent.objects.create(
                    run_id=run_id,
                    kind=EventKind.DB_FAULT,
                    step_id=step_id,
                    actor=worker_id,
                    message=message,
                )
                dispatch_on_commit(run_id, countdown=DB_FAULT_RETRY_SECONDS)
        return bool(released)

    drop_connection()  # most faults leave it unusable; a new one costs one connect
    try:
        return retry_db(release_txn, what=f"the release of run {run_id}")
    except Exception as exc:  # noqa: BLE001 - the lease expires into the recovery path
        if not is_db_fault(exc):
            raise
        logger.error(
            "durable: could not release run %s after a database fault (%s); it "
            "is recovered when its lease expires",
            run_id,
            exc,
        )
        return False


def _run_workflow(execution: Execution, spec, workflow_input, compensating: bool) -> None:
    """Run the workflow (or the compensation) to its end, a wait, or a stop."""
    try:
        if compensating:
            result = run_compensation(execution)
        else:
            if spec.limits is not None:  # max_concurrent_runs (docs/limits.md): may park
                position = execution.cursor.run.cursor_position
                execution.limits.admit(spec.limits, wait_id="limit:run", position=position)
            result = spec.fn(WorkflowContext(execution), workflow_input)
            if execution.cursor.started_children:  # parent_close_policy="wait" (children.md)
                execution.children.join_waiting()
        if execution.cursor.stopped is None:
            execution.checkpoints.complete(result)
    except (Suspend, StepFailed, NonDeterminismError, RunStopped):
        flush_at_stop(
            execution.checkpoints, execution.checkpoints.batch
        )  # batched steps still pending, if any
    except DatabaseUnavailable:
        raise
    except LeaseLost:
        logger.warning(
            "durable: worker %s lost the lease of run %s; it stops without recording anything more",
            execution.cursor.worker_id,
            execution.cursor.run_id,
        )
    except Exception as exc:  # noqa: BLE001 - user workflow code failed
        if is_db_fault(exc):  # e.g. orchestration code's own query: not the workflow's fault
            raise DatabaseUnavailable(exc) from exc
        _fail_unless_stopped(execution, exc)


#: why an exception of the workflow code itself (outside a step) fails the run for good
_WORKFLOW_RAISED = "the workflow code raised it outside a step; workflow code is not retried"


def _fail_unless_stopped(execution: Execution, exc: BaseException) -> None:
    if execution.cursor.stopped is not None:
        return
    # workflow code is not retried (only its steps are): replaying it would raise again
    info = error_info(exc, classification=PERMANENT, reason=_WORKFLOW_RAISED)
    info["traceback"] = safe_traceback(exc)
    try:
        execution.checkpoints.fail_run(info, event=EventKind.FAILED)
    except DatabaseUnavailable:
        raise
    except (RunStopped, LeaseLost):
        pass
    except Exception as fault:
        if is_db_fault(fault):  # the failure could not be recorded: the retry records it
            raise DatabaseUnavailable(fault) from fault
        raise
