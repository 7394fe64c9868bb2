"""The dashboard's hot partials (dashboard/jinja2/dashboard/rows/, rendered by the
``{% load dashboard_rows %}`` tags): every kind of row shows what it holds, in the
current time zone, with every value that comes from a run escaped."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse
from django.utils import timezone

import durable
from dashboard import selectors
from dashboard.templatetags.dashboard_rows import (
    approval_items,
    event_rows,
    failed_rows,
    options,
    payload,
    runs_rows,
    step_rows,
)
from durable.models import Operation, Run, RunStatus, TraceEvent, Wait
from durable.queries.runs import RunFilters, runs_page
from durable.testing import drive
from tests.dashboard import dash_workflows as dw

pytestmark = pytest.mark.django_db(transaction=True)


def no_raw_markup(html: str, *texts: str) -> None:
    """None of ``texts`` (hostile values the test stored) reaches the HTML unescaped."""
    for text in texts:
        assert text not in html, text


def test_runs_rows_show_every_kind_of_run_escaped_in_the_current_time_zone():
    now = timezone.now()
    otto = User.objects.create_user("otto<b>")

    def run(rid, **fields):
        defaults = dict(
            workflow_name="dash.echo",
            workflow_version="1",
            status=RunStatus.SUCCEEDED,
            input="{}",
            input_hash="h",
            created_at=now - timedelta(hours=2),
        )
        return Run.objects.create(id=rid, **{**defaults, **fields})

    run("plain", started_at=now - timedelta(hours=1), finished_at=now - timedelta(minutes=59))
    run(
        "tagged.run_1",
        tags=["nightly", "<b>bold</b>", 7, "it's"],
        started_by=otto,
        started_at=now - timedelta(days=40),
        finished_at=now - timedelta(days=39),
        workflow_version="2&3",
    )
    run("a" * 40, started_by_name="os:alice", status=RunStatus.PENDING)
    run("3f2a9c1e-0000-4000-8000-1234567890ab", status=RunStatus.FAILED, error_type="X")
    waiting = run("waiting", status=RunStatus.WAITING, started_at=now - timedelta(seconds=3))
    Wait.objects.create(
        run=waiting,
        wait_id="w",
        position=0,
        kind="approval",
        key="k",
        title="Approve the <refund> of a very long title that goes on and on past sixty chars",
        created_at=now - timedelta(minutes=7),
    )
    keyed = run("keyed", status=RunStatus.WAITING, started_at=now - timedelta(days=2))
    Wait.objects.create(run=keyed, wait_id="s", position=0, kind="signal", key="go&stop")
    unknown = run("unknown", status=RunStatus.WAITING, started_at=now - timedelta(minutes=3))
    Operation.objects.create(
        run=unknown,
        step_id="pay",
        idempotency_key="ik",
        tool_name="pay",
        safety="unsafe_write",
        status="unknown",
    )
    page = runs_page(RunFilters(), now=now)
    assert len(page.rows) == 7
    assert any(row.needs_attention for row in page.rows)
    html = str(runs_rows(page.rows))
    assert html.count("<tr") == 7 and html.count("</tr>") == 7
    assert html.count(' class="needs-attention"') == sum(r.needs_attention for r in page.rows)
    assert ">unknown outcome</span>" in html
    assert f'href="{reverse("dashboard:run", args=["tagged.run_1"])}"' in html
    assert '<span class="tag">&lt;b&gt;bold&lt;/b&gt;</span>' in html
    assert '<span class="tag">7</span>' in html and "it&#39;s" in html
    assert "@2&amp;3</span>" in html and "by otto&lt;b&gt;</span>" in html
    assert ">3f2a9c1e…</a>" in html and ">" + "a" * 31 + "…</a>" in html
    assert "Approve the &lt;refund&gt; of a very long title that goes on and …" in html
    assert "go&amp;stop" in html and ">Waiting for a signal<" not in html
    assert html.count('<span class="muted">—</span>') == 5  # five runs wait on nothing
    no_raw_markup(html, "<b>", "<refund>", "otto<b>", "2&3", "go&stop")
    with timezone.override("America/New_York"):  # times shown in the current time zone
        local = str(runs_rows(page.rows))
    assert re.search(r'datetime="[^"]+-0[45]:00"', local)
    assert re.search(r'title="[^"]+ E[SD]T"', local)


def test_no_rows_no_html():
    assert str(runs_rows([])).strip() == ""


@pytest.fixture
def step_runs(operator):
    runs = [
        drive(durable.start("dash.echo", {"text": "<hello & 'bye'>"}).id),
        drive(durable.start("dash.fail", {"why": "card <declined>"}).id),
        drive(durable.start("tests.approval", {"budget": 5}).id),
    ]
    dw.KNOBS["flaky"] = 2
    runs.append(drive(durable.start("dash.flaky", {}).id))
    dw.KNOBS["unknown"] = 1
    runs.append(drive(durable.start("dash.transfer", {"amount": 5}).id))
    runs.append(drive(durable.start("dash.slow_retry", {}).id, wait_for_retries=False))
    runs.append(drive(durable.start("dash.parallel", {}).id))
    return runs


def test_step_rows_show_every_kind_of_step(step_runs):
    """Plain, failed, retried with attempts, with an operation of unknown outcome, retrying,
    waiting for an approval, parallel calls: each shows what it holds, escaped."""
    seen = set()
    for run in step_runs:
        detail = selectors.run_detail(run)
        rows = detail.steps + detail.tail
        html = str(step_rows(rows, run))
        assert html.count('<li class="step step-') == len(rows)
        # the newline after a tag is the space between inline parts, as in Django's
        assert "</span><span" not in html and "ms·" not in html
        for row in rows:
            s = row.step
            item = html.split(f'id="step-{s.pk}"', 1)[1].split('<li class="step ', 1)[0]
            assert f'<span class="mono step-id">{s.step_id}</span>' in item
            assert f'<span class="badge status-{s.status}">{s.get_status_display()}</span>' in item
            seen.add(s.status)
            if row.attempts:
                seen.add("attempts")
                assert f'id="attempts-{s.pk}"' in item
                assert item.count("<strong>Attempt ") == len(row.attempts)
            if row.operation:
                seen.add("operation")
                assert f"<code>{row.operation.idempotency_key}</code>" in item
                assert row.operation.get_status_display() in item
            if s.error:
                seen.add("error")
                assert f'<span class="mono">{s.error["type"]}</span>' in item
            if row.safety:
                seen.add("safety")
                assert f'class="safety safety-{row.safety}"' in item
            if row.group:
                seen.add("group")
            for kind, p in (("step-input", row.input), ("step-output", row.output)):
                link = reverse("dashboard:payload", args=[run.id, kind, s.pk])
                assert (f'hx-get="{link}"' in item) is not p.empty
    assert {"attempts", "operation", "error", "safety", "group", "failed", "succeeded"} <= seen
    failed = step_runs[1]
    html = str(step_rows(selectors.run_detail(failed).steps, failed))
    assert "card &lt;declined&gt;" in html and "<declined>" not in html


def test_a_parallel_groups_calls_are_marked_with_the_group_and_its_size(step_runs):
    run = step_runs[-1]
    detail = selectors.run_detail(run)
    marks = [(r.step.step_id, r.group, r.group_size) for r in detail.steps + detail.tail]
    assert marks == [
        ("parallel[0]", "parallel", 3),
        ("parallel[1]", "parallel", 3),
        ("parallel[2]", "parallel", 3),
        ("parallel#2[0]", "parallel#2", 1),
    ]
    html = str(step_rows(detail.steps, run))
    assert html.count(">parallel group parallel · 3 calls</span>") == 3
    assert ">parallel group parallel#2 · 1 call</span>" in html


def test_step_rows_name_an_operations_other_owner(step_runs):
    """A write owned by another run (a fork took it over), resolved, called twice."""
    transfer, other = step_runs[4], step_runs[0]
    Operation.objects.filter(run=transfer).update(
        owner_run=other, resolution="happened", resolved_by="otto", attempts=2, external_id="x<1>"
    )
    detail = selectors.run_detail(transfer)
    rows = detail.steps + detail.tail
    assert any(row.operation for row in rows)
    html = str(step_rows(rows, transfer))
    assert "compensating this run leaves it" in html and "x&lt;1&gt;" in html
    assert " · 2 calls" in html and " · happened (otto)" in html
    assert f'href="{reverse("dashboard:run", args=[other.id])}"' in html
    no_raw_markup(html, "x<1>")


@pytest.fixture
def inbox_requests(approver):
    """Pending requests of every plain shape, and some that take the template's path."""
    from approvals.models import ApprovalRequest

    group = Group.objects.create(name="finance <team>")
    approver.groups.add(group)
    runs = [
        drive(durable.start("tests.approval", {"budget": n, "note": "<b>"}).id) for n in range(5)
    ]
    runs.append(drive(durable.start("tests.tool_approval", {"to": "bob@example.com"}).id))
    requests = list(ApprovalRequest.objects.filter(run__in=runs).order_by("created_at", "id"))
    now = timezone.now()
    plain = requests[:5]
    ApprovalRequest.objects.filter(pk=plain[0].pk).update(
        expires_at=now + timedelta(minutes=5), title="Approve <this> & 'that'"
    )
    ApprovalRequest.objects.filter(pk=plain[1].pk).update(
        expires_at=now - timedelta(minutes=5), required_approvals=2, approver_group=group
    )
    ApprovalRequest.objects.filter(pk=plain[2].pk).update(
        payload='{"text": "' + "x" * 5000 + '"}', tool_name="waits.send", safety="unsafe_write"
    )
    ApprovalRequest.objects.filter(pk=plain[3].pk).update(payload=None)
    return requests


