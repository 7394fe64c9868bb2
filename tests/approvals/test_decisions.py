"""The decision path: exact deadlines (S17), edits checked before they are recorded (S18),
decisions bound to a version of the arguments (N-of-M), secrets kept in edits."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from approvals import edits
from approvals.models import ApprovalArguments, ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.selectors import pending_for
from approvals.services import ApprovalExpired, ArgumentsChanged, InvalidEdit, approval_decide
from durable.models import Run, RunStatus, TraceEvent, Wait, WaitStatus
from durable.testing import drive
from durable.worker.sweeper import sweep
from tests import waits_workflows as ww

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _calls():
    ww.CALLS.clear()
    yield
    ww.CALLS.clear()


def waiting(workflow: str, data: dict) -> tuple[Run, ApprovalRequest]:
    run = drive(durable.start(workflow, data).id)
    assert run.status == RunStatus.WAITING, run.error
    return run, ApprovalRequest.objects.get(run=run)


def backdate(req: ApprovalRequest, seconds: float) -> ApprovalRequest:
    """Move the deadline ``seconds`` into the past, as if that time passed without a sweep."""
    past = timezone.now() - timedelta(seconds=seconds)
    Wait.objects.filter(pk=req.wait_id).update(wake_at=past)
    ApprovalRequest.objects.filter(pk=req.pk).update(expires_at=past)
    req.refresh_from_db()
    return req


# ---------------------------------------------------------------- S17: deadlines


def test_s17_late_click_is_refused_and_the_timeout_rejects(make_user):
    buyer = make_user("buyer", groups=("buyers",))
    run, req = waiting(
        "tests.purchase", {"approvers": "buyers", "timeout": 600, "on_timeout": "reject"}
    )
    req = backdate(req, 1)  # the deadline passed a second ago; no sweeper ran
    deadline = req.expires_at
    assert Wait.objects.get(pk=req.wait_id).status == WaitStatus.PENDING
    with pytest.raises(ApprovalExpired, match="this request expired at") as err:
        approval_decide(request_id=req.pk, user=buyer, approve=True)
    assert err.value.outcome == "rejected" and err.value.expired_at == deadline
    assert deadline.isoformat(timespec="seconds") in str(err.value)
    # the timeout's outcome was committed as of the deadline, and no approval recorded
    req.refresh_from_db()
    assert req.status == ApprovalStatus.EXPIRED and req.decided_by == "timeout"
    assert req.decided_at == deadline
    assert not ApprovalDecision.objects.filter(request=req).exists()
    assert Run.objects.get(pk=run.id).status == RunStatus.PENDING
    out = drive(run.id).output_value()
    assert out["approved"] is False and out["expired"] is True
    assert out["decided_by"] == ["timeout"] and out["decided_at"] == deadline.isoformat()
    # the click again: the same answer, nothing changes
    with pytest.raises(ApprovalExpired, match="this request expired at"):
        approval_decide(request_id=req.pk, user=buyer, approve=True)


def test_s17_late_click_with_escalation_is_refused_and_finance_is_asked(make_user, durable_env):
    buyer = make_user("buyer", groups=("buyers",))
    fin = make_user("fin", groups=("finance",))
    run, req = waiting(
        "tests.purchase",
        {"approvers": "buyers", "timeout": 600, "on_timeout": "escalate", "escalate_to": "finance"},
    )
    deadline = req.expires_at
    # the first deadline passes (the second is 600 s after it); no sweep runs meanwhile
    durable_env.clock.move_to(deadline + timedelta(seconds=1))
    with pytest.raises(ApprovalExpired, match="escalated to the group 'finance'") as err:
        approval_decide(request_id=req.pk, user=buyer, approve=True)
    assert err.value.outcome == "escalated"
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING and req.approver_group.name == "finance"
    assert req.escalated_at == deadline
    assert req.expires_at == deadline + timedelta(seconds=600)  # as of the deadline
    assert Wait.objects.get(pk=req.wait_id).wake_at == req.expires_at
    assert not ApprovalDecision.objects.filter(request=req).exists()
    assert TraceEvent.objects.filter(run=run, kind="approval_escalated").count() == 1
    assert req in pending_for(fin) and req not in pending_for(buyer)
    approval_decide(request_id=req.pk, user=fin, approve=True)  # within its own deadline
    out = drive(run.id).output_value()
    assert out["approved"] is True and out["decided_by"] == ["fin"]


def test_a_click_after_the_sweeper_escalated_is_refused_as_expired(make_user):
    buyer = make_user("buyer", groups=("buyers",))
    _run, req = waiting(
        "tests.purchase",
        {"approvers": "buyers", "timeout": 600, "on_timeout": "escalate", "escalate_to": "finance"},
    )
    backdate(req, 1)
    assert sweep()["timers"] == 0  # escalated, still pending
    with pytest.raises(ApprovalExpired, match="escalated to the group 'finance'"):
        approval_decide(request_id=req.pk, user=buyer, approve=True)


def test_a_decision_at_the_deadline_itself_is_refused():
    _run, req = waiting("tests.purchase", {"timeout": 600})
    assert req.is_expired(req.expires_at) is True  # "at or after"
    assert req.is_expired(req.expires_at - timedelta(microseconds=1)) is False


def test_the_sweeper_applies_the_timeout_as_of_the_deadline(make_user, durable_env):
    run, req = waiting("tests.purchase", {"timeout": 600})
    deadline = req.expires_at
    durable_env.advance(timedelta(seconds=630))  # the sweeper runs as the deadline passes
    req.refresh_from_db()
    assert req.status == ApprovalStatus.EXPIRED and req.decided_at == deadline
    assert Run.objects.get(pk=run.id).output_value()["decided_at"] == deadline.isoformat()


def test_a_late_sweeper_applies_escalation_and_expiry_each_at_its_deadline(make_user, durable_env):
    run, req = waiting(
        "tests.purchase", {"timeout": 5, "on_timeout": "escalate", "escalate_to": "finance"}
    )
    first = req.expires_at
    durable_env.clock.move_to(first + timedelta(seconds=6))  # both deadlines pass, no sweep
    assert sweep()["timers"] == 1
    req.refresh_from_db()
    assert req.escalated_at == first and req.status == ApprovalStatus.EXPIRED
    assert req.decided_at == first + timedelta(seconds=5)
    kinds = list(
        TraceEvent.objects.filter(
            run=run, kind__in=("approval_escalated", "wait_expired")
        ).values_list("kind", flat=True)
    )
    assert kinds == ["approval_escalated", "wait_expired"]
    assert drive(run.id).output_value()["expired"] is True


# ------------------------------------------------------------ S18: edits are checked


def test_s18_invalid_edits_are_refused_and_the_request_stays_pending(make_user):
    ed = make_user("ed")
    run, req = waiting("tests.refund", {})
    with pytest.raises(InvalidEdit) as err:
        approval_decide(
            request_id=req.pk,
            user=ed,
            approve=True,
            edited={"charge_id": "ch_1", "amount": "forty"},
        )
    assert list(err.value.errors) == ["amount"] and "integer" in str(err.value)
    with pytest.raises(InvalidEdit) as err:
        approval_decide(request_id=req.pk, user=ed, approve=True, edited={"charge_id": "ch_1"})
    assert list(err.value.errors) == ["amount"] and "required" in err.value.errors["amount"][0]
    # "40" is text, not an int: strict, so what runs is exactly what was approved
    with pytest.raises(InvalidEdit, match="amount"):
        approval_decide(
            request_id=req.pk, user=ed, approve=True, edited={"charge_id": "ch_1", "amount": "40"}
        )
    with pytest.raises(InvalidEdit, match="takes no argument"):
        approval_decide(
            request_id=req.pk,
            user=ed,
            approve=True,
            edited={"charge_id": "ch_1", "amount": 40, "to": "attacker"},
        )
    req.refresh_from_db()
    assert req.status == ApprovalStatus.PENDING
    assert not req.decisions.exists() and req.versions.count() == 1
    assert Wait.objects.get(pk=req.wait_id).status == WaitStatus.PENDING

    approval_decide(
        request_id=req.pk, user=ed, approve=True, edited={"charge_id": "ch_1", "amount": 40}
    )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"result": {"refunded": 40, "charge": "ch_1"}}
    assert ww.CALLS == [("refund", {"charge_id": "ch_1", "amount": 40})]  # once, with 40
    assert drive(run.id).status == RunStatus.SUCCEEDED and len(ww.CALLS) == 1
    # the trace records the proposal and the edit
    event = TraceEvent.objects.get(run=run, kind="approval_edited")
    assert event.data["proposed"] == {"charge_id": "ch_1", "amount": 100}
    assert event.data["edited"] == {"charge_id": "ch_1", "amount": 40}
    assert "amount: 100 → 40" in event.message


def test_deep_or_huge_edits_are_refused_without_a_recursion_error(make_user):
    ed = make_user("ed")
    _run, req = waiting("tests.refund", {})
    for text in (
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 50_000 + "1" + "}" * 50_000,
        '{"charge_id": "' + "x" * (edits.EDIT_MAX_BYTES + 10) + '"}',
    ):
        with pytest.raises(InvalidEdit):
            edits.parse_edit(text)
    deep: dict = {}
    node = deep
    for _ in range(sys.getrecursionlimit() + 100):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(InvalidEdit, match="nested deeper than"):
        approval_decide(
            request_id=req.pk, user=ed, approve=True, edited={"charge_id": deep, "amount": 1}
        )
    assert not req.decisions.exists()


def test_an_unchanged_edit_is_a_plain_approval_of_the_current_version(make_user):
    ed = make_user("ed")
    run, req = waiting("tests.refund", {})
    approval_decide(
        request_id=req.pk, user=ed, approve=True, edited={"amount": 100, "charge_id": "ch_1"}
    )
    assert req.versions.count() == 1
    assert drive(run.id).output_value() == {"result": {"refunded": 100, "charge": "ch_1"}}


# ------------------------------------------------------ N of M: argument versions


def test_an_edit_resets_earlier_approvals_and_only_the_approved_version_runs(make_user):
    """The hole: approver 1 approves {"amount": 10}, approver 2 edits to 999999 for an
    attacker; before, the run got approver 2's values with both names on it."""
    alice, bob = make_user("alice"), make_user("bob")
    run, req = waiting(
        "tests.purchase", {"required": 2, "allow_edit": True, "payload": {"amount": 10}}
    )
    approval_decide(request_id=req.pk, user=alice, approve=True, version=1)
    assert req not in pending_for(alice)
    approval_decide(
        request_id=req.pk,
        user=bob,
        approve=True,
        edited={"amount": 999999, "to": "attacker"},
        version=1,
    )
    req.refresh_from_db()
    # alice approved version 1 only: the request waits, and she is asked again
    assert req.status == ApprovalStatus.PENDING and req.arguments.number == 2
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING
    assert req in pending_for(alice) and req not in pending_for(bob)
    event = TraceEvent.objects.get(run=run, kind="approval_edited")
    assert "alice" in event.message and "asked again" in event.message
    # a click from alice's stale page (version 1) records nothing
    with pytest.raises(ArgumentsChanged, match="version 2 is by bob"):
        approval_decide(request_id=req.pk, user=alice, approve=True, version=1)
    # alice rejects what she now sees
    approval_decide(
        request_id=req.pk, user=alice, approve=False, comment="not to attacker", version=2
    )
    out = drive(run.id).output_value()
    assert out["approved"] is False and out["decided_by"] == ["alice"]


