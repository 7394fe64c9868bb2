"""Schedules: start a workflow at every slot of a cron expression, exactly once per slot.

``durable.schedule("daily-report", "reports.daily", {"team": "ops"}, cron="0 12 * * *",
timezone="Europe/Berlin")`` declares (or updates) a :class:`~durable.models.Schedule`;
the beat's ``durable.tick_schedules`` task (every ``DURABLE_SCHEDULE_TICK_SECONDS``,
default 5 s) calls :func:`tick`, which starts each due slot's run.

Exactly one run per slot. The run id is ``schedule.<name>.<slot in UTC, YYYYMMDDTHHMMZ>``:
``durable.start`` is idempotent on the run id, so two beat processes that tick at once
(or a tick repeated after a crash) start one run. A tick takes its time from the
database (``statement_timestamp()`` on PostgreSQL), so the beat machines' clocks may
disagree by any amount without starting a slot early or twice. The slot's start and the
schedule's next slot commit in one transaction: a tick killed half-way leaves both as
they were, and the next tick starts the same slot under the same run id.

Time zones and daylight saving time follow Debian's cron (the field arithmetic is
``cronsim``'s, https://github.com/cuu508/cronsim, on the wall clock; :func:`next_slot`
maps wall times to instants): a slot whose local time does not exist (02:30 on the night
clocks go forward) starts right after the change (03:00); a local time that happens twice
(clocks go back) starts once, at its first occurrence, for every shape of the minute field
(``*/15 1 * * *`` too); only expressions whose hour field is every hour (``*``) run by the
clock as it passes, in both passes of a repeated hour and not in a skipped one.

Missed slots (no beat ran, e.g. during a deploy; or a tick that found several slots due):
``catchup="one"`` (default) starts the latest missed slot and counts the others as
skipped; ``"all"`` starts every missed slot (at most ``DURABLE_SCHEDULE_MAX_CATCHUP`` per
tick, default 100; the rest on the next ticks); ``"none"`` starts a slot only if it is at
most ``DURABLE_SCHEDULE_GRACE_SECONDS`` (default 60) late. A paused schedule starts
nothing; resuming it starts from the next slot after the resume (slots while paused are
not caught up). A run still going when the next slot comes does not stop that slot.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.db import transaction
from django.utils import timezone as dj_timezone

from durable import conf, postgres, registry
from durable.exceptions import RunInputConflict, ScheduleNotFound, WorkflowNotFound
from durable.models import Run, Schedule
from durable.services.base import actor_of
from durable.values import codec
from durable.values.redaction import check_identifier
from durable.vocabulary import Catchup

__all__ = [
    "ScheduleNotFound",
    "check_name",
    "db_now",
    "next_slot",
    "pause",
    "resume",
    "run_now",
    "schedule",
    "slot_run_id",
    "tick",
]

log = logging.getLogger("durable.services.schedules")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
#: slots a "one"/"none" tick walks before it jumps close to now (a long outage of a
#: frequent schedule); the skipped count is then a lower bound
_WALK_LIMIT = 10_000


# --- slots ------------------------------------------------------------------------------


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(
            f"timezone {name!r} is not a known IANA zone name (e.g. 'UTC', 'Europe/Berlin')"
        ) from None


def next_slot(cron: str, tz: str, after: datetime) -> datetime:
    """The first slot of ``cron`` in zone ``tz`` strictly after ``after`` (aware), in UTC.

    Daylight saving time follows Debian's cron (docs/schedules.md#daylight-saving-time):
    an expression whose hour field matches every hour (``*``, ``*/1``, ``0-23``) runs by
    the clock as it passes -- in both passes of a repeated hour, not in a skipped one;
    any other expression starts each wall-clock slot once, whatever the shape of its
    fields (lists, ranges, steps): a time that happens twice at its first occurrence, a
    time that does not exist at the first instant after the change.

    Raises ``ValueError`` naming the problem for a malformed expression, an unknown zone
    or an expression that never fires (``0 0 30 2 *``).
    """
    zone = _zone(tz)
    fields = str(cron).split()
    if len(fields) != 5:  # cronsim also reads a sixth, seconds field: slots are minutes here
        raise ValueError(
            f"cron {cron!r} is not valid: five fields (minute hour day-of-month month "
            f"day-of-week), got {len(fields)}"
        )
    try:
        # the wall-clock slots, from the wall time of ``after``: cronsim on a naive
        # datetime walks the local calendar and knows nothing of the zone's changes
        wall = CronSim(str(cron), after.astimezone(zone).replace(tzinfo=None))
        if wall.hours != set(range(24)):
            return _first_instant_after(wall, zone, after)
        return _by_the_clock(str(cron), zone, after)
    except CronSimError as exc:
        raise ValueError(f"cron {cron!r} is not valid: {exc}") from None
    except StopIteration:
        raise ValueError(f"cron {cron!r} never fires") from None


def _first_instant_after(wall: CronSim, zone: ZoneInfo, after: datetime) -> datetime:
    """The first wall-clock slot of ``wall`` whose first instant is after ``after`` (UTC).

    ``after`` may be in the second pass of a repeated hour: the slots of that hour whose
    first occurrence has passed are skipped, not started again.
    """
    while True:
        slot = next(wall)
        instant = _first_instant(slot, zone)
        if instant > after:
            return instant


def _by_the_clock(cron: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The first instant after ``after`` (UTC) whose local time is a slot of ``cron``.

    Walks the time line in stretches of one offset: within one, local time is UTC plus
    the offset, so the first slot is cronsim's; a stretch that ends before it (the clocks
    change) is left at the change. Assumes a zone changes its offset at most once a day.
    """
    at = after.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    while True:
        offset = at.astimezone(zone).utcoffset()
        assert offset is not None
        local = (at + offset).replace(tzinfo=None) - timedelta(seconds=1)
        candidate = next(CronSim(cron, local)).replace(tzinfo=UTC) - offset
        end = min(candidate, at + timedelta(days=1))
        if end.astimezone(zone).utcoffset() == offset:
            if end == candidate:
                return candidate
            at = end  # no slot within a day of one offset: go on from there
            continue
        # the offset changes before the slot: go on from the first minute of the new one
        lo, hi = at, end
        while hi - lo > timedelta(minutes=1):
            mid = lo + timedelta(minutes=(hi - lo) // timedelta(minutes=2))
            lo, hi = (mid, hi) if mid.astimezone(zone).utcoffset() == offset else (lo, mid)
        at = hi


def _first_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first instant (UTC) at which the naive local time ``wall`` shows, or, for a time
    the clocks skip, the first instant after the change."""
    while True:
        instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == wall:
            return instant
        wall += timedelta(minutes=1)  # skipped: the first minute that exists comes next


def slot_run_id(name: str, slot: datetime) -> str:
    """The run id of ``name``'s slot ``slot``: ``schedule.<name>.<YYYYMMDDTHHMMZ>``."""
    return f"schedule.{name}.{slot.astimezone(UTC):%Y%m%dT%H%MZ}"


def db_now() -> datetime:
    """Now, by the database's clock (one clock for every beat process)."""
    now = postgres.database_now()
    return now.astimezone(UTC) if now is not None else dj_timezone.now()


# --- declaring and operating ------------------------------------------------------------


def check_name(name: Any) -> str:
    """``name`` if it is a valid schedule name; else ``ValueError`` saying what is allowed."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"schedule name {name!r} is not valid: use 1-80 letters, digits, '.', '_' and "
            "'-', starting with a letter or digit"
        )
    check_identifier(name, "schedule name")
    return name


def schedule(
    name: str,
    workflow_name: str,
    input: Any = None,
    *,
    cron: str,
    timezone: str = "UTC",
    catchup: str = Catchup.LATEST,
    by: Any = None,
) -> Schedule:
    """Create or update the schedule ``name``: start ``workflow_name`` with ``input`` at
    every slot of ``cron`` (five fields, minute resolution) in ``timezone``.

    Idempotent: declaring the same schedule again (e.g. at every deploy) keeps its next
    slot; changing ``cron`` or ``timezone`` moves it to the first slot after now. A paused
    schedule stays paused. Returns the row.

    Raises ``ValueError`` naming the argument (name: 1-80 letters, digits, ``.``, ``_``,
    ``-``; cron; timezone; catchup), :class:`~durable.WorkflowNotFound` for a workflow
    this process has not registered, :class:`~durable.PayloadError` for an input that
    cannot be stored.
    """
    check_name(name)
    if catchup not in Catchup.values:
        raise ValueError(f"catchup must be one of {', '.join(Catchup.values)}, got {catchup!r}")
    spec = registry.get_workflow(workflow_name)
    input_text = codec.dumps_checked(input, what="schedule input")
    actor = actor_of(by)
    with transaction.atomic():
        now = db_now()
        first = next_slot(cron, timezone, now)  # validates cron and zone
        row = Schedule.objects.select_for_update().filter(name=name).first()
        fields: dict[str, Any] = {
            "workflow_name": spec.name,
            "input": input_text,
            "catchup": str(catchup),
            "updated_by": actor,
        }
        if row is None:
            row = Schedule.objects.create(
                name=name, cron=cron, timezone=timezone, next_slot_at=first, **fields
            )
            return row
        if (row.cron, row.timezone) != (cron, timezone) or row.next_slot_at is None:
            fields.update(cron=cron, timezone=timezone, next_slot_at=first)
        for key, value in fields.items():
            setattr(row, key, value)
        row.save()
    return row


def _get(name: str) -> Schedule:
    row = Schedule.objects.select_for_update().filter(name=name).first()
    if row is None:
        raise ScheduleNotFound(name)
    return row


def pause(name: str, *, by: Any = None) -> Schedule:
    """Stop starting runs of ``name`` until :func:`resume`. Raises :class:`ScheduleNotFound`."""
    actor = actor_of(by)
    with transaction.atomic():
        row = _get(name)
        row.paused, row.updated_by = True, actor
        row.save(update_fields=["paused", "updated_by", "updated_at"])
    return row


def resume(name: str, *, by: Any = None) -> Schedule:
    """Start ``name`` again from its first slot after now (slots while paused are not
    caught up). Raises :class:`ScheduleNotFound`."""
    actor = actor_of(by)
    with transaction.atomic():
        row = _get(name)
        if row.paused:
            row.paused = False
            row.next_slot_at = next_slot(row.cron, row.timezone, db_now())
        row.updated_by = actor
        row.save(update_fields=["paused", "next_slot_at", "updated_by", "updated_at"])
    return row


def run_now(name: str, *, by: Any = None) -> Run:
    """Start one run of ``name`` now, outside its slots (a paused schedule too).

    Its run id is ``schedule.<name>.manual.<12 hex digits>``. Raises
    :class:`ScheduleNotFound`, :class:`~durable.WorkflowNotFound`.
    """
    from durable.client import start

    actor_of(by)  # the same limits as every operator action
    row = Schedule.objects.filter(name=name).first()
    if row is None:
        raise ScheduleNotFound(name)
    run = start(
        row.workflow_name,
        codec.decode(row.input),
        f"schedule.{name}.manual.{uuid.uuid4().hex[:12]}",
        tags=[f"schedule:{name}"],
        started_by=by if by is not None else f"schedule:{name}",
    )
    Schedule.objects.filter(pk=row.pk).update(last_run_id=run.id)  # the page's "last run"
    return run


# --- the tick ---------------------------------------------------------------------------


def _due_slots(row: Schedule, now: datetime) -> tuple[list[datetime], int]:
    """The slots of ``row`` to start at ``now`` and how many due slots are skipped."""
    limit = int(conf.get("SCHEDULE_MAX_CATCHUP"))
    assert row.next_slot_at is not None
    slot = row.next_slot_at
    due: list[datetime] = []
    jumped = False
    while slot <= now:
        due.append(slot)
        if row.catchup == Catchup.ALL and len(due) >= limit:
            break
        if len(due) >= _WALK_LIMIT and not jumped:  # a long outage: jump close to now
            jumped, skipped_so_far = True, len(due)
            due = []
            slot = next_slot(row.cron, row.timezone, now - timedelta(days=2))
            row.skipped_slots += skipped_so_far
            continue
        slot = next_slot(row.cron, row.timezone, slot)
    if row.catchup == Catchup.ALL:
        return due, 0
    if row.catchup == Catchup.LATEST:
        return due[-1:], max(len(due) - 1, 0)
    grace = timedelta(seconds=float(conf.get("SCHEDULE_GRACE_SECONDS")))
    kept = [s for s in due if now - s <= grace]
    return kept, len(due) - len(kept)


def _tick_one(pk: int, now: datetime) -> list[str]:
    from durable.client import start

    started: list[str] = []
    with transaction.atomic():
        row = (
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(pk=pk, paused=False, next_slot_at__lte=now)
            .first()
        )
        if row is None:  # another beat holds it, or it was paused or already advanced
            return started
        slots, skipped = _due_slots(row, now)
        input_value = codec.decode(row.input)
        for slot in slots:
            run_id = slot_run_id(row.name, slot)
            try:
                start(
                    row.workflow_name,
                    input_value,
                    run_id,
                    tags=[f"schedule:{row.name}"],
                    started_by=f"schedule:{row.name}",
                )
            except RunInputConflict:
                pass  # the slot has its run (started before the input was changed)
            except WorkflowNotFound as exc:
                log.error("schedule %s: %s; slot %s not started", row.name, exc, slot)
                skipped += 1
                continue
            started.append(run_id)
            row.last_run_id = run_id
        if slots:
            row.last_slot_at = max(slots)
        row.skipped_slots += skipped
        # "all" may have stopped at its per-tick limit: go on from its last slot; the
        # other policies dealt with every due slot, so the next one is after now
        after = max(slots) if row.catchup == Catchup.ALL and slots else now
        row.next_slot_at = next_slot(row.cron, row.timezone, after)
        row.save(update_fields=["last_slot_at", "last_run_id", "skipped_slots", "next_slot_at"])
    return started


def tick(*, now: datetime | None = None) -> list[str]:
    """Start every due slot of every schedule that is not paused; return the run ids.

    ``now`` (aware) is for tests; by default the database's clock. Safe to call from
    several processes at once (see the module docstring).
    """
    now = now or db_now()
    due = list(
        Schedule.objects.filter(paused=False, next_slot_at__lte=now)
        .order_by("next_slot_at")
        .values_list("pk", flat=True)[:500]
    )
    started: list[str] = []
    for pk in due:
        started += _tick_one(pk, now)
    return started
