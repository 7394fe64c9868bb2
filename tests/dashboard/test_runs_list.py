"""The runs list: counts, filters, sorting, keyset pagination, HTMX fragments, queries."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from dashboard import selectors
from durable.models import Run, RunStatus, Step, Wait
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard.conftest import HTMX, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def run_ids(response) -> list[str]:
    """Run ids of the table's rows, in order."""
    return re.findall(r'class="mono run-link" href="/runs/([^/]+)/"', response.content.decode())


def pager(response) -> dict[str, str]:
    """The pager's links of a response: {"Next": url, "Previous": url, ...}."""
    page = response.content.decode().split('<nav class="pager"', 1)
    if len(page) < 2:
        return {}
    nav = page[1].split("</nav>")[0]
    links = re.findall(r'<a class="btn" href="([^"]+)"[^>]*>([^<]+)</a>', nav)
    return {label.strip("←→ "): html.unescape(url) for url, label in links}


def bulk_runs(
    n: int,
    *,
    status=RunStatus.SUCCEEDED,
    start=None,
    step=timedelta(seconds=1),
    prefix="r",
    **fields,
) -> list[Run]:
    start = start or timezone.now() - timedelta(days=1)
    runs = [
        Run(
            id=f"{prefix}{i:04d}",
            workflow_name=fields.get("workflow_name", "dash.echo"),
            workflow_version=fields.get("workflow_version", "1"),
            status=status,
            input=f'{{"n":{i}}}',
            input_hash="h",
            created_at=start + i * step,
            started_at=start + i * step,
            finished_at=start + i * step + timedelta(seconds=i % 7)
            if status in ("succeeded", "failed")
            else None,
        )
        for i in range(n)
    ]
    return Run.objects.bulk_create(runs)


@pytest.fixture
def mixed_runs(operator):
    """One run in each interesting state; returns {name: run}."""
    runs = {}
    runs["done"] = drive(
        durable.start(
            "dash.echo", {"text": "hello"}, tags=["nightly"], version="1", started_by=operator
        ).id
    )
    runs["v2"] = drive(durable.start("dash.echo", {"text": "second"}, version="2").id)
    runs["failed"] = drive(durable.start("dash.fail", {"why": "card declined"}).id)
    runs["approval"] = drive(durable.start("tests.approval", {"budget": 5}).id)
    runs["signal"] = drive(durable.start("tests.signal", {}).id)
    dw.KNOBS["flaky"] = 2
    runs["flaky"] = drive(durable.start("dash.flaky", {}).id)
    runs["retrying"] = drive(durable.start("dash.slow_retry", {}).id, wait_for_retries=False)
    dw.KNOBS["unknown"] = 1
    runs["unknown"] = drive(durable.start("dash.transfer", {"amount": 5}).id)
    assert runs["failed"].status == "failed"
    assert runs["approval"].status == "waiting"
    assert runs["retrying"].status == "retrying", runs["retrying"].error
    assert runs["unknown"].status == "waiting"
    assert runs["flaky"].status == "succeeded"
    return runs


def test_page_shows_counts_and_rows(operator_client, mixed_runs):
    response = operator_client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "<!doctype html>" in page and 'id="filters"' in page
    assert set(run_ids(response)) == {r.id for r in mixed_runs.values()}
    counts = response.context["counts"]
    assert counts["all"] == 8 and counts["failed"] == 1 and counts["retrying"] == 1
    assert counts["waiting"] == 3 and counts["approval"] == 1
    assert counts["attention"] == 2  # the failed run and the unknown outcome
    assert 'id="count-attention"' in page
    row = page.split(mixed_runs["done"].id, 1)[1].split("</tr>", 1)[0]
    assert "dash.echo" in row and "by otto" in row and "nightly" in page
    approval_row = page.split(f"/runs/{mixed_runs['approval'].id}/", 1)[1].split("</tr>", 1)[0]
    assert "Approval" in approval_row and "Approve the budget" in approval_row


def test_htmx_request_gets_only_the_table_fragment(viewer_client, mixed_runs):
    response = viewer_client.get("/?status=failed", **HTMX)
    page = response.content.decode()
    assert response.status_code == 200
    assert "<!doctype html>" not in page and 'id="filters"' not in page
    assert page.lstrip().startswith('<section id="runs-results"')
    assert 'hx-get="/?status=failed"' in page  # the live refresh keeps the filters
    assert 'hx-swap-oob="true"' in page  # the counts are refreshed out of band
    assert run_ids(response) == [mixed_runs["failed"].id]
    assert "HX-Request" in response["Vary"]


def test_history_restore_gets_the_whole_page(viewer_client, mixed_runs):
    response = viewer_client.get("/?status=failed", HTTP_HX_HISTORY_RESTORE_REQUEST="true", **HTMX)
    assert "<!doctype html>" in response.content.decode()


@pytest.mark.parametrize(
    "query,expected",
    [
        ("status=failed", ["failed"]),
        ("status=retrying", ["retrying"]),
        ("status=approval", ["approval"]),
        ("status=attention", ["failed", "unknown"]),
        ("status=succeeded&workflow=dash.echo", ["done", "v2"]),
        ("workflow=dash.echo&version=2", ["v2"]),
        ("started_by=otto", ["done"]),
        ("retries=1", ["flaky"]),
        ("retries=2", ["flaky"]),
        ("retries=3", []),
        ("q=nightly", ["done"]),
        ("q=second", ["v2"]),
    ],
)
def test_filters(viewer_client, mixed_runs, query, expected):
    response = viewer_client.get(f"/?{query}", **HTMX)
    assert response.status_code == 200
    assert sorted(run_ids(response)) == sorted(mixed_runs[name].id for name in expected)


