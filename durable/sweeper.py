"""The sweeper: finds runs that need a worker and dispatches them, idempotently.

It runs every ``DURABLE['SWEEP_INTERVAL_SECONDS']`` from Celery beat and once at each
worker's start. Running it on many processes at once is safe: a dispatch is only a hint,
and a claim is a fenced, conditional update. ``dispatched_at`` keeps it from sending a
message every sweep for a run whose message is still queued.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from . import conf
from .dispatch import _send
from .models import Run, TraceEvent
from .waits import wake_due

logger = logging.getLogger("durable.sweeper")

BATCH = 500


def _pick(qs, limit: int = BATCH) -> list[str]:
    return list(qs.order_by().values_list("id", flat=True)[:limit])


def sweep(now=None) -> dict[str, Any]:
    """Dispatch runs whose lease expired, whose retry or timer is due, or whose dispatch
    was lost. Returns ``{"expired": n, "due": n, "timers": n, "pending": n, "run_ids": [...]}``.
    """
    now = now or timezone.now()
    stale = now - timedelta(seconds=float(conf.get("REDISPATCH_AFTER_SECONDS")))
    not_recently = Q(dispatched_at__isnull=True) | Q(dispatched_at__lt=stale)

    expired = _pick(Run.objects.expired_leases(now).filter(
        not_recently | Q(dispatched_at__lt=F("lease_expires_at"))))
    due = _pick(Run.objects.due(now).filter(not_recently | Q(dispatched_at__lt=F("wake_at"))))
    timers = _wake_due_timers(now)
    pending = _pick(Run.objects.undispatched(stale))

    run_ids = list(dict.fromkeys(expired + due + pending))  # woken timers dispatch themselves
    if run_ids:
        with transaction.atomic():
            Run.objects.filter(pk__in=run_ids).update(dispatched_at=now)
            if expired:
                TraceEvent.objects.bulk_create([
                    TraceEvent(run_id=rid, kind="lease_expired", actor="sweeper",
                               message="lease expired without a heartbeat: the worker is "
                                       "presumed lost; dispatched for recovery")
                    for rid in expired])
            if conf.get("DISPATCH") == "celery":
                for rid in run_ids:
                    transaction.on_commit(lambda rid=rid: _send(rid, None))
    result = {"expired": len(expired), "due": len(due), "timers": len(timers),
              "pending": len(pending), "run_ids": run_ids}
    if run_ids:
        logger.info("durable sweep: %s", {k: v for k, v in result.items() if k != "run_ids"})
    return result


def _wake_due_timers(now) -> list[str]:
    """Fire due timers and expire timed-out waits; return the runs to dispatch."""
    return wake_due(now)