def test_approval_items_show_every_kind_of_request(inbox_requests, approver):
    items, _total = selectors.inbox(approver)
    assert len(items) == 6
    html = str(approval_items(items, None, "t<k>"))
    assert html.count("<article ") == 6 and html.count("</article>") == 6
    assert html.count('name="csrfmiddlewaretoken" value="t&lt;k&gt;"') == 6
    assert "is-expired" in html and "Show all" in html and "finance &lt;team&gt;" in html
    assert "Approve &lt;this&gt; &amp; &#39;that&#39;" in html
    assert "1 of 2 approvals so far" in html or "0 of 2 approvals so far" in html
    assert "Edit the parameters" in html  # the tool's request lets the approver edit
    assert '<span class="safety safety-unsafe_write">unsafe write</span>' in html
    for item in items:
        decide = reverse("dashboard:decide", args=[item.request.pk])
        assert html.count(f'hx-post="{decide}"') == 1
    no_raw_markup(html, "t<k>", "<this>", "finance <team>", '"note": "<b>"')


def test_a_refused_decision_shows_its_form_again_with_its_errors(inbox_requests, approver):
    items, _total = selectors.inbox(approver)
    tool = items[-1].request
    refused = {
        "key": f"approval-{tool.pk}",
        "data": {"comment": "why <not>", "edited": '{"to": "<x>"}'},
        "errors": {"comment": ["Say why."]},
        "arg_errors": [{"field": "to", "messages": ["not an <email>"]}],
    }
    html = str(approval_items(items, refused, "tok"))
    article = html.split(f'id="approval-{tool.pk}"', 1)[1].split("</article>", 1)[0]
    assert "why &lt;not&gt;</textarea>" in article and 'aria-invalid="true"' in article
    assert "Say why." in article and "not an &lt;email&gt;" in article
    assert '<details class="edit-params" id="edit-' in article and " open>" in article
    others = html.split(f'id="approval-{tool.pk}"', 1)[0]
    assert "Say why." not in others and "aria-invalid" not in others
    no_raw_markup(html, "<not>", "<x>", "<email>")


