"""Celery tasks: thin, by id (CONVENTIONS.md). Celery is only the transport."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_ready


@shared_task(name="durable.execute_run", acks_late=True, reject_on_worker_lost=True,
             ignore_result=True, max_retries=0)
def execute_run(run_id: str) -> str | None:
    """Execute one run (claim, replay, continue) -- ``durable.engine.execute``."""
    from .engine import execute

    return execute(run_id)


@shared_task(name="durable.sweep", ignore_result=True, max_retries=0)
def sweep() -> dict[str, int]:
    """Re-dispatch expired leases, due retries and timers, and lost dispatches."""
    from .sweeper import sweep as run_sweep

    return run_sweep()


@worker_ready.connect
def _sweep_at_worker_start(sender=None, **kwargs) -> None:  # pragma: no cover - celery hook
    sweep.delay()
