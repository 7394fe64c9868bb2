"""Outside trial 31: the operator dashboard tried against bugs that users of similar tools
(Temporal UI, Prefect UI, Airflow UI, Elsa, MDW) reported in their public trackers.

Each test names the report it comes from and checks that the same failure does not
happen here. They drive the pages through Django's test client, as a browser would post
them (a filter form sends every field, a form box holds text).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel

import durable
from dashboard.selectors.overview import overview
from durable.models import Operation, Run, RunStatus
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard import start_workflows  # noqa: F401  (registers start.ticket)
from tests.dashboard.conftest import HTMX

pytestmark = pytest.mark.django_db(transaction=True)  # drive() runs the engine here


# --- fixture workflows ---------------------------------------------------------------


class Parcel(BaseModel):
    sku: str
    qty: int


class Shipment(BaseModel):
    """An input whose optional fields are nullable, as most real inputs are."""

    destination: str
    note: str | None = None
    weight_kg: float | None = None
    item_ids: list[int] | None = None
    parcels: list[Parcel] = []


@durable.workflow(name="trial31.ship")
def ship(ctx, input: Shipment) -> dict:
    return {"ok": True}


@pytest.fixture(autouse=True)
def _trial_workflows(settings):
    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [
            *modules,
            "tests.dashboard.start_workflows",
            "tests.dashboard.test_outside_trial_31",
        ],
    }


def run_ids(response) -> list[str]:
    """Run ids of the runs list's rows, in order."""
    return re.findall(r'class="mono run-link" href="/runs/([^/]+)/"', response.content.decode())


#: what the runs list's filter form sends when only the workflow is chosen: every field,
#: the empty ones too, and the sort it always has
FORM_FIELDS = {
    "q": "",
    "status": "",
    "workflow": "",
    "version": "",
    "started_by": "",
    "created_from": "",
    "created_to": "",
    "waiting_minutes": "",
    "retries": "",
    "sort": "-created",
}


# --- 1. search for text holding quotes or a backslash --------------------------------


def test_search_finds_input_text_that_holds_quotes_or_a_backslash(viewer_client):
    """temporalio/ui#1714, "filtering values containing quotes does not work": a filter on
    a value holding ``"`` found nothing. Here the search box looks in a run's input text
    (docs/dashboard.md: "search by run id, tag, input or output text"): a customer's
    quoted words and a Windows path must be found as typed, not only as their JSON
    escapes (``\\"``, ``\\\\``) happen to read."""
    quoted = durable.start("dash.echo", {"note": 'customer wrote "refund me now"'})
    path = durable.start("dash.echo", {"file": "C:\\exports\\march.csv"})
    durable.start("dash.echo", {"note": "refund me later"})

    by_quote = run_ids(viewer_client.get("/", {"q": '"refund me now"'}, **HTMX))
    by_path = run_ids(viewer_client.get("/", {"q": "C:\\exports\\march"}, **HTMX))
    # the control: the same runs are found by words without a quote or a backslash
    assert run_ids(viewer_client.get("/", {"q": "refund me now"}, **HTMX)) == [quoted.id]
    assert run_ids(viewer_client.get("/", {"q": "march.csv"}, **HTMX)) == [path.id]
    assert (by_quote, by_path) == ([quoted.id], [path.id]), (
        f"the quoted words found {by_quote}, the path found {by_path}"
    )


# --- 2. search and a status filter together ------------------------------------------


def test_search_by_run_id_and_a_status_filter_list_only_runs_matching_both(viewer_client):
    """temporalio/web#391, "web UI search will return non-relevant workflows": searching a
    workflow id and then choosing a status listed workflows unrelated to the id. Here
    the two filters must be ANDed, in the rows and in the status counts."""
    target = drive(durable.start("dash.fail", {"why": "declined"}, run_id="ord-4711-a").id)
    drive(durable.start("dash.fail", {"why": "declined"}, run_id="ord-9999-b").id)
    drive(durable.start("dash.echo", {"n": 1}, run_id="ord-4711-ok").id)
    assert target.status == RunStatus.FAILED

    response = viewer_client.get("/", {**FORM_FIELDS, "q": "ord-4711", "status": "failed"})
    assert run_ids(response) == [target.id]
    counts = response.context["counts"]
    assert counts["failed"] == 1 and counts["all"] == 2 and counts["succeeded"] == 1


