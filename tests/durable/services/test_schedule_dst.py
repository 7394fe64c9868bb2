"""Cron slots across daylight saving time, against an independent model (docs/schedules.md).

The model walks the wall clock of a zone minute by minute (UTC minute → local wall time)
and derives the slots from the rule as documented: an expression whose hour field matches
every hour runs by the clock as it passes (both passes of a repeated hour, nothing in a
skipped one); any other expression starts each wall-clock slot once, a repeated time at
its first occurrence and a skipped time at the first instant after the change. Fields are
generated as structures (numbers, lists, ranges, steps) whose sets the model computes
itself, so neither the parsing nor the DST handling of the code under test is trusted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from durable.services.schedules import next_slot

_COMMON = dict(
    deadline=None, database=None, derandomize=False, suppress_health_check=[HealthCheck.too_slow]
)
#: a few seconds in CI; the slow profile below walks many more zones and expressions
QUICK = settings(max_examples=120, **_COMMON)
SLOW = settings(max_examples=3000, **_COMMON)

#: zones with the shapes of change tzdb knows: northern and southern hemisphere, a
#: negative DST (Dublin), 30-minute changes (Lord Howe), two hours (Troll), changes at
#: midnight (Havana, Santiago, Beirut), at 02:45 (Chatham), odd offsets (St Johns),
#: and Casablanca's suspension for Ramadan
ZONES = [
    "America/New_York",
    "America/Los_Angeles",
    "America/St_Johns",
    "America/Havana",
    "America/Santiago",
    "Africa/Casablanca",
    "America/Nuuk",
    "Europe/Berlin",
    "Europe/London",
    "Europe/Dublin",
    "Asia/Beirut",
    "Asia/Jerusalem",
    "Africa/Cairo",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Pacific/Auckland",
    "Pacific/Chatham",
    "Antarctica/Troll",
]
MINUTE = timedelta(minutes=1)


def _wall(u: datetime, zone: ZoneInfo) -> datetime:
    return u.astimezone(zone).replace(tzinfo=None)


@functools.cache
def _transitions(zone_name: str) -> tuple[datetime, ...]:
    """The instants (UTC, on the minute) at which ``zone_name``'s offset changes, 2025-2031."""
    zone = ZoneInfo(zone_name)
    out = []
    u = datetime(2025, 1, 1, tzinfo=UTC)
    end = datetime(2031, 1, 1, tzinfo=UTC)
    step = timedelta(hours=1)
    while u < end:
        if u.astimezone(zone).utcoffset() != (u + step).astimezone(zone).utcoffset():
            lo, hi = u, u + step  # offset(lo) != offset(hi): bisect to the minute
            while hi - lo > MINUTE:
                mid = lo + (hi - lo) // 2
                mid = mid.replace(second=0, microsecond=0)
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            out.append(hi)
        u += step
    return tuple(out)


# --- fields as structures -------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    text: str
    values: frozenset[int]
    star: bool  # starts with "*" (Debian's day-of-month/day-of-week rule)


def _item(lo: int, hi: int, near: list[int]) -> st.SearchStrategy[tuple[str, set[int]]]:
    number = st.one_of(st.sampled_from(near), st.integers(lo, hi)) if near else st.integers(lo, hi)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, set[int]]:
        kind = draw(st.sampled_from(["number", "range", "range_step", "star_step"]))
        if kind == "number":
            n = draw(number)
            return str(n), {n}
        if kind == "star_step":
            step = draw(st.integers(1, hi - lo + 1))
            return f"*/{step}", set(range(lo, hi + 1, step))
        a, b = sorted((draw(number), draw(number)))
        if kind == "range":
            return f"{a}-{b}", set(range(a, b + 1))
        step = draw(st.integers(1, hi - lo + 1))
        return f"{a}-{b}/{step}", set(range(a, b + 1, step))

    return build()


