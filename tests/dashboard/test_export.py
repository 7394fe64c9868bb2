"""The run page's audit export: the button, the JSON download and the printable page."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

import durable
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard.conftest import login

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-live0123456789abcdef"


@pytest.fixture
def run():
    dw.KNOBS["flaky"] = 1
    return drive(durable.start("dash.flaky", {"n": 1, "api_key": SECRET}).id)


def test_the_run_page_has_the_export_buttons(viewer_client, run):
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert f'href="/runs/{run.id}/export.json" download>Download JSON</a>' in page
    assert f'href="/runs/{run.id}/export/">Readable page</a>' in page


def test_the_json_download_is_the_audit_document_naming_who_exported(viewer_client, viewer, run):
    response = viewer_client.get(f"/runs/{run.id}/export.json")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.id}.json"'
    doc = json.loads(response.content)
    assert doc["run"]["id"] == run.id
    assert doc["exported_by"] == viewer.username
    assert [s["step_id"] for s in doc["steps"]][-1] == "flaky"
    assert "run.input.api_key" in doc["redactions"]
    assert SECRET not in response.content.decode()


def test_the_readable_page_shows_steps_attempts_and_redactions(viewer_client, run):
    response = viewer_client.get(f"/runs/{run.id}/export/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Audit export" in page and "Download JSON" in page
    assert "flaky" in page and "transient" in page
    assert "run.input.api_key" in page
    assert SECRET not in page
    # the dashboard's CSP allows no inline style: the page uses the stylesheet
    assert "<style" not in page


def test_export_needs_login_and_the_viewer_permission(run):
    assert Client().get(f"/runs/{run.id}/export.json").status_code == 302
    nobody = login(User.objects.create_user("nobody", password="pw-for-tests"))
    assert nobody.get(f"/runs/{run.id}/export.json").status_code == 403
    assert nobody.get(f"/runs/{run.id}/export/").status_code == 403


def test_export_of_an_unknown_run_is_404(viewer_client):
    assert viewer_client.get("/runs/no-such-run/export.json").status_code == 404
    assert viewer_client.get("/runs/no-such-run/export/").status_code == 404


def test_export_refuses_post(viewer_client, run):
    assert viewer_client.post(f"/runs/{run.id}/export/").status_code in (403, 405)
