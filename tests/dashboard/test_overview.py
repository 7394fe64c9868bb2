"""The overview page (issue 31, item 6): runs by status over time, failure rate and
p50 / p95 durations per workflow, tokens and cost, pending approvals by age; all from
the database, on both databases (the percentiles are PostgreSQL's percentile_cont or
the same rule in Python on SQLite)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from approvals.models import ApprovalRequest
from dashboard.selectors import overview as figures
from durable.models import Run, RunStatus, TraceEvent
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)


def run(rid, workflow, status, *, created, seconds=None, tokens=0, started_by_name=""):
    start = created + timedelta(seconds=1)
    return Run.objects.create(
        id=rid,
        workflow_name=workflow,
        workflow_version="1",
        status=status,
        input="{}",
        input_hash="h",
        created_at=created,
        started_at=start if seconds is not None else None,
        finished_at=start + timedelta(seconds=seconds) if seconds is not None else None,
        tokens_used=tokens,
        started_by_name=started_by_name,
    )


@pytest.fixture
def now():
    return timezone.now().replace(minute=30, second=0, microsecond=0)


@pytest.fixture
def seeded(now):
    two_hours_ago = now - timedelta(hours=2)
    for i, secs in enumerate((1, 2, 3, 4)):
        run(
            f"ok{i}",
            "shop.order",
            RunStatus.SUCCEEDED,
            created=two_hours_ago,
            seconds=secs,
            tokens=100,
        )
    run("bad", "shop.order", RunStatus.FAILED, created=now - timedelta(minutes=10), seconds=10)
    run("wait", "shop.refund", RunStatus.WAITING, created=now - timedelta(minutes=5))
    run("old", "shop.order", RunStatus.SUCCEEDED, created=now - timedelta(days=3), seconds=1)
    run("sys", "approval-email.x", RunStatus.SUCCEEDED, created=now, seconds=1,
        started_by_name="system:approvals")  # fmt: skip
    for rid, cost in (("ok0", 0.25), ("ok1", 0.5)):
        TraceEvent.objects.create(
            run_id=rid, kind="step_executed", data={"kind": "llm", "tokens": 100, "cost_usd": cost}
        )
    TraceEvent.objects.create(run_id="ok2", kind="step_executed", data={"kind": "tool"})


def test_runs_by_status_per_hour_leave_system_runs_and_older_runs_out(seeded, now):
    ov = figures.overview("24h", now=now)
    assert ov.runs == 6  # not the 3-day-old run, not the system's
    by_hour = {b.start: b.counts for b in ov.buckets if b.total}
    hour = lambda at: timezone.localtime(at).replace(minute=0, second=0, microsecond=0)  # noqa: E731
    assert by_hour == {
        hour(now - timedelta(hours=2)): {"succeeded": 4},
        hour(now - timedelta(minutes=10)): {"failed": 1, "waiting": 1},
    }
    assert len(ov.buckets) in (24, 25)  # every hour of the window, empty ones too
    assert ov.peak == 4
    assert figures.overview("7d", now=now).runs == 7  # the 3-day-old run is in the week


def test_failure_rate_percentiles_tokens_and_cost_per_workflow(seeded, now):
    ov = figures.overview("24h", now=now)
    rows = {w.name: w for w in ov.workflows}
    order = rows["shop.order"]
    assert (order.runs, order.finished, order.failed) == (5, 5, 1)
    assert order.failure_rate == pytest.approx(0.2)
    # durations 1, 2, 3, 4 and 10 s: percentile_cont's interpolation
    assert order.p50 == pytest.approx(3.0)
    assert order.p95 == pytest.approx(4 + (10 - 4) * 0.8)
    assert order.tokens == 400
    assert order.cost == pytest.approx(0.75)
    refund = rows["shop.refund"]
    assert refund.failure_rate is None and refund.p50 is None and refund.cost is None
    assert ov.priced is True
    assert [w.name for w in ov.workflows] == ["shop.order", "shop.refund"]  # busiest first


def test_pending_approvals_by_age(settings, now):
    from tests.dashboard import dash_workflows  # noqa: F401  (dash.announce)

    runs = [drive(durable.start("dash.announce", {}, started_by="os:sam").id) for _ in range(3)]
    assert all(r.status == "waiting" for r in runs)
    ages = (timedelta(minutes=5), timedelta(hours=5), timedelta(days=10))
    for r, age in zip(runs, ages, strict=True):
        ApprovalRequest.objects.filter(run=r).update(created_at=now - age)
    assert figures.overview("24h", now=now).approvals == [
        ("under 1 h", 1),
        ("1 h to 1 d", 1),
        ("1 d to 7 d", 0),
        ("over 7 d", 1),
    ]


def test_the_page_for_a_viewer_and_a_bad_window(viewer_client, seeded):
    page = viewer_client.get("/overview/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "Runs by status, per hour" in body and "shop.order" in body and "<svg" in body
    assert "$0.7500" in body and "20%" in body
    week = viewer_client.get("/overview/?window=7d").content.decode()
    assert "Runs by status, per day" in week and 'aria-current="page">The last 7 days' in week
    bad = viewer_client.get("/overview/?window=1y")
    assert bad.status_code == 400 and "24h, 7d, 30d" in bad.content.decode()


def test_no_price_says_how_to_set_one(viewer_client):
    run("r1", "shop.order", RunStatus.SUCCEEDED, created=timezone.now(), seconds=1, tokens=5)
    body = viewer_client.get("/overview/").content.decode()
    assert "LLM_PRICES" in body
    assert viewer_client.get("/overview/?window=30d").status_code == 200


def test_who_may_see_it_and_odd_windows(client, viewer_client):
    """The runs list's permission: a stranger is sent to log in, a user without a role
    is refused; an odd window is the default (empty) or a 400, never a 500."""
    from tests.dashboard.conftest import login, make_user

    anonymous = client.get("/overview/")
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]
    assert login(make_user("nobody")).get("/overview/").status_code == 403
    assert viewer_client.get("/overview/?window=").status_code == 200
    assert viewer_client.get("/overview/?window=%2030d%20").status_code == 200
    for odd in ("30D", "%00", "x" * 5000, "24h&window=1y"):
        assert viewer_client.get(f"/overview/?window={odd}").status_code == 400, odd
    assert viewer_client.post("/overview/").status_code == 405


def test_figures_are_recounted_when_runs_changed_but_not_at_every_request(seeded, now):
    """A busy system creates a run a second: counting at each request would cost each
    request the whole count (seconds at 1M runs). Changed runs are counted again once
    ``RECOUNT_SECONDS`` passed; unchanged ones are served from the cache."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    first = figures.overview("24h", now=now)
    assert first.runs == 6 and first.counted_at == now
    run("new", "shop.order", RunStatus.PENDING, created=now + timedelta(seconds=1))
    # changed, but counted a moment ago: the same figures
    assert figures.overview("24h", now=now + timedelta(seconds=1)).runs == 6
    # changed, and the recount's time has come
    later = now + timedelta(seconds=figures.RECOUNT_SECONDS["24h"] + 1)
    again = figures.overview("24h", now=later)
    assert again.runs == 7 and again.counted_at == later
    # nothing changed since: two queries (the newest run and event), no count
    with CaptureQueriesContext(connection) as queries:
        cached = figures.overview("24h", now=later + timedelta(seconds=20))
    assert cached.runs == 7 and cached.counted_at == later
    assert len(queries) == 2, [q["sql"][:80] for q in queries]
    # each window has its own figures and its own time
    assert figures.overview("7d", now=later).runs == 8