def _field(lo: int, hi: int, near: list[int], star_weight: int = 1) -> st.SearchStrategy[Field]:
    star = st.just(Field("*", frozenset(range(lo, hi + 1)), True))
    items = st.lists(_item(lo, hi, near), min_size=1, max_size=4).map(
        lambda parts: Field(
            ",".join(t for t, _ in parts),
            frozenset().union(*(v for _, v in parts)),
            parts[0][0].startswith("*"),
        )
    )
    return st.one_of(*([star] * star_weight), items)


@dataclass(frozen=True)
class Case:
    zone: str
    minute: Field
    hour: Field
    dom: Field
    month: Field
    dow: Field
    start: datetime  # the window the model is compared on (UTC)
    end: datetime

    @property
    def cron(self) -> str:
        return " ".join(f.text for f in (self.minute, self.hour, self.dom, self.month, self.dow))


@st.composite
def cases(draw: st.DrawFn) -> Case:
    zone_name = draw(st.sampled_from(ZONES))
    zone = ZoneInfo(zone_name)
    change = draw(st.sampled_from(_transitions(zone_name)))
    before, after = _wall(change - MINUTE, zone), _wall(change, zone)
    near_hours = sorted({(h + d) % 24 for h in (before.hour, after.hour) for d in (-1, 0, 1)})
    near_minutes = sorted({0, 15, 30, 45, before.minute, after.minute})
    days = {before.date(), after.date()}
    # day fields that fire on the day of the change, mostly; dow 7 is Sunday too
    dom = draw(_field(1, 31, sorted(d.day for d in days), star_weight=3))
    dow_near = sorted({(d.weekday() + 1) % 7 for d in days} | {7})
    dow = draw(_field(0, 7, dow_near, star_weight=3))
    month = draw(_field(1, 12, sorted(d.month for d in days), star_weight=3))
    return Case(
        zone=zone_name,
        minute=draw(_field(0, 59, near_minutes)),
        hour=draw(_field(0, 23, near_hours, star_weight=2)),
        dom=dom,
        month=month,
        dow=dow,
        start=change - timedelta(hours=draw(st.integers(1, 4))),
        end=change + timedelta(hours=draw(st.integers(1, 4))),
    )


# --- the model ------------------------------------------------------------------------------


def _matches(case: Case, wall: datetime) -> bool:
    dow = (wall.weekday() + 1) % 7
    dom_ok = wall.day in case.dom.values
    dow_ok = dow in case.dow.values or (dow == 0 and 7 in case.dow.values)
    # Debian's cron: either day field starting with "*" makes the two an AND, else an OR
    day_ok = (dom_ok and dow_ok) if (case.dom.star or case.dow.star) else (dom_ok or dow_ok)
    return (
        wall.minute in case.minute.values
        and wall.hour in case.hour.values
        and wall.month in case.month.values
        and day_ok
    )


def model_slots(case: Case) -> list[datetime]:
    """Every slot in ``[case.start, case.end)``, by walking the zone's wall clock."""
    zone = ZoneInfo(case.zone)
    by_the_clock = case.hour.values == frozenset(range(24))
    u = case.start - timedelta(days=1)  # to know which wall times were already seen
    latest = previous = _wall(u - MINUTE, zone)
    out = []
    while u < case.end:
        wall = _wall(u, zone)
        fires = _matches(case, wall) and (by_the_clock or wall > latest)
        if not by_the_clock and wall - previous > MINUTE:  # the clock jumped forward
            skipped = previous + MINUTE
            while skipped < wall and not fires:
                fires = skipped > latest and _matches(case, skipped)
                skipped += MINUTE
        if fires and u >= case.start:
            out.append(u)
        latest, previous = max(latest, wall), wall
        u += MINUTE
    return out


# --- the properties ---------------------------------------------------------------------------


def _walk(case: Case) -> list[datetime]:
    slots, at = [], case.start - timedelta(seconds=1)
    while True:
        at = next_slot(case.cron, case.zone, at)
        if at >= case.end:
            return slots
        slots.append(at)


