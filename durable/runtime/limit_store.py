"""The shared state of limits in the database: admit a call, free its slot, slow a key.

Every decision about a key is taken under its :class:`~durable.models.Limit` row's lock
(``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's IMMEDIATE transaction holds the
database's write lock), with the database's clock on PostgreSQL, so workers on several
machines share one limit and one clock. A rate is a sliding window (the admissions of
the last period are kept on the row): no window of one period ever admits more than the
rate allows, which is what a provider's "n per period" counts -- a token bucket would
admit up to twice the rate in one window after a quiet period. A concurrency slot is a
row that counts while its run holds the lease it was taken under (see
:mod:`durable.models.limits`), so a dead worker's slot frees itself when the lease expires.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from durable import clock, postgres
from durable.dispatch import dispatch_now
from durable.limits import Limits
from durable.models.limits import Limit, LimitSlot
from durable.models.runs import Run
from durable.models.waits import Wait
from durable.vocabulary import WaitKind, WaitStatus

#: seconds added to a rate's period: the provider receives a call some milliseconds
#: after it was admitted, and not always the same number (a busy machine stalls a
#: process for tens of milliseconds), so a window exactly one period long could let the
#: provider see one call too many; 0.1 s costs a "10/s" rate a tenth of its throughput
GUARD_SECONDS = 0.1
#: a call waiting for a concurrency slot checks again at least this often (seconds): a
#: freed slot wakes the oldest waiter at once, this is the fallback
CONCURRENCY_RECHECK_SECONDS = 2.0
#: ... and those further back in the queue at most this long (seconds): each round of
#: ``concurrency`` runs ahead of it adds CONCURRENCY_RECHECK_SECONDS
MAX_RECHECK_SECONDS = 30.0
#: seconds a run woken for its turn (or due to wake) keeps its place in the queue before
#: the runs behind it may go first: a worker claims a woken run in well under a second
#: when idle, in seconds when its queue is long or its machine loaded
QUEUE_GRACE_SECONDS = 10.0
#: ``Wait.resolved_by`` of a ``limit`` wait woken for its turn, and once admitted
WOKEN_BY = "limit"
ADMITTED_BY = "limit:admitted"


@dataclass(frozen=True)
class Verdict:
    """The answer to an admission: ``admitted``; else ``until`` (when to try again, by
    the database's clock), ``delay`` (seconds from now until then) and ``reason``
    (``"rate"``, ``"concurrency"`` or ``"slowed"``)."""

    admitted: bool
    until: datetime | None = None
    reason: str = ""
    delay: float = 0.0


ADMITTED = Verdict(True)


def db_now() -> datetime:
    """Now by the database's clock on PostgreSQL (shared by every machine), else by
    this machine's (SQLite is one machine's database)."""
    return postgres.database_now(wall_clock=True) or timezone.now()


def _locked(key: str) -> Limit:
    """The key's row, locked; created on first use (two creators: one wins, both lock)."""
    row = Limit.objects.select_for_update().filter(key=key).first()
    if row is not None:
        return row
    try:
        with transaction.atomic():  # a savepoint: a concurrent creator's row wins
            Limit.objects.create(key=key)
    except IntegrityError:
        pass
    return Limit.objects.select_for_update().get(key=key)


def _live_slots(key: str, now: datetime) -> tuple[list[LimitSlot], list[int]]:
    """The key's slots whose run still holds the lease they were taken under, and the
    ids of the others (their execution ended or its worker died)."""
    live: list[LimitSlot] = []
    dead: list[LimitSlot] = []
    for slot in LimitSlot.objects.filter(key=key).select_related("run").order_by("id"):
        run: Run = slot.run
        holding = (
            run.lease_token == slot.lease_token
            and run.lease_expires_at is not None
            and run.lease_expires_at > now
        )
        (live if holding else dead).append(slot)
    return live, [s.pk for s in dead]


def queued_ahead(key: str, *, run_id: str, since: datetime | None) -> int:
    """How many runs queue for ``key`` ahead of a call that first asked at ``since``
    (``None``: asks now, behind everyone): the runs parked on a ``limit`` wait of the key
    that first asked earlier, still due to come back (their wake time less than
    :data:`QUEUE_GRACE_SECONDS` ago), and those woken for it within that grace that have
    not been admitted yet. A run that does not come back within the grace lets the runs
    behind it go first, and has its place again when it asks. Times are the shared
    clock's (:mod:`durable.clock`), as the waits' are."""
    grace = clock.now() - timedelta(seconds=QUEUE_GRACE_SECONDS)
    parked = Q(status=WaitStatus.PENDING, wake_at__gt=grace)
    woken = Q(status=WaitStatus.RESOLVED, resolved_by=WOKEN_BY, resolved_at__gt=grace)
    ahead = Wait.objects.filter(parked | woken, kind=WaitKind.LIMIT, key=key[:255])
    if since is not None:
        ahead = ahead.filter(created_at__lt=since)
    return ahead.exclude(run_id=run_id).values("run_id").distinct().count()


