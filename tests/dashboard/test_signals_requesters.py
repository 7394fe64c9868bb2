"""The run page's signal form and undelivered signals; who started a run and four-eyes
notices for unknown requesters and forks, in the run page and the approvals inbox."""

from __future__ import annotations

import re

import pytest

import durable
from durable.models import Signal, TraceEvent
from durable.testing import drive
from tests.dashboard.conftest import HTMX, login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_on_go():
    run = drive(durable.start("tests.signal", {}, started_by="os:ops").id)
    assert run.status == "waiting"
    return run


def card(page: str, req_pk: int) -> str:
    return page.split(f'id="approval-{req_pk}"', 1)[1].split("</article>", 1)[0]


# --------------------------------------------------------------------------- signals


def test_operator_sees_the_signal_form_and_the_names_the_run_waits_on(operator_client):
    run = waiting_on_go()
    page = operator_client.get(f"/runs/{run.id}/").content.decode()
    assert f'hx-post="/runs/{run.id}/signal/"' in page and "Send signal</button>" in page
    assert "This run waits on go." in page and '<option value="go">' in page
    assert 'name="csrfmiddlewaretoken"' in page.split('aria-label="Send a signal"', 1)[1]
    assert "<script>" not in page.split('aria-label="Send a signal"', 1)[1].split("</form>")[0]


def test_viewer_sees_no_signal_form_and_cannot_post_one(viewer_client):
    run = waiting_on_go()
    assert "Send signal</button>" not in viewer_client.get(f"/runs/{run.id}/").content.decode()
    response = viewer_client.post(f"/runs/{run.id}/signal/", {"name": "go"}, **HTMX)
    assert response.status_code == 403 and "durable.operate_run" in response.content.decode()
    assert not Signal.objects.exists()


