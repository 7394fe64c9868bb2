"""durable.clock: on PostgreSQL the database's clock carried by this process's monotonic
clock, whatever this machine's wall clock says; on SQLite this machine's wall clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durable import clock
from durable.postgres import database_now

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_anchor():
    clock.forget()
    yield
    clock.forget()


def test_a_stepped_wall_clock_does_not_move_the_shared_clock(monkeypatch):
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(hours=1))
    now = clock.now()
    if connection.vendor == "postgresql":
        assert abs((now - database_now(wall_clock=True)).total_seconds()) < 2
    else:  # one machine: its wall clock is the shared one
        assert abs((now - timezone.now()).total_seconds()) < 2


def test_the_shared_clock_moves_with_the_monotonic_clock_between_reads(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite: the wall clock is read each time")
    first = clock.now()
    mono = clock.time.monotonic()
    monkeypatch.setattr(clock.time, "monotonic", lambda: mono + 12.5)
    with CaptureQueriesContext(connection) as queries:
        later = clock.now()  # within RESYNC_SECONDS of the last read: no query
    assert len(queries) == 0
    assert 12 < (later - first).total_seconds() < 14
    monkeypatch.setattr(clock.time, "monotonic", lambda: mono + clock.RESYNC_SECONDS + 1)
    with CaptureQueriesContext(connection) as queries:
        resynced = clock.now()  # read again: the database's clock
    assert len(queries) == 1
    assert abs((resynced - database_now(wall_clock=True)).total_seconds()) < 2


def test_an_unreadable_database_falls_back_to_the_last_reading(monkeypatch):
    from django.db import OperationalError

    from durable import postgres

    first = clock.now()

    def down(**kwargs):
        raise OperationalError("server closed the connection")

    monkeypatch.setattr(postgres, "database_now", down)
    mono = clock.time.monotonic()
    monkeypatch.setattr(clock.time, "monotonic", lambda: mono + clock.RESYNC_SECONDS + 1)
    later = clock.now()
    assert later >= first
    clock.forget()
    assert abs((clock.now() - timezone.now()).total_seconds()) < 2  # none yet: this machine's
