# ruff: noqa: E501  (the reference template keeps its long lines)
"""The runs table's rows rendered in Python (dashboard.rows) are the HTML the template
rendered, byte for byte, for every kind of row."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.template import engines
from django.utils import timezone

import durable
from dashboard import selectors
from dashboard.rows import runs_rows
from dashboard.step_rows import step_rows
from durable.models import Operation, Run, RunStatus, TraceEvent, Wait
from durable.queries.runs import RunFilters, runs_page
from durable.testing import drive
from tests.dashboard import dash_workflows as dw

pytestmark = pytest.mark.django_db(transaction=True)

#: the runs table's rows as templates/dashboard/runs.html had them (the reference)
TEMPLATE_ROWS = """{% load dashboard_tags %}
        {% for row in page.rows %}{% with run=row.run %}
        <tr{% if row.needs_attention %} class="needs-attention"{% endif %}>
          <td data-label="Status">
            <span class="badge status-{{ run.status }}">{{ run.get_status_display }}</span>
            {% if run.attention %}<span class="badge badge-warn" title="A write's outcome is unknown">unknown outcome</span>{% endif %}
          </td>
          <td data-label="Run">
            <a class="mono run-link" href="{% url 'dashboard:run' run.id %}" title="{{ run.id }}">{{ run.id|short_id }}</a>
            {% for tag in run.tags %}<span class="tag">{{ tag }}</span>{% endfor %}
          </td>
          <td data-label="Workflow">{{ run.workflow_name }}<span class="muted">@{{ run.workflow_version }}</span></td>
          <td data-label="Started">
            {% with when=run.started_at|default:run.created_at %}
            <time datetime="{{ when|date:'c' }}" title="{{ when|date:'Y-m-d H:i:s T' }}">{{ when|ago }}</time>
            {% endwith %}
            {% if run.started_by_name or run.started_by %}<span class="muted">by {{ run.starter_label }}</span>{% endif %}
          </td>
          <td data-label="Duration">{{ row.duration|duration }}</td>
          <td data-label="Steps" class="num">{{ run.steps_executed }}</td>
          <td data-label="Waiting on">
            {% if row.current_wait %}
              <span class="wait-kind">{{ row.current_wait.get_kind_display }}</span>
              {{ row.current_wait.title|default:row.current_wait.key|truncatechars:60 }}
              <span class="muted">for {{ row.current_wait.created_at|since }}</span>
            {% else %}<span class="muted">—</span>{% endif %}
          </td>
        </tr>
        {% endwith %}{% empty %}
        <tr><td colspan="7" class="empty">No runs match these filters.</td></tr>
        {% endfor %}
"""


def reference(rows) -> str:
    template = engines["django"].from_string(TEMPLATE_ROWS)
    return template.render({"page": {"rows": rows}})


def test_rows_are_the_templates_html():
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
    assert any(getattr(row.run, "attention", False) for row in page.rows)
    expected = reference(page.rows)
    got = str(runs_rows(page.rows))
    # the template's loop adds the same indentation before the first row
    assert "        " + got + "\n" == expected.split("\n", 1)[1]
    assert "&lt;b&gt;bold&lt;/b&gt;" in got and "<b>" not in got
    with timezone.override("America/New_York"):  # times shown in the current time zone
        assert (
            "        " + str(runs_rows(page.rows)) + "\n" == reference(page.rows).split("\n", 1)[1]
        )
        assert "-05:00" in reference(page.rows) or "-04:00" in reference(page.rows)


def test_no_rows_no_html():
    assert str(runs_rows([])) == ""


STEP_TEMPLATE = (Path(__file__).parent / "reference" / "step.html").read_text()


def step_reference(rows, run) -> str:
    template = engines["django"].from_string(STEP_TEMPLATE)
    return "".join(template.render({"row": row, "run": run}) for row in rows)


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


def test_step_rows_are_the_templates_html(step_runs):
    """Every kind of step (plain, failed, retried with attempts, with an operation of
    unknown outcome, retrying, waiting for an approval) renders as _step.html did."""
    seen = set()
    for run in step_runs:
        detail = selectors.run_detail(run)
        rows = detail.steps + detail.tail
        assert str(step_rows(rows, run)) == step_reference(rows, run)
        for row in rows:
            seen.add(row.step.status)
            seen.update(
                name
                for name, present in (
                    ("attempts", row.attempts),
                    ("operation", row.operation),
                    ("error", row.step.error),
                    ("safety", row.safety),
                    ("group", row.group),
                )
                if present
            )
    assert {"attempts", "operation", "error", "safety", "group", "failed", "succeeded"} <= seen


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
    assert html == step_reference(rows, transfer)
    assert "compensating this run leaves it" in html and "x&lt;1&gt;" in html


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


def test_approval_items_are_the_templates_html(inbox_requests, approver):
    from dashboard.approval_items import _plain, approval_items

    items, _total = selectors.inbox(approver)
    assert len(items) == 6
    assert [_plain(i, None) for i in items] == [True] * 5 + [False]
    template = engines["django"].from_string(
        (Path(__file__).parents[2] / "dashboard/templates/dashboard/_approval.html").read_text()
    )
    expected = "".join(
        "\n  "
        + template.render(
            {"item": i, "r": i.request, "refused": None, "csrf_token": "t<k>"}
        ).strip()
        + "\n  "
        for i in items
    )
    got = str(approval_items(items, None, "t<k>"))
    assert got == expected
    assert got.count('name="csrfmiddlewaretoken" value="t&lt;k&gt;"') == 6
    assert "is-expired" in got and "Show all" in got and "finance &lt;team&gt;" in got
    assert "Edit the parameters" in got  # the tool's request took the template's path


EVENTS_TEMPLATE = """{% load dashboard_tags %}
      {% for e in detail.events %}
        <tr>
          <td data-label="Time" class="nowrap"><time datetime="{{ e.created_at|date:'c' }}" title="{{ e.created_at|date:'Y-m-d H:i:s.u' }}">{{ e.created_at|date:"H:i:s" }}</time></td>
          <td data-label="Event"><span class="event-kind">{{ e.kind }}</span></td>
          <td data-label="Step" class="mono">{{ e.step_id }}</td>
          <td data-label="By" class="nowrap">{{ e.actor }}</td>
          <td data-label="Message">{{ e.message }}{% with extra=e.data|compact_json %}{% if extra %} <span class="muted event-data">{{ extra }}</span>{% endif %}{% endwith %}</td>
        </tr>
      {% endfor %}
