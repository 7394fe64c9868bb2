"""Capabilities 4, 6 and 10: retention keeps a child that an active fork of its parent
may still read (docs/retention-and-audit.md "What is never pruned"); the beat starts
each wall-clock slot once across DST changes (docs/schedules.md "Daylight saving
time"), end to end through ``tick``; identifiers and names with characters that do not
show as themselves are refused (docs/security.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import durable
from durable.exceptions import InvalidIdentifier
from durable.models import Run, RunStatus, Schedule
from durable.services import retention
from durable.services import schedules as sched
from durable.testing import drive
from tests.api.conftest import api_for
from tests.dashboard.conftest import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


# --- retention ---------------------------------------------------------------------------


def test_a_finished_child_is_kept_while_an_active_fork_of_its_parent_may_read_it():
    """ "Manual run deletion can destroy surviving retry work"
    (https://github.com/vekexasia/pi-extensible-workflows/issues/263: deleting a failed
    parent removed what its surviving retry needed) and gascity "retention deletes a
    workflow root without checking for live descendant steps"
    (https://github.com/gastownhall/gascity/issues/5834). A parent and its child have
    finished; the parent is forked (the fork, unfinished, may still read the child's
    end). A prune must keep the parent and the child until the fork is done."""
    parent = drive(durable.start("acceptance.parent_child_fork", {}).id)
    child_id = f"{parent.id}.kid"
    assert parent.status == RunStatus.WAITING
    assert drive(child_id).status == RunStatus.SUCCEEDED
    parent = drive(parent.id)
    assert parent.status == RunStatus.SUCCEEDED, parent.error
    fork = durable.fork(parent.id, from_step="after", by="ops")
    assert fork.status == RunStatus.PENDING

    report = retention.prune(older_than=0)
    assert report["runs"] == 0, report
    assert Run.objects.filter(pk__in=[parent.id, child_id, fork.id]).count() == 3
    assert retention.why_kept(Run.objects.get(pk=child_id))
    assert retention.why_kept(Run.objects.get(pk=parent.id))

    done = drive(fork.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert done.output_value()["child"] == {"n": 1}
    assert retention.prune(older_than=0)["runs"] == 3
    assert not Run.objects.filter(pk__in=[parent.id, child_id, fork.id]).exists()


def test_a_fork_from_the_parents_wait_child_step_reads_the_parents_child():
    """The premise of the retention rule "an active fork of its parent ... may still
    read its end" (docs/retention-and-audit.md) and of Temporal's reset/"fork" users
    (https://github.com/dbos-inc/dbos-transact-golang/pull/120: "forked workflow ID
    generation ... not idempotent"): a fork that starts at the parent's ``wait_child``
    step reuses the recorded ``start_child`` and waits on that same child, which has
    ended: it gets the child's result. No prune involved."""
    from durable.models import Step

    parent = drive(durable.start("acceptance.parent_child_fork", {}).id)
    child_id = f"{parent.id}.kid"
    assert drive(child_id).status == RunStatus.SUCCEEDED
    assert drive(parent.id).status == RunStatus.SUCCEEDED
    wait_step = (
        Step.objects.filter(run_id=parent.id, step_id__startswith="wait:")
        .values_list("step_id", flat=True)
        .get()
    )
    fork = durable.fork(parent.id, from_step=wait_step, by="ops")
    done = drive(fork.id)
    assert done.status == RunStatus.SUCCEEDED, (done.error_type, done.error)
    assert done.output_value()["child"] == {"n": 1}


def test_a_fork_of_a_fork_from_the_wait_child_step_reads_the_grandparents_child():
    """Control for the next test, no prune: P2, a fork of P1 (itself a fork of P) from
    the ``wait_child`` step, waits on P's child and gets its result (the engine follows
    the fork lineage, durable/waits/child_ends.py)."""
    from durable.models import Step

    parent = drive(durable.start("acceptance.parent_child_fork", {}).id)
    assert drive(f"{parent.id}.kid").status == RunStatus.SUCCEEDED
    assert drive(parent.id).status == RunStatus.SUCCEEDED
    first = durable.fork(parent.id, from_step="after", by="ops")
    assert drive(first.id).status == RunStatus.SUCCEEDED
    wait_step = (
        Step.objects.filter(run_id=first.id, step_id__startswith="wait:")
        .values_list("step_id", flat=True)
        .get()
    )
    second = durable.fork(first.id, from_step=wait_step, by="ops")
    done = drive(second.id)
    assert done.status == RunStatus.SUCCEEDED, (done.error_type, done.error)
    assert done.output_value()["child"] == {"n": 1}


def test_a_finished_child_is_kept_while_a_fork_of_a_fork_of_its_parent_waits_on_it():
    """Same reports (https://github.com/vekexasia/pi-extensible-workflows/issues/263: a
    retry of a retry borrows what its ancestor made). The parent P and its child C have
    finished; P is forked (P1, finished), and P1 is forked again (P2) from P1's
    ``wait_child`` step, so P2 will read C's end anew. The docs keep "a child whose
    parent, or an active fork of its parent, is unfinished"; P2 is a fork of the
    parent's fork and reads the same child: a prune must not delete C, or P2 fails with
    ``ChildRunMissing``."""
    from durable.models import Step

    parent = drive(durable.start("acceptance.parent_child_fork", {}).id)
    child_id = f"{parent.id}.kid"
    assert drive(child_id).status == RunStatus.SUCCEEDED
    assert drive(parent.id).status == RunStatus.SUCCEEDED
    first = durable.fork(parent.id, from_step="after", by="ops")
    assert drive(first.id).status == RunStatus.SUCCEEDED
    wait_step = (
        Step.objects.filter(run_id=first.id, step_id__startswith="wait:")
        .values_list("step_id", flat=True)
        .get()
    )
    second = durable.fork(first.id, from_step=wait_step, by="ops")
    assert second.status == RunStatus.PENDING

    retention.prune(older_than=0)
    kept = Run.objects.filter(pk=child_id).exists()
    done = drive(second.id)
    assert kept, (
        "the child was pruned while a fork of its parent's fork still waits on it; the "
        f"fork then ended {done.status}: {done.error_type}: {(done.error or {}).get('message')}"
    )
    assert done.status == RunStatus.SUCCEEDED, (done.error_type, done.error)
    assert done.output_value()["child"] == {"n": 1}


# --- DST through the beat's tick --------------------------------------------------------------


def _declare(name: str, cron: str, zone: str, start: datetime, catchup: str = "all") -> None:
    sched.schedule(name, "acceptance.echo", {}, cron=cron, timezone=zone, catchup=catchup)
    Schedule.objects.filter(name=name).update(next_slot_at=sched.next_slot(cron, zone, start))


def _started(name: str) -> list[str]:
    return sorted(
        Run.objects.filter(id__startswith=f"schedule.{name}.").values_list("id", flat=True)
    )


def _tick_every(minutes: int, start: datetime, end: datetime) -> None:
    now = start
    while now <= end:
        sched.tick(now=now)
        now += timedelta(minutes=minutes)


def test_the_beat_starts_a_daily_slot_once_on_the_fall_back_day():
    """go-cron "CronJob executes twice during DST fall back"
    (https://github.com/netresearch/go-cron/issues/349) and kandev "stop DST fall-back
    from firing automations twice" (https://github.com/kdlbs/kandev/pull/3490).
    ``30 1 * * *`` in New York, the beat ticking every 5 minutes from 2026-10-31 to
    2026-11-02: one run a day, and on 2026-11-01 at the first 01:30 (EDT, 05:30Z),
    not again at 01:30 EST (06:30Z)."""
    _declare("acc-fall", "30 1 * * *", "America/New_York", datetime(2026, 10, 31, 0, tzinfo=UTC))
    _tick_every(5, datetime(2026, 10, 31, 0, tzinfo=UTC), datetime(2026, 11, 2, 23, tzinfo=UTC))
    assert _started("acc-fall") == [
        "schedule.acc-fall.20261031T0530Z",
        "schedule.acc-fall.20261101T0530Z",
        "schedule.acc-fall.20261102T0630Z",
    ]


def test_the_beat_starts_a_skipped_slot_once_right_after_the_spring_change():
    """Temporal "Improve DST handling in schedules"
    (https://github.com/temporalio/temporal/issues/8205: a cron "might run zero, one, or
    two times in a day"). ``30 2 * * *`` in New York: 2026-03-08 02:30 does not exist;
    the beat starts it once, at 03:00 EDT (07:00Z)."""
    _declare("acc-spring", "30 2 * * *", "America/New_York", datetime(2026, 3, 7, 0, tzinfo=UTC))
    _tick_every(5, datetime(2026, 3, 7, 0, tzinfo=UTC), datetime(2026, 3, 9, 23, tzinfo=UTC))
    assert _started("acc-spring") == [
        "schedule.acc-spring.20260307T0730Z",
        "schedule.acc-spring.20260308T0700Z",
        "schedule.acc-spring.20260309T0630Z",
    ]


def test_a_catch_up_across_the_repeated_hour_starts_each_wall_clock_slot_once():
    """hermes-agent "a next-run computed inside the DST fall-back hour is never in the
    past" (https://github.com/NousResearch/hermes-agent/pull/109532: re-fire inside the
    repeated hour). The beat is down from 04:00Z to 08:00Z on 2026-11-01 (both passes of
    New York's 01:00-02:00), ``*/15 1 * * *`` with catchup ``all``: the catch-up starts
    01:00, 01:15, 01:30, 01:45 EDT once each (docs/schedules.md's own example), none in
    EST (the tick inside the second pass, 01:20 EST, does the catch-up; the next tick
    after it starts nothing more)."""
    name = "acc-catchup"
    _declare(name, "*/15 1 * * *", "America/New_York", datetime(2026, 11, 1, 3, tzinfo=UTC))
    sched.tick(now=datetime(2026, 11, 1, 4, 0, tzinfo=UTC))
    assert _started(name) == []
    sched.tick(now=datetime(2026, 11, 1, 6, 20, tzinfo=UTC))  # 01:20 EST, the second pass
    sched.tick(now=datetime(2026, 11, 1, 8, 0, tzinfo=UTC))
    assert _started(name) == [
        f"schedule.{name}.20261101T0500Z",
        f"schedule.{name}.20261101T0515Z",
        f"schedule.{name}.20261101T0530Z",
        f"schedule.{name}.20261101T0545Z",
    ]


# --- identifiers -------------------------------------------------------------------------------

#: Cf / Zl characters the docs name (bidi overrides and isolates, zero-width, separators)
NAMED = {
    "RLO U+202E": "\u202e",
    "LRI U+2066": "\u2066",
    "ZWSP U+200B": "\u200b",
    "WORD JOINER U+2060": "\u2060",
    "BOM U+FEFF": "\ufeff",
    "LINE SEPARATOR U+2028": "\u2028",
    "TAG A U+E0041": "\U000e0041",
}
#: default-ignorable characters outside Cc/Cf/Zl/Zp that render as nothing either
#: (Unicode's Default_Ignorable_Code_Point): zero-width or blank, they do not show as
#: themselves, the property the docs refuse
IGNORABLE = {
    "COMBINING GRAPHEME JOINER U+034F": "\u034f",
    "VARIATION SELECTOR-16 U+FE0F": "\ufe0f",
    "HANGUL FILLER U+3164": "\u3164",
}


def _what(run) -> str:
    return f"{run.status} {run.error_type}: {(run.error or {}).get('message', '')[:160]}"


def _surfaces(hidden: str) -> dict[str, object]:
    """What each surface did with ``invoice<hidden>fdp-exe``: 'refused' or a value."""
    name = f"invoice{hidden}fdp-exe"
    seen: dict[str, object] = {}
    try:
        durable.start("acceptance.echo", {}, tags=[name])
        seen["tag"] = "accepted"
    except InvalidIdentifier:
        seen["tag"] = "refused"
    try:
        durable.start("acceptance.echo", {}, started_by=name)
        seen["started_by"] = "accepted"
    except InvalidIdentifier:
        seen["started_by"] = "refused"
    waiting = drive(durable.start("acceptance.signal", {}).id)
    try:
        durable.signal(waiting.id, name, {})
        seen["signal name"] = "accepted"
    except InvalidIdentifier:
        seen["signal name"] = "refused"
    try:
        durable.cancel(waiting.id, by=name)
        seen["cancel by"] = "accepted"
    except InvalidIdentifier:
        seen["cancel by"] = "refused"
    step = drive(durable.start("acceptance.named_step", {"step_id": name}).id)
    seen["step id"] = "refused" if step.error_type == "InvalidIdentifier" else _what(step)
    child = drive(durable.start("acceptance.child_ids", {"child_id": name}).id)
    # a child id is also held to an ASCII pattern (it becomes part of a run id): a
    # ValueError failing the parent, with no child made, is a refusal too
    refused = child.error_type in ("InvalidIdentifier", "ValueError") and not (
        Run.objects.filter(parent_run_id=child.id).exists()
    )
    seen["child id"] = "refused" if refused else _what(child)
    return seen


@pytest.mark.parametrize("hidden", list(NAMED.values()), ids=list(NAMED))
def test_identifiers_with_a_bidi_zero_width_or_separator_character_are_refused(hidden):
    """Trojan Source in names: calich "validateName lets a mixed-content name carry a
    Unicode bidi-override character" (https://github.com/XiovV/calich/issues/252),
    supply-drop-bbs "validate_mesh_node_name doesn't block Unicode display-spoofing
    characters" (https://github.com/Mesh-America/supply-drop-bbs/issues/228). Every
    surface the docs list refuses the name."""
    assert set(_surfaces(hidden).values()) == {"refused"}, _surfaces(hidden)


@pytest.mark.parametrize("hidden", list(IGNORABLE.values()), ids=list(IGNORABLE))
def test_identifiers_with_other_invisible_characters_are_refused(hidden):
    """cperl "disable bidi spoofs on names" (https://github.com/perl11/cperl/issues/223:
    U+200B..U+2063 and friends refused in identifiers) and BloodHound "UI renders ...
    zero-width joiners ... with no visual indicator"
    (https://github.com/SpecterOps/BloodHound/issues/3270). These default-ignorable
    characters are not in Cc/Cf/Zl/Zp but render as nothing (or a blank) just the same:
    ``invoice<U+034F>fdp.exe`` reads as ``invoicefdp.exe``."""
    assert set(_surfaces(hidden).values()) == {"refused"}, _surfaces(hidden)


def test_the_api_answers_422_for_a_tag_or_signal_name_with_a_bidi_override():
    """Same reports, through the JSON API (docs/security.md: "422 in the API")."""
    api = api_for(make_user("acc-otto", "operator"))
    started = api.post("/runs", {"workflow": "acceptance.echo", "input": {}, "tags": ["a\u202eb"]})
    assert started.status_code == 422, started.content
    assert "U+202E" in started.json()["detail"]
    waiting = drive(durable.start("acceptance.signal", {}).id)
    sent = api.post(f"/runs/{waiting.id}/signals", {"name": "g\u200bo", "payload": {}})
    assert sent.status_code == 422, sent.content
