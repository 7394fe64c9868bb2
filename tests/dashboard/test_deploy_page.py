"""The Deploy check page: open runs by version beside the versions this code registers,
and the replay check an operator runs from it."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.urls import reverse

import durable
from dashboard.selectors import LAST_REPORT_KEY
from durable.models import Run, RunStatus, Step, TraceEvent, Wait
from durable.testing import drive
from tests.durable import replay_workflows as rw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    rw.reset()
    cache.delete(LAST_REPORT_KEY)
    yield
    rw.reset()
    cache.delete(LAST_REPORT_KEY)


def waiting_run(message: str = "twice") -> Run:
    run = drive(durable.start("replay.support", {"message": message}, version="1").id)
    assert run.status == RunStatus.WAITING, run.error
    return run


def test_the_page_lists_open_runs_by_version_and_versions_not_registered(viewer_client):
    waiting_run()
    waiting_run("again")
    retired = waiting_run("old")
    Run.objects.filter(pk=retired.pk).update(workflow_version="0-retired")
    page = viewer_client.get(reverse("dashboard:deploy")).content.decode()
    v1 = page.split('id="version-replay.support-1"')[1].split("</tr>")[0]
    assert ">2</a>" in v1 and "registered" in v1 and "not registered" not in v1
    v2 = page.split('id="version-replay.support-2"')[1].split("</tr>")[0]
    assert "latest" in v2 and ">0<" in v2
    old = page.split('id="version-replay.support-0-retired"')[1].split("</tr>")[0]
    assert ">1</a>" in old and "not registered" in old
    assert "Check open runs now" not in page  # a viewer sees, an operator checks
    assert "No check has been run from this page yet." in page


def test_an_operator_runs_the_check_and_the_page_shows_each_divergence(
    operator, operator_client, viewer_client
):
    run = waiting_run()
    rw.EDIT["support"] = "call_before_wait"
    counts = [m.objects.count() for m in (Run, Step, Wait, TraceEvent)]
    response = operator_client.post(reverse("dashboard:deploy_check"), follow=True)
    page = response.content.decode()
    assert "1 of 1 open runs diverge from this code." in page
    assert f"by {operator.username}: 1 open runs checked" in page
    assert reverse("dashboard:run", args=[run.id]) in page
    assert "approval:refund (wait)" in page and "check_fraud (step)" in page
    assert f"{rw.__file__}:" in page
    assert [m.objects.count() for m in (Run, Step, Wait, TraceEvent)] == counts
    assert rw.CALLS.count("check_fraud") == 0
    # the viewer sees the last report, and may not run one
    assert "check_fraud (step)" in viewer_client.get(reverse("dashboard:deploy")).content.decode()
    assert viewer_client.post(reverse("dashboard:deploy_check")).status_code == 403
    assert operator_client.get(reverse("dashboard:deploy_check")).status_code == 405
    rw.EDIT.clear()
    page = operator_client.post(reverse("dashboard:deploy_check"), follow=True).content.decode()
    assert "All 1 open runs checked replay on this code." in page
