"""Helpers for testing workflows in-process, without a broker or worker processes.

With ``DURABLE['DISPATCH'] = "manual"``, nothing is sent to Celery; :func:`drive`
executes a run in the calling thread until it finishes, waits, or has nothing due.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from durable import clock
from durable.models import TERMINAL, Run, RunStatus, Step, Wait, WaitKind, WaitStatus
from durable.worker.engine import execute


def due_time() -> datetime:
    """A time every executor already sees as past, to bring a scheduled retry, a step's
    next attempt or a timer forward in a test (:func:`make_due` does it for all of a
    run's scheduled times; ``Wait.objects.filter(pk=...).update(wake_at=due_time())``
    for one): the shared clock's now (:func:`durable.clock.now`, the
    database's on PostgreSQL) less a second. ``timezone.now()`` is this machine's clock:
    the shared one, read through an anchor, may be a few milliseconds behind it, and a
    retry made due "now" by it is not due yet for the executor."""
    return clock.now() - timedelta(seconds=1)


def make_due(run_id: str) -> int:
    """Bring every time ``run_id`` has scheduled forward to :func:`due_time`, as if it had
    come: the run's ``wake_at`` (a stored retry, a compensation's retry), its steps'
    ``next_attempt_at`` and its pending waits' ``wake_at`` (a timer, a wait's timeout).

    Only times that are set move: a run or a wait without a ``wake_at`` is not given one
    (that would turn a wait without a timeout into one that times out). Nothing is
    executed or woken: drive the run, and for a wait let the sweeper close it
    (``durable.waits.closing.wake_due``). Returns the number of rows moved (runs + steps
    + waits); 0 for a run that does not exist or has nothing scheduled. Raises nothing of
    its own (database errors propagate).
    """
    due = due_time()
    return (
        Run.objects.filter(pk=run_id, wake_at__isnull=False).update(wake_at=due)
        + Step.objects.filter(run_id=run_id, next_attempt_at__isnull=False).update(
            next_attempt_at=due
        )
        + Wait.objects.filter(
            run_id=run_id, status=WaitStatus.PENDING, wake_at__isnull=False
        ).update(wake_at=due)
    )


def drive(
    run_id: str,
    *,
    max_executions: int = 100,
    wait_for_retries: bool = True,
    worker_id: str = "test-worker",
) -> Run:
    """Execute ``run_id`` here until it is terminal or waiting (a compensation waiting
    for an operator included); returns the fresh Run.

    ``wait_for_retries``: sleep until a scheduled retry is due (keep retry intervals
    short in tests). Raises ``RuntimeError`` after ``max_executions`` executions.
    """
    for _ in range(max_executions):
        run = Run.objects.get(pk=run_id)
        if run.status in TERMINAL or run.status == RunStatus.WAITING:
            return run
        if (
            run.status == RunStatus.COMPENSATING
            and not run.lease_token
            and run.waits.filter(kind=WaitKind.RECONCILE, status=WaitStatus.PENDING).exists()
        ):
            return run  # the compensation waits for an operator's decision
        scheduled = run.status == RunStatus.RETRYING or (
            run.status == RunStatus.COMPENSATING and not run.lease_token and run.wake_at is not None
        )  # a compensation's retry is due at wake_at
        if scheduled:
            if not wait_for_retries:
                return run
            delay = (run.wake_at - clock.now()).total_seconds() if run.wake_at else 0
            if delay > 0:
                time.sleep(delay)
        execute(run_id, worker_id=worker_id)
    raise RuntimeError(f"run {run_id} did not settle after {max_executions} executions")
