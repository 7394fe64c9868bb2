"""A worker host whose wall clock is an hour off (stepped ahead or back, as NTP, a resumed
VM or an operator can do) neither takes runs that other workers still hold nor leaves
its own runs stranded when it dies: leases, liveness beats and the sweeper keep time by
the database's clock (durable/clock.py).

The skewed worker is a real ``celery worker`` process whose wall clock
(``django.utils.timezone.now``, what the engine reads) is an hour off and whose monotonic
clock is not (examples/clock_skew.py). The other worker and this test's sweeps keep the
machine's clock.

PostgreSQL only: on the embedded default every worker shares the one machine that holds
the SQLite file, and so its one clock (docs/production.md#clocks).
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection

import durable
from durable import conf
from durable.models import Run, RunStatus, TraceEvent, WorkerProcess
from durable.postgres import database_now
from durable.vocabulary import EventKind
from durable.worker.tasks import execute_run
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]


def held_calls(proc_env, run_id: str) -> list[dict]:
    return [i for i in proc_env.invocations() if i["run"] == run_id and i["step"] == "held"]


@pytest.fixture
def skewed(workers, tmp_path):
    """``skewed(seconds)`` starts a worker whose wall clock is ``seconds`` off."""
    if connection.vendor != "postgresql":
        pytest.skip("the embedded default's workers share one machine, and its one clock")

    def start(seconds: int):
        offset = tmp_path / "clock-offset"
        offset.write_text(f"{seconds:+d}")
        return workers.start(wait=True, CLOCK_OFFSET_FILE=str(offset))

    return start


def recovered(run_id: str) -> int:
    return TraceEvent.objects.filter(run_id=run_id, kind=EventKind.RECOVERED).count()


@pytest.mark.parametrize("step", [3600, -3600], ids=["ahead", "behind"])
def test_a_worker_whose_clock_is_an_hour_off_neither_takes_nor_strands_runs(
    workers, proc_env, skewed, step
):
    lease = conf.lease_seconds()
    # 1. a run the machine-clock worker holds is not taken by the skewed one, which
    #    sweeps at its start and then serves the queue beside it
    normal = workers.start(wait=True)
    first = durable.start("crash.gated", {})
    wait_until(lambda: held_calls(proc_env, first.id), 30, what="the held step to start")
    off = skewed(step)
    pid = off.pid
    # a redelivered or duplicated message for the held run reaches the skewed worker
    # (the other one is busy with the run): its claim judges the lease by the database's
    # clock, so it leaves the run to its living holder
    execute_run.delay(first.id)
    wait_until(
        lambda: (
            re.search(r"Task durable\.execute_run\[\S+\] succeeded in ", off.log_text())
            or len(held_calls(proc_env, first.id)) > 1  # it took the run
        ),
        60,
        what="the skewed worker to try the held run",
        sweep=False,
    )
    (proc_env.dir / f"gate-{first.id}").touch()
    first = wait_for_run(first.id, timeout=60)
    assert first.status == RunStatus.SUCCEEDED, first.error
    assert [c["pid"] for c in held_calls(proc_env, first.id)] == [normal.pid]
    assert recovered(first.id) == 0

    # 2. a run the skewed worker holds: its lease and beat are by the database's clock,
    #    so no one takes the run while it lives, and it resumes promptly when it dies
    normal.kill()
    second = durable.start("crash.gated", {})
    wait_until(lambda: held_calls(proc_env, second.id), 60, what="the skewed worker to claim")
    assert [c["pid"] for c in held_calls(proc_env, second.id)] == [pid]
    beat_at = WorkerProcess.objects.get(pid=pid).beat_at
    db_now = database_now(wall_clock=True)
    assert abs((beat_at - db_now).total_seconds()) < 10, (beat_at, db_now)
    row = Run.objects.get(pk=second.id)
    assert row.status == RunStatus.RUNNING, (row.status, row.error)
    ahead = (row.lease_expires_at - db_now).total_seconds()
    assert -1 < ahead <= lease + 1, (row.lease_expires_at, db_now)
    survivor = workers.start(wait=True)
    # the survivor serves the queue and this test sweeps: the held run stays with its
    # living holder for two leases and more
    until = db_now + timedelta(seconds=3 * lease)
    wait_until(lambda: database_now(wall_clock=True) > until, 30, what="three leases")
    assert recovered(second.id) == 0
    assert Run.objects.get(pk=second.id).lease_owner.split(":")[1] == str(pid)
    off.kill()
    (proc_env.dir / f"gate-{second.id}").touch()
    second = wait_for_run(second.id, timeout=60)
    assert second.status == RunStatus.SUCCEEDED, second.error
    assert [c["pid"] for c in held_calls(proc_env, second.id)] == [pid, survivor.pid]
