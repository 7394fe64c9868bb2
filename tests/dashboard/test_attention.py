"""Needs attention: unknown outcomes to reconcile, failed runs to resume or compensate."""

from __future__ import annotations

import pytest

import durable
from durable.models import Operation
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard.conftest import HTMX

pytestmark = pytest.mark.django_db(transaction=True)


def unknown_outcome_run(amount: int = 5):
    dw.KNOBS["unknown"] = 1
    run = drive(durable.start("dash.transfer", {"amount": amount}).id)
    assert run.status == "waiting", run.error
    return run, Operation.objects.get(run=run)


def test_page_lists_unknown_outcomes_and_failed_runs(operator_client):
    _run, op = unknown_outcome_run()
    failed = drive(durable.start("dash.fail", {"why": "nope"}).id)
    response = operator_client.get("/attention/")
    assert response.status_code == 200
    page = response.content.decode()
    card = page.split(f'id="operation-{op.pk}"', 1)[1].split("</article>", 1)[0]
    assert "dash.send_money" in card and op.idempotency_key in card and "unsafe write" in card
    assert "timed out after the request was sent" in card
    assert "It happened</button>" in card and "It did not happen — retry</button>" in card
    assert "Abort the run</button>" in card and "&#34;amount&#34;: 5" in card
    failed_row = page.split(f"/runs/{failed.id}/", 1)[1].split("</tr>", 1)[0]
    assert "cannot do it: nope" in failed_row
    assert "Resume</button>" in failed_row and "Compensate</button>" in failed_row


def test_viewer_sees_the_page_without_the_forms(viewer_client):
    _run, op = unknown_outcome_run()
    drive(durable.start("dash.fail", {}).id)
    page = viewer_client.get("/attention/").content.decode()
    assert op.idempotency_key in page and "needs the operator role" in page
    assert "It happened</button>" not in page and "Resume</button>" not in page
    response = viewer_client.post(f"/operations/{op.pk}/reconcile/", {"outcome": "abort"})
    assert response.status_code == 403 and "durable.operate_run" in response.content.decode()


def test_it_happened_with_a_result(operator_client):
    run, op = unknown_outcome_run(9)
    response = operator_client.post(
        f"/operations/{op.pk}/reconcile/",
        {
            "outcome": "happened",
            "external_id": "tr_ext_1",
            "result": '{"transfer": "tr_ext_1"}',
            "reason": "seen in the bank's dashboard",
        },
        **HTMX,
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="attention"')
    assert "Recorded that dash.send_money happened" in body
    assert f'id="operation-{op.pk}"' not in body
    op.refresh_from_db()
    assert op.status == "succeeded" and op.external_id == "tr_ext_1" and op.resolved_by == "otto"
    run = drive(run.id)
    assert run.status == "succeeded" and run.output_value() == {"receipt": {"transfer": "tr_ext_1"}}


def test_it_did_not_happen_retries(operator_client):
    run, op = unknown_outcome_run(3)
    response = operator_client.post(
        f"/operations/{op.pk}/reconcile/", {"outcome": "not_happened"}, **HTMX
    )
    assert response.status_code == 200 and "did not happen" in response.content.decode()
    run = drive(run.id)
    assert run.status == "succeeded" and run.output_value()["receipt"]["amount"] == 3


def test_abort_from_the_run_page(operator_client):
    run, op = unknown_outcome_run()
    response = operator_client.post(
        f"/operations/{op.pk}/reconcile/", {"outcome": "abort", "return_to": "detail"}, **HTMX
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="run-main"') and "Aborted run" in body
    run.refresh_from_db()
    assert run.status == "failed" and run.error_type == "AbortedByOperator"


def test_bad_result_json_is_422_and_changes_nothing(operator_client):
    _run, op = unknown_outcome_run()
    response = operator_client.post(
        f"/operations/{op.pk}/reconcile/", {"outcome": "happened", "result": "{oops"}, **HTMX
    )
    assert response.status_code == 422 and "not valid JSON" in response.content.decode()
    op.refresh_from_db()
    assert op.status == "unknown" and op.resolution == ""


def test_second_decision_is_a_409(operator_client):
    _run, op = unknown_outcome_run()
    durable_services = __import__("durable.services.runs", fromlist=["operation_reconcile"])
    durable_services.operation_reconcile(operation_id=op.pk, outcome="not_happened", by="ops")
    response = operator_client.post(f"/operations/{op.pk}/reconcile/", {"outcome": "abort"}, **HTMX)
    assert response.status_code == 409 and "Nothing changed" in response.content.decode()


def test_unknown_operation_is_404(operator_client):
    assert (
        operator_client.post("/operations/424242/reconcile/", {"outcome": "abort"}).status_code
        == 404
    )


def test_attention_query_count_is_bounded(operator_client, django_assert_max_num_queries):
    unknown_outcome_run()
    drive(durable.start("dash.fail", {}).id)
    with django_assert_max_num_queries(14) as few:
        operator_client.get("/attention/")
    for i in range(5):
        unknown_outcome_run(i)
        drive(durable.start("dash.fail", {}).id)
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = operator_client.get("/attention/").content.decode()
    assert page.count('class="card op-card"') == 6


def test_a_refused_reconcile_form_keeps_what_was_typed(operator_client):
    _run, op = unknown_outcome_run()
    response = operator_client.post(
        f"/operations/{op.pk}/reconcile/",
        {"outcome": "happened", "external_id": "tr_<9>", "result": "{oops"},
        **HTMX,
    )
    card = response.content.decode().split(f'id="operation-{op.pk}"', 1)[1]
    assert 'value="tr_&lt;9&gt;"' in card and ">{oops</textarea>" in card
    assert 'aria-invalid="true"' in card
