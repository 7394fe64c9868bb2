"""The OpenAI Agents SDK's documentation examples (``tests.contrib.openai_doc_agents``)
across real worker processes, each run's worker SIGKILLed once mid-run.

One test starts every example's run at once against two workers armed with each run's
crash point (``CRASH_AT``: each fires once); whenever a worker dies, another starts, until
every run has finished. Then each run has the answer its docs page states, and every
model call that finished was made once: only the call (or tool) in flight when the
worker died is made again.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from agents import SQLiteSession
from django.contrib.auth.models import Permission, User

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.contrib.openai_agents import durable_run
from durable.models import Run, RunStatus, Step
from tests.contrib import oai_agents as oa
from tests.contrib import openai_doc_agents as docs
from tests.contrib import pai_agents as pa
from tests.contrib.conftest import (  # noqa: F401 (the scripted LLM's fixtures)
    llm_server_fixture,
    scripted_llm_fixture,
)
from tests.harness import wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]

WORKER_ENV = {
    "DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.openai_doc_agents,"
    "tests.contrib.oai_agents"
}
CRASH_AT = ",".join(
    [
        "model:Customer support agent",  # input guardrails: the agent's own request
        "model:Output check",  # output guardrails: inside the guardrail's step
        "tool:classify_text",  # tool guardrails: between the two guardrails
        "tool:fetch_user_age",  # context
        "tool:get_temperature",  # human in the loop: the approved call
        "model:Spanish agent",  # agents as tools: the nested agent's request
        "model:Concise assistant",  # sessions: the first turn's request
        "tool:lookup_order",  # issue 29's guardrail: after the agent-backed guardrail
    ]
)
FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


def models() -> Counter:
    return Counter(c["name"] for c in pa.calls() if c["kind"] == "model")


def tools() -> Counter:
    return Counter(c["name"] for c in pa.calls() if c["kind"] == "tool")


def model_steps(run_id: str) -> int:
    return Step.objects.filter(run_id=run_id, step_id__regex=r"^model(#\d+)?$").count()


def test_each_documentation_example_survives_a_sigkill(workers, proc_env, scripted_llm):
    alice = User.objects.create_user("alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    runs = {
        "input": durable_run(docs.agent, "Where is my order?").id,
        "output": durable_run(docs.output_agent, "Where is my order?").id,
        "tools": durable_run(docs.classifier, "hello world").id,
        "context": durable_run(
            docs.assistant, "What is the age of the user?", context=docs.UserInfo("John", 123)
        ).id,
        "hitl": durable_run(docs.weather, "What is the temperature in Oakland?").id,
        "nested": durable_run(docs.orchestrator_agent, "Say 'Hello, how are you?' in Spanish.").id,
        "session": durable_run(
            docs.concise, "What city is the Golden Gate Bridge in?", session_id="c-9"
        ).id,
        # the refunds desk (the scripted LLM server) behind an agent-backed input guardrail
        "guarded": durable_run(oa.guarded_refunds, "Please refund order C-3").id,
    }
    approved = (runs["hitl"], runs["guarded"])
    # two workers, so that one goes on while the other's replacement starts
    alive = [workers.start(crash_at=CRASH_AT, **WORKER_ENV) for _ in range(2)]

    def status(run_id: str) -> str:
        return Run.objects.filter(pk=run_id).values_list("status", flat=True).get()

    def needs_me() -> bool:
        waiting = ApprovalRequest.objects.filter(run_id__in=approved, status=ApprovalStatus.PENDING)
        return (
            not all(w.alive() for w in alive)
            or waiting.exists()
            or all(status(r) in FINISHED for r in runs.values())
        )

    while True:
        wait_until(needs_me, 90, what="a dead worker, an approval or every run's end")
        pending = ApprovalRequest.objects.filter(run_id__in=approved, status=ApprovalStatus.PENDING)
        for req in pending:
            approval_decide(request_id=req.pk, user=alice, approve=True)
        for i, worker in enumerate(alive):
            if not worker.alive():
                worker.reap()
                alive[i] = workers.start(crash_at=CRASH_AT, **WORKER_ENV)
        if all(status(r) in FINISHED for r in runs.values()):
            break
    crashed = {p for p in CRASH_AT.split(",") if proc_env.crashed(p)}
    assert crashed == set(CRASH_AT.split(","))  # every run lost its worker once

    out = {name: Run.objects.get(pk=run_id) for name, run_id in runs.items()}
    for run in out.values():
        assert run.status == RunStatus.SUCCEEDED, (run.workflow_name, run.error)
    final = {name: run.output_value()["final_output"] for name, run in out.items()}
    assert final == {
        "input": "Happy to help with your order.",
        "output": {"response": "Happy to help with your order."},
        "tools": "Classified: length:11",
        "context": "The user John is 47 years old.",
        "hitl": "The temperature in Oakland is 20° Celsius",
        "nested": "In Spanish: Hola, ¿cómo estás?",
        "session": "San Francisco",
        "guarded": "Refunded 30 for order C-3.",
    }
    # each call in flight at a crash twice (it never finished), every other once
    assert models() == Counter(
        {
            "Guardrail check": 1,  # the input guardrail's agent: recorded with its step
            "Customer support agent": 2,
            "Structured support agent": 1,
            "Output check": 2,  # killed inside the output guardrail's step
            "Classifier": 2,
            "Assistant": 2,
            "Weather assistant": 2,
            "orchestrator_agent": 2,
            "Spanish agent": 2,
            "Concise assistant": 2,
            "checker": 1,  # issue 29: the guardrail's agent, not asked again after the crash
        }
    )
    assert tools() == Counter(
        {
            "classify_text": 2,
            "fetch_user_age": 2,
            "get_temperature": 2,
            "lookup_order": 2,
            "refund_order": 1,
        }
    )
    guardrails = Counter(c["name"] for c in pa.calls() if c["kind"] == "guardrail")
    assert guardrails == Counter({"refund_check": 1, "no_card_numbers": 1})
    assert [model_steps(runs[n]) for n in ("input", "tools", "hitl", "nested")] == [1, 2, 2, 3]
    # the session got the turn's items once, not again on the replay
    items = asyncio.run(SQLiteSession("c-9", docs.sessions_db()).get_items())
    assert [i.get("role") for i in items] == ["user", "assistant"]
