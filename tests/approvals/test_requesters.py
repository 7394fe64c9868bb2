"""Who asked for a run, and four-eyes: starters from every entry point, unknown
requesters, named requesters, forks (S19; issue 11 item 7)."""

from __future__ import annotations

import getpass
from io import StringIO

import pytest
from django.core.management import call_command

import durable
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import NotAllowed, approval_decide
from durable import requesters
from durable.models import Run, RunStatus, TraceEvent
from durable.services.runs import run_fork
from durable.testing import drive
from tests.approvals import approval_workflows as flows

pytestmark = pytest.mark.django_db(transaction=True)


def pending_request(run: Run) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)


def cli_start(*args: str) -> Run:
    out = StringIO()
    call_command("durable", "start", *args, stdout=out, stderr=StringIO())
    return Run.objects.get(pk=out.getvalue().strip().splitlines()[-1])


def refused(user, req: ApprovalRequest) -> NotAllowed:
    with pytest.raises(NotAllowed) as err:
        approval_decide(request_id=req.pk, user=user, approve=True)
    assert "four-eyes" in str(err.value)
    return err.value


# ------------------------------------------------------------- S19: the CLI starter


def test_s19_cli_starter_is_recorded_and_cannot_approve_their_own_unsafe_write(
    make_user, monkeypatch
):
    """``manage.py durable start`` of a workflow whose unsafe_write needs
    approval. The OS login is recorded as ``os:<login>``, mapped to the dashboard account
    of the same name, and that person cannot approve; another approver can."""
    alice, bob = make_user("alice"), make_user("bob")
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")
    run = cli_start("apf.tool_send", "--input", '{"to": "eve@example.com"}')
    assert run.started_by_name == "os:alice" and run.started_by_id == alice.pk
    assert run.requesters == [{"user": alice.pk, "name": "os:alice"}]
    assert TraceEvent.objects.get(run=run, kind="created").actor == "os:alice"
    run = drive(run.id)
    assert run.status == RunStatus.WAITING, run.error
    req = pending_request(run)
    assert req.four_eyes and req.required_approvals == 1 and not req.requester_unknown

    err = refused(alice, req)
    assert err.missing == ["a different approver than the run's starter"]
    assert f"alice started run {run.id}" in str(err)
    assert flows.calls("apf.send") == 0 and not req.decisions.exists()
    approval_decide(request_id=req.pk, user=bob, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert flows.calls("apf.send", run.id) == 1


def test_cli_starter_without_an_account_is_matched_by_name_when_one_appears(make_user, monkeypatch):
    monkeypatch.setattr(getpass, "getuser", lambda: "carol")
    run = drive(cli_start("apf.tool_send", "--input", '{"to": "x@example.com"}').id)
    assert run.started_by_id is None and run.starter_label == "os:carol"
    carol = make_user("carol")  # the account is created after the run started
    refused(carol, pending_request(run))


def test_cli_by_names_the_starter(make_user, monkeypatch):
    monkeypatch.setattr(getpass, "getuser", lambda: "root")
    bob, carol = make_user("bob"), make_user("carol")
    run = drive(cli_start("apf.tool_send", "--input", '{"to": "x@example.com"}', "--by", "bob").id)
    assert run.started_by_id == bob.pk and run.started_by_name == "bob"
    req = pending_request(run)
    refused(bob, req)
    approval_decide(request_id=req.pk, user=carol, approve=True)
    assert drive(run.id).status == RunStatus.SUCCEEDED


def test_sdk_and_dashboard_starters_are_recorded(make_user):
    alice = make_user("alice")
    by_user = durable.start("apf.simple", {}, started_by=alice)
    by_name = durable.start("apf.simple", {}, started_by="api:billing")
    nobody = durable.start("apf.simple", {})
    assert (by_user.started_by_id, by_user.starter_label) == (alice.pk, "alice")
    assert (by_name.started_by_id, by_name.starter_label) == (None, "api:billing")
    assert nobody.starter_label == "unknown" and nobody.requester_unknown
    assert not by_user.requester_unknown and not by_name.requester_unknown
    from django.contrib.auth.models import AnonymousUser

    assert durable.start("apf.simple", {}, started_by=AnonymousUser()).requester_unknown


# ------------------------------------------------------------------ unknown starter


def test_unknown_requester_needs_two_different_approvers(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    run = drive(durable.start("apf.tool_send", {"to": "x@example.com"}).id)  # no starter
    req = pending_request(run)
    assert req.four_eyes and req.requester_unknown and req.required_approvals == 2
    event = TraceEvent.objects.get(run=run, kind="four_eyes_requester_unknown")
    assert "two different approvers" in event.message
    approval_decide(request_id=req.pk, user=alice, approve=True)
    assert pending_request(run).status == ApprovalStatus.PENDING
    assert drive(run.id).status == RunStatus.WAITING and flows.calls("apf.send") == 0
    approval_decide(request_id=req.pk, user=bob, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["result"]["sent"] == "x@example.com"


def test_unknown_requester_does_not_change_an_approval_without_four_eyes(make_user):
    alice = make_user("alice")
    run = drive(durable.start("apf.approve", {}).id)
    req = pending_request(run)
    assert not req.four_eyes and req.required_approvals == 1
    approval_decide(request_id=req.pk, user=alice, approve=True)
    assert drive(run.id).status == RunStatus.SUCCEEDED


# ---------------------------------------------------------------- named requesters


def test_a_requester_named_by_the_workflow_cannot_approve(make_user):
    sam, olga = make_user("sam"), make_user("olga")
    run = drive(durable.start("apf.named_requester", {"requester": "Sam"}, started_by="os:ops").id)
    req = pending_request(run)
    assert [p["name"] for p in req.requesters] == ["os:ops", "Sam"]
    assert req.requesters[1]["user"] == sam.pk
    err = refused(sam, req)
    assert err.missing == ["a different approver than those who asked for it"]
    approval_decide(request_id=req.pk, user=olga, approve=True)
    assert drive(run.id).output_value()["decided_by"] == ["olga"]


def test_requesters_must_be_a_list_of_names():
    run = drive(durable.start("apf.named_requester", {"requester": 7}, started_by="x").id)
    assert run.status == RunStatus.FAILED
    assert "requesters must be a list of names" in run.error["message"]


# --------------------------------------------------------------------------- forks


def _finished_send(starter, approver) -> Run:
    run = drive(durable.start("apf.tool_send", {"to": "x@example.com"}, started_by=starter).id)
    approval_decide(request_id=pending_request(run).pk, user=approver, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def test_fork_requesters_are_the_forker_and_the_source_starter(make_user):
    """Issue 11 item 7: a fork started by another operator must not let the original
    starter approve the same write again -- nor the forker."""
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    source = _finished_send(alice, bob)
    fork = drive(run_fork(run_id=source.id, from_step="approve:apf.send", by=carol).id)
    assert fork.status == RunStatus.WAITING, fork.error
    assert fork.started_by_id == carol.pk
    assert [p["name"] for p in fork.requesters] == ["carol", "alice"]
    req = pending_request(fork)
    assert req.required_approvals == 1 and not req.requester_unknown
    assert refused(alice, req).missing == ["a different approver than those who asked for it"]
    assert refused(carol, req).missing == ["a different approver than the run's starter"]
    approval_decide(request_id=req.pk, user=bob, approve=True)
    assert drive(fork.id).status == RunStatus.SUCCEEDED


def test_fork_of_a_fork_inherits_every_requester(make_user):
    alice, bob, carol, dave = (make_user(n) for n in ("alice", "bob", "carol", "dave"))
    source = _finished_send(alice, bob)
    first = drive(run_fork(run_id=source.id, from_step="approve:apf.send", by=carol).id)
    approval_decide(request_id=pending_request(first).pk, user=bob, approve=True)
    assert drive(first.id).status == RunStatus.SUCCEEDED
    second = drive(durable.fork(first.id, from_step="approve:apf.send", by="os:dave").id)
    assert [p["name"] for p in second.requesters] == ["os:dave", "carol", "alice"]
    req = pending_request(second)
    for user in (alice, carol, dave):
        refused(user, req)
    approval_decide(request_id=req.pk, user=bob, approve=True)
    assert drive(second.id).status == RunStatus.SUCCEEDED


def test_fork_of_a_run_with_an_unknown_starter_still_needs_two_approvers(make_user):
    bob, carol, erin = make_user("bob"), make_user("carol"), make_user("erin")
    source = drive(durable.start("apf.tool_send", {"to": "x@example.com"}).id)
    approval_decide(
        request_id=pending_request(source).pk, user=bob, approve=False, comment="not now"
    )  # one rejection decides
    assert drive(source.id).status == RunStatus.SUCCEEDED
    fork = drive(run_fork(run_id=source.id, from_step="approve:apf.send", by=carol).id)
    assert requesters.any_unknown(fork.requesters) and fork.requester_unknown
    req = pending_request(fork)
    assert req.required_approvals == 2
    refused(carol, req)
    approval_decide(request_id=req.pk, user=bob, approve=True)
    approval_decide(request_id=req.pk, user=erin, approve=True)
    assert drive(fork.id).status == RunStatus.SUCCEEDED


# ------------------------------------------------------------------ matching rules


def test_matching_is_by_account_or_by_bare_name(make_user):
    alice = make_user("alice")
    assert requesters.includes(alice, [{"user": alice.pk, "name": "whatever"}])
    assert requesters.includes(alice, [{"user": None, "name": "os:Alice"}])
    assert requesters.includes(alice, [{"user": None, "name": "cli:alice"}])
    assert not requesters.includes(alice, [{"user": None, "name": "os:alicia"}])
    assert not requesters.includes(alice, [{"user": None, "name": ""}])
    assert not requesters.includes(None, [{"user": None, "name": "alice"}])
    assert (
        requesters.describe([{"user": None, "name": "os:bob"}, requesters.UNKNOWN])
        == "os:bob and someone unknown"
    )
