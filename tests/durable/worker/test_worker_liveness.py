"""The sweeper releases at once the leases of a worker process that stopped beating.

(With real processes and SIGKILL: tests/processes/test_worker_liveness.py.)
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from durable import conf
from durable.models import Run, RunStatus, TraceEvent, WorkerProcess
from durable.worker.heartbeat import beat_process, process_key
from durable.worker.sweeper import sweep

pytestmark = pytest.mark.django_db


def running(run_id: str, owner: str, *, lease_written_ago: float) -> Run:
    now = timezone.now()
    return Run.objects.create(
        id=run_id,
        workflow_name="w",
        workflow_version="1",
        input="null",
        input_hash="x",
        status=RunStatus.RUNNING,
        lease_owner=owner,
        lease_token=f"tok-{run_id}",
        lease_expires_at=now
        - timedelta(seconds=lease_written_ago)
        + timedelta(seconds=conf.lease_seconds()),
        dispatched_at=now - timedelta(seconds=60),
        claims=1,
    )


def process(key: str, *, beat_ago: float) -> WorkerProcess:
    host, _, pid = key.rpartition(":")
    return WorkerProcess.objects.create(
        id=key, hostname=host, pid=int(pid), beat_at=timezone.now() - timedelta(seconds=beat_ago)
    )


def test_runs_of_a_silent_process_are_released_and_others_are_not():
    dead_after = conf.worker_dead_after_seconds()
    assert dead_after == 6.0 and conf.lease_seconds() == 30.0  # the defaults
    process("h1:100", beat_ago=dead_after + 2)
    process("h1:1000", beat_ago=0.5)  # alive; its id starts like the dead one's
    process("h2:100", beat_ago=0.5)
    orphan = running("orphan", "h1:100:7", lease_written_ago=dead_after + 3)
    lookalike = running("lookalike", "h1:1000:7", lease_written_ago=dead_after + 3)
    alive = running("alive", "h2:100:7", lease_written_ago=dead_after + 3)
    fresh = running("fresh", "h1:100:8", lease_written_ago=1.0)  # claimed just now
    unknown = running("unknown", "h3:5:1", lease_written_ago=dead_after + 3)  # no row

    result = sweep()

    assert result["orphaned"] == 1 and "orphan" in result["run_ids"]
    row = Run.objects.get(pk=orphan.pk)
    assert row.lease_expires_at < timezone.now() and row.lease_token == "tok-orphan"
    event = TraceEvent.objects.get(run_id="orphan", kind="owner_dead")
    assert "h1:100" in event.message
    assert not TraceEvent.objects.filter(run_id="orphan", kind="lease_expired").exists()
    for kept in (lookalike, alive, fresh, unknown):
        row = Run.objects.get(pk=kept.pk)
        assert row.lease_expires_at == kept.lease_expires_at, kept.pk
        assert kept.pk not in result["run_ids"]


def test_long_silent_processes_are_forgotten():
    process("old:1", beat_ago=7200)
    process("recent:1", beat_ago=60)
    sweep()
    assert list(WorkerProcess.objects.values_list("id", flat=True)) == ["recent:1"]


def test_beat_process_upserts_this_process():
    beat_process()
    first = WorkerProcess.objects.get(pk=process_key())
    beat_process()
    second = WorkerProcess.objects.get(pk=process_key())
    assert second.beat_at >= first.beat_at and second.started_at == first.started_at
    assert WorkerProcess.objects.count() == 1


def test_admin_lists_worker_processes_and_which_are_silent(admin_client):
    from django.urls import reverse

    process("h9:1", beat_ago=0.1)
    process("h9:2", beat_ago=120)
    page = admin_client.get(reverse("admin:durable_workerprocess_changelist")).content.decode()
    assert "h9:1" in page and "beating" in page
    assert "s: presumed dead" in page and "silent for 12" in page
