"""Celery tasks: thin, by id. Celery is only the transport (docs/architecture.md#dispatch).

``CeleryDispatcher`` is the dispatch backend (``DURABLE['DISPATCH'] = "celery"``): it
lives here, with the task it sends, so that the engine never imports Celery.
"""

from __future__ import annotations

from celery import shared_task
from celery.signals import task_postrun, task_prerun, worker_init, worker_ready

from durable.dispatch import Dispatcher


@shared_task(
    name="durable.execute_run",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=0,
)
def execute_run(run_id: str) -> str | None:
    """Execute one run (claim, replay, continue) -- ``durable.worker.engine.execute``."""
    from durable.worker.engine import execute

    return execute(run_id)


class CeleryDispatcher(Dispatcher):
    """Sends a hint as an ``execute_run`` task message, delayed by ``countdown``."""

    def send(self, run_id: str, countdown: float | None) -> None:
        if countdown and countdown > 0:
            execute_run.apply_async((run_id,), countdown=countdown)
        else:
            execute_run.apply_async((run_id,))


@shared_task(name="durable.sweep", ignore_result=True, max_retries=0)
def sweep() -> dict[str, int]:
    """Re-dispatch expired leases, due retries and timers, and lost dispatches. A
    database fault (a failover, a terminated connection that looked usable a moment
    before) is retried on a fresh connection: the sweep is idempotent."""
    from durable.runtime.dbconn import retry_db
    from durable.worker.sweeper import sweep as run_sweep

    return retry_db(run_sweep, what="the sweep")


@shared_task(name="durable.tick_schedules", ignore_result=True, max_retries=0)
def tick_schedules() -> int:
    """Start the due slots of every schedule (durable/services/schedules.py); the number started."""
    from durable.runtime.dbconn import retry_db
    from durable.services.schedules import tick

    return len(retry_db(tick, what="the schedules' tick"))  # a slot starts once: idempotent


@shared_task(name="durable.prune", ignore_result=True, max_retries=0)
def prune() -> int:
    """Delete finished runs past their retention (durable/services/retention.py); runs deleted."""
    from durable.services.retention import prune as run_prune

    return int(run_prune()["runs"])


@worker_init.connect
def _discover_before_forking(sender=None, **kwargs) -> None:  # pragma: no cover - celery hook
    """The workflow modules, imported in the worker's main process before it forks its
    children (they share them), not by each child at its first run."""
    from durable.registry import ensure_discovered

    ensure_discovered()


@worker_ready.connect
def _sweep_at_worker_start(sender=None, **kwargs) -> None:  # pragma: no cover - celery hook
    sweep.delay()


@task_prerun.connect
@task_postrun.connect
def _drop_broken_connections(sender=None, task=None, **kwargs) -> None:
    """Before and after every task, as Django does around every request: close a
    connection that had an error or outlived ``CONN_MAX_AGE``, and arm the health check
    (``CONN_HEALTH_CHECKS``) of the next query. Celery's own Django fix-up does this
    only every ``CELERY_DB_REUSE_MAX`` tasks once that setting keeps connections, so
    without this a terminated connection would fail every later sweep of the worker.
    Not for eager calls: they run inside the caller's transaction.
    """
    request = getattr(task if task is not None else sender, "request", None)
    if getattr(request, "is_eager", False):
        return
    from django.db import close_old_connections, connection

    if not connection.in_atomic_block:
        close_old_connections()
        if kwargs.get("signal") is task_prerun:
            _announce_process()


_announced_pid = 0


def _announce_process() -> None:
    """Write this process's liveness row before its first task (a prefork child or a
    solo worker), so that a process that dies before its heartbeat thread's first beat
    is already known to the sweeper (``durable.worker.heartbeat``). Once per process."""
    global _announced_pid
    import os

    from durable.runtime.dbconn import is_db_fault
    from durable.worker.heartbeat import beat_process

    if _announced_pid == os.getpid():
        return
    try:
        beat_process()
    except Exception as exc:  # noqa: BLE001 - the heartbeat thread's beats follow
        if not is_db_fault(exc):
            raise
        return
    _announced_pid = os.getpid()