def test_an_edited_version_runs_once_both_approved_it(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    run, req = waiting(
        "tests.purchase", {"required": 2, "allow_edit": True, "payload": {"amount": 10}}
    )
    approval_decide(request_id=req.pk, user=alice, approve=True)
    approval_decide(request_id=req.pk, user=bob, approve=True, edited={"amount": 12})
    approval_decide(request_id=req.pk, user=alice, approve=True, version=2)
    out = drive(run.id).output_value()
    assert out["approved"] is True and out["edited"] == {"amount": 12}
    assert out["decided_by"] == ["bob", "alice"]
    v2 = ApprovalArguments.objects.get(request=req, number=2)
    assert set(
        ApprovalDecision.objects.filter(arguments=v2).values_list("arguments_digest", flat=True)
    ) == {v2.digest}
    assert ApprovalDecision.objects.filter(request=req).count() == 3  # the v1 one is kept


def test_an_edit_by_the_first_approver_is_not_dropped_by_the_second(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    run, req = waiting(
        "tests.purchase", {"required": 2, "allow_edit": True, "payload": {"amount": 10}}
    )
    approval_decide(request_id=req.pk, user=alice, approve=True, edited={"amount": 20})
    approval_decide(request_id=req.pk, user=bob, approve=True)  # what bob sees: version 2
    out = drive(run.id).output_value()
    assert out["approved"] is True and out["edited"] == {"amount": 20}
    assert out["decided_by"] == ["alice", "bob"]


# ---------------------------------------------------------------- secrets in edits

SECRET = "sk-test-XYZ0123456789"


def test_an_edit_keeps_the_real_secret_and_never_shows_it(make_user):
    ed = make_user("ed")
    run, req = waiting("tests.pay", {"amount": 10, "api_key": SECRET})
    assert edits.secret_keys(req.arguments.value) == {"api_key"}
    assert SECRET not in (req.arguments.value or "") and SECRET not in (req.payload or "")
    approval_decide(request_id=req.pk, user=ed, approve=True, edited={"amount": 12})
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ww.CALLS == [("pay", {"amount": 12, "api_key": SECRET, "memo": ""})]
    v2 = ApprovalArguments.objects.get(request=req, number=2)
    assert SECRET not in v2.value and SECRET not in (
        ApprovalDecision.objects.get(request=req).edited or ""
    )
    assert SECRET not in str(TraceEvent.objects.get(run=run, kind="approval_edited").data)


def test_the_placeholder_means_kept_and_a_secret_cannot_be_changed(make_user):
    ed = make_user("ed")
    run, req = waiting("tests.pay", {"amount": 10, "api_key": SECRET})
    with pytest.raises(InvalidEdit) as err:
        approval_decide(
            request_id=req.pk,
            user=ed,
            approve=True,
            edited={"amount": 12, "api_key": "sk-attacker-000000"},
        )
    assert list(err.value.errors) == ["api_key"] and "secret, kept" in str(err.value)
    with pytest.raises(InvalidEdit) as err:
        approval_decide(
            request_id=req.pk,
            user=ed,
            approve=True,
            edited={"amount": 12, "memo": "key [REDACTED]"},
        )
    assert list(err.value.errors) == ["memo"] and "placeholder" in str(err.value)
    assert not req.decisions.exists()
    approval_decide(
        request_id=req.pk,
        user=ed,
        approve=True,
        edited={"amount": 12, "api_key": "[REDACTED]", "memo": "ok"},
    )
    drive(run.id)
    assert ww.CALLS == [("pay", {"amount": 12, "api_key": SECRET, "memo": "ok"})]


# ---------------------------------------------------------------------------- CLI


def test_cli_refuses_a_late_approval_with_the_reason(make_user):
    from django.core.management import CommandError, call_command

    make_user("buyer", groups=("buyers",))
    run, req = waiting("tests.purchase", {"approvers": "buyers", "timeout": 600})
    backdate(req, 1)
    with pytest.raises(CommandError, match="this request expired at") as err:
        call_command("approvals", "approve", str(req.pk), "--as", "buyer")
    assert err.value.returncode == 2
    assert drive(run.id).output_value()["expired"] is True


def test_cli_names_the_field_of_an_invalid_edit(make_user, capsys):
    from django.core.management import CommandError, call_command

    make_user("ed")
    run, req = waiting("tests.refund", {})
    call_command("approvals", "pending", "--as", "ed")
    assert f"{req.pk}\t" in capsys.readouterr().out
    with pytest.raises(CommandError, match="amount"):
        call_command(
            "approvals",
            "approve",
            str(req.pk),
            "--as",
            "ed",
            "--edit",
            '{"charge_id": "ch_1", "amount": "forty"}',
        )
    call_command(
        "approvals",
        "approve",
        str(req.pk),
        "--as",
        "ed",
        "--version",
        "1",
        "--edit",
        '{"charge_id": "ch_1", "amount": 40}',
    )
    assert drive(run.id).output_value() == {"result": {"refunded": 40, "charge": "ch_1"}}
