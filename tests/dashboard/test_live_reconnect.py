"""The live-update follower survives a terminated database connection (S28)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from dashboard.live import Follower
from durable.models import Run, TraceEvent
from tests.durable.worker.test_db_faults import terminate_my_backend

pytestmark = pytest.mark.django_db(transaction=True)


def test_follower_polls_again_after_its_connection_was_terminated():
    if connection.vendor != "postgresql":
        pytest.skip("terminates a PostgreSQL backend; SQLite has no server connection")
    run = Run.objects.create(workflow_name="w", workflow_version="1", input="null", input_hash="x")
    follower = Follower()
    assert async_to_sync(follower.poll)(None) == []
    TraceEvent.objects.create(run=run, kind="claimed")
    terminate_my_backend()  # the poll's thread uses this connection (thread-sensitive)
    assert async_to_sync(follower.poll)(None) == [run.id]
