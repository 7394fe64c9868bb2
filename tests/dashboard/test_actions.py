"""Run actions: cancel, resume, compensate, fork -- and what happens when they are refused."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run, TraceEvent
from durable.testing import drive
from tests import waits_workflows as ww
from tests.dashboard.conftest import HTMX

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_a_waiting_run_with_htmx(operator_client, operator):
    run = drive(durable.start("tests.signal", {}).id)
    page = operator_client.get(f"/runs/{run.id}/").content.decode()
    assert "Cancel run</button>" in page and "hx-confirm=" in page
    response = operator_client.post(f"/runs/{run.id}/cancel/", {"reason": "not needed <b>"}, **HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="run-main"')
    assert 'id="flash"' in body and 'hx-swap-oob="true"' in body
    assert f"Cancelled run {run.id}" in body
    assert "Cancel run</button>" not in body  # no longer legal
    run.refresh_from_db()
    assert run.status == "cancelled"
    event = TraceEvent.objects.filter(run=run, kind="cancelled").get()
    assert event.actor == "otto" and "not needed <b>" in event.message
    assert "not needed &lt;b&gt;" in body
    # an operator's decision, told as a note, not as a failure with a classification
    assert '<div class="run-note" role="note">' in body and "run-error" not in body
    assert "permanent" not in body.split('class="run-note"')[1].split("</div>")[0]


def test_cancel_without_htmx_redirects_with_a_message(operator_client):
    run = drive(durable.start("tests.signal", {}).id)
    response = operator_client.post(f"/runs/{run.id}/cancel/", follow=True)
    assert response.redirect_chain == [(f"/runs/{run.id}/", 302)]
    assert f"Cancelled run {run.id}" in response.content.decode()


def test_action_that_became_illegal_is_a_409_with_the_fresh_fragment(operator_client):
    run = drive(durable.start("tests.signal", {}).id)
    durable.cancel(run.id, by="someone else")  # while the operator's page was open
    response = operator_client.post(f"/runs/{run.id}/cancel/", **HTMX)
    assert response.status_code == 409
    body = response.content.decode()
    assert "Nothing changed: cannot cancel run" in body and "it is cancelled" in body
    assert body.lstrip().startswith('<div id="run-main"') and "Cancelled" in body
    # the same without HTMX: the whole page, with the message
    plain = operator_client.post(f"/runs/{run.id}/cancel/")
    assert plain.status_code == 409 and "<!doctype html>" in plain.content.decode()
    assert "Nothing changed" in plain.content.decode()


def test_resume_a_failed_run(operator_client):
    run = drive(durable.start("dash.fail", {}).id)
    response = operator_client.post(
        f"/runs/{run.id}/resume/", {"reason": "fixed", "extra_steps": "5"}, **HTMX
    )
    assert response.status_code == 200 and "Resumed run" in response.content.decode()
    run.refresh_from_db()
    assert run.status == "pending" and run.max_steps == 10005


def test_resume_with_bad_budget_is_422(operator_client):
    run = drive(durable.start("dash.fail", {}).id)
    response = operator_client.post(f"/runs/{run.id}/resume/", {"extra_steps": "-1"}, **HTMX)
    assert response.status_code == 422
    assert "Extra steps for the budget" in response.content.decode()
    run.refresh_from_db()
    assert run.status == "failed"


def test_compensate_a_failed_run(operator_client):
    ww.EFFECTS.clear()
    run = drive(durable.start("tests.charge_then_fail", {}).id)
    assert run.status == "failed"
    response = operator_client.post(f"/runs/{run.id}/compensate/", **HTMX)
    assert response.status_code == 200 and "Compensation of run" in response.content.decode()
    assert drive(run.id).status == "compensated"
    assert ww.EFFECTS[-2:] == [("refund", 20), ("refund", 10)]
    ww.EFFECTS.append(("fixed",))


def test_fork_redirects_to_the_new_run(operator_client):
    run = drive(durable.start("dash.fail", {}).id)
    response = operator_client.post(f"/runs/{run.id}/fork/", {"from_step": "boom"}, **HTMX)
    assert response.status_code == 200
    fork = Run.objects.get(forked_from=run)
    assert response["HX-Redirect"] == f"/runs/{fork.id}/"
    page = operator_client.get(f"/runs/{fork.id}/").content.decode()
    assert f"Forked run {run.id} into {fork.id}" in page and "Forked from" in page
    plain = operator_client.post(f"/runs/{run.id}/fork/", {"from_step": "first"})
    assert plain.status_code == 302


def test_fork_from_an_unknown_step_is_422(operator_client):
    run = drive(durable.start("dash.fail", {}).id)
    response = operator_client.post(f"/runs/{run.id}/fork/", {"from_step": "nope"}, **HTMX)
    assert response.status_code == 422 and "Re-run from step" in response.content.decode()


def test_actions_on_unknown_runs_or_actions_are_404(operator_client):
    assert operator_client.post("/runs/nope/cancel/", **HTMX).status_code == 404
    run = drive(durable.start("dash.fail", {}).id)
    assert operator_client.post(f"/runs/{run.id}/explode/").status_code == 404


def test_action_from_the_attention_page_refreshes_that_page(operator_client):
    run = drive(durable.start("dash.fail", {}).id)
    response = operator_client.post(f"/runs/{run.id}/resume/", {"return_to": "attention"}, **HTMX)
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith('<div id="attention"')
    assert "Resumed run" in body