def test_search_by_run_id(viewer_client, mixed_runs):
    rid = mixed_runs["failed"].id
    assert run_ids(viewer_client.get(f"/?q={rid[:13]}", **HTMX)) == [rid]


def test_filter_waiting_longer_than(viewer_client, mixed_runs):
    assert run_ids(viewer_client.get("/?waiting_minutes=5", **HTMX)) == []
    Wait.objects.filter(run=mixed_runs["signal"]).update(
        created_at=timezone.now() - timedelta(minutes=30)
    )
    assert run_ids(viewer_client.get("/?waiting_minutes=5", **HTMX)) == [mixed_runs["signal"].id]
    assert run_ids(viewer_client.get("/?waiting_minutes=45", **HTMX)) == []


def test_filter_date_range(viewer_client):
    now = timezone.now()
    bulk_runs(3, start=now - timedelta(days=10), step=timedelta(days=3))  # -10, -7, -4 days
    day = (now - timedelta(days=7)).date()
    ids = run_ids(viewer_client.get(f"/?created_from={day}&created_to={day}", **HTMX))
    assert ids == ["r0001"]
    ids = run_ids(viewer_client.get(f"/?created_from={day}", **HTMX))
    assert sorted(ids) == ["r0001", "r0002"]


def test_invalid_filters_are_reported_not_fatal(viewer_client, mixed_runs):
    response = viewer_client.get(
        "/?status=bogus&retries=-3&created_from=yesterday&after=%%%garbage", **HTMX
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "Some filters were not applied" in page
    assert len(run_ids(response)) == len(mixed_runs)


def test_sort_by_duration(viewer_client):
    bulk_runs(7)  # run i lasts i % 7 seconds
    longest = run_ids(viewer_client.get("/?sort=-duration", **HTMX))
    assert longest[0] == "r0006" and longest[-1] == "r0000"
    shortest = run_ids(viewer_client.get("/?sort=duration", **HTMX))
    assert shortest == list(reversed(longest))
    oldest = run_ids(viewer_client.get("/?sort=created", **HTMX))
    assert oldest == [f"r{i:04d}" for i in range(7)]


@pytest.mark.parametrize("sort", ["-created", "created", "-duration", "duration"])
def test_keyset_pagination_walks_every_run_once(viewer_client, sort):
    bulk_runs(selectors.PAGE_SIZE * 2 + 7)
    same_time = timezone.now() - timedelta(hours=1)
    Run.objects.filter(id__in=["r0003", "r0004", "r0005"]).update(created_at=same_time)
    seen, url, pages = [], f"/?sort={sort}", []
    while url:
        response = viewer_client.get(url, **HTMX)
        ids = run_ids(response)
        pages.append(ids)
        seen += ids
        url = pager(response).get("Next", "")
    assert len(seen) == len(set(seen)) == selectors.PAGE_SIZE * 2 + 7
    assert [len(p) for p in pages] == [selectors.PAGE_SIZE, selectors.PAGE_SIZE, 7]
    # and back: "previous" from the last page gives the middle page again
    back = viewer_client.get(pager(response)["Previous"], **HTMX)
    assert run_ids(back) == pages[1]
    assert set(pager(back)) == {"Previous", "First page", "Next"}
    assert "First page" not in pager(viewer_client.get(pager(back)["Previous"], **HTMX))


def test_list_query_count_does_not_grow_with_rows(viewer_client, django_assert_max_num_queries):
    bulk_runs(3)
    with django_assert_max_num_queries(13) as few:  # 13: + the saved views
        viewer_client.get("/?sort=-duration")  # the duration sort reads two index ranges
    bulk_runs(60, prefix="s", status=RunStatus.WAITING)
    for run in Run.objects.filter(status="waiting")[:60]:
        Wait.objects.create(run=run, wait_id="w", position=0, kind="signal", key="go")
        Step.objects.create(run=run, step_id="a", position=0, status="succeeded", attempts=3)
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = viewer_client.get("/?retries=1&sort=-duration")
    assert len(run_ids(response)) == selectors.PAGE_SIZE


def test_empty_list_says_so(viewer_client):
    response = viewer_client.get("/?q=nothing-matches-this")
    assert "No runs match these filters." in response.content.decode()
    make_user("someone")


def test_search_finds_a_run_by_its_output(viewer_client):
    import durable
    from durable.testing import drive

    found = drive(durable.start("dash.echo", {"order": "ord_5512"}, version="1").id)
    drive(durable.start("dash.echo", {"order": "ord_7000"}, version="1").id)
    found.refresh_from_db()
    assert "ord_5512" in found.output  # the echo's output repeats its input
    # a text only the output holds: the run's id is not it, its input is not it
    from durable.models import Run

    Run.objects.filter(pk=found.pk).update(output='{"receipt": "rcpt_OUTPUT_ONLY_42"}')
    assert run_ids(viewer_client.get("/?q=rcpt_output_only", **HTMX)) == [found.id]