# --- 3. a saved view of one filter is recognised when the form sends it ---------------


def test_a_view_saved_with_only_a_workflow_is_marked_current_when_the_form_applies_it(
    viewer_client,
):
    """PrefectHQ/prefect-ui-library#1749: a saved filter holding only flows filtered
    correctly but the selector showed "Custom" instead of the saved filter. Here a view
    saved with the workflow filter alone must be marked current both through its own
    link and when the filter form (which sends every field, empty ones and the sort
    too) shows the same runs."""
    saved = viewer_client.post(
        "/views/save/", {"name": "Echo runs", "query": "workflow=dash.echo&sort=-created"}
    )
    assert saved.status_code == 302
    marked = 'aria-current="page">Echo runs'
    by_link = viewer_client.get(saved["Location"]).content.decode()
    assert marked in by_link
    by_form = viewer_client.get("/", {**FORM_FIELDS, "workflow": "dash.echo"}).content.decode()
    assert marked in by_form
    other = viewer_client.get("/", {**FORM_FIELDS, "workflow": "dash.fail"}).content.decode()
    assert marked not in other


# --- 4. nullable fields of a typed start form ----------------------------------------


def test_nullable_fields_of_a_typed_input_take_plain_values(operator_client):
    """apache/airflow#31930, "trigger DAG with config form doesn't allow valid floats and
    empty strings" (a ``["number", "null"]`` param), and apache/airflow#45032 (a
    ``["array", "null"]`` param's value not passed). Here a pydantic input whose optional
    fields are ``str | None``, ``float | None`` and ``list[int] | None``: a note typed as
    plain text, a weight of 12.55 and a list of ids must start the run with those
    values, and the fields left empty keep their defaults (docs/dashboard.md: "a field
    per property: text, number, ... a JSON box for anything nested")."""
    page = operator_client.get("/runs/new/", {"workflow": "trial31.ship"}).content.decode()
    assert 'name="note"' in page and 'name="weight_kg"' in page

    response = operator_client.post(
        "/runs/new/",
        {
            "workflow": "trial31.ship",
            "destination": "Oslo",
            "note": "leave it at the door",
            "weight_kg": "12.55",
            "item_ids": "[1, 2]",
        },
    )
    body = response.content.decode()
    errors = re.findall(r'id="in-([a-z_]+)-error"[^>]*>([^<]*)<', body)
    assert response.status_code == 302, f"refused with {response.status_code}: {errors}"
    run = Run.objects.get(workflow_name="trial31.ship")
    assert run.input_value() == {
        "destination": "Oslo",
        "note": "leave it at the door",
        "weight_kg": 12.55,
        "item_ids": [1, 2],
        "parcels": [],
    }


def test_a_list_of_objects_field_starts_the_run_with_objects_not_strings(operator_client):
    """apache/airflow#41439, "Trigger DAG with config form transforms array of objects into
    array of strings". Here a ``list[Parcel]`` field (a JSON box) must reach the run as a
    list of objects, and a list of strings must be refused by its field, nothing
    started."""
    response = operator_client.post(
        "/runs/new/",
        {
            "workflow": "trial31.ship",
            "destination": "Bergen",
            "parcels": '[{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]',
        },
    )
    assert response.status_code == 302, response.content.decode()[:1500]
    run = Run.objects.get(workflow_name="trial31.ship")
    assert run.input_value()["parcels"] == [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]

    refused = operator_client.post(
        "/runs/new/",
        {"workflow": "trial31.ship", "destination": "Bergen", "parcels": '["{\\"sku\\": 1}"]'},
    )
    assert refused.status_code == 422 and 'id="in-parcels-error"' in refused.content.decode()
    assert Run.objects.filter(workflow_name="trial31.ship").count() == 1


# --- 5. large integers keep every digit ----------------------------------------------

BIG = 3544790567247868102  # over 2**53: a JavaScript number would round it


