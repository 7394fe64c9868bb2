"""DurableAgent (PydanticAI) across real worker processes: SIGKILL during a model
request, during a tool call, and while the run waits for approval.

Workers import ``tests.contrib.pai_agents``; its FunctionModel and tools append one line
per invocation to ``$CRASH_TEST_DIR/calls.jsonl``, and ``CRASH_AT=model:2`` /
``CRASH_AT=tool:lookup`` kills the worker at that invocation's first line (once). A
request or call that was killed runs again (it never finished); every one that finished
runs exactly once, and the run ends with the uninterrupted run's output and history.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.contrib.auth.models import Permission, User

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.models import Run, RunStatus
from tests.contrib import pai_agents as pa
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.pai_agents"}
FULL = Counter({"model:1": 1, "tool:lookup": 1, "model:2": 1, "tool:refund": 1, "model:3": 1})


def counted() -> Counter:
    return Counter(f"{c['kind']}:{c['name']}" for c in pa.calls())


def approve_and_finish(run_id: str) -> Run:
    alice, _ = User.objects.get_or_create(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    wait_for_run(run_id, timeout=40, statuses=(RunStatus.WAITING,))
    approval_decide(
        request_id=ApprovalRequest.objects.get(run_id=run_id).pk, user=alice, approve=True
    )
    run = wait_for_run(run_id, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def comparable(messages) -> list:
    """The history without what differs between any two runs (times, ids)."""
    volatile = {"timestamp", "run_id", "conversation_id", "provider_response_id"}

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in volatile}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return clean(messages)


@pytest.mark.parametrize("crash_at", ["model:2", "tool:lookup"])
def test_a_killed_worker_resumes_without_repeating_a_finished_request_or_tool(
    workers, proc_env, crash_at
):
    first = workers.start(wait=True, crash_at=crash_at, **WORKER_ENV)
    run = pa.durable_refund_agent.start("refund order A-1", started_by="os:requester")
    wait_until(lambda: proc_env.crashed(crash_at), 30, what=f"the crash at {crash_at}")
    first.proc.wait(timeout=10)
    assert not first.alive()
    workers.start(wait=True, **WORKER_ENV)
    run = approve_and_finish(run.id)
    # the killed invocation ran again (it never finished); everything else exactly once
    assert counted() == FULL + Counter({crash_at: 1})
    result = pa.durable_refund_agent.decode(run.output_value())
    assert result.output == pa.Summary(order_id="A-1", refunded=30, status="refunded")

    # an uninterrupted run of the same agent ends with the same history
    pa_calls_before = len(pa.calls())
    other = pa.durable_refund_agent.start("refund order A-1", started_by="os:requester")
    other = approve_and_finish(other.id)
    assert len(pa.calls()) - pa_calls_before == sum(FULL.values())
    assert comparable(other.output_value()["messages"]) == comparable(
        run.output_value()["messages"]
    )


def test_a_worker_killed_while_the_run_waits_for_approval(workers, proc_env):
    first = workers.start(wait=True, **WORKER_ENV)
    run = pa.durable_refund_agent.start("refund order A-1", started_by="os:requester")
    wait_for_run(run.id, timeout=30, statuses=(RunStatus.WAITING,))
    first.kill()
    workers.start(wait=True, **WORKER_ENV)
    time.sleep(0.5)
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING
    run = approve_and_finish(run.id)
    assert counted() == FULL
    assert pa.durable_refund_agent.decode(run.output_value()).output.refunded == 30
