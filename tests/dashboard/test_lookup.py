""" "Look it up again": the unknown-outcome card asks the tool's reconcile hook now and
shows what it found, with the decision it suggests filled in; nothing changes until the
operator decides (issue 31)."""

from __future__ import annotations

import pytest

import durable
from durable.exceptions import IllegalTransition
from durable.models import Operation
from durable.services.runs import operation_lookup, operation_reconcile
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard.conftest import HTMX

pytestmark = pytest.mark.django_db(transaction=True)


def parked_payment(amount: int = 7):
    """A payout whose write timed out while the provider's lookup was down: it waits."""
    dw.KNOBS["unknown"] = 1
    run = drive(durable.start("dash.payout", {"amount": amount}).id)
    assert run.status == "waiting", run.error
    return run, Operation.objects.get(run=run)


def test_the_lookup_finds_the_write_and_the_operator_records_it(operator_client):
    run, op = parked_payment()
    page = operator_client.get(f"/runs/{run.id}/").content.decode()
    assert "Look it up again</button>" in page
    dw.provider_records(op.idempotency_key, {"payment": "pay_ext_7", "amount": 7})

    response = operator_client.post(f"/operations/{op.pk}/lookup/", {"return_to": "detail"}, **HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="run-main"')
    assert "Found: it happened." in body and "<code>pay_ext_7</code>" in body
    card = body.split('aria-label="It happened: operation', 1)[1].split("</form>", 1)[0]
    assert 'value="pay_ext_7"' in card and "&quot;pay_ext_7&quot;" in card
    assert "looked up: the reconcile hook found it" in card
    op.refresh_from_db()
    assert op.status == "unknown" and op.resolution == ""  # nothing changed yet

    operation_reconcile(
        operation_id=op.pk,
        outcome="happened",
        result={"payment": "pay_ext_7", "amount": 7},
        external_id="pay_ext_7",
        by="otto",
    )
    run = drive(run.id)
    assert run.status == "succeeded"
    assert run.output_value() == {"receipt": {"payment": "pay_ext_7", "amount": 7}}


def test_the_lookup_does_not_find_it_and_suggests_a_retry(operator_client):
    _run, op = parked_payment()
    dw.provider_records(op.idempotency_key, None)
    body = operator_client.post(f"/operations/{op.pk}/lookup/", {}, **HTMX).content.decode()
    assert body.lstrip().startswith('<div id="attention"')
    assert "Not found: it did not happen." in body
    assert 'value="looked up: the reconcile hook did not find it"' in body


def test_a_lookup_that_cannot_tell_says_why_and_a_plain_post_shows_the_page(operator_client):
    run, op = parked_payment()
    response = operator_client.post(f"/operations/{op.pk}/lookup/", {"return_to": "detail"})
    assert response.status_code == 200  # shown, not redirected: the answer is on the page
    body = response.content.decode()
    assert "The lookup could not tell" in body
    assert "ConnectionError: the provider&#x27;s lookup API is down" in body
    assert "<html" in body


def test_a_tool_without_a_hook_has_no_button_and_the_service_says_so(operator_client):
    dw.KNOBS["unknown"] = 1
    run = drive(durable.start("dash.transfer", {"amount": 2}).id)
    op = Operation.objects.get(run=run)
    page = operator_client.get(f"/runs/{run.id}/").content.decode()
    assert "It happened</button>" in page and "Look it up again" not in page
    found = operation_lookup(operation_id=op.pk)
    assert found.found is None and "has no reconcile hook" in found.error


def test_a_decided_operation_is_a_409_and_a_viewer_is_refused(operator_client, viewer_client):
    _run, op = parked_payment()
    response = viewer_client.post(f"/operations/{op.pk}/lookup/", {})
    assert response.status_code == 403
    operation_reconcile(operation_id=op.pk, outcome="not_happened", by="ops")
    response = operator_client.post(f"/operations/{op.pk}/lookup/", {}, **HTMX)
    assert response.status_code == 409 and "Nothing to look up" in response.content.decode()
    with pytest.raises(IllegalTransition, match="only an unknown outcome"):
        operation_lookup(operation_id=op.idempotency_key)
    assert operator_client.post("/operations/424242/lookup/", {}).status_code == 404
