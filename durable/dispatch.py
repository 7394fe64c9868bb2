"""Sending "look at run X now" hints to workers. Messages are hints; the database decides."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from . import conf

logger = logging.getLogger("durable.dispatch")


def _send(run_id: str, countdown: float | None) -> None:
    from .tasks import execute_run

    try:
        if countdown and countdown > 0:
            execute_run.apply_async((run_id,), countdown=countdown)
        else:
            execute_run.apply_async((run_id,))
    except Exception:  # noqa: BLE001 - the sweeper re-dispatches; never lose the caller's work
        logger.exception("durable: could not send run %s to the broker; the sweeper will "
                         "dispatch it again", run_id)


#: a delayed hint further out than this (seconds) is not sent: brokers hold delayed
#: messages in worker memory, so long timers and retries are left to the sweeper
MAX_COUNTDOWN_SECONDS = 300.0


def dispatch_on_commit(run_id: str, *, countdown: float | None = None,
                       mark: bool = True) -> None:
    """Ask a worker to execute ``run_id`` once the current transaction commits.

    ``countdown``: seconds to wait before the worker looks (a retry's or timer's due
    time); beyond ``MAX_COUNTDOWN_SECONDS`` nothing is sent and the sweeper dispatches
    the run when it is due. ``mark``: record ``dispatched_at`` (pass False when the
    caller already set it). With ``DURABLE['DISPATCH'] == "manual"`` nothing is sent
    (tests drive execution).
    """
    if conf.get("DISPATCH") != "celery":
        return
    if countdown is not None and countdown > MAX_COUNTDOWN_SECONDS:
        return
    if mark:
        from .models import Run

        Run.objects.filter(pk=run_id).update(dispatched_at=timezone.now())
    transaction.on_commit(lambda: _send(run_id, countdown))
