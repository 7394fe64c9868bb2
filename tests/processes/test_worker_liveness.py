"""Recovery with the default lease (30 s): a SIGKILLed worker's run is released as soon
as its process is seen dead (no liveness beat for 6 s), not when its lease runs out.

Workers run with ``DURABLE_LEASE_SECONDS=30`` and the default liveness settings (beat
every 2 s, dead after 6 s); the test process sweeps every 0.5 s (``tests/harness.py``).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime

import pytest

import durable
from durable import conf
from durable.models import AttemptOutcome, Run, RunStatus, StepAttempt, TraceEvent
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

DEFAULT_LEASE = {"DURABLE_LEASE_SECONDS": "30"}


def slow_calls(proc_env, run_id: str) -> list[dict]:
    return [i for i in proc_env.invocations() if i["run"] == run_id and i["step"] == "slow"]


@pytest.mark.processes
def test_default_lease_killed_worker_is_seen_dead_and_its_run_resumes_elsewhere(
    workers, proc_env, settings
):
    settings.DURABLE = {**settings.DURABLE, "LEASE_SECONDS": 30.0, "HEARTBEAT_SECONDS": None}
    assert conf.worker_dead_after_seconds() == 6.0
    a = workers.start(**DEFAULT_LEASE)
    b = workers.start(**DEFAULT_LEASE)
    a.wait_ready()
    b.wait_ready()

    run = durable.start("crash.slow_first", {"seconds": 60})
    wait_until(lambda: slow_calls(proc_env, run.id), 30, what="the slow step to start")
    time.sleep(1.0)
    row = Run.objects.get(pk=run.id)
    owner_pid = int(row.lease_owner.split(":")[1])
    victim, survivor = (a, b) if owner_pid == a.pid else (b, a)
    assert owner_pid == victim.pid, row.lease_owner
    victim.kill()
    killed_at = time.time()
    lease_end = Run.objects.get(pk=run.id).lease_expires_at  # what the lease alone allows

    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    calls = slow_calls(proc_env, run.id)
    assert [c["pid"] for c in calls] == [victim.pid, survivor.pid]
    resumed_at = datetime.fromtimestamp(calls[1]["t"], tz=UTC)
    # released because the owner was seen dead, well before its lease would have expired
    assert resumed_at < lease_end, (resumed_at, lease_end)
    print(f"kill -> next attempt of the step: {calls[1]['t'] - killed_at:.1f} s")
    kinds = Counter(TraceEvent.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds["owner_dead"] == 1 and kinds["recovered"] == 1
    assert kinds["lease_expired"] == 0
    dead = TraceEvent.objects.get(run=run, kind="owner_dead")
    assert f":{victim.pid} " in dead.message
    assert [(a.step.step_id, a.outcome) for a in StepAttempt.objects.filter(run=run)] == [
        ("slow", AttemptOutcome.WORKER_LOST)
    ]
    assert run.claims == 2
