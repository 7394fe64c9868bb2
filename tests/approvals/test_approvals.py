"""Approvals: who may decide, what a decision carries, N-of-M, expiry, escalation, S09."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.contrib.auth.models import Group, Permission
from django.utils import timezone

import durable
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.selectors import pending_for
from approvals.services import (
    AlreadyDecided,
    ApprovalExpired,
    ApprovalNotFound,
    NotAllowed,
    approval_decide,
)
from durable.exceptions import DurableConfigurationError, IllegalTransition, InvalidDuration
from durable.models import Run, RunStatus, Step, TraceEvent, Wait, WaitStatus
from durable.testing import drive
from durable.worker.sweeper import sweep
from tests.approvals import approval_workflows as flows

pytestmark = pytest.mark.django_db(transaction=True)


def start_waiting(workflow: str, data: dict | None = None, **options) -> Run:
    # a known starter who is none of the tests' approvers (unless the test names one):
    # with an unknown one, four-eyes requests would need two approvers
    options.setdefault("started_by", "os:requester")
    run = drive(durable.start(workflow, data or {}, **options).id)
    assert run.status == RunStatus.WAITING, run.error
    return run


def request_of(run: Run, key: str | None = None) -> ApprovalRequest:
    qs = ApprovalRequest.objects.filter(run=run)
    return qs.get(key=key) if key else qs.get()


# ------------------------------------------------------------------ approve / reject


def test_approve_resumes_the_run_with_an_approved_decision(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve", {"payload": {"amount": 5}})
    req = request_of(run)
    assert req.status == ApprovalStatus.PENDING and flows.calls("after", run.id) == 0
    approval_decide(request_id=req.pk, user=alice, approve=True, comment="fine")
    req.refresh_from_db()
    assert req.status == ApprovalStatus.APPROVED and req.decided_by == "alice"
    assert Run.objects.get(pk=run.id).status == RunStatus.PENDING
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["approved"] is True and out["decided_by"] == ["alice"]
    assert out["comment"] == "fine" and out["expired"] is False
    assert flows.calls("after", run.id) == 1


def test_rejection_comment_reaches_the_workflow(make_user):
    bob = make_user("bob")
    run = start_waiting("apf.approve")
    approval_decide(
        request_id=request_of(run).pk, user=bob, approve=False, comment="over budget, try 50"
    )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["approved"] is False
    assert out["comment"] == "over budget, try 50"
    assert out["decided_by"] == ["bob"]
    assert request_of(run).status == ApprovalStatus.REJECTED


def test_rejected_tool_call_returns_model_recoverable_and_tool_not_called(make_user):
    bob = make_user("bob")
    run = start_waiting("apf.tool_send", {"to": "eve@example.com"})
    req = request_of(run)
    assert req.tool_name == "apf.send" and req.safety == "unsafe_write"
    approval_decide(
        request_id=req.pk,
        user=bob,
        approve=False,
        comment="wrong recipient, use the support address",
    )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["type"] == "ApprovalRejected"
    assert "rejected by bob" in out["error"]
    assert "wrong recipient, use the support address" in out["error"]
    assert out["details"]["comment"] == "wrong recipient, use the support address"
    assert flows.calls("apf.send") == 0
    assert not run.operations.exists()
    assert (
        not Step.objects.filter(run=run, kind="tool")
        .exclude(error__classification="model_recoverable")
        .exists()
    )


def test_approved_tool_call_runs_the_tool_once(make_user):
    bob = make_user("bob")
    run = start_waiting("apf.tool_send", {"to": "eve@example.com"})
    approval_decide(request_id=request_of(run).pk, user=bob, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"result": {"sent": "eve@example.com", "body": "hello"}}
    assert flows.calls("apf.send", run.id) == 1


# ------------------------------------------------------------------------- editing


def test_edit_refused_where_the_policy_does_not_allow_it(make_user):
    bob = make_user("bob")
    run = start_waiting("apf.tool_send", {"to": "eve@example.com"})
    req = request_of(run)
    assert req.allow_edit is False
    with pytest.raises(NotAllowed) as err:
        approval_decide(
            request_id=req.pk,
            user=bob,
            approve=True,
            edited={"to": "mallory@example.com", "body": "hello"},
        )
    assert "editing" in str(err.value) and err.value.missing == ["a policy that allows editing"]
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING and not req.decisions.exists()


def test_edit_allowed_replaces_the_tool_parameters(make_user):
    ed = make_user("ed", groups=("editors",))
    run = start_waiting("apf.tool_post", {"text": "draft"})
    req = request_of(run)
    assert req.allow_edit is True and req.approver_group.name == "editors"
    approval_decide(request_id=req.pk, user=ed, approve=True, edited={"text": "final"})
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"result": {"posted": "final"}}
    assert [c[2] for c in flows.CALLS if c[0] == "apf.post"] == ["final"]


def test_edit_of_a_plain_approval_reaches_the_decision(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve", {"allow_edit": True, "payload": {"n": 1}})
    approval_decide(request_id=request_of(run).pk, user=alice, approve=True, edited={"n": 2})
    out = drive(run.id).output_value()
    assert out["approved"] is True and out["edited"] == {"n": 2}


def test_edited_parameters_must_be_a_dict(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve", {"allow_edit": True})
    with pytest.raises(ValueError, match="JSON object"):
        approval_decide(
            request_id=request_of(run).pk, user=alice, approve=True, edited=["not", "a", "dict"]
        )
    assert request_of(run).status == ApprovalStatus.PENDING


# ---------------------------------------------------------------------- authority


def test_approver_group_is_enforced(make_user):
    outsider = make_user("outsider")
    member = make_user("fin", groups=("finance",))
    run = start_waiting("apf.approve", {"approvers": "finance"})
    req = request_of(run)
    with pytest.raises(NotAllowed) as err:
        approval_decide(request_id=req.pk, user=outsider, approve=True)
    assert err.value.missing == ["membership of the group 'finance'"]
    assert "outsider may not decide" in str(err.value)
    assert list(pending_for(outsider)) == [] and list(pending_for(member)) == [req]
    approval_decide(request_id=req.pk, user=member, approve=True)
    assert drive(run.id).output_value()["decided_by"] == ["fin"]


def test_user_without_permission_is_told_what_is_missing(make_user):
    nobody = make_user("nobody", perm=False)
    run = start_waiting("apf.approve", {"approvers": "finance"})
    req = request_of(run)
    with pytest.raises(NotAllowed) as err:
        approval_decide(request_id=req.pk, user=nobody, approve=True)
    assert err.value.missing == [
        "the permission approvals.decide_approval",
        "membership of the group 'finance'",
    ]
    assert "approvals.decide_approval" in str(err.value) and "'finance'" in str(err.value)
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING and not req.decisions.exists()
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING


def test_inactive_user_is_refused(make_user):
    gone = make_user("gone", active=False)
    run = start_waiting("apf.approve")
    with pytest.raises(NotAllowed) as err:
        approval_decide(request_id=request_of(run).pk, user=gone, approve=True)
    assert err.value.missing == ["an active account"]
    assert request_of(run).status == ApprovalStatus.PENDING


def test_user_deactivated_after_the_request_is_refused(make_user):
    carol = make_user("carol")
    run = start_waiting("apf.approve")
    stale = type(carol).objects.get(pk=carol.pk)
    type(carol).objects.filter(pk=carol.pk).update(is_active=False)
    assert stale.is_active  # the caller's object is stale; the service must re-read
    with pytest.raises(NotAllowed) as err:
        approval_decide(request_id=request_of(run).pk, user=stale, approve=True)
    assert err.value.missing == ["an active account"]


def test_permission_removed_after_the_request_is_refused_at_decision_time(make_user):
    carol = make_user("carol")
    run = start_waiting("apf.approve")
    req = request_of(run)
    assert carol.has_perm("approvals.decide_approval")  # fills the object's perm cache
    carol.user_permissions.remove(Permission.objects.get(codename="decide_approval"))
    assert carol.has_perm("approvals.decide_approval")  # the stale object still says yes
    with pytest.raises(NotAllowed) as err:
        approval_decide(request_id=req.pk, user=carol, approve=True)
    assert err.value.missing == ["the permission approvals.decide_approval"]
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING and not req.decisions.exists()


def test_group_membership_removed_after_the_request_is_refused(make_user):
    fin = make_user("fin", groups=("finance",))
    run = start_waiting("apf.approve", {"approvers": "finance"})
    fin.groups.remove(Group.objects.get(name="finance"))
    with pytest.raises(NotAllowed) as err:
        approval_decide(request_id=request_of(run).pk, user=fin, approve=True)
    assert err.value.missing == ["membership of the group 'finance'"]


# ---------------------------------------------------------------------- four eyes


def test_four_eyes_starter_cannot_approve_own_unsafe_write(make_user):
    alice = make_user("alice")
    bob = make_user("bob")
    run = start_waiting("apf.tool_send", {"to": "eve@example.com"}, started_by=alice)
    req = request_of(run)
    assert req.four_eyes is True and req.requested_by_id == alice.pk
    with pytest.raises(NotAllowed) as err:
        approval_decide(request_id=req.pk, user=alice, approve=True)
    assert "four-eyes" in str(err.value)
    assert err.value.missing == ["a different approver than the run's starter"]
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING and not req.decisions.exists()
    assert flows.calls("apf.send") == 0
    approval_decide(request_id=req.pk, user=bob, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert flows.calls("apf.send", run.id) == 1
    assert request_of(run).decided_by == "bob"


def test_plain_approval_without_four_eyes_lets_the_starter_approve(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve", started_by=alice)
    approval_decide(request_id=request_of(run).pk, user=alice, approve=True)
    assert drive(run.id).output_value()["approved"] is True


# --------------------------------------------------------------------------- N of M


def test_two_of_m_first_approval_is_recorded_and_second_resolves(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    run = start_waiting("apf.approve", {"required": 2})
    req = request_of(run)
    approval_decide(request_id=req.pk, user=alice, approve=True)
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING
    assert req.decisions.count() == 1
    assert Wait.objects.get(pk=req.wait_id).status == WaitStatus.PENDING
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING
    recorded = TraceEvent.objects.filter(run=run, kind="approval_recorded")
    assert [(e.actor, e.message) for e in recorded] == [("alice", "approved by alice (1 of 2)")]
    assert drive(run.id).status == RunStatus.WAITING
    assert flows.calls("after", run.id) == 0

    with pytest.raises(AlreadyDecided, match="alice already approved"):
        approval_decide(request_id=req.pk, user=alice, approve=True)
    assert req.decisions.count() == 1

    approval_decide(request_id=req.pk, user=bob, approve=True)
    req.refresh_from_db()
    assert req.status == ApprovalStatus.APPROVED and req.decided_by == "alice, bob"
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["decided_by"] == ["alice", "bob"]
    assert flows.calls("after", run.id) == 1


def test_same_user_twice_is_already_decided(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve")
    req = request_of(run)
    approval_decide(request_id=req.pk, user=alice, approve=True)
    with pytest.raises(AlreadyDecided, match="already approved by alice"):
        approval_decide(request_id=req.pk, user=alice, approve=False, comment="changed my mind")
    req.refresh_from_db()
    assert req.status == ApprovalStatus.APPROVED and req.comment == ""
    assert ApprovalDecision.objects.filter(request=req).count() == 1


# --------------------------------------------------------- refused decision targets


def test_decision_on_a_cancelled_run_is_refused(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve")
    durable.cancel(run.id, by="ops", reason="customer withdrew")
    req = request_of(run)
    assert req.status == ApprovalStatus.CANCELLED
    with pytest.raises(IllegalTransition, match="cancelled"):
        approval_decide(request_id=req.pk, user=alice, approve=True)
    assert not req.decisions.exists()
    assert Run.objects.get(pk=run.id).status == RunStatus.CANCELLED


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.COMPENSATED])
def test_decision_on_a_finished_run_is_refused_with_a_clear_message(make_user, status):
    alice = make_user("alice")
    run = start_waiting("apf.approve")
    # a pending request on a finished run (e.g. finished by an operator out of band)
    Run.objects.filter(pk=run.id).update(status=status, finished_at=timezone.now())
    req = request_of(run)
    with pytest.raises(
        IllegalTransition, match=f"run {run.id} is {status}; decisions on cancelled or finished"
    ):
        approval_decide(request_id=req.pk, user=alice, approve=True)
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING and not req.decisions.exists()
    assert Wait.objects.get(pk=req.wait_id).status == WaitStatus.PENDING


def test_decision_after_the_run_finished_is_already_decided(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve")
    req = request_of(run)
    approval_decide(request_id=req.pk, user=alice, approve=True)
    assert drive(run.id).status == RunStatus.SUCCEEDED
    with pytest.raises(AlreadyDecided):
        approval_decide(request_id=req.pk, user=alice, approve=True)


def test_unknown_request_id_is_approval_not_found(make_user):
    alice = make_user("alice")
    with pytest.raises(ApprovalNotFound, match="approval request 987654 does not exist"):
        approval_decide(request_id=987654, user=alice, approve=True)


# ---------------------------------------------------------------------- expiry


def _expire_now(req: ApprovalRequest) -> None:
    past = timezone.now() - timedelta(seconds=1)
    Wait.objects.filter(pk=req.wait_id).update(wake_at=past)
    ApprovalRequest.objects.filter(pk=req.pk).update(expires_at=past)


def test_expiry_with_reject_gives_an_expired_rejection(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve", {"timeout": 3600, "on_timeout": "reject"})
    req = request_of(run)
    assert req.expires_at is not None
    wait = Wait.objects.get(pk=req.wait_id)
    assert wait.wake_at == req.expires_at
    assert sweep()["timers"] == 0  # not due yet
    assert request_of(run).status == ApprovalStatus.PENDING
    _expire_now(req)
    assert sweep()["timers"] == 1
    req.refresh_from_db()
    assert req.status == ApprovalStatus.EXPIRED and req.decided_by == "timeout"
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["approved"] is False and out["expired"] is True
    assert out["decided_by"] == ["timeout"]
    with pytest.raises(AlreadyDecided, match="expired"):
        approval_decide(request_id=req.pk, user=alice, approve=True)


def test_expiry_by_a_tiny_timeout_and_a_real_wait(make_user):
    run = start_waiting("apf.approve", {"timeout": 0.05})
    import time

    time.sleep(0.1)
    assert sweep()["timers"] == 1
    out = drive(run.id).output_value()
    assert out["approved"] is False and out["expired"] is True


def test_expiry_with_escalate_moves_the_request_then_a_member_decides(make_user):
    first_line = make_user("lead", groups=("team-leads",))
    director = make_user("dir", groups=("directors",))
    run = start_waiting(
        "apf.approve",
        {
            "approvers": "team-leads",
            "timeout": 3600,
            "on_timeout": "escalate",
            "escalate_to": "directors",
        },
    )
    req = request_of(run)
    _expire_now(req)
    assert sweep()["timers"] == 0  # escalation does not close the wait
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING
    assert req.approver_group.name == "directors" and req.escalated_at is not None
    assert req.expires_at > timezone.now() + timedelta(seconds=3000)
    wait = Wait.objects.get(pk=req.wait_id)
    assert wait.status == WaitStatus.PENDING and wait.wake_at == req.expires_at
    assert TraceEvent.objects.filter(run=run, kind="approval_escalated").count() == 1
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING
    assert sweep()["timers"] == 0  # not escalated (nor expired) twice

    # the first line's click after the deadline: refused as expired (409), not a bare 403
    with pytest.raises(ApprovalExpired, match="escalated to the group 'directors'"):
        approval_decide(request_id=req.pk, user=first_line, approve=True)
    approval_decide(request_id=req.pk, user=director, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["decided_by"] == ["dir"]


def test_escalated_request_expires_as_a_rejection_the_second_time(make_user):
    make_user("dir", groups=("directors",))
    run = start_waiting(
        "apf.approve", {"timeout": 3600, "on_timeout": "escalate", "escalate_to": "directors"}
    )
    req = request_of(run)
    _expire_now(req)
    sweep()
    _expire_now(request_of(run))
    assert sweep()["timers"] == 1
    out = drive(run.id).output_value()
    assert out["approved"] is False and out["expired"] is True
    assert request_of(run).status == ApprovalStatus.EXPIRED


def test_approval_granted_days_later_continues_the_run(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve", {"timeout": 7 * 24 * 3600})
    req = request_of(run)
    created = req.created_at
    real_now = timezone.now

    def later():
        return real_now() + timedelta(days=3)

    with mock.patch("django.utils.timezone.now", later):
        assert sweep()["timers"] == 0  # 3 of 7 days: still pending
        approval_decide(request_id=req.pk, user=alice, approve=True, comment="back from leave")
        run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    req.refresh_from_db()
    assert req.decided_at - created >= timedelta(days=3)
    out = run.output_value()
    assert out["approved"] is True and out["comment"] == "back from leave"
    assert flows.calls("after", run.id) == 1


def test_approval_with_timestamps_moved_back_three_days_continues(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.approve")
    back = timedelta(days=3)
    for model, fields in (
        (Run, ("created_at", "started_at", "updated_at")),
        (Wait, ("created_at",)),
        (ApprovalRequest, ("created_at",)),
        (Step, ("started_at",)),
        (TraceEvent, ("created_at",)),
    ):
        rows = (
            model.objects.filter(run_id=run.id)
            if model is not Run
            else model.objects.filter(pk=run.id)
        )
        for obj in rows:
            for f in fields:
                if getattr(obj, f) is not None:
                    setattr(obj, f, getattr(obj, f) - back)
            if model is TraceEvent:
                continue  # append-only; it only feeds the timeline
            obj.save(update_fields=list(fields))
    approval_decide(request_id=request_of(run).pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert flows.calls("after", run.id) == 1


# -------------------------------------------------------------------------------- S09


def test_s09_a_used_answer_does_not_answer_the_next_wait(make_user):
    alice = make_user("alice")
    run = start_waiting("apf.s09")
    budget = request_of(run, "approve_budget")
    approval_decide(request_id=budget.pk, user=alice, approve=True)
    # a double click: the same approval sent again, before and after the run moved on
    with pytest.raises(AlreadyDecided, match="already approved by alice"):
        approval_decide(request_id=budget.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING
    with pytest.raises(AlreadyDecided, match="already approved by alice"):
        approval_decide(request_id=budget.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING
    send = request_of(run, "approve_send")
    assert send.status == ApprovalStatus.PENDING and not send.decisions.exists()
    assert Wait.objects.get(pk=send.wait_id).status == WaitStatus.PENDING
    assert flows.calls("send_email") == 0
    assert ApprovalDecision.objects.filter(request=budget).count() == 1
    assert Wait.objects.filter(run=run, status=WaitStatus.RESOLVED).count() == 1

    approval_decide(request_id=send.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == "sent"
    assert flows.calls("send_email", run.id) == 1


# ------------------------------------------------------ a tool's approval policy


def test_a_tools_approval_needs_its_declared_count_and_expires_into_a_rejection(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    run = start_waiting("apf.tool_wire", {"amount": 5})
    req = request_of(run)
    assert req.required_approvals == 2
    assert req.expires_at is not None
    assert abs((req.expires_at - req.created_at).total_seconds() - 3600) < 5
    approval_decide(request_id=req.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING  # one of two approvals is not enough
    approval_decide(request_id=req.pk, user=bob, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"result": {"wired": 5}}


def test_a_tools_approval_that_times_out_reaches_the_model_as_a_rejection(make_user):
    run = start_waiting("apf.tool_wire", {"amount": 7})
    _expire_now(request_of(run))
    assert sweep()["timers"] == 1
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["type"] == "ApprovalRejected" and out["details"]["expired"] is True
    assert flows.calls("apf.wire", run.id) == 0  # the write never ran


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"approvals_required": 0}, "approvals_required"),
        ({"approval_on_timeout": "ignore"}, "approval_on_timeout"),
        ({"approval_on_timeout": "escalate"}, "escalate_to"),
    ],
)
def test_a_bad_tool_approval_policy_is_refused_at_declaration(options, message):
    with pytest.raises(DurableConfigurationError, match=message):
        durable.tool(name="apf.bad_policy", safety="idempotent_write", **options)


def test_a_bad_tool_approval_timeout_is_refused_like_its_timeout():
    with pytest.raises(InvalidDuration, match="approval_timeout"):
        durable.tool(name="apf.bad_policy", safety="idempotent_write", approval_timeout=-1)