"""


def test_event_rows_and_fork_options_are_the_templates_html(step_runs):
    from dashboard.rows import event_rows, options

    run = step_runs[4]
    TraceEvent.objects.create(
        run=run, kind="note", step_id="<s>", message="a & b", actor="x<y>", data={"k": "<v>"}
    )
    events = list(TraceEvent.objects.filter(run=run).order_by("id"))
    assert len(events) > 3
    for zone in ("UTC", "Asia/Kolkata"):
        with timezone.override(zone):
            expected = (
                engines["django"]
                .from_string(EVENTS_TEMPLATE)
                .render({"detail": {"events": events}})
            )
            assert "      " + str(event_rows(events)) + "\n" == expected.split("\n", 1)[1]
    ids = ["call", "call#2", "<b>&'\""]
    reference = engines["django"].from_string(
        '{% for step_id in ids %}<option value="{{ step_id }}">{{ step_id }}</option>{% endfor %}'
    )
    assert str(options(ids)) == reference.render({"ids": ids})


FAILED_TEMPLATE = """{% load dashboard_tags %}
      {% for run in failed %}
        <tr>
          <td data-label="Run"><a class="mono" href="{% url 'dashboard:run' run.id %}">{{ run.id|short_id }}</a> <span class="badge status-{{ run.status }}">{{ run.get_status_display }}</span></td>
          <td data-label="Workflow">{{ run.workflow_name }}<span class="muted">@{{ run.workflow_version }}</span></td>
          <td data-label="Failed">{% if run.finished_at %}<time datetime="{{ run.finished_at|date:'c' }}" title="{{ run.finished_at|date:'Y-m-d H:i:s T' }}">{{ run.finished_at|ago }}</time>{% endif %}</td>
          <td data-label="Error"><span class="mono">{{ run.error.type|default:run.error_type }}</span>{% if run.error.message %}: {{ run.error.message|truncatechars:200 }}{% endif %}</td>
          {% if may_operate %}
          <td data-label="Decide" class="row-actions">
            {% if run.status == "failed" %}
            <form method="post" action="{% url 'dashboard:run_action' run.id 'resume' %}" hx-post="{% url 'dashboard:run_action' run.id 'resume' %}" hx-target="#attention" hx-swap="outerHTML" hx-confirm="Resume run {{ run.id }}? Completed steps replay and the failed step runs again.">
              {% csrf_token %}<input type="hidden" name="return_to" value="attention">
              <button type="submit" class="btn small primary">Resume</button>
            </form>
            {% endif %}
            <form method="post" action="{% url 'dashboard:run_action' run.id 'compensate' %}" hx-post="{% url 'dashboard:run_action' run.id 'compensate' %}" hx-target="#attention" hx-swap="outerHTML" hx-confirm="Compensate run {{ run.id }}? Its completed writes are undone, newest first.">
              {% csrf_token %}<input type="hidden" name="return_to" value="attention">
              <button type="submit" class="btn small warn">Compensate</button>
            </form>
          </td>
          {% endif %}
        </tr>
      {% endfor %}
"""


@pytest.mark.parametrize("may_operate", [True, False])
def test_failed_rows_are_the_templates_html(may_operate):
    from dashboard.rows import failed_rows

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
    context = {"failed": runs, "may_operate": may_operate, "csrf_token": "tok"}
    expected = engines["django"].from_string(FAILED_TEMPLATE).render(context)
    got = str(failed_rows(runs, may_operate, "tok"))
    assert "      " + got + "\n" == expected.split("\n", 1)[1]
    assert ("Compensate</button>" in got) is may_operate
