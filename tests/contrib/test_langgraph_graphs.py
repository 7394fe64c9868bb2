"""Graph workflows in-process: super-steps as steps, interrupts as approvals, call_tool."""

from __future__ import annotations

from collections import Counter

import pytest
from django.contrib.auth.models import Permission, User

import durable
from approvals.models import ApprovalRequest
from approvals.services import AlreadyDecided, approval_decide
from durable.models import RunStatus, Step
from durable.testing import drive

# a sync graph checkpoints from LangGraph's background threads (their own connections)
pytestmark = pytest.mark.django_db(transaction=True)


def approver(name="alice"):
    user = User.objects.create_user(name, password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


def nodes_run(lg) -> Counter:
    return Counter(line["node"] for line in lg.NODE_LOG)


def test_a_graph_runs_as_a_run_with_one_step_per_super_step(lg_workflows):
    run = drive(durable.start("lg.chain", {"log": ["in"]}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["log"] == ["in", "a", "b", "c", "d"]
    steps = list(Step.objects.filter(run=run).order_by("position"))
    assert [s.step_id for s in steps] == [f"superstep-{i}" for i in range(1, 5)]
    first = steps[0].output_value()
    assert [n["node"] for n in first["nodes"]] == ["a"]
    assert first["nodes"][0]["output"] == {"log": ["a"]}
    assert first["nodes"][0]["input"]["log"] == ["in"]
    assert first["nodes"][0]["seconds"] >= 0
    third = steps[2].output_value()
    assert third["nodes"][0]["node"] == "c" and third["nodes"][0]["seconds"] >= 0.2
    assert steps[-1].output_value()["done"] is True
    assert nodes_run(lg_workflows) == Counter("abcd")


def test_a_failed_node_is_retried_without_running_finished_super_steps_again(lg_workflows):
    lg_workflows.FAIL_ONCE.add("c")
    run = drive(durable.start("lg.chain", {"log": []}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["log"] == ["a", "b", "c", "d"]
    # c failed once (a transient error) and ran again; a and b were replayed, not run
    assert nodes_run(lg_workflows) == Counter({"a": 1, "b": 1, "c": 2, "d": 1})
    step = Step.objects.get(run=run, step_id="superstep-3")
    assert step.attempts == 2


def test_a_fork_of_a_graph_run_continues_from_the_checkpoint_before_its_step(lg_workflows):
    """durable.fork at superstep-3: a and b are reused (their records and the source
    thread's checkpoints), c and d run again in the fork's own thread."""
    run = drive(durable.start("lg.chain", {"log": ["in"]}).id)
    forked = drive(durable.fork(run.id, from_step="superstep-3").id)
    assert forked.status == RunStatus.SUCCEEDED, forked.error
    assert forked.output_value()["log"] == ["in", "a", "b", "c", "d"]
    assert nodes_run(lg_workflows) == Counter({"a": 1, "b": 1, "c": 2, "d": 2})
    # the source's thread is untouched
    assert run.output_value() == drive(run.id).output_value()


def test_fork_graph_updates_the_state_like_langgraphs_time_travel(lg_workflows):
    """LangGraph's time travel (docs: "Use time-travel"): update_state at a past
    checkpoint, then continue. fork_graph does it on a Durable fork."""
    from durable.contrib.langgraph import fork_graph

    run = drive(durable.start("lg.chain", {"log": ["in"]}).id)
    forked = fork_graph(run.id, from_step="superstep-3", values={"log": ["edited"]}, as_node="b")
    forked = drive(forked.id)
    assert forked.status == RunStatus.SUCCEEDED, forked.error
    assert forked.output_value()["log"] == ["in", "a", "b", "edited", "c", "d"]
    assert nodes_run(lg_workflows) == Counter({"a": 1, "b": 1, "c": 2, "d": 2})
    assert run.output_value()["log"] == ["in", "a", "b", "c", "d"]
    with pytest.raises(ValueError, match="no state before it"):
        fork_graph(run.id, from_step="superstep-1", values={"log": ["x"]})
    with pytest.raises(ValueError, match="not a super-step"):
        fork_graph(run.id, from_step="superstep-9")


def test_a_fork_of_a_pruned_graph_run_fails_with_a_clear_error(lg_workflows):
    from durable.contrib.langgraph.models import LangGraphCheckpoint

    run = drive(durable.start("lg.chain", {"log": []}).id)
    LangGraphCheckpoint.objects.filter(thread_id=run.id).delete()
    forked = drive(durable.fork(run.id, from_step="superstep-3").id)
    assert forked.status == RunStatus.FAILED
    assert "cannot continue" in forked.error["message"]


def test_two_interrupts_in_one_super_step_reach_the_inbox_together_and_resume_together(
    lg_workflows,
):
    alice = approver()
    run = drive(durable.start("lg.two_questions", {}).id)
    assert run.status == RunStatus.WAITING
    reqs = list(ApprovalRequest.objects.filter(run=run).order_by("id"))
    assert len(reqs) == 2  # both questions are in the inbox at once
    keys = [r.payload_for_display()["payload"]["key"] for r in reqs]
    assert sorted(keys) == ["x", "y"]
    assert reqs[0].key != reqs[1].key  # waits are keyed by interrupt id
    first, second = reqs
    first_key = keys[0]
    # answered in the other order than asked
    approval_decide(request_id=second.pk, user=alice, approve=False, comment="no")
    run = drive(run.id)
    assert run.status == RunStatus.WAITING  # the graph resumes once, with both answers
    assert nodes_run(lg_workflows) == Counter({"start": 1, "ask-x": 1, "ask-y": 1})
    approval_decide(
        request_id=first.pk, user=alice, approve=True, edited={"question": "q", "key": "A1"}
    )
    with pytest.raises(AlreadyDecided):
        approval_decide(request_id=first.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    answers = {k: v for a in run.output_value()["answers"] for k, v in a.items()}
    other = "y" if first_key == "x" else "x"
    assert answers[first_key]["approved"] is True
    assert answers[first_key]["answer"] == {"question": "q", "key": "A1"}
    assert answers[other]["approved"] is False and answers[other]["comment"] == "no"
    assert answers[other]["answer"] is None
    assert run.output_value()["log"] == ["start", "end"]
    # each asking node ran twice: once to ask, once resumed with its answer
    assert nodes_run(lg_workflows) == Counter({"start": 1, "ask-x": 2, "ask-y": 2, "end": 1})


def test_a_string_interrupt_is_wrapped_and_answered(lg_workflows):
    alice = approver()
    run = drive(durable.start("lg.plain_question", {}).id)
    req = ApprovalRequest.objects.get(run=run)
    assert req.payload_for_display()["payload"] == {"value": "Ship it?"}
    assert "Ship it?" in req.title
    approval_decide(request_id=req.pk, user=alice, approve=True, edited={"value": "yes"})
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["answers"][0]["answer"] == "yes"


def test_a_stale_answer_cannot_answer_the_next_interrupt(lg_workflows):
    alice, bob = approver(), approver("bob")
    run = drive(durable.start("lg.two_in_a_row", {}).id)
    first = ApprovalRequest.objects.get(run=run)
    assert first.payload_for_display()["payload"] == {"question": "first?"}
    approval_decide(request_id=first.pk, user=alice, approve=True, edited={"question": "1"})
    run = drive(run.id)
    assert run.status == RunStatus.WAITING
    second = ApprovalRequest.objects.filter(run=run).exclude(pk=first.pk).get()
    assert second.payload_for_display()["payload"] == {"question": "second?"}
    # answering the first request again (another approver, a replayed click) is refused
    # and does not touch the second
    with pytest.raises(Exception, match="already|decided|not pending|closed"):
        approval_decide(request_id=first.pk, user=bob, approve=False)
    second.refresh_from_db()
    assert second.status == "pending"
    assert drive(run.id).status == RunStatus.WAITING
    approval_decide(request_id=second.pk, user=alice, approve=True, edited={"question": "2"})
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    first_answer, second_answer = run.output_value()["answers"]
    assert first_answer["answer"] == {"question": "1"}
    assert second_answer["answer"] == {"question": "2"}


def test_call_tool_from_a_node_goes_through_the_ledger(lg_workflows):
    from durable.models import Operation

    run = drive(durable.start("lg.refund", {}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(lg_workflows.REFUNDS) == 1
    op = Operation.objects.get(run=run)
    assert op.safety == "unsafe_write" and op.status == "succeeded"
    assert op.idempotency_key == f"{run.id}:pay.lg_refund"
    assert lg_workflows.REFUNDS[0]["key"] == op.idempotency_key
    assert run.output_value()["refund"]["amount"] == 5
    assert run.output_value()["log"] == ["plan", "pay", "after"]
    # the node ran twice (stopped at the call, then resumed with its result)
    assert nodes_run(lg_workflows)["pay"] == 2
    assert nodes_run(lg_workflows)["pay-after-tool"] == 1


def test_the_dashboard_shows_super_steps_and_the_interrupt_in_the_inbox(lg_workflows):
    from django.test import Client

    admin = User.objects.create_superuser("root", password="pw-for-tests")
    client = Client()
    client.force_login(admin)
    done = drive(durable.start("lg.chain", {"log": []}).id)
    page = client.get(f"/runs/{done.id}/")
    assert page.status_code == 200
    steps = client.get(f"/runs/{done.id}/steps/")
    assert steps.status_code == 200
    text = page.content.decode() + steps.content.decode()
    assert "superstep-1" in text and "superstep-4" in text
    waiting = drive(durable.start("lg.plain_question", {}).id)
    inbox = client.get("/approvals/")
    assert inbox.status_code == 200
    assert "Ship it?" in inbox.content.decode()
    assert waiting.status == RunStatus.WAITING


def test_pruning_a_graph_run_deletes_its_threads_checkpoints(lg_workflows):
    from durable.contrib.langgraph.models import (
        LangGraphBlob,
        LangGraphCheckpoint,
        LangGraphWrite,
    )
    from durable.services.retention import prune_run

    run = drive(durable.start("lg.chain", {"log": ["in"]}).id)
    other = drive(durable.start("lg.chain", {"log": ["other"]}).id)
    assert LangGraphCheckpoint.objects.filter(thread_id=run.id).exists()
    counts = prune_run(run.id)
    for model in (LangGraphCheckpoint, LangGraphBlob, LangGraphWrite):
        assert not model.objects.filter(thread_id=run.id).exists(), model.__name__
    assert counts.get("langgraphcheckpoint", 0) > 0
    # another run's thread stays
    assert LangGraphCheckpoint.objects.filter(thread_id=other.id).exists()


def test_a_super_step_cut_off_between_its_writes_and_its_checkpoint_resumes(
    lg_workflows, monkeypatch
):
    """Found by the chaos audit: a worker killed after node ``a``'s writes were saved and
    before the super-step's checkpoint left a task with writes and no ``next``; the retry
    read that as "the graph finished" and the run succeeded with ``a``'s output missing
    (and, in an agent, its tool calls never made). Now the retry applies the saved writes
    and goes on, without running ``a`` again."""
    from durable.contrib.langgraph.saver import DurableSaver

    real_put = DurableSaver.put
    cut = []

    def put(self, config, checkpoint, metadata, new_versions):
        if metadata.get("step") == 1 and not cut:  # the checkpoint after node a
            cut.append(True)
            raise ConnectionError("the worker was killed before the checkpoint was saved")
        return real_put(self, config, checkpoint, metadata, new_versions)

    monkeypatch.setattr(DurableSaver, "put", put)
    run = drive(durable.start("lg.chain", {"log": ["in"]}).id)
    assert cut, "the cut never happened"
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["log"] == ["in", "a", "b", "c", "d"]
    assert nodes_run(lg_workflows) == Counter("abcd")  # a's writes were kept, not redone


def test_a_run_waiting_one_interrupt_at_a_time_resumes_with_interrupts_together(
    lg_workflows, monkeypatch
):
    """A run parked by the driver before interrupts were asked together (one wait, the
    second not yet created) resumes unchanged under the new driver: the same positions,
    the second question added to the inbox, the graph resumed once."""
    from durable.contrib.langgraph import graph as lg_graph

    alice = approver()

    def one_by_one(ctx, humans, answers):  # the driver before wait_for_approvals
        for iid, (request, kind, details, wrapped) in humans:
            decision = ctx.wait_for_approval(**request)
            answers[iid] = lg_graph.resume_value(decision, kind, details, wrapped)
        humans.clear()

    with monkeypatch.context() as patch:
        patch.setattr(lg_graph, "_ask_together", one_by_one)
        run = drive(durable.start("lg.two_questions", {}).id)
    assert run.status == RunStatus.WAITING
    first = ApprovalRequest.objects.get(run=run)  # the old driver asked one at a time
    approval_decide(request_id=first.pk, user=alice, approve=True)
    run = drive(run.id)  # the new driver
    assert run.status == RunStatus.WAITING, run.error
    second = ApprovalRequest.objects.filter(run=run).exclude(pk=first.pk).get()
    approval_decide(request_id=second.pk, user=alice, approve=False)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    answers = {k: v["approved"] for a in run.output_value()["answers"] for k, v in a.items()}
    assert sorted(answers.values()) == [False, True]
    assert nodes_run(lg_workflows) == Counter({"start": 1, "ask-x": 2, "ask-y": 2, "end": 1})