def acquire(
    limits: Limits,
    *,
    run_id: str,
    token: str,
    since: datetime | None = None,
    wait_id: str | None = None,
) -> tuple[Verdict, int | None]:
    """Admit one call under ``limits`` for the run's execution holding lease ``token``.

    Admission is first come, first served: ``since`` is when this call first asked (a
    parked run keeps the time of its first park across wakes; ``None`` for a call asking
    now), and a call is admitted only when the limit has room for it and for every run
    queued ahead of it (:func:`queued_ahead`), so a call arriving now never takes the turn
    of a run parked before it. ``wait_id`` is this call's ``limit`` wait, if it parked
    before: admitted, it leaves the queue.

    Returns ``(verdict, slot_id)``: when admitted, the rate's admission is recorded and,
    with a concurrency limit, a slot is taken (its id, for :func:`release`). When not,
    nothing is recorded and ``verdict.until`` says when the call may be admitted: the
    end of a 429's slow-down, the time enough admissions leave the window for this call
    and the ones ahead of it, or for a concurrency limit, first in line, the earliest of
    a holder's lease expiry and :data:`CONCURRENCY_RECHECK_SECONDS` from now, further back
    that many seconds more for each round of ``concurrency`` runs ahead (at most
    :data:`MAX_RECHECK_SECONDS`; a freed slot wakes the first in the queue at once).
    One transaction under the key's lock.
    """
    with transaction.atomic():
        row = _locked(limits.key)
        now = db_now()
        if row.slowed_until is not None and row.slowed_until > now:
            return _wait(row.slowed_until, "slowed", now), None
        ahead = queued_ahead(limits.key, run_id=run_id, since=since)
        if limits.concurrency:
            live, dead = _live_slots(limits.key, now)
            if dead:
                LimitSlot.objects.filter(pk__in=dead).delete()
            # this execution's own slots count too: a slot handed to a body that
            # outlived its timeout is held until that body ends (docs/limits.md)
            if len(live) + ahead >= limits.concurrency:
                # a freed slot wakes the first in the queue at once; the rechecks are the
                # fallback (a holder that died: its lease). The first in line recheck at
                # a holder's lease expiry and every CONCURRENCY_RECHECK_SECONDS; those
                # behind them, whom a slot reaches only after the ones ahead, less often:
                # 132 runs parked on one slot rechecking every 2 s were 66 claims a second,
                # and starved the workers (the chaos audit's 1,000 runs)
                rounds = 1 + ahead // limits.concurrency
                recheck = now + timedelta(
                    seconds=min(CONCURRENCY_RECHECK_SECONDS * rounds, MAX_RECHECK_SECONDS)
                )
                leases = [s.run.lease_expires_at for s in live if s.run.lease_expires_at]
                first_in_line = ahead < limits.concurrency
                return _wait(
                    min([*leases, recheck] if first_in_line else [recheck]), "concurrency", now
                ), None
        admitted = [float(t) for t in row.admitted or []]
        if limits.rate is not None:
            window = limits.rate.period + GUARD_SECONDS
            stamp = now.timestamp()
            admitted = [t for t in admitted if t > stamp - window]
            calls = limits.rate.calls
            free = calls - len(admitted)
            if ahead >= free:
                # the window's places come round once a window: one free now, or when
                # an admission in it leaves; the runs ahead take the first ``ahead`` of
                # them, so this call's is the next (a parked run wakes near its turn)
                places = sorted([stamp] * max(free, 0) + [t + window for t in admitted])
                turn = places[ahead % calls] + window * (ahead // calls)
                return _wait(datetime.fromtimestamp(turn, tz=UTC), "rate", now), None
            admitted.append(round(stamp, 6))
        Limit.objects.filter(pk=row.pk).update(admitted=admitted, updated_at=now)
        slot_id = None
        if limits.concurrency:
            slot_id = LimitSlot.objects.create(
                key=limits.key, run_id=run_id, lease_token=token, acquired_at=now
            ).pk
        if wait_id is not None:  # out of the queue: its turn is taken
            Wait.objects.filter(
                run_id=run_id, wait_id=wait_id[:255], kind=WaitKind.LIMIT, resolved_by=WOKEN_BY
            ).update(resolved_by=ADMITTED_BY)
    return ADMITTED, slot_id


def _wait(until: datetime, reason: str, now: datetime) -> Verdict:
    return Verdict(False, until, reason, max(0.0, (until - now).total_seconds()))


def release(key: str, slot_id: int) -> None:
    """Free a concurrency slot and wake the oldest run parked for this key's
    concurrency (its wait becomes due and its run is dispatched)."""
    deleted, _ = LimitSlot.objects.filter(pk=slot_id).delete()
    if deleted:
        wake_waiters(key, 1)


def wake_waiters(key: str, count: int) -> None:
    """Make the ``count`` oldest pending concurrency waits of ``key`` due now and
    dispatch their runs (a hint: the claim re-checks the limit)."""
    now = clock.now()  # the waits' wake_at are by the shared clock (limit_gate.py)
    waits = list(
        Wait.objects.filter(
            kind=WaitKind.LIMIT,
            key=key,
            status=WaitStatus.PENDING,
            title__startswith="waiting for concurrency",
            wake_at__gt=now,
        )
        .order_by("created_at")
        .values_list("pk", "run_id")[:count]
    )
    for pk, run_id in waits:
        if Wait.objects.filter(pk=pk, status=WaitStatus.PENDING).update(wake_at=now):
            dispatch_now(run_id)


def slow(key: str, seconds: float) -> datetime:
    """A provider answered 429 with ``Retry-After: seconds``: nobody calls under
    ``key`` before now + ``seconds`` (a later slow-down already set is kept).
    Returns the key's ``slowed_until``."""
    with transaction.atomic():
        row = _locked(key)
        until = db_now() + timedelta(seconds=seconds)
        if row.slowed_until is None or row.slowed_until < until:
            Limit.objects.filter(pk=row.pk).update(slowed_until=until)
            return until
        return row.slowed_until
