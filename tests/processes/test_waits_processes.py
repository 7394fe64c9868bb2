"""Waits across real worker processes: a durable sleep that falls due while no worker is
up (S07), and an approval across a SIGKILL.

Workers are ``celery worker --pool=solo`` processes (``tests/harness.py``) that import
``tests.approvals.approval_workflows``; the step bodies of the ``apf.proc_*`` workflows append one
line per invocation to ``$CRASH_TEST_DIR/waits_invocations.jsonl``, so "ran exactly
once" is counted across processes.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

import durable
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.models import Run, RunStatus, TraceEvent, Wait, WaitStatus
from tests import crash_workflows as cw
from tests.approvals import approval_workflows as flows  # noqa: F401  (registers apf.* in the test process)
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {
    "DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.approvals.approval_workflows",
    "APF_RECORD_FILE": "1",
}


def invocations(proc_env, run_id: str) -> list[dict]:
    return [
        i for i in cw.read_jsonl(proc_env.dir / "waits_invocations.jsonl") if i["run"] == run_id
    ]


def labels(proc_env, run_id: str) -> Counter:
    return Counter(i["label"] for i in invocations(proc_env, run_id))


def test_s07_durable_sleep_while_no_worker_is_up(workers, proc_env):
    """A, sleep 2 s, B. All workers die at ~0.5 s; three start after the timer is due.
    B runs exactly once, in one of the new workers, soon after they start; A never again."""
    first = workers.start(wait=True, **WORKER_ENV)
    run = durable.start("apf.proc_sleep", {"seconds": 2.0})
    started = time.monotonic()
    wait_for_run(run.id, timeout=20, statuses=(RunStatus.WAITING,))
    assert labels(proc_env, run.id) == Counter({"A": 1})
    time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
    first.kill()  # SIGKILL: every worker is gone
    killed_at = time.time()
    wait = Wait.objects.get(run=run, wait_id="sleep")
    assert wait.status == WaitStatus.PENDING

    # stay down until the timer is well past due (nothing sweeps meanwhile)
    time.sleep(max(0.0, (wait.wake_at - timezone.now()).total_seconds()) + 1.0)
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING
    assert labels(proc_env, run.id) == Counter({"A": 1})
    claims_before = TraceEvent.objects.filter(run=run, kind="claimed").count()

    restart_at = time.time()
    restarted = [workers.start(**WORKER_ENV) for _ in range(3)]
    for w in restarted:
        w.wait_ready()
    # the workers' own start-up sweep finds the due timer; the test does not sweep
    run = wait_until(
        lambda: (r := Run.objects.get(pk=run.id)).status == RunStatus.SUCCEEDED and r,
        40,
        what="the run to finish after the restart",
        sweep=False,
    )
    assert run.output_value() == "done"
    calls = invocations(proc_env, run.id)
    assert Counter(i["label"] for i in calls) == Counter({"A": 1, "B": 1})
    b = next(i for i in calls if i["label"] == "B")
    assert b["pid"] in {w.pid for w in restarted}  # run by a new worker
    assert b["t"] > restart_at > killed_at
    print(f"S07: B ran {b['t'] - restart_at:.2f} s after the three workers were started")
    # exactly one worker took the timer: one claim after the restart
    assert TraceEvent.objects.filter(run=run, kind="claimed").count() == claims_before + 1
    assert Wait.objects.get(pk=wait.pk).status == WaitStatus.RESOLVED
    assert TraceEvent.objects.filter(run=run, kind="wait_resolved").count() == 1


def test_approval_decided_while_the_worker_is_dead_completes_on_a_fresh_worker(workers, proc_env):
    alice = User.objects.create_user("alice", password="x")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    first = workers.start(wait=True, **WORKER_ENV)
    run = durable.start("apf.proc_approval", {})
    wait_for_run(run.id, timeout=20, statuses=(RunStatus.WAITING,))
    first.kill()

    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=alice, approve=True, comment="go")
    assert ApprovalRequest.objects.get(pk=req.pk).status == ApprovalStatus.APPROVED
    assert Run.objects.get(pk=run.id).status == RunStatus.PENDING
    time.sleep(0.5)
    assert labels(proc_env, run.id) == Counter({"A": 1})  # nobody ran it meanwhile

    second = workers.start(wait=True, **WORKER_ENV)
    run = wait_for_run(run.id, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["approved"] is True and out["decided_by"] == ["alice"] and out["comment"] == "go"
    calls = invocations(proc_env, run.id)
    assert Counter(i["label"] for i in calls) == Counter({"A": 1, "B": 1})
    assert [i["pid"] for i in calls] == [first.pid, second.pid]


def test_approval_pending_across_a_worker_kill_then_decided(workers, proc_env):
    """The worker dies while the run waits; a new one is up before the decision."""
    bob = User.objects.create_user("bob", password="x")
    bob.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    first = workers.start(wait=True, **WORKER_ENV)
    run = durable.start("apf.proc_approval", {})
    wait_for_run(run.id, timeout=20, statuses=(RunStatus.WAITING,))
    first.kill()
    second = workers.start(wait=True, **WORKER_ENV)
    time.sleep(1.0)
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING  # still waiting
    approval_decide(
        request_id=ApprovalRequest.objects.get(run=run).pk, user=bob, approve=False, comment="no"
    )
    run = wait_for_run(run.id, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["approved"] is False
    calls = invocations(proc_env, run.id)
    assert Counter(i["label"] for i in calls) == Counter({"A": 1, "B": 1})
    assert [i["pid"] for i in calls] == [first.pid, second.pid]
