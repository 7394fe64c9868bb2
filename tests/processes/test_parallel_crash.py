"""A worker killed inside a parallel group: recorded calls never run again.

``crash.parallel`` (``tests/parallel_crash_workflows.py``) is one group: p0, the unsafe
write w, p1..p4. Worker A is SIGKILLed in p3's body once p0, w, p1 and p2 are committed
(the checkpoints are written in list order; p4 has run, unrecorded); worker B takes over.
Every call recorded before the crash ran exactly once, w made exactly one transfer, the
unrecorded calls ran again, and every call has exactly one checkpoint.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

import durable
from durable.models import Run, RunStatus, Step
from tests import parallel_crash_workflows  # noqa: F401 - registers crash.parallel here
from tests.harness import wait_for_run

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.parallel_crash_workflows"}
IDS = ["p0", "w", "p1", "p2", "p3", "p4"]


def test_a_worker_killed_inside_a_parallel_group_runs_only_the_unrecorded_calls_again(
    workers, proc_env
):
    run = durable.start("crash.parallel", {})
    a = workers.start(crash_at="p3:before", **ENV)
    assert a.wait_exit(timeout=60) == -signal.SIGKILL, "worker A should have died in p3"
    assert proc_env.crashed("p3:before")
    recorded = set(Step.objects.filter(run_id=run.id).values_list("step_id", flat=True))
    assert recorded == {"p0", "w", "p1", "p2"}  # positions 0..3: the crash came after them
    assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING  # held by a dead worker

    workers.start(**ENV)
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [0, {"transfer_id": "X-1", "total": 7}, 10, 20, 30, 40]

    steps = list(Step.objects.filter(run=run).order_by("position"))
    assert [(s.position, s.step_id, s.status) for s in steps] == [
        (i, sid, "succeeded") for i, sid in enumerate(IDS)
    ]
    calls = Counter(
        i["step"] for i in proc_env.invocations() if i["run"] == run.id and i["kind"] == "step"
    )
    # recorded before the crash: once; the body killed mid-way and the unrecorded: again
    assert calls["p0"] == calls["w"] == calls["p1"] == calls["p2"] == 1
    assert calls["p3"] == 2
    assert 1 <= calls["p4"] <= 2  # it ran with the others, most likely before the kill
    transfers = [e for e in proc_env.effects() if e["service"] == "transfers"]
    assert len(transfers) == 1
    assert run.claims == 2
