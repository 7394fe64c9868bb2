"""A fork with an edited input (issue 31, item 4): the start form prefilled from a run,
then either a fork that reuses the steps before a chosen one, or a new run; the same
from the API, the CLI and the SDK."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import durable
from durable.models import Run, Step, TraceEvent
from durable.testing import drive
from tests.api.conftest import api_for
from tests.dashboard import start_workflows as sw

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/runs/new/"


@pytest.fixture(autouse=True)
def _typed_workflows(settings):
    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [*modules, "tests.dashboard.start_workflows"],
    }
    sw.ORDER_CALLS.clear()


def failed_order() -> Run:
    run = drive(
        durable.start("start.order", {"customer": "acme", "quantity": 200, "api_key": "sk-1"}).id
    )
    assert run.status == "failed", run.error
    return run


def test_the_form_is_prefilled_from_the_run_with_its_fork_points(operator_client):
    source = failed_order()
    page = operator_client.get(URL, {"from": source.id}).content.decode()
    assert 'name="customer" id="in-customer" value="acme"' in page
    assert 'name="quantity" id="in-quantity" value="200"' in page
    assert 'value="[REDACTED]"' in page and "sk-1" not in page  # a secret is not shown
    assert '<option value="quote">' in page and '<option value="confirm">' in page
    assert f'name="from" value="{source.id}"' in page
    run_page = operator_client.get(f"/runs/{source.id}/").content.decode()
    assert f'href="{URL}?from={source.id}"' in run_page


def test_a_fork_from_a_step_reuses_what_came_before_with_the_new_input(operator_client, operator):
    source = failed_order()
    form = {"from": source.id, "workflow": "start.order", "from_step": "confirm"}
    response = operator_client.post(
        URL, {**form, "customer": "acme", "quantity": "5", "api_key": "sk-2", "reason": "typo"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    fork = Run.objects.get(forked_from=source)
    assert response["Location"] == f"/runs/{fork.id}/"
    assert fork.input_value() == {"customer": "acme", "quantity": 5, "api_key": "sk-2"}
    assert fork.started_by == operator
    assert list(Step.objects.filter(run=fork).values_list("step_id", flat=True)) == ["quote"]
    fork = drive(fork.id)
    assert fork.status == "succeeded", fork.error
    # the quote was reused as it was made (for 200), the confirmation ran with 5
    assert fork.output_value() == {"quote": {"for": "acme", "qty": 200}, "confirmed": 5}
    assert sw.ORDER_CALLS == {"quote": 1, "confirm": 2}
    created = TraceEvent.objects.get(run=fork, kind="created")
    assert created.data["input_edited"] is True and "with an edited input" in created.message


def test_no_step_starts_a_new_run_and_a_left_secret_starts_nothing(operator_client):
    source = failed_order()
    form = {"from": source.id, "workflow": "start.order", "customer": "acme", "quantity": "7"}
    kept = operator_client.post(URL, {**form, "api_key": "[REDACTED]", "from_step": "confirm"})
    assert kept.status_code == 422 and "Type its value again" in kept.content.decode()
    assert Run.objects.count() == 1
    fresh = operator_client.post(URL, {**form, "api_key": "sk-3", "from_step": ""})
    assert fresh.status_code == 302
    new = Run.objects.exclude(pk=source.pk).get()
    assert new.forked_from_id is None and new.input_value()["quantity"] == 7


def test_bad_sources_and_steps_are_refused_by_name(operator_client, viewer_client):
    source = failed_order()
    unknown = operator_client.get(URL, {"from": "no-such-run"})
    assert unknown.status_code == 422 and "no run" in unknown.content.decode()
    bad = operator_client.post(
        URL, {"from": source.id, "from_step": "nope", "customer": "a", "quantity": "1"}
    )
    assert bad.status_code == 422 and "cannot be forked from step" in bad.content.decode()
    running = durable.start("start.order", {"customer": "b", "quantity": 1})  # not finished
    page = operator_client.get(URL, {"from": running.id}).content.decode()
    assert "cannot be forked" in page and '<option value="quote">' not in page
    assert viewer_client.get(URL, {"from": source.id}).status_code == 403
    assert Run.objects.count() == 2


def test_the_api_cli_and_sdk_fork_with_an_input(operator):
    source = failed_order()
    client = api_for(operator)
    body = {
        "from_step": "confirm",
        "input": {"customer": "acme", "quantity": 3},
        "new_run_id": "f1",
    }
    made = client.post(f"/runs/{source.id}/fork", body)
    assert made.status_code == 201, made.content
    assert Run.objects.get(pk="f1").input_value() == {"customer": "acme", "quantity": 3}
    assert client.post(f"/runs/{source.id}/fork", body).status_code == 200  # the same
    other = client.post(f"/runs/{source.id}/fork", {**body, "input": {"quantity": 4}})
    assert other.status_code == 409 and "input" in other.content.decode()
    same = client.post(f"/runs/{source.id}/fork", {"from_step": "confirm"})
    assert Run.objects.get(pk=same.json()["id"]).input_hash == source.input_hash

    out = StringIO()
    call_command(
        "durable", "fork", source.id, "--from-step", "confirm", "--input",
        json.dumps({"customer": "cli", "quantity": 2}), stdout=out,
    )  # fmt: skip
    assert "with the input given" in out.getvalue()
    with pytest.raises(CommandError, match="--input"):
        call_command("durable", "fork", source.id, "--from-step", "confirm", "--input", "{x")
    sdk = durable.fork(source.id, from_step="confirm", input={"customer": "sdk", "quantity": 1})
    assert sdk.input_value()["customer"] == "sdk"
