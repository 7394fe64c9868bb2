"""Graph workflows (durable.contrib.langgraph) on real worker processes.

Workers are ``celery worker --pool=solo`` processes importing
``tests.contrib.lg_workflows``; node bodies append one line per execution to
``$CRASH_TEST_DIR/lg_nodes.jsonl`` (with the worker's pid), so "ran exactly once" is
counted across processes. ``LG_CRASH_AT=<node>`` makes the first worker that runs that
node SIGKILL itself inside it (mid-graph: the earlier super-steps are checkpointed).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

pytest.importorskip("langgraph")

from django.contrib.auth.models import Permission, User

import durable
from approvals.models import ApprovalRequest
from approvals.services import AlreadyDecided, approval_decide
from durable.models import Operation, RunStatus, Step
from tests.contrib import lg_workflows
from tests.harness import wait_for_run

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.lg_workflows"}


def node_lines(proc_env) -> list[dict]:
    path = proc_env.dir / "lg_nodes.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def approver(name: str) -> User:
    user = User.objects.create_user(name, password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


def test_a_worker_killed_mid_graph_the_run_resumes_on_another_from_the_checkpoint(
    workers, proc_env
):
    """a -> b -> c -> d; the worker dies inside c. Another worker finishes the run: a and
    b never run again (their super-steps are checkpointed), c runs again, then d."""
    first = workers.start(wait=True, LG_CRASH_AT="c", **WORKER_ENV)
    run = durable.start("lg.chain", {"log": ["in"]})
    assert first.wait_exit(30) != 0  # SIGKILLed itself inside node c
    assert (proc_env.dir / "lg-crashed-c").exists()
    assert Counter(n["node"] for n in node_lines(proc_env)) == Counter("abc")

    second = workers.start(wait=True, **WORKER_ENV)
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["log"] == ["in", "a", "b", "c", "d"]
    lines = node_lines(proc_env)
    assert Counter(n["node"] for n in lines) == Counter({"a": 1, "b": 1, "c": 2, "d": 1})
    assert [n["pid"] for n in lines] == [first.pid] * 3 + [second.pid] * 2
    steps = list(Step.objects.filter(run=run).order_by("position"))
    assert [s.step_id for s in steps] == [
        "superstep-1",
        "superstep-2",
        "superstep-3",
        "superstep-4",
    ]
    assert [n["node"] for n in steps[2].output_value()["nodes"]] == ["c"]


def test_interrupts_answered_across_a_worker_kill_and_a_double_answer_is_refused(workers, proc_env):
    alice, bob = approver("alice"), approver("bob")
    first = workers.start(wait=True, **WORKER_ENV)
    run = durable.start("lg.two_questions", {})
    wait_for_run(run.id, timeout=30, statuses=(RunStatus.WAITING,))
    first.kill()
    second = workers.start(wait=True, **WORKER_ENV)
    # both interrupts of the super-step are in the inbox together
    req1, req2 = ApprovalRequest.objects.filter(run=run).order_by("id")
    approval_decide(request_id=req1.pk, user=alice, approve=True, edited={"question": "a"})
    with pytest.raises(AlreadyDecided):
        approval_decide(request_id=req1.pk, user=alice, approve=True)
    # a late answer to the first request (another approver) changes nothing
    with pytest.raises(Exception, match="already|decided|not pending|closed"):
        approval_decide(request_id=req1.pk, user=bob, approve=False)
    approval_decide(request_id=req2.pk, user=bob, approve=False, comment="no")
    run = wait_for_run(run.id, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error
    answers = {k: v for a in run.output_value()["answers"] for k, v in a.items()}
    key1 = req1.payload_for_display()["payload"]["key"]
    key2 = req2.payload_for_display()["payload"]["key"]
    assert {key1, key2} == {"x", "y"}
    assert answers[key1]["approved"] is True and answers[key1]["answer"] == {"question": "a"}
    assert answers[key2]["approved"] is False and answers[key2]["comment"] == "no"
    nodes = Counter(n["node"] for n in node_lines(proc_env))
    assert nodes["start"] == 1 and nodes["end"] == 1
    assert second.alive()


def test_a_node_killed_after_its_tool_call_does_not_refund_twice(workers, proc_env):
    """pay calls lg_refund through call_tool (the ledger), then its worker dies. The node
    runs again on another worker: the refund is the recorded one, made once."""
    first = workers.start(wait=True, LG_CRASH_AT="pay", **WORKER_ENV)
    run = durable.start("lg.refund", {})
    assert first.wait_exit(30) != 0
    workers.start(wait=True, **WORKER_ENV)
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    refunds = lg_workflows.refunds_made()
    assert len(refunds) == 1
    op = Operation.objects.get(run=run)
    assert op.status == "succeeded" and refunds[0]["key"] == op.idempotency_key
    assert run.output_value()["refund"] == refunds[0]
    nodes = Counter(n["node"] for n in node_lines(proc_env))
    assert nodes["pay-after-tool"] == 2  # ran again after the crash, without a new refund


def test_approve_or_reject_rejected_across_a_worker_kill_takes_the_reject_branch(workers, proc_env):
    """The docs' "Approve or reject" graph (version 2, resume="approve"): the worker
    waiting on the approval is SIGKILLed; the rejection, decided meanwhile, is read by
    another worker and the graph goes down the cancel branch. One request, decided once."""
    alice = approver("alice")
    first = workers.start(wait=True, **WORKER_ENV)
    run = durable.start("lg.approval", {"action_details": "Transfer $500"})
    wait_for_run(run.id, timeout=30, statuses=(RunStatus.WAITING,))
    first.kill()
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=alice, approve=False, comment="too much")
    workers.start(wait=True, **WORKER_ENV)
    run = wait_for_run(run.id, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["status"] == "rejected"
    assert ApprovalRequest.objects.filter(run=run).count() == 1


@pytest.fixture
def scripted_llm():
    """The scripted LLM server (examples/fake_llm.py) in a thread, for the workers."""
    from examples._http import start
    from examples.fake_llm import FakeLLM

    llm = FakeLLM()
    server = start(llm.router, "fake-llm")
    llm.env = {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
        "OPENAI_API_KEY": "scripted",
    }
    try:
        yield llm
    finally:
        server.shutdown()


def test_a_node_killed_after_its_model_calls_does_not_ask_the_model_again(
    workers, proc_env, scripted_llm
):
    """write makes two call_model calls (LLM steps), then its worker dies inside the
    node. Another worker re-runs the node: both answers are the recorded ones, the
    scripted model was asked exactly twice."""
    llm_env = scripted_llm.env
    first = workers.start(wait=True, LG_CRASH_AT="write", **llm_env, **WORKER_ENV)
    run = durable.start("lg.writer", {"topic": "otters", "log": []})
    assert first.wait_exit(30) != 0
    workers.start(wait=True, **llm_env, **WORKER_ENV)
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(scripted_llm.log) == 2
    llm_steps = Step.objects.filter(run=run, kind="llm").order_by("position")
    assert [s.step_id for s in llm_steps] == ["write.llm", "write.llm#2"]
    assert run.output_value()["draft"] == llm_steps[1].output_value()["content"]
    nodes = Counter(n["node"] for n in node_lines(proc_env))
    assert nodes["write-done"] == 2  # the killed run of the node and the one after it
