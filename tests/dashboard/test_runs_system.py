"""The runs list hides the runs the system starts for itself (approval emails, webhook
deliveries: started by ``system:<what>``) unless "show system runs" is on, a toggle kept in
the URL; the status counts follow the other filters (issue 31, item 2)."""

from __future__ import annotations

import re

import pytest

import durable
from durable.requesters import SYSTEM_PREFIX
from durable.testing import drive
from tests.dashboard.conftest import HTMX

pytestmark = pytest.mark.django_db(transaction=True)


def run_ids(response) -> set[str]:
    return set(
        re.findall(r'class="mono run-link" href="/runs/([^/]+)/"', response.content.decode())
    )


def counts(response) -> dict[str, int]:
    return response.context["counts"]


@pytest.fixture
def runs():
    """Two runs of people (one tagged, one failed), two of the system."""
    mine = drive(durable.start("dash.echo", {"text": "a"}, tags=["nightly"], run_id="mine-1").id)
    failed = drive(durable.start("dash.fail", {"why": "declined"}, run_id="mine-2").id)
    email = drive(
        durable.start(
            "dash.echo", {"text": "mail"}, run_id="approval-email.42", started_by="system:webhooks"
        ).id
    )
    hook = drive(
        durable.start(
            "dash.fail", {"why": "410"}, run_id="webhook.1.42", started_by=f"{SYSTEM_PREFIX}x"
        ).id
    )
    assert failed.status == hook.status == "failed"
    return {"mine": mine, "failed": failed, "email": email, "hook": hook}


def test_system_runs_are_hidden_by_default_and_counted_out(viewer, viewer_client, runs):
    from tests.api.conftest import api_for

    response = viewer_client.get("/")
    assert run_ids(response) == {"mine-1", "mine-2"}
    assert counts(response)["all"] == 2 and counts(response)["failed"] == 1
    assert counts(response)["attention"] == 1
    page = response.content.decode()
    # the toggle is on the page, off, labelled
    assert re.search(r'<input type="checkbox" name="system" id="id_system" value="1" aria', page)
    assert '<label for="id_system">Show system runs</label>' in page
    # the JSON API lists them as it always has
    items = api_for(viewer).get("/runs?limit=50").json()["items"]
    assert {item["id"] for item in items} == {r.id for r in runs.values()}


def test_show_system_runs_lists_them_marked_and_counts_them(viewer_client, runs):
    response = viewer_client.get("/?system=1")
    assert run_ids(response) == {"mine-1", "mine-2", "approval-email.42", "webhook.1.42"}
    assert counts(response)["all"] == 4 and counts(response)["failed"] == 2
    page = response.content.decode()
    assert 'id="id_system" value="1" checked' in page
    row = page.split('href="/runs/approval-email.42/"', 1)[1].split("</tr>", 1)[0]
    assert 'class="tag tag-system"' in row
    mine = page.split('href="/runs/mine-1/"', 1)[1].split("</tr>", 1)[0]
    assert "tag-system" not in mine


def test_the_toggle_stays_in_the_live_refresh_and_pager_urls(viewer_client, runs):
    response = viewer_client.get("/?system=1&status=failed", **HTMX)
    page = response.content.decode()
    assert 'hx-get="/?system=1&amp;status=failed"' in page
    assert run_ids(response) == {"mine-2", "webhook.1.42"}
    assert run_ids(viewer_client.get("/?status=failed", **HTMX)) == {"mine-2"}


def test_counts_follow_the_workflow_search_and_date_filters(viewer_client, runs):
    by_workflow = viewer_client.get("/?workflow=dash.fail&status=succeeded")
    # the chips count the other filters' runs, whatever status is chosen
    assert counts(by_workflow)["all"] == 1 and counts(by_workflow)["failed"] == 1
    assert counts(by_workflow)["succeeded"] == 0 and run_ids(by_workflow) == set()
    by_workflow_all = viewer_client.get("/?workflow=dash.fail&system=1")
    assert counts(by_workflow_all)["failed"] == 2 and counts(by_workflow_all)["attention"] == 2
    by_tag = viewer_client.get("/?q=nightly")
    assert counts(by_tag)["all"] == 1 and counts(by_tag)["succeeded"] == 1
    assert counts(by_tag)["failed"] == 0
    day = runs["mine"].created_at.date()
    tomorrow = day.replace(year=day.year + 1)
    by_date = viewer_client.get(f"/?created_from={tomorrow.isoformat()}&system=1")
    assert counts(by_date)["all"] == 0
    # the status chip's own count is the list it shows
    failed = viewer_client.get("/?status=failed")
    assert counts(failed)["failed"] == len(run_ids(failed)) == 1


def test_counts_of_two_filters_are_not_mixed_up_by_the_cache(viewer_client, runs):
    assert counts(viewer_client.get("/?system=1"))["all"] == 4
    assert counts(viewer_client.get("/"))["all"] == 2
    assert counts(viewer_client.get("/?system=1"))["all"] == 4


def test_an_empty_list_says_system_runs_that_match_are_hidden(viewer_client, runs):
    page = viewer_client.get("/?q=approval-email").content.decode()
    assert "No runs match these filters." in page
    assert "System runs that match are hidden" in page
    assert 'href="?q=approval-email&amp;system=1">show system runs</a>' in page
    plain = viewer_client.get("/?q=nothing-at-all").content.decode()
    assert "No runs match" in plain and "System runs that match" not in plain


@pytest.mark.parametrize("value", ["2", "yes please", "\x00", "1" * 300])
def test_a_bad_toggle_is_reported_not_a_500(viewer_client, runs, value):
    response = viewer_client.get("/", {"system": value})
    assert response.status_code == 200
    page = response.content.decode()
    assert "Some filters were not applied: Show system runs: Select a valid choice" in page
    assert run_ids(response) == {"mine-1", "mine-2"}