def test_a_large_integer_keeps_every_digit_from_the_form_to_the_run_page(operator_client):
    """temporalio/ui#2670, "Float/int rounding issue on workflow create with JSON payload":
    ``{"foo": 3544790567247868102}`` started from the UI became ...868000. Here the
    untyped JSON box and a typed integer field must start the run with the exact number,
    and the run page must show it."""
    untyped = operator_client.post(
        "/runs/new/", {"workflow": "dash.echo", "input": f'{{"foo": {BIG}}}'}
    )
    assert untyped.status_code == 302
    run = Run.objects.get(workflow_name="dash.echo")
    assert run.input_value() == {"foo": BIG}
    assert str(BIG) in operator_client.get(untyped["Location"]).content.decode()

    typed = operator_client.post(
        "/runs/new/", {"workflow": "start.ticket", "title": "big", "count": str(BIG)}
    )
    assert typed.status_code == 302, typed.content.decode()[:1500]
    ticket = Run.objects.get(workflow_name="start.ticket")
    assert ticket.input_value()["count"] == BIG
    assert str(BIG) in operator_client.get(typed["Location"]).content.decode()


# --- 6. a run id that is also the name of a page --------------------------------------


@pytest.mark.parametrize("run_id", ["new", "compare", "bulk"])
def test_a_run_whose_id_is_a_page_name_opens_its_own_page(viewer_client, operator_client, run_id):
    """temporalio/ui#1084 (and #668, #2129): a workflow whose id holds certain characters
    could not be opened, its link gave a 404. Here ``durable.start`` accepts any run id
    of letters, digits, '.', '_' and '-'; the runs list links each run to
    ``/runs/<id>/``. A run named like one of the pages under ``/runs/`` (``new``,
    ``compare``, ``bulk``) must either be refused when started, or open its own page
    from that link, for a viewer as for an operator."""
    try:
        run = durable.start("dash.echo", {"n": 1}, run_id=run_id)
    except ValueError:
        return  # refused up front: no run is left without a page
    listed = viewer_client.get("/", **HTMX).content.decode()
    assert f'href="/runs/{run.id}/"' in listed
    for client in (viewer_client, operator_client):
        page = client.get(f"/runs/{run.id}/")
        assert page.status_code == 200, f"/runs/{run.id}/ answered {page.status_code}"
        assert page.resolver_match.url_name == "run", (
            f"/runs/{run.id}/ is the {page.resolver_match.url_name!r} page, not the run's"
        )


# --- 7. non-ASCII text is shown as text, not as escapes --------------------------------

NORDIC = "Æble og Øl på Ålandsgatan, betalt til Müller"


def test_non_ascii_text_reads_as_itself_on_the_run_page_and_the_comparison(viewer_client):
    """elsa-workflows/elsa-core#7725, "Pretty JSON view escapes Unicode characters": Æ, Ø
    and Å showed as \\u00C6... in the pretty view. Here the run page's pretty-printed
    input and output and the comparison's diffs must show the letters themselves."""
    a = drive(durable.start("dash.echo", {"memo": NORDIC}).id)
    b = drive(durable.start("dash.echo", {"memo": NORDIC + "!"}).id)
    page = viewer_client.get(f"/runs/{a.id}/").content.decode()
    assert NORDIC in page and "\\u00c6" not in page.lower()
    compare = viewer_client.get("/runs/compare/", {"a": a.id, "b": b.id}).content.decode()
    assert NORDIC in compare and "\\u00c6" not in compare.lower()


def test_a_found_write_is_filled_in_as_readable_json(operator_client):
    """elsa-workflows/elsa-core#7725 again, on the "Look it up again" card: the result the
    reconcile hook found is filled into *It happened* as JSON for the operator to check
    (docs/dashboard.md) before recording it; its text must read as the provider wrote
    it, not as ``\\u00dc`` escapes."""
    dw.KNOBS["unknown"] = 1
    run = drive(durable.start("dash.payout", {"amount": 7}).id)
    assert run.status == "waiting", run.error
    op = Operation.objects.get(run=run)
    memo = "Überweisung an Müller, Größe L"
    dw.provider_records(op.idempotency_key, {"payment": "pay_ext_7", "amount": 7, "memo": memo})
    body = operator_client.post(
        f"/operations/{op.pk}/lookup/", {"return_to": "detail"}, **HTMX
    ).content.decode()
    card = body.split('aria-label="It happened: operation', 1)[1].split("</form>", 1)[0]
    assert "pay_ext_7" in card
    assert memo in card, "the found result is filled in with escapes: " + (
        re.search(r"memo[^\n]*", card).group(0) if "memo" in card else card[:600]
    )


