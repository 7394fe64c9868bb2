"""What ``interrupt()`` returns in a graph workflow: the value the graph expects.

The graphs are LangGraph's own examples (docs.langchain.com/oss/python/langgraph/
interrupts), in ``tests.contrib.lg_workflows``, with only the Durable lines changed.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.models import RunStatus
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)


def approver(name="alice"):
    user = User.objects.create_user(name, password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


def pending(run):
    return ApprovalRequest.objects.filter(run=run, status="pending").get()


def decide(run, approve, **kw):
    approval_decide(request_id=pending(run).pk, user=kw.pop("user"), approve=approve, **kw)
    return drive(run.id)


@pytest.mark.parametrize(("approve", "status"), [(True, "approved"), (False, "rejected")])
def test_approve_or_reject_takes_the_branch_the_approver_chose(lg_workflows, approve, status):
    """Interrupts page, "Approve or reject": ``Command(resume=True)`` proceeds,
    ``Command(resume=False)`` cancels. A rejection in the inbox must cancel."""
    alice = approver()
    run = drive(durable.start("lg.approval", {"action_details": "Transfer $500"}).id)
    assert run.status == RunStatus.WAITING and run.workflow_version == "2"
    req = pending(run)
    assert req.payload_for_display()["payload"] == {
        "question": "Do you want to proceed with this action?",
        "details": "Transfer $500",
    }
    run = decide(run, approve, user=alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["status"] == status


def test_a_version_registered_before_resume_keeps_the_decision_dict(lg_workflows):
    """Version 1 (no ``resume=``) gets the dict, as documented before: a graph that
    reads ``answer["approved"]`` keeps working, and a run of it waiting now resumes as
    it was started."""
    alice = approver()
    run = drive(durable.start("lg.approval", {"action_details": "x"}, version="1").id)
    assert run.workflow_version == "1" and run.status == RunStatus.WAITING
    run = decide(run, False, user=alice, comment="no")
    assert run.status == RunStatus.SUCCEEDED, run.error
    # the dict is truthy: the documented (old) behaviour this version relies on
    assert run.output_value()["status"] == "approved"


def test_review_and_edit_returns_the_edited_content(lg_workflows):
    """Interrupts page, "Review and edit state": ``interrupt()`` returns the edited text."""
    alice = approver()
    run = drive(durable.start("lg.review", {"generated_text": "draft"}).id)
    assert pending(run).payload_for_display()["payload"]["content"] == "draft"
    run = decide(
        run,
        True,
        user=alice,
        edited={"instruction": "Review and edit this content", "content": "improved"},
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"generated_text": "improved"}
    # approved as shown: the content unchanged
    run = drive(durable.start("lg.review", {"generated_text": "fine"}).id)
    run = decide(run, True, user=alice)
    assert run.output_value() == {"generated_text": "fine"}


def test_validating_input_asks_again_until_the_answer_is_valid(lg_workflows):
    """Interrupts page, "Validating human input": an invalid answer asks again; the
    valid answer is the node's result."""
    alice = approver()
    run = drive(durable.start("lg.age", {"age": None}).id)
    assert pending(run).payload_for_display()["payload"] == {"value": "What is your age?"}
    run = decide(run, True, user=alice, edited={"value": -3})
    assert run.status == RunStatus.WAITING
    assert "not a valid age" in pending(run).payload_for_display()["payload"]["value"]
    run = decide(run, True, user=alice, edited={"value": 30})
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"age": 30}


@pytest.mark.parametrize(
    ("approve", "status"), [(True, "approved"), (False, "not approved: False")]
)
def test_ask_declares_the_mapping_at_the_interrupt(lg_workflows, approve, status):
    alice = approver()
    run = drive(durable.start("lg.asked", {"action_details": "deploy"}).id)
    assert pending(run).payload_for_display()["payload"] == {"value": "Run deploy?"}
    assert pending(run).allow_edit is False  # a yes/no question is not editable
    run = decide(run, approve, user=alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["status"] == status


def test_an_interrupt_no_declaration_covers_is_refused_at_the_interrupt(lg_workflows):
    run = drive(durable.start("lg.approval_unmapped", {"action_details": "x"}).id)
    assert run.status == RunStatus.FAILED
    assert "node 'approval'" in run.error["message"]
    assert "does not say what interrupt() returns" in run.error["message"]
    assert not ApprovalRequest.objects.filter(run=run).exists()


def test_contradicting_declarations_are_refused_not_guessed(lg_workflows):
    run = drive(durable.start("lg.asked_conflict", {"action_details": "x"}).id)
    assert run.status == RunStatus.FAILED
    assert "'approve'" in run.error["message"] and "'answer'" in run.error["message"]
    assert not ApprovalRequest.objects.filter(run=run).exists()


def test_ask_and_graph_workflow_refuse_an_unknown_kind():
    from durable.contrib.langgraph import ask, graph_workflow
    from durable.exceptions import DurableConfigurationError

    with pytest.raises(ValueError, match="resume must be one of"):
        ask("x", "yes")
    with pytest.raises(DurableConfigurationError, match="a resume kind is one of"):
        graph_workflow("lg.bad", "1", lambda: None, resume={"n": "maybe"})
    with pytest.raises(DurableConfigurationError, match="durability"):
        graph_workflow("lg.bad", "1", lambda: None, durability="eventually")
