"""Schedules: one run per slot, the catch-up policies, daylight saving time, pause/resume.

Ticks are driven with an explicit ``now`` (the database's clock otherwise); the
multi-process tests (two beats with skewed clocks, a tick killed half-way) are in
tests/processes/test_schedules_processes.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

import durable
from durable.models import Run, Schedule
from durable.services import schedules
from durable.services.schedules import ScheduleNotFound, slot_run_id, tick
from tests import schedule_workflows  # noqa: F401  (registers sched.report)

pytestmark = pytest.mark.django_db


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def declare(cron: str = "0 12 * * *", tz: str = "UTC", catchup: str = "one", at=None):
    row = durable.schedule(
        "daily", "sched.report", {"team": "ops"}, cron=cron, timezone=tz, catchup=catchup
    )
    if at is not None:  # put the next slot where the test starts
        row.next_slot_at = schedules.next_slot(cron, tz, at)
        row.save()
    return row


def runs() -> list[str]:
    return sorted(Run.objects.filter(id__startswith="schedule.daily.").values_list("id", flat=True))


# --- declaring ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": "bad name"}, "schedule name 'bad name' is not valid"),
        ({"name": "x" * 81}, "is not valid: use 1-80"),
        ({"cron": "61 * * * *"}, "cron '61 * * * *' is not valid"),
        ({"cron": "0 0 30 2 *"}, "cron '0 0 30 2 *' is not valid: Bad day-of-month"),
        ({"timezone": "Mars/Olympus"}, "timezone 'Mars/Olympus' is not a known IANA zone"),
        ({"catchup": "some"}, "catchup must be one of one, all, none, got 'some'"),
        ({"cron": "0 12 * * *\x00"}, "is not valid"),
        (
            {"cron": "*/5 * * * * *"},
            "five fields (minute hour day-of-month month day-of-week), got 6",
        ),
        ({"timezone": "UTC\x00"}, "is not a known IANA zone name"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_argument(kwargs, error):
    args = {"name": "daily", "cron": "0 12 * * *", "timezone": "UTC", "catchup": "one", **kwargs}
    name = args.pop("name")
    with pytest.raises(ValueError, match=re.escape(error)):
        durable.schedule(name, "sched.report", {}, **args)
    assert not Schedule.objects.exists()


def test_an_unknown_workflow_or_an_unstorable_input_is_refused():
    with pytest.raises(durable.WorkflowNotFound):
        durable.schedule("daily", "no.such.workflow", cron="0 12 * * *")
    with pytest.raises(durable.PayloadError):
        durable.schedule("daily", "sched.report", {"f": object()}, cron="0 12 * * *")
    assert not Schedule.objects.exists()


def test_declaring_again_keeps_the_next_slot_and_a_new_cron_moves_it():
    first = declare(at=utc(2026, 1, 1))
    assert first.next_slot_at == utc(2026, 1, 1, 12)
    again = declare()  # the same declaration at the next deploy
    assert again.pk == first.pk and again.next_slot_at == utc(2026, 1, 1, 12)
    moved = declare(cron="0 13 * * *")
    assert moved.next_slot_at > utc(2026, 1, 2) and moved.next_slot_at.hour == 13


# --- one run per slot ----------------------------------------------------------------------


def test_each_slot_starts_one_run_whose_id_names_the_slot():
    declare(at=utc(2026, 1, 1))
    assert tick(now=utc(2026, 1, 1, 11, 59)) == []
    assert tick(now=utc(2026, 1, 1, 12, 0, 3)) == ["schedule.daily.20260101T1200Z"]
    assert tick(now=utc(2026, 1, 1, 12, 0, 4)) == []  # the slot has its run
    run = Run.objects.get(pk="schedule.daily.20260101T1200Z")
    assert run.input_value() == {"team": "ops"} and run.tags == ["schedule:daily"]
    assert run.started_by_name == "schedule:daily"
    row = Schedule.objects.get(name="daily")
    assert row.next_slot_at == utc(2026, 1, 2, 12) and row.last_run_id == run.id


def test_a_tick_repeated_for_the_same_slot_starts_nothing_more():
    """What two beats (or a tick repeated after a crash) do: the run id makes it one."""
    declare(at=utc(2026, 1, 1))
    tick(now=utc(2026, 1, 1, 12, 0, 1))
    Schedule.objects.filter(name="daily").update(next_slot_at=utc(2026, 1, 1, 12))  # rewound
    assert tick(now=utc(2026, 1, 1, 12, 0, 2)) == ["schedule.daily.20260101T1200Z"]
    assert runs() == ["schedule.daily.20260101T1200Z"]


# --- missed slots -----------------------------------------------------------------------


def test_catchup_one_starts_the_latest_missed_slot_and_counts_the_rest():
    declare(cron="0 * * * *", at=utc(2026, 1, 1))
    tick(now=utc(2026, 1, 1, 5, 30))  # slots 01:00 .. 05:00 were missed
    assert runs() == ["schedule.daily.20260101T0500Z"]
    row = Schedule.objects.get(name="daily")
    assert row.skipped_slots == 4 and row.next_slot_at == utc(2026, 1, 1, 6)


def test_catchup_all_starts_every_missed_slot_a_limited_number_per_tick(settings):
    settings.DURABLE = {**settings.DURABLE, "SCHEDULE_MAX_CATCHUP": 3}
    declare(cron="0 * * * *", catchup="all", at=utc(2026, 1, 1))
    now = utc(2026, 1, 1, 5, 30)
    assert len(tick(now=now)) == 3  # 01:00, 02:00, 03:00
    assert len(tick(now=now)) == 2  # 04:00, 05:00
    assert tick(now=now) == []
    assert runs() == [slot_run_id("daily", utc(2026, 1, 1, h)) for h in range(1, 6)]
    assert Schedule.objects.get(name="daily").skipped_slots == 0


def test_catchup_none_starts_only_a_slot_within_the_grace_period(settings):
    settings.DURABLE = {**settings.DURABLE, "SCHEDULE_GRACE_SECONDS": 60}
    declare(cron="0 * * * *", catchup="none", at=utc(2026, 1, 1))
    assert tick(now=utc(2026, 1, 1, 3, 0, 59)) == ["schedule.daily.20260101T0300Z"]
    assert Schedule.objects.get(name="daily").skipped_slots == 2  # 01:00, 02:00
    assert tick(now=utc(2026, 1, 1, 4, 5)) == []  # five minutes late: skipped
    assert Schedule.objects.get(name="daily").skipped_slots == 3


def test_a_long_outage_of_a_frequent_schedule_is_walked_quickly():
    declare(cron="* * * * *", at=utc(2025, 1, 1))  # a year of minutes missed
    started = tick(now=utc(2026, 1, 1, 0, 0, 30))
    assert started == ["schedule.daily.20260101T0000Z"]
    assert Schedule.objects.get(name="daily").skipped_slots >= 10_000


# --- daylight saving time (Europe/Berlin: 29 March 2026 02:00 -> 03:00, 25 October
# 2026 03:00 -> 02:00) -----------------------------------------------------------------


def _ticks(start: datetime, hours: int) -> list[str]:
    out: list[str] = []
    for minute in range(0, hours * 60, 5):
        out += tick(now=start + timedelta(minutes=minute))
    return out


def test_a_local_time_that_does_not_exist_starts_right_after_the_change():
    declare(cron="30 2 * * *", tz="Europe/Berlin", at=utc(2026, 3, 27, 12))
    started = _ticks(utc(2026, 3, 27, 12), 62)
    # 02:30 CET = 01:30Z on the 28th; on the 29th 02:30 does not exist: 03:00 CEST = 01:00Z;
    # then 02:30 CEST = 00:30Z
    assert started == [
        "schedule.daily.20260328T0130Z",
        "schedule.daily.20260329T0100Z",
        "schedule.daily.20260330T0030Z",
    ]


def test_a_local_time_that_happens_twice_starts_once_but_hourly_runs_in_both_hours():
    declare(cron="30 2 * * *", tz="Europe/Berlin", at=utc(2026, 10, 24, 12))
    assert _ticks(utc(2026, 10, 24, 12), 40) == [
        "schedule.daily.20261025T0030Z",  # 02:30 CEST, not again at 02:30 CET
        "schedule.daily.20261026T0130Z",
    ]
    Schedule.objects.all().delete()
    Run.objects.all().delete()
    declare(cron="0 * * * *", tz="Europe/Berlin", at=utc(2026, 10, 24, 23, 30))
    assert _ticks(utc(2026, 10, 24, 23, 30), 4) == [
        "schedule.daily.20261025T0000Z",  # 02:00 CEST
        "schedule.daily.20261025T0100Z",  # 02:00 CET
        "schedule.daily.20261025T0200Z",
        "schedule.daily.20261025T0300Z",
    ]


def test_s31_a_minute_step_in_the_repeated_hour_starts_each_wall_clock_slot_once(monkeypatch):
    """S31: ``*/15 1 * * *`` in New York on 2026-11-01 (01:00-01:59 happens twice), the
    beat ticking every minute: 01:00, 01:15, 01:30, 01:45 start once, in the first pass;
    the next slot (what the pages and the API show), a resume and a catch-up in the second
    pass agree."""
    cron, tz = "*/15 1 * * *", "America/New_York"
    declare(cron=cron, tz=tz, at=utc(2026, 11, 1, 4, 30))
    started: list[str] = []
    for minute in range(150):  # 00:30 EDT to 02:00 EST, every minute
        started += tick(now=utc(2026, 11, 1, 4, 30) + timedelta(minutes=minute))
    first_pass = [
        "schedule.daily.20261101T0500Z",
        "schedule.daily.20261101T0515Z",
        "schedule.daily.20261101T0530Z",
        "schedule.daily.20261101T0545Z",
    ]
    assert started == first_pass
    assert runs() == first_pass
    tomorrow = utc(2026, 11, 2, 6)  # 01:00 EST
    assert Schedule.objects.get(name="daily").next_slot_at == tomorrow

    # paused before the change, resumed in the second pass: nothing of this night again
    schedules.pause("daily")
    monkeypatch.setattr(schedules, "db_now", lambda: utc(2026, 11, 1, 6, 20))  # 01:20 EST
    assert schedules.resume("daily").next_slot_at == tomorrow

    # a beat down from 00:50 EDT to 01:50 EST catches every slot up once
    Schedule.objects.all().delete()
    Run.objects.all().delete()
    declare(cron=cron, tz=tz, catchup="all", at=utc(2026, 11, 1, 4, 50))
    assert tick(now=utc(2026, 11, 1, 6, 50)) == first_pass
    assert Schedule.objects.get(name="daily").next_slot_at == tomorrow


# --- pause, resume, run now ----------------------------------------------------------------


def test_a_paused_schedule_starts_nothing_and_resumes_from_the_next_slot():
    declare(cron="* * * * *")
    schedules.pause("daily", by="ops")
    # paused for ten minutes: ten slots went by
    Schedule.objects.filter(name="daily").update(
        next_slot_at=datetime.now(UTC) - timedelta(minutes=10)
    )
    row = Schedule.objects.get(name="daily")
    assert row.paused and row.updated_by == "ops"
    assert tick() == [] and tick(now=datetime.now(UTC)) == []
    resumed = schedules.resume("daily")
    assert not resumed.paused
    # the slots while paused are not started: the next one is after the resume
    assert resumed.next_slot_at > datetime.now(UTC) - timedelta(seconds=1)
    assert tick() == [] and runs() == []


def test_run_now_starts_a_run_outside_the_slots_even_when_paused():
    declare()
    schedules.pause("daily")
    one, two = schedules.run_now("daily", by="ops"), schedules.run_now("daily")
    assert one.id != two.id and one.id.startswith("schedule.daily.manual.")
    assert Schedule.objects.get(name="daily").last_run_id == two.id  # the page's last run
    assert one.input_value() == {"team": "ops"} and one.started_by_name == "ops"
    with pytest.raises(ScheduleNotFound, match="schedule 'nope' does not exist"):
        schedules.run_now("nope")
    with pytest.raises(ScheduleNotFound):
        schedules.pause("nope")


def test_a_beat_whose_clock_runs_ahead_does_not_start_a_slot_early(monkeypatch):
    """On PostgreSQL a tick reads the time from the database, not from its machine."""
    from django.db import connection
    from django.utils import timezone

    if connection.vendor != "postgresql":
        pytest.skip("SQLite is a file on the beat's own machine: one clock")
    row = declare(cron="* * * * *")
    due = row.next_slot_at
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(minutes=5))
    assert due > real_now()  # not due by the database's clock, due by this process's
    assert tick() == [] and runs() == []