def test_event_rows_and_fork_options_escape_what_they_show(step_runs):
    run = step_runs[4]
    TraceEvent.objects.create(
        run=run, kind="note", step_id="<s>", message="a & b", actor="x<y>", data={"k": "<v>"}
    )
    events = list(TraceEvent.objects.filter(run=run).order_by("id"))
    assert len(events) > 3
    html = str(event_rows(events))
    assert html.count("<tr>") == len(events)
    assert '<td data-label="Step" class="mono">&lt;s&gt;</td>' in html
    assert "a &amp; b" in html and "x&lt;y&gt;" in html
    assert '<span class="muted event-data">{&#34;k&#34;: &#34;&lt;v&gt;&#34;}</span>' in html
    no_raw_markup(html, "<s>", "<v>", "x<y>")
    with timezone.override("Asia/Kolkata"):
        assert "+05:30" in str(event_rows(events))
    got = str(options(["call", "call#2", "<b>&'\""]))
    assert got == (
        '<option value="call">call</option><option value="call#2">call#2</option>'
        '<option value="&lt;b&gt;&amp;&#39;&#34;">&lt;b&gt;&amp;&#39;&#34;</option>'
    )


def test_a_payload_is_cut_with_a_link_to_all_of_it():
    p = selectors.Payload(text="<x>" * 10, size=50_000, truncated=True, empty=False)
    html = str(payload(p, "step-input", 7, "run-1"))
    link = reverse("dashboard:payload", args=["run-1", "step-input", 7])
    assert f'hx-get="{link}"' in html and "&lt;x&gt;" in html and "<x>" not in html
    assert "Showing the first 30 characters of 50 k characters." in html
    empty = selectors.Payload(text="", size=0, truncated=False, empty=True)
    assert str(payload(empty, "step-input", 7, "run-1")) == '<p class="muted">—</p>'


