"""DurableAgent (PydanticAI) across real worker processes: SIGKILL during a model
request, during a tool call, and while the run waits for approval; and the five
documentation examples (tests/contrib/pydantic_ai_docs.py), each killed once.

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
from pydantic_ai import UsageLimits

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.models import Run, RunStatus, Step
from tests.contrib import pai_agents as pa
from tests.contrib import pydantic_ai_docs as docs
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
    volatile = {
        "timestamp",
        "request_timestamp",  # pydantic-ai 2.7x: when the request was sent
        "duration",
        "run_id",
        "conversation_id",
        "provider_response_id",
    }

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


def test_the_five_documentation_examples_survive_a_kill_in_each(workers, proc_env):
    """The crash variants of tests/contrib/test_pydantic_ai_docs.py: the five examples'
    runs share workers, each killed during one example's second model request (once per
    example), a new worker started after each kill. Every example still ends as its page
    says; only the killed request ran twice (it never finished), every other request and
    the dice roll once, and each model request is recorded once."""
    env = {**WORKER_ENV}
    env["DURABLE_WORKFLOW_MODULES"] += ",tests.contrib.pydantic_ai_docs"
    examples = ["roulette", "dice", "limits", "files", "support"]
    crash_at = ",".join(f"model:{ex}:2" for ex in examples)
    runs = {
        "roulette": docs.durable_roulette.start("Put my money on square eighteen", deps=18),
        "dice": docs.durable_dice.start("My guess is 4", deps="Anne"),
        "limits": docs.durable_limits.start(
            "Begin infinite retry loop!", usage_limits=UsageLimits(request_limit=3)
        ),
        "files": docs.durable_files.start(
            "Delete `__init__.py`, write `Hello, world!` to `README.md`, and clear `.env`"
        ),
        "support": docs.durable_support.start("What is my balance?", deps={"customer_id": 123}),
    }
    ended = (RunStatus.SUCCEEDED, RunStatus.FAILED)
    workers_started = [workers.start(wait=True, crash_at=crash_at, **env)]

    def until(done) -> None:
        """Until ``done()``, a new worker after each kill (one per example at most)."""
        for _ in range(len(examples) + 1):
            worker = workers_started[-1]
            wait_until(lambda w=worker: done() or not w.alive(), 60, what="a kill or the end")
            if done():
                return
            worker.proc.wait(timeout=10)
            workers_started.append(workers.start(wait=True, crash_at=crash_at, **env))
        raise AssertionError("more kills than examples")

    def status(example: str) -> str:
        return Run.objects.get(pk=runs[example].id).status

    # the files example's second request comes after its approvals
    until(lambda: status("files") == RunStatus.WAITING)
    alice, _ = User.objects.get_or_create(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    pending = ApprovalRequest.objects.filter(run_id=runs["files"].id, status=ApprovalStatus.PENDING)
    assert pending.count() == 2  # together
    for req in pending:
        approval_decide(request_id=req.pk, user=alice, approve=req.key.startswith("update_file"))
    until(lambda: all(status(ex) in ended for ex in examples))
    assert all(proc_env.crashed(f"model:{ex}:2") for ex in examples)
    final = {ex: Run.objects.get(pk=r.id) for ex, r in runs.items()}

    assert docs.durable_roulette.decode(final["roulette"].output_value()).output is True
    dice = docs.durable_dice.decode(final["dice"].output_value()).output
    assert "Anne" in dice
    assert final["limits"].status == RunStatus.FAILED
    assert "would exceed the request_limit of 3" in final["limits"].error["message"]
    files = docs.durable_files.decode(final["files"].output_value()).output
    assert '"update_file_dotenv": ["success"' in files and '"delete_file": ["denied"' in files
    support = docs.durable_support.decode(final["support"].output_value()).output
    assert support.support_advice.startswith("Hello John") and support.risk == 1

    expected = {"roulette": 2, "dice": 2, "limits": 3, "files": 2, "support": 2}
    want = Counter(f"model:{ex}:{n}" for ex, k in expected.items() for n in range(1, k + 1))
    want += Counter(f"model:{ex}:2" for ex in examples)  # the killed request, again
    want["tool:dice:roll_dice"] = 1
    assert counted() == want
    for ex, run in final.items():
        models = Step.objects.filter(run_id=run.id, step_id__startswith="model")
        assert models.count() == expected[ex], ex
