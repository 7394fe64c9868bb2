"""Starting a run from the dashboard (``/runs/new/``): a form from the input's type hint,
checked before anything starts; a JSON box for an untyped input."""

from __future__ import annotations

import json

import pytest

from durable.models import Run
from tests.dashboard import start_workflows  # noqa: F401  (registers the typed workflows)

URL = "/runs/new/"


@pytest.fixture(autouse=True)
def _typed_workflows(settings):
    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [*modules, "tests.dashboard.start_workflows"],
    }


def test_the_page_offers_the_users_workflows_not_the_systems(operator_client):
    page = operator_client.get(URL).content.decode()
    assert 'value="start.ticket"' in page and 'value="dash.echo"' in page
    assert 'value="api.webhook_delivery"' not in page and "durable.mcp.call" not in page


def test_the_workflow_that_sends_approval_emails_is_not_offered(operator_client, settings):
    """The outside trial of issue 31 found ``examples.approval_email`` offered: it is the
    system's (``DURABLE_APPROVAL_EMAIL_WORKFLOW`` names it), whatever its namespace."""
    settings.DURABLE_APPROVAL_EMAIL_WORKFLOW = "dash.echo"
    page = operator_client.get(URL).content.decode()
    assert 'value="start.ticket"' in page and 'value="dash.echo"' not in page
    response = operator_client.post(URL, {"workflow": "dash.echo", "input": "{}"})
    assert response.status_code in (404, 422) and not Run.objects.exists()


def test_a_typed_input_gets_a_field_per_property_with_its_kind(operator_client):
    page = operator_client.get(URL, {"workflow": "start.ticket"}).content.decode()
    assert 'name="title"' in page and "what the ticket is about" in page
    assert 'type="checkbox" name="urgent"' in page
    assert '<select name="priority"' in page and 'value="high"' in page
    assert '<textarea name="labels"' in page  # a list: a JSON box


def test_a_typed_input_is_checked_by_field_and_nothing_starts(operator_client):
    before = Run.objects.count()
    response = operator_client.post(
        URL, {"workflow": "start.ticket", "title": "", "count": "three", "labels": "[1,"}
    )
    assert response.status_code == 422
    page = response.content.decode()
    assert 'id="in-count-error"' in page and "valid integer" in page
    assert 'id="in-labels-error"' in page and "not JSON" in page
    assert Run.objects.count() == before


def test_a_valid_typed_input_starts_the_run_as_the_operator(operator_client, operator):
    response = operator_client.post(
        URL,
        {
            "workflow": "start.ticket",
            "title": "Printer on fire",
            "count": "3",
            "urgent": "1",
            "priority": "high",
            "labels": '["ops"]',
        },
    )
    assert response.status_code == 302
    run = Run.objects.get(workflow_name="start.ticket")
    assert response["Location"] == f"/runs/{run.id}/"
    assert run.input_value() == {
        "title": "Printer on fire",
        "count": 3,
        "urgent": True,
        "priority": "high",
        "labels": ["ops"],
    }
    assert run.started_by_id == operator.pk


@pytest.mark.parametrize(
    "workflow, form, value",
    [
        (
            "start.refund",
            {"order_id": "A-1", "amount": "12.5"},
            {"order_id": "A-1", "amount": 12.5},
        ),
        ("start.ping", {"host": "db1"}, {"host": "db1", "tries": 3}),  # the default
    ],
)
def test_a_typeddict_and_a_dataclass_make_forms_too(operator_client, workflow, form, value):
    response = operator_client.post(URL, {"workflow": workflow, **form})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Run.objects.get(workflow_name=workflow).input_value() == value


def test_an_untyped_input_is_a_json_box_with_the_last_runs_input(operator_client):
    import durable

    durable.start("dash.echo", {"n": 41})
    page = operator_client.get(URL, {"workflow": "dash.echo"}).content.decode()
    assert 'name="input"' in page and "&quot;n&quot;: 41" in page
    bad = operator_client.post(URL, {"workflow": "dash.echo", "input": "{n: 1}"})
    assert bad.status_code == 422 and "not JSON" in bad.content.decode()
    good = operator_client.post(URL, {"workflow": "dash.echo", "input": json.dumps({"n": 42})})
    assert good.status_code == 302
    assert Run.objects.filter(workflow_name="dash.echo").count() == 2


def test_a_system_or_unknown_workflow_is_refused_and_a_viewer_may_not_start(
    operator_client, viewer_client
):
    for name in ("api.webhook_delivery", "no.such.workflow"):
        response = operator_client.post(URL, {"workflow": name, "input": "{}"})
        assert response.status_code == 422 and "no workflow" in response.content.decode()
    assert viewer_client.get(URL).status_code == 403
    assert viewer_client.post(URL, {"workflow": "dash.echo", "input": "{}"}).status_code == 403
    assert not Run.objects.exists()


def test_the_runs_list_links_to_it_for_an_operator_only(operator_client, viewer_client):
    assert URL in operator_client.get("/").content.decode()
    assert URL not in viewer_client.get("/").content.decode()
