"""The sweeper: finds runs that need a worker and dispatches them, idempotently.

It runs every ``DURABLE['SWEEP_INTERVAL_SECONDS']`` from Celery beat and once at each
worker's start. Running it on many processes at once is safe: a dispatch is only a hint,
and a claim is a fenced, conditional update. ``dispatched_at`` keeps it from sending a
message every sweep for a run whose message is still queued.

**Dead workers.** A run whose lease belongs to a worker process that stopped beating
(``WorkerProcess.beat_at`` older than ``DURABLE['WORKER_DEAD_AFTER_SECONDS']``, 6 s by
default; see ``durable.worker.heartbeat``) has its lease expired at once and is recovered like
any expired lease, instead of waiting for the lease to run out (30 s by default). Only
runs whose lease was written (claimed or extended) before that same cutoff qualify: a
live process beats within ``WORKER_BEAT_SECONDS`` of claiming a run. The run keeps its
fencing token until another worker claims it, so if the process was only slow, its
next lease extension wins the race and nothing changes hands.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q

from durable import clock, conf
from durable.dispatch import dispatch_on_commit
from durable.models import Run, RunStatus, TraceEvent, WorkerProcess
from durable.vocabulary import EventKind
from durable.waits.closing import wake_due
from durable.waits.deadlines import expire_deadlines

logger = logging.getLogger("durable.sweeper")

BATCH = 500


def _pick(qs, limit: int = BATCH) -> list[str]:
    return list(qs.order_by().values_list("id", flat=True)[:limit])


def sweep(now=None) -> dict[str, Any]:
    """Dispatch runs whose lease expired, whose retry or timer is due, or whose dispatch
    was lost; fail the idle runs past their deadline (:mod:`durable.waits.deadlines`).
    Returns ``{"expired": n, "orphaned": n, "deadlines": n, "due": n, "timers": n,
    "pending": n, "run_ids": [...]}`` (``run_ids``: the runs dispatched).
    """
    now = now or clock.now()
    deadlines = expire_deadlines(now)  # first: a run past its deadline is not dispatched
    stale = now - timedelta(seconds=float(conf.get("REDISPATCH_AFTER_SECONDS")))
    not_recently = Q(dispatched_at__isnull=True) | Q(dispatched_at__lt=stale)

    orphaned = _expire_leases_of_dead_processes(now)
    expired = _pick(
        Run.objects.expired_leases(now).filter(
            not_recently | Q(dispatched_at__lt=F("lease_expires_at"))
        )
    )
    due = _pick(Run.objects.due(now).filter(not_recently | Q(dispatched_at__lt=F("wake_at"))))
    timers = _wake_due_timers(now)
    pending = _not_backed_off(Run.objects.undispatched(stale), now)

    run_ids = list(dict.fromkeys(expired + due + pending))  # woken timers dispatch themselves
    if run_ids:
        with transaction.atomic():
            run_ids = _unlocked(run_ids)
            expired = [rid for rid in expired if rid in run_ids]
            Run.objects.filter(pk__in=run_ids).update(dispatched_at=now)
            if expired:
                TraceEvent.objects.bulk_create(
                    [
                        TraceEvent(
                            run_id=rid,
                            kind=EventKind.LEASE_EXPIRED,
                            actor="sweeper",
                            message="lease expired without a heartbeat: the worker is "
                            "presumed lost; dispatched for recovery",
                        )
                        for rid in expired
                        if rid not in orphaned
                    ]
                )
            for rid in run_ids:
                dispatch_on_commit(rid, mark=False)  # marked above, with the others
    result = {
        "expired": len(expired),
        "orphaned": len(orphaned),
        "deadlines": len(deadlines),
        "due": len(due),
        "timers": len(timers),
        "pending": len(pending),
        "run_ids": run_ids,
    }
    if run_ids or deadlines:
        logger.info("durable sweep: %s", {k: v for k, v in result.items() if k != "run_ids"})
    return result


#: a pending run is dispatched again at most this many REDISPATCH_AFTER_SECONDS apart
REDISPATCH_BACKOFF_CAP = 10


def _not_backed_off(qs, now) -> list[str]:
    """Of the undispatched runs ``qs``, those due for another dispatch, oldest dispatch
    first: each dispatch waits at least as long as the run had waited before it (5 s,
    10 s, 20 s ... after the first; at most REDISPATCH_BACKOFF_CAP x
    REDISPATCH_AFTER_SECONDS). A pending run's message is most often still queued behind
    a backlog: sent again every REDISPATCH_AFTER_SECONDS, 600 pending runs added 100
    messages a second to a queue the workers drained slower, and the real work sat behind
    the copies (the 1,000-run chaos audit). A lost message is still sent again, later."""
    after = float(conf.get("REDISPATCH_AFTER_SECONDS"))
    cap = timedelta(seconds=after * REDISPATCH_BACKOFF_CAP)
    rows = qs.order_by("dispatched_at").values_list("id", "created_at", "dispatched_at")
    picked = []
    for run_id, created_at, dispatched_at in rows[: BATCH * 4]:
        if dispatched_at is not None:
            waited = min(max(dispatched_at - created_at, timedelta(seconds=after)), cap)
            if now - dispatched_at < waited:
                continue
        picked.append(run_id)
        if len(picked) >= BATCH:
            break
    return picked


def _unlocked(run_ids: list[str]) -> list[str]:
    """Those of ``run_ids`` whose rows no other transaction holds, now locked by this one
    (in their order). A row stays locked by a session whose worker host was cut off
    mid-transaction until the server's keepalive ends it (docs/production.md#database-connections);
    waiting for it would stall every other run's recovery, and no claim can take that run
    meanwhile, so it is left to a later sweep. On SQLite (one writer) every row is free.
    """
    if not connection.features.has_select_for_update_skip_locked:
        return run_ids
    free = set(
        Run.objects.filter(pk__in=run_ids)
        .select_for_update(skip_locked=True)
        .values_list("id", flat=True)
    )
    return [rid for rid in run_ids if rid in free]


def _wake_due_timers(now) -> list[str]:
    """Fire due timers and expire timed-out waits; return the runs to dispatch."""
    return wake_due(now)


#: liveness rows silent for longer than this (seconds) are deleted
FORGET_PROCESSES_AFTER_SECONDS = 3600.0


def _expire_leases_of_dead_processes(now) -> set[str]:
    """Expire the leases held by worker processes presumed dead; return those runs.

    Each gets an ``owner_dead`` trace event naming the process and its last beat.
    """
    cutoff = now - timedelta(seconds=conf.worker_dead_after_seconds())
    dead = dict(
        WorkerProcess.objects.silent_since(cutoff)
        .order_by("beat_at")
        .values_list("id", "beat_at")[:100]
    )
    if not dead:
        return set()
    owners = Q()
    for key in dead:
        owners |= Q(lease_owner__startswith=f"{key}:")
    # written before the cutoff: lease_expires_at = written + LEASE_SECONDS
    qs = Run.objects.filter(
        owners,
        status__in=(RunStatus.RUNNING, RunStatus.COMPENSATING),
        lease_expires_at__gte=now,
        lease_expires_at__lt=cutoff + timedelta(seconds=conf.lease_seconds()),
    ).exclude(lease_token="")
    rows = list(qs.order_by().values_list("id", "lease_owner")[:BATCH])
    orphaned: set[str] = set()
    if rows:
        with transaction.atomic():
            unlocked = set(_unlocked([rid for rid, _ in rows]))
            rows = [(rid, owner) for rid, owner in rows if rid in unlocked]
            # the same conditions again, in the UPDATE: a run claimed meanwhile is kept
            qs.filter(pk__in=[rid for rid, _ in rows]).update(
                lease_expires_at=now - timedelta(microseconds=1)
            )
            orphaned = set(
                qs.model.objects.filter(pk__in=[rid for rid, _ in rows], lease_expires_at__lt=now)
                .exclude(lease_token="")
                .values_list("id", flat=True)
            )
            events = []
            for rid, owner in rows:
                if rid not in orphaned:
                    continue
                key = owner.rsplit(":", 1)[0]
                beat = dead.get(key)
                events.append(
                    TraceEvent(
                        run_id=rid,
                        kind=EventKind.OWNER_DEAD,
                        actor="sweeper",
                        message=f"worker process {key} has not beaten since "
                        f"{beat.isoformat() if beat else '?'} (presumed dead after "
                        f"{conf.worker_dead_after_seconds():g} s): its lease is released "
                        "for recovery",
                    )
                )
            TraceEvent.objects.bulk_create(events)
    WorkerProcess.objects.silent_since(
        now - timedelta(seconds=FORGET_PROCESSES_AFTER_SECONDS)
    ).delete()
    return orphaned
