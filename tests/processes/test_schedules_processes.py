"""Schedules across processes: two beats with skewed clocks start each slot once; a tick
SIGKILLed half-way leaves nothing half-written, and the next tick starts the same slots.

Each "beat" is a real Python process calling ``durable.services.schedules.tick()`` on the test's
database; its clock is skewed by patching ``django.utils.timezone.now`` before Django
loads (what a machine whose clock is off looks like to the code).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest

import durable
from durable.models import Run, Schedule
from durable.services.schedules import tick
from tests import schedule_workflows  # noqa: F401  (registers sched.report)
from tests.harness import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

BEAT = textwrap.dedent(
    """
    import datetime, os, signal
    from django.utils import timezone
    skew = float(os.environ.get("SKEW_SECONDS", "0"))
    if skew:
        real_now = timezone.now
        timezone.now = lambda: real_now() + datetime.timedelta(seconds=skew)
    import django
    django.setup()
    import durable.client
    from durable.services import schedules
    kill_after = int(os.environ.get("KILL_AFTER_STARTS", "0"))
    if kill_after:
        original, count = durable.client.start, [0]
        def start(*args, **kwargs):
            run = original(*args, **kwargs)
            count[0] += 1
            if count[0] >= kill_after:  # inside the tick's transaction, before it commits
                os.kill(os.getpid(), signal.SIGKILL)
            return run
        durable.client.start = start
    for _ in range(int(os.environ.get("TICKS", "5"))):
        schedules.tick()
    """
)


def beat(tmp_path, **env: str) -> subprocess.Popen:
    environment = worker_env(
        tmp_path,
        DURABLE_DISPATCH="manual",
        DURABLE_WORKFLOW_MODULES="tests.schedule_workflows",
        **env,
    )
    return subprocess.Popen(
        [sys.executable, "-c", BEAT], env=environment, cwd=REPO, start_new_session=True
    )


def minutely(missed: int) -> datetime:
    """A every-minute schedule (catchup "all") whose last ``missed`` slots are due."""
    durable.schedule("minutely", "sched.report", {}, cron="* * * * *", catchup="all")
    first = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=missed)
    Schedule.objects.filter(name="minutely").update(next_slot_at=first)
    return first


def slots() -> list[datetime]:
    ids = Run.objects.filter(id__startswith="schedule.minutely.").values_list("id", flat=True)
    return sorted(
        datetime.strptime(i.rsplit(".", 1)[1], "%Y%m%dT%H%MZ").replace(tzinfo=UTC) for i in ids
    )


def assert_every_minute_once(first: datetime, at_least: int) -> None:
    got = slots()
    assert len(got) >= at_least
    assert got == [first + timedelta(minutes=i) for i in range(len(got))]  # no gap, no repeat


def test_two_beats_with_skewed_clocks_start_each_slot_once(tmp_path):
    first = minutely(missed=20)
    beats = [beat(tmp_path, SKEW_SECONDS=skew, TICKS="8") for skew in ("7", "-7")]
    for proc in beats:
        assert proc.wait(timeout=120) == 0
    assert_every_minute_once(first, at_least=20)
    row = Schedule.objects.get(name="minutely")
    assert row.next_slot_at > slots()[-1]


def test_a_tick_killed_half_way_leaves_nothing_and_the_next_tick_starts_the_same_slots(
    tmp_path,
):
    first = minutely(missed=10)
    proc = beat(tmp_path, KILL_AFTER_STARTS="3", TICKS="1")
    assert proc.wait(timeout=120) == -signal.SIGKILL
    assert slots() == []  # the three runs it started were in the tick's transaction
    assert Schedule.objects.get(name="minutely").next_slot_at == first
    tick()
    assert_every_minute_once(first, at_least=10)
