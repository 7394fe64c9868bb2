"""A run parked on a rate or concurrency limit is visible (docs/limits.md): the run
page names the limit and the wake time, the runs list filters runs waiting for a limit,
and the admin's tool page shows a tool's limits."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

import durable
from durable.models import RunStatus, Tool, Wait, WaitKind
from durable.testing import drive
from tests import limit_workflows as lw

pytestmark = pytest.mark.django_db(transaction=True)


def _parked_run() -> str:
    lw.reset()
    drive(durable.start("limits.reads", {"name": "a", "n": 2}).id)
    run_id = durable.start("limits.reads", {"name": "b", "n": 1}).id
    assert drive(run_id).status == RunStatus.WAITING
    return run_id


def _ids(response) -> list[str]:
    return re.findall(r'class="mono run-link" href="/runs/([^/]+)/"', response.content.decode())


def test_the_run_page_says_which_limit_and_until_when(viewer_client):
    run_id = _parked_run()
    wait = Wait.objects.get(run_id=run_id, kind=WaitKind.LIMIT)
    page = viewer_client.get(f"/runs/{run_id}/").content.decode()
    header = page.split('<div class="limit-wait">', 1)[1].split("</div>", 1)[0]
    assert "waiting for rate limit of tool:limited_read" in header
    assert wait.wake_at.strftime("%Y-%m-%dT%H:%M:%S") in header


def test_the_runs_list_filters_runs_waiting_for_a_limit(viewer_client):
    parked = _parked_run()
    sleeping = durable.start("limits.reads", {"name": "c", "n": 0}).id
    drive(sleeping)
    response = viewer_client.get("/?status=limit")
    assert response.status_code == 200
    assert _ids(response) == [parked]
    body = viewer_client.get("/").content.decode()
    assert 'id="count-limit">1<' in body
    assert "Rate or concurrency limit" in body  # the row's "Waiting on" column


def test_the_admin_tool_page_shows_and_overrides_limits(db):
    admin = User.objects.create_superuser("root", password="pw-for-tests-only")
    client = Client()
    client.force_login(admin)
    tool = Tool.objects.get(name="limited_read")
    listing = client.get("/admin/durable/tool/").content.decode()
    assert "2/m" in listing
    page = client.get(f"/admin/durable/tool/{tool.pk}/change/").content.decode()
    assert 'name="rate_limit"' in page and "&quot;rate_limit&quot;: &quot;2/m&quot;" in page
    form = {
        "description": tool.description,
        "safety": tool.safety,
        "retry_policy": "null",
        "timeout_seconds": "",
        "approver_group": "",
        "rate_limit": "every so often",
        "concurrency": "",
    }
    response = client.post(f"/admin/durable/tool/{tool.pk}/change/", form)
    assert response.status_code == 200  # refused on the field, not saved
    assert "rate_limit must look like" in response.content.decode()
    form["rate_limit"] = "5/s"
    form["concurrency"] = "3"
    response = client.post(f"/admin/durable/tool/{tool.pk}/change/", form)
    assert response.status_code == 302
    assert "5/s, 3 at once" in client.get("/admin/durable/tool/").content.decode()
