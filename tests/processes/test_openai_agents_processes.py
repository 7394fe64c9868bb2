"""durable_run (OpenAI Agents SDK) across real worker processes: SIGKILL during a model
request, during a tool call, and while the run waits for approval.

The scripted LLM server runs in the test process (``tests/contrib/conftest.py``) and
logs every request it answers; the workers import ``tests.contrib.oai_agents``, whose
tools append to ``$CRASH_TEST_DIR/calls.jsonl``. A request or call that was killed runs
again (it never finished); every one that finished runs exactly once.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.contrib.auth.models import Permission, User

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.openai_agents import durable_run
from durable.models import Run, RunStatus, Step
from tests.contrib import oai_agents as oa
from tests.contrib import pai_agents as pa
from tests.contrib.conftest import (  # noqa: F401 (the scripted LLM's fixtures)
    llm_server_fixture,
    scripted_llm_fixture,
)
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.oai_agents"}
TOOLS = Counter({"lookup_order": 1, "refund_order": 1})


def tools_run() -> Counter:
    return Counter(c["name"] for c in pa.calls())


def received(llm) -> int:
    """The refunds desk's model requests that reached the server, answered or not."""
    return sum(1 for e in llm.received if e["script"] == "refund-desk")


def answered(llm) -> int:
    return sum(1 for e in llm.log if e["script"] == "refund-desk" and e["status"] == 200)


def approve_and_finish(run_id: str) -> Run:
    alice, _ = User.objects.get_or_create(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    wait_for_run(run_id, timeout=40, statuses=(RunStatus.WAITING,))
    approval_decide(
        request_id=ApprovalRequest.objects.get(run_id=run_id).pk, user=alice, approve=True
    )
    run = wait_for_run(run_id, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == "Refunded 30 for order C-3."
    return run


def start() -> Run:
    return durable_run(oa.triage, "Please refund order C-3", started_by="os:requester")


def test_killed_during_a_model_request(workers, proc_env, scripted_llm):
    # the refunds agent's first request takes 3 s: the worker dies while it is in flight
    scripted_llm.queued.append(
        {"fault": "slow", "arg": 3.0, "times": 1, "match": "You refund orders"}
    )
    first = workers.start(wait=True, **WORKER_ENV)
    run = start()
    wait_until(
        lambda: Step.objects.filter(run_id=run.id, step_id="handoff:Refunds").exists(),
        30,
        what="the handoff",
    )
    wait_until(lambda: received(scripted_llm) == 2, 30, what="the refunds' request")
    assert answered(scripted_llm) == 1  # the triage's; the refunds' is in flight
    first.kill()
    workers.start(wait=True, **WORKER_ENV)
    approve_and_finish(run.id)
    # the killed request is answered into the void meanwhile (its 3 s end)
    wait_until(lambda: answered(scripted_llm) == 4 + 1, 30, what="the killed request's end")
    assert received(scripted_llm) == 4 + 1  # four model calls, one of them twice
    assert tools_run() == TOOLS


def test_killed_during_a_tool_call(workers, proc_env, scripted_llm):
    first = workers.start(wait=True, crash_at="tool:lookup_order", **WORKER_ENV)
    run = start()
    wait_until(lambda: proc_env.crashed("tool:lookup_order"), 30, what="the crash")
    first.proc.wait(timeout=10)
    workers.start(wait=True, **WORKER_ENV)
    approve_and_finish(run.id)
    assert answered(scripted_llm) == 4  # no model call paid twice
    assert tools_run() == TOOLS + Counter({"lookup_order": 1})  # the killed call, again


def test_killed_while_waiting_for_approval(workers, proc_env, scripted_llm):
    first = workers.start(wait=True, **WORKER_ENV)
    run = start()
    wait_for_run(run.id, timeout=30, statuses=(RunStatus.WAITING,))
    first.kill()
    workers.start(wait=True, **WORKER_ENV)
    run = approve_and_finish(run.id)
    assert answered(scripted_llm) == 4
    assert tools_run() == TOOLS
    steps = list(Step.objects.filter(run=run).values_list("step_id", flat=True))
    assert steps.count("handoff:Refunds") == 1