def test_misaddressed_signal_is_kept_with_a_warning_and_listed_as_undelivered(operator_client):
    run = waiting_on_go()
    response = operator_client.post(
        f"/runs/{run.id}/signal/", {"name": "og", "payload": '{"note": "<b>DN-1</b>"}'}, **HTMX
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert "flash-warning" in body
    assert "kept; this run waits on go, never on &#x27;og&#x27;" in body
    section = body.split('id="undelivered-title"', 1)[1].split("</section>", 1)[0]
    assert "og" in section and "no wait with this name" in section and "otto" in section
    assert "&lt;b&gt;DN-1&lt;/b&gt;" in section and "<b>DN-1" not in section
    sig = Signal.objects.get(run=run)
    assert sig.wait_id is None and sig.sent_by == "otto"
    run.refresh_from_db()
    assert run.status == "waiting"


def test_signal_to_the_waiting_name_is_delivered(operator_client):
    run = waiting_on_go()
    response = operator_client.post(
        f"/runs/{run.id}/signal/", {"name": "go", "payload": "[1, 2]"}, **HTMX
    )
    body = response.content.decode()
    assert response.status_code == 200 and "flash-success" in body
    assert "delivered to its wait" in body and 'id="undelivered-title"' not in body
    assert drive(run.id).output_value() == {"got": [1, 2]}


def test_early_signal_has_its_own_words(operator_client):
    run = durable.start("tests.signal", {}, started_by="os:ops")  # not driven: no wait yet
    body = operator_client.post(f"/runs/{run.id}/signal/", {"name": "go"}, **HTMX).content.decode()
    assert "has not waited on any signal yet" in body and "this run waits on" not in body
    assert drive(run.id).output_value() == {"got": None}


def test_signal_without_htmx_redirects_with_the_message(operator_client):
    run = waiting_on_go()
    response = operator_client.post(f"/runs/{run.id}/signal/", {"name": "og"}, follow=True)
    assert response.redirect_chain == [(f"/runs/{run.id}/", 302)]
    body = response.content.decode()
    assert "flash-warning" in body and "kept; this run waits on go" in body


def test_bad_json_payload_is_a_422_that_keeps_what_was_typed(operator_client):
    run = waiting_on_go()
    response = operator_client.post(
        f"/runs/{run.id}/signal/", {"name": "go", "payload": "{note: 1}"}, **HTMX
    )
    assert response.status_code == 422
    body = response.content.decode()
    assert "The payload is not valid JSON" in body and "{note: 1}</textarea>" in body
    assert not Signal.objects.exists()


def test_signal_to_a_finished_run_is_a_409(operator_client):
    run = waiting_on_go()
    durable.cancel(run.id, by="ops")
    response = operator_client.post(f"/runs/{run.id}/signal/", {"name": "go"}, **HTMX)
    assert response.status_code == 409 and "Nothing changed" in response.content.decode()


def test_signal_without_csrf_token_is_refused(operator):
    run = waiting_on_go()
    client = login(operator, enforce_csrf_checks=True)
    assert client.post(f"/runs/{run.id}/signal/", {"name": "go"}, **HTMX).status_code == 403
    assert not Signal.objects.exists()


def test_finished_run_page_lists_the_signal_it_never_consumed(operator_client):
    run = waiting_on_go()
    durable.signal(run.id, "og", 1, by="ops")
    durable.cancel(run.id, by="ops")
    page = operator_client.get(f"/runs/{run.id}/").content.decode()
    section = page.split('id="undelivered-title"', 1)[1].split("</section>", 1)[0]
    assert "and the run has ended" in section and ">og<" in section
    assert "signals_unconsumed" in page
    assert TraceEvent.objects.filter(run=run, kind="signals_unconsumed").count() == 1


# -------------------------------------------------------------- starters, four-eyes


def _tool_approval(**kwargs):
    from approvals.models import ApprovalRequest

    run = drive(durable.start("tests.tool_approval", {"to": "bob@example.com"}, **kwargs).id)
    assert run.status == "waiting"
    return run, ApprovalRequest.objects.get(run=run)


def test_unknown_requester_is_shown_in_the_inbox_and_on_the_run_page(approver_client):
    run, req = _tool_approval()  # started without a starter
    assert req.required_approvals == 2
    inbox = card(approver_client.get("/approvals/").content.decode(), req.pk)
    assert 'started by <span class="muted">unknown</span>' in inbox
    assert "Requester unknown" in inbox and "needs 2 different approvers (0 so far)" in inbox
    assert 'value="approve"' in inbox
    page = approver_client.get(f"/runs/{run.id}/").content.decode()
    assert "Who asked for this run is unknown" in page
    assert "requester unknown, so 2 different approvers are needed" in page


def test_known_starter_shows_no_unknown_notice(approver_client):
    run, req = _tool_approval(started_by="os:ops")
    inbox = card(approver_client.get("/approvals/").content.decode(), req.pk)
    assert "started by os:ops" in inbox and "Requester unknown" not in inbox
    page = approver_client.get(f"/runs/{run.id}/").content.decode()
    assert "Who asked for this run is unknown" not in page
    assert re.search(r"<dt>Started by</dt><dd>os:ops</dd>", page)


def test_original_starter_of_a_fork_cannot_approve_it_in_the_inbox(approver, operator):
    """A fork started by another operator: its original starter sees the four-eyes note
    and no Approve button, and a forged approve is refused."""
    run, req = _tool_approval(started_by=approver)
    other = make_user("bea", "approver")
    login(other).post(f"/approvals/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert drive(run.id).status == "succeeded"
    fork = login(operator).post(
        f"/runs/{run.id}/fork/", {"from_step": "approve:waits.send"}, **HTMX
    )
    assert fork.status_code == 200
    from approvals.models import ApprovalRequest

    forked_run = drive(run.forks.get().id)
    fork_req = ApprovalRequest.objects.get(run=forked_run)
    assert [p["name"] for p in fork_req.requesters] == ["otto", "alice"]
    client = login(approver)
    inbox = card(client.get("/approvals/").content.decode(), fork_req.pk)
    assert "You asked for this run" in inbox and 'value="approve"' not in inbox
    response = client.post(f"/approvals/{fork_req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response.status_code == 403
    assert "those who asked for it" in response.content.decode()
    page = client.get(f"/runs/{forked_run.id}/").content.decode()
    assert "<dt>Requesters</dt><dd>otto and alice" in page


def test_runs_started_by_name_can_be_filtered(operator_client):
    durable.start("tests.signal", {}, started_by="os:zed")
    page = operator_client.get("/?started_by=os:zed").content.decode()
    assert "by os:zed" in page