@pytest.mark.parametrize("may_operate", [True, False])
def test_failed_rows_offer_what_an_operator_may_do(may_operate):
    now = timezone.now()
    common = dict(workflow_name="dash.<echo>", workflow_version="1", input="{}", input_hash="h")
    Run.objects.create(
        id="failed-1",
        status=RunStatus.FAILED,
        finished_at=now - timedelta(minutes=3),
        error={"type": "PermanentError", "message": "HTTP <403> " + "x" * 300},
        error_type="PermanentError",
        **common,
    )
    Run.objects.create(
        id="failed-2", status=RunStatus.COMPENSATION_FAILED, error_type="Boom", **common
    )
    Run.objects.create(
        id="failed-3", status=RunStatus.FAILED, error={"message": ""}, error_type="T", **common
    )
    runs = selectors.failed_runs()
    assert len(runs) == 3
    html = str(failed_rows(runs, may_operate, "tok"))
    assert html.count("<tr>") == 3
    assert ("Compensate</button>" in html) is may_operate
    assert html.count("Resume</button>") == (2 if may_operate else 0)  # not the compensation
    assert html.count('value="tok"') == (5 if may_operate else 0)
    assert "HTTP &lt;403&gt; " in html and "x" * 188 + "…</td>" in html  # cut at 200 characters
    assert '<span class="mono">Boom</span>' in html and "dash.&lt;echo&gt;" in html
    no_raw_markup(html, "<403>", "<echo>")


def test_failed_rows_say_why_the_failure_is_final():
    """S35: the "needs attention" list shows the rule that made a failure final."""
    Run.objects.create(
        id="failed-why",
        status=RunStatus.FAILED,
        finished_at=timezone.now(),
        error={"type": "RateLimited", "message": "429", "reason": "Retry-After <inf> too long"},
        error_type="RateLimited",
        workflow_name="w",
        workflow_version="1",
        input="{}",
        input_hash="h",
    )
    html = str(failed_rows(selectors.failed_runs(), False, "tok"))
    assert "Failed for good: Retry-After &lt;inf&gt; too long</span>" in html
    no_raw_markup(html, "<inf>")
