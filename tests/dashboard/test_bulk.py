"""Bulk actions on the runs the list's filters match (``/runs/bulk/``): a preview of what
can and cannot take the action, then a run that carries it out batch by batch, each run
acted on and audited as on its own page."""

from __future__ import annotations

import json

import pytest

import durable
from durable.models import Run, RunStatus, TraceEvent
from durable.testing import drive

URL = "/runs/bulk/"

pytestmark = pytest.mark.django_db(transaction=True)  # drive() runs the engine here


@pytest.fixture
def runs(db):
    pending = [durable.start("dash.echo", {"n": i}) for i in range(3)]
    done = drive(durable.start("dash.echo", {"n": 9}).id)
    assert done.status == RunStatus.SUCCEEDED
    return pending, done


def test_the_preview_counts_and_names_what_cannot_take_it(operator_client, runs):
    pending, done = runs
    page = operator_client.post(
        URL, {"action": "cancel", "reason": "bad deploy", "query": "workflow=dash.echo"}
    )
    assert page.status_code == 200
    html = page.content.decode()
    assert '<strong id="bulk-eligible">3</strong>' in html
    assert '<strong id="bulk-refused">1</strong>' in html and done.id in html
    assert all(Run.objects.get(pk=r.id).status == RunStatus.PENDING for r in pending)


def test_the_confirmation_runs_the_action_as_a_run_and_audits_each(operator_client, runs, operator):
    pending, done = runs
    preview = operator_client.post(
        URL, {"action": "cancel", "reason": "bad deploy", "query": "workflow=dash.echo"}
    )
    ids = json.loads(preview.context["run_ids"])
    assert sorted(ids) == sorted(r.id for r in pending)
    ids.append(done.id)  # finished meanwhile, as it were: skipped, not an error
    response = operator_client.post(
        URL,
        {"action": "cancel", "reason": "bad deploy", "run_ids": json.dumps(ids), "confirm": "1"},
    )
    assert response.status_code == 302
    bulk = Run.objects.get(workflow_name="dashboard.bulk_action")
    assert response["Location"] == f"/runs/{bulk.id}/" and bulk.started_by_id == operator.pk
    bulk = drive(bulk.id)
    assert bulk.status == RunStatus.SUCCEEDED, bulk.error
    out = bulk.output_value()
    assert out["done"] == 3 and [s["run"] for s in out["skipped"]] == [done.id]
    for r in pending:
        assert Run.objects.get(pk=r.id).status == RunStatus.CANCELLED
        event = TraceEvent.objects.filter(run_id=r.id, kind="cancelled").get()
        assert event.actor == "otto" and "bad deploy" in event.message


def test_a_bulk_action_needs_an_action_a_reason_and_an_operator(
    operator_client, viewer_client, runs
):
    assert operator_client.post(URL, {"action": "delete", "reason": "x"}).status_code == 422
    assert operator_client.post(URL, {"action": "cancel", "reason": " "}).status_code == 422
    assert viewer_client.post(URL, {"action": "cancel", "reason": "x"}).status_code == 403
    for hostile in ("not json", "5", '{"a": 1}', '["bad\\u0000id", 7, "../x"]'):
        confirm = {"action": "cancel", "reason": "x", "run_ids": hostile, "confirm": "1"}
        assert operator_client.post(URL, confirm).status_code == 422, hostile
    odd = {"action": "cancel", "reason": "x", "query": "created_from=soon&q=%00&status=zzz"}
    assert operator_client.post(URL, odd).status_code == 200
    assert not Run.objects.filter(workflow_name="dashboard.bulk_action").exists()


def test_the_runs_list_offers_it_to_an_operator_only(operator_client, viewer_client, db):
    assert 'action="/runs/bulk/"' in operator_client.get("/?workflow=dash.echo").content.decode()
    assert 'action="/runs/bulk/"' not in viewer_client.get("/").content.decode()


def test_ticked_rows_are_the_runs_acted_on_instead_of_every_match(
    operator_client, viewer_client, runs
):
    pending, done = runs
    page = operator_client.get("/?workflow=dash.echo").content.decode()
    box = f'name="selected" value="{pending[0].id}" form="bulk-form"'
    assert box in page and 'id="bulk-form"' in page
    assert 'name="selected"' not in viewer_client.get("/").content.decode()

    picked = [pending[0].id, done.id, "not a run id!"]
    preview = operator_client.post(
        URL,
        {"action": "cancel", "reason": "r", "query": "workflow=dash.echo", "selected": picked},
    )
    html = preview.content.decode()
    assert "<strong>2</strong> selected runs." in html
    assert '<strong id="bulk-eligible">1</strong>' in html
    assert '<strong id="bulk-refused">1</strong>' in html
    assert json.loads(preview.context["run_ids"]) == [pending[0].id]


def test_filters_changed_in_place_are_the_ones_the_bulk_form_posts(operator_client):
    """The filter form swaps only the results (htmx): the bulk form's hidden query is
    swapped with them, or a bulk action would take the filters the page was opened with."""
    from tests.dashboard.conftest import HTMX

    page = operator_client.get("/?status=failed").content.decode()
    assert 'id="bulk-query" value="status=failed"' in page
    fragment = operator_client.get("/?status=cancelled&workflow=dash.echo", **HTMX).content.decode()
    assert (
        '<input type="hidden" name="query" id="bulk-query" '
        'value="status=cancelled&amp;workflow=dash.echo" form="bulk-form" hx-swap-oob="true">'
    ) in fragment