# --- 8. a bulk action over runs that cannot take it -----------------------------------


def test_a_bulk_cancel_of_ticked_finished_runs_offers_no_confirmation(operator_client):
    """temporalio/ui#2148, "batch-actions check terminable workflows length": with only
    terminated workflows selected, the batch "Terminate" button stayed enabled. Here the
    preview of a bulk cancel of ticked runs that all finished must say none can take it
    and offer no confirmation; a forged confirmation cancels nothing."""
    done = [drive(durable.start("dash.echo", {"n": i}).id) for i in range(2)]
    assert all(r.status == RunStatus.SUCCEEDED for r in done)
    preview = operator_client.post(
        "/runs/bulk/",
        {
            "action": "cancel",
            "reason": "cleanup",
            "query": "workflow=dash.echo",
            "selected": [r.id for r in done],
        },
    )
    html = preview.content.decode()
    assert preview.status_code == 200
    assert '<strong id="bulk-eligible">0</strong>' in html
    assert '<strong id="bulk-refused">2</strong>' in html
    assert 'name="confirm"' not in html and "No run can take it." in html
    assert json.loads(preview.context["run_ids"]) == []
    forged = operator_client.post(
        "/runs/bulk/",
        {"action": "cancel", "reason": "cleanup", "run_ids": "[]", "confirm": "1"},
    )
    assert forged.status_code == 422
    assert not Run.objects.filter(workflow_name="dashboard.bulk_action").exists()


# --- 9. the overview's hourly chart across a clock change ------------------------------


def _hourly_runs(since: datetime, hours: int) -> None:
    Run.objects.bulk_create(
        Run(
            id=f"hour-{i:02d}",
            workflow_name="dash.echo",
            workflow_version="1",
            status=RunStatus.SUCCEEDED,
            input="{}",
            input_hash="h",
            created_at=since + timedelta(hours=i, minutes=30),
            started_at=since + timedelta(hours=i, minutes=30),
            finished_at=since + timedelta(hours=i, minutes=31),
        )
        for i in range(hours)
    )


@pytest.mark.parametrize(
    "now",
    [
        datetime(2026, 11, 1, 18, 0, tzinfo=UTC),  # New York's clocks went back at 06:00 UTC
        datetime(2026, 3, 8, 18, 0, tzinfo=UTC),  # and forward at 07:00 UTC
    ],
    ids=["fall-back", "spring-forward"],
)
def test_the_hourly_chart_has_one_bar_per_hour_across_a_clock_change(settings, now):
    """CenturyLinkCloud/mdw#764, "Switch from Daylight Saving Time causes duplicate date in
    Dashboard Chart" (a workflow engine's dashboard). Here the overview's 24 h chart, in
    a zone with a clock change that day: one run created in each real hour must give
    bars of one run each, every bar a distinct hour, none missing, none doubled."""
    settings.TIME_ZONE = "America/New_York"
    since = now - timedelta(hours=24)
    _hourly_runs(since, 24)
    figures = overview("24h", now=now)
    assert figures.runs == 24
    bars = [(b.start.isoformat(), b.total) for b in figures.buckets]
    instants = [b.start.timestamp() for b in figures.buckets]
    twice = [bar for bar, at in zip(bars, instants, strict=True) if instants.count(at) > 1]
    assert not twice, f"one instant is two bars: {twice}"
    with_runs = [(b.start.isoformat(), b.total) for b in figures.buckets if b.total]
    assert all(total == 1 for _, total in with_runs), f"hours merged into one bar: {with_runs}"
    assert len(with_runs) == 24
    # every bar starts on a whole hour of an offset the zone really has at that instant
    for b in figures.buckets:
        assert b.start.minute == 0 and (b.start.timestamp() % 3600) == 0, b.start