def _check(case: Case, probes: list[int]) -> None:
    expected = model_slots(case)
    assert _walk(case) == expected, (case.cron, case.zone)
    # every path that asks "what is next after t" (a tick, a resume, a catch-up, a page)
    # gets the model's answer, from any instant, in either pass of a repeated hour
    span = int((case.end - case.start).total_seconds())
    for probe in probes:
        after = case.start + timedelta(seconds=probe % span)
        later = [s for s in expected if s > after]
        got = next_slot(case.cron, case.zone, after)
        if later:
            assert got == later[0], (case.cron, case.zone, after)
        else:
            assert got >= case.end, (case.cron, case.zone, after)


_STAR_DOM = Field("*", frozenset(range(1, 32)), True)
_STAR_MONTH = Field("*", frozenset(range(1, 13)), True)
_STAR_DOW = Field("*", frozenset(range(8)), True)
_PROBES = st.lists(st.integers(0, 10**6), min_size=1, max_size=5)


@QUICK
@given(case=cases(), probes=_PROBES)
@example(  # S31: a minute step in a repeated hour (New York, 2026-11-01)
    case=Case(
        zone="America/New_York",
        minute=Field("*/15", frozenset({0, 15, 30, 45}), True),
        hour=Field("1", frozenset({1}), False),
        dom=_STAR_DOM,
        month=_STAR_MONTH,
        dow=_STAR_DOW,
        start=datetime(2026, 11, 1, 3, tzinfo=UTC),
        end=datetime(2026, 11, 1, 9, tzinfo=UTC),
    ),
    probes=[3 * 3600 + 10 * 60, 3 * 3600 + 70 * 60],
)
@example(  # an hour field that is every hour, not written "*": by the clock
    case=Case(
        zone="America/New_York",
        minute=Field("0", frozenset({0}), False),
        hour=Field("0,*/1", frozenset(range(24)), False),
        dom=_STAR_DOM,
        month=_STAR_MONTH,
        dow=_STAR_DOW,
        start=datetime(2025, 11, 2, 5, tzinfo=UTC),
        end=datetime(2025, 11, 2, 7, tzinfo=UTC),
    ),
    probes=[0],
)
@example(  # Lord Howe goes back 30 minutes: 01:30 shows twice, hourly runs twice
    case=Case(
        zone="Australia/Lord_Howe",
        minute=Field("30", frozenset({30}), False),
        hour=Field("*", frozenset(range(24)), True),
        dom=_STAR_DOM,
        month=_STAR_MONTH,
        dow=_STAR_DOW,
        start=datetime(2025, 4, 5, 13, tzinfo=UTC),
        end=datetime(2025, 4, 5, 17, tzinfo=UTC),
    ),
    probes=[3000],
)
@example(  # Berlin skips 02:00-02:59: the four slots start once, at 03:00
    case=Case(
        zone="Europe/Berlin",
        minute=Field("*/15", frozenset({0, 15, 30, 45}), True),
        hour=Field("2", frozenset({2}), False),
        dom=_STAR_DOM,
        month=_STAR_MONTH,
        dow=_STAR_DOW,
        start=datetime(2026, 3, 28, 23, tzinfo=UTC),
        end=datetime(2026, 3, 29, 3, tzinfo=UTC),
    ),
    probes=[3600],
)
def test_slots_across_dst_changes_follow_the_wall_clock_model(case, probes):
    _check(case, probes)


@pytest.mark.slow
@SLOW
@given(case=cases(), probes=_PROBES)
def test_slots_across_dst_changes_follow_the_wall_clock_model_many(case, probes):
    _check(case, probes)


def test_the_zones_have_changes_to_test():
    """A zone that stopped changing would make the property above vacuous for it."""
    for name in ZONES:
        assert _transitions(name), name
    assert date(2026, 11, 1) in {t.date() for t in _transitions("America/New_York")}
