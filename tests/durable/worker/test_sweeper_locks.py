"""A run row locked by a session that went silent (its worker host cut off in the middle
of a transaction) does not stall the sweeper: the other runs are recovered and
dispatched, the locked one is left to a later sweep (durable/worker/sweeper.py).

PostgreSQL only: SQLite has one writer, and no row locks to skip.
"""

from __future__ import annotations

import pytest
from django.db import connection

from durable.models import Run
from durable.worker.sweeper import sweep
from tests.durable.worker.test_worker_liveness import process, running

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("how", ["expired", "owner_dead"])
def test_a_row_locked_by_a_silent_session_is_skipped_not_waited_for(other_session, how):
    if how == "expired":
        stuck = running("stuck", "h9:1:1", lease_written_ago=120)
        free = running("free", "h9:1:2", lease_written_ago=120)
    else:  # released because its process stopped beating, before its lease ran out
        process("h9:2", beat_ago=60)
        stuck = running("stuck", "h9:2:1", lease_written_ago=10)
        free = running("free", "h9:2:2", lease_written_ago=10)
    other_session.execute(
        f"SELECT id FROM {Run._meta.db_table} WHERE id = %s FOR UPDATE", [stuck.id]
    )  # and the session goes silent, its transaction open
    with connection.cursor() as cursor:  # a sweeper that waited would fail here, not hang
        cursor.execute("SET lock_timeout = '5s'")
    try:
        result = sweep()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert result["run_ids"] == [free.id]
    assert Run.objects.get(pk=free.id).dispatched_at is not None
    assert Run.objects.get(pk=stuck.id).dispatched_at < Run.objects.get(pk=free.id).dispatched_at
    other_session.rollback()  # the server ended the silent session: the next sweep takes it
    assert stuck.id in sweep()["run_ids"]
