"""The Django admin of Durable, and the Tool rows that ``durable.services.toolsync`` creates."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.contrib.auth.models import Group
from django.contrib.messages import get_messages
from django.db.models.signals import post_migrate
from django.urls import reverse

import durable
from durable import registry
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Signal,
    Step,
    StepAttempt,
    StreamEvent,
    Tool,
    TraceEvent,
    Wait,
)
from durable.services import toolsync
from durable.testing import drive
from durable.values import codec
from tests.durable import cli_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)

HISTORY_MODELS = (Run, Step, StepAttempt, Operation, Wait, Signal, TraceEvent, StreamEvent)
ALL_MODELS = (*HISTORY_MODELS, Tool)


@pytest.fixture(autouse=True)
def _reset_fixtures():
    cw.reset()
    yield
    cw.reset()


def _url(model, action: str, *args) -> str:
    return reverse(f"admin:durable_{model._meta.model_name}_{action}", args=args)


def unknown_outcome_run(amount: int = 5) -> tuple[Run, Operation]:
    cw.FAILURES["cli_charge"] = 1
    run = drive(durable.start("cli.charge", {"amount": amount}).id)
    assert run.status == RunStatus.WAITING, run.error
    return run, Operation.objects.get(run=run)


def admin_pages(client) -> dict[str, str]:
    """Every changelist and every change page of Durable's models: url -> content."""
    pages = {}
    for model in ALL_MODELS:
        urls = [_url(model, "changelist")]
        urls += [_url(model, "change", pk) for pk in model.objects.values_list("pk", flat=True)]
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)
            pages[url] = response.content.decode()
    return pages


def populate() -> Run:
    """A row in every table: a run waiting on an unknown outcome, a signal, a stream
    event, tool rows."""
    run, _ = unknown_outcome_run()
    Signal.objects.create(run=run, name="go", payload=codec.encode({"ok": True}))
    StreamEvent.objects.create(run=run, seq=1, step_id="llm", kind="token", data={"delta": "Hi"})
    drive(durable.start("cli.fail", {"why": "no stock"}).id)
    toolsync.sync_tools()
    return run


# --- pages ---------------------------------------------------------------------------


def test_every_changelist_and_change_page_loads(admin_client):
    run = populate()
    pages = admin_pages(admin_client)
    assert all(Model.objects.exists() for Model in ALL_MODELS)
    run_page = pages[_url(Run, "change", run.id)]
    assert "cli_charge" in run_page  # the steps inline
    assert f"?run__id__exact={run.id}" in run_page


def test_changelists_filter_by_run_status_and_kind(admin_client):
    run = populate()
    for model, query in [
        (Step, f"run__id__exact={run.id}&status__exact=waiting"),
        (Run, "status__exact=waiting"),
        (Wait, "kind__exact=reconcile"),
        (TraceEvent, f"run__id__exact={run.id}&kind__exact=unknown_outcome"),
        (Operation, "status__exact=unknown"),
        (StepAttempt, "classification__exact=ambiguous"),
        (Run, f"q={run.id}"),
        (Tool, "safety__exact=unsafe_write&q=cli_charge"),
    ]:
        response = admin_client.get(_url(model, "changelist") + "?" + query)
        assert response.status_code == 200, (model, query)
        assert response.context["cl"].result_count == 1, (model, query)


def test_history_cannot_be_added_changed_or_deleted(admin_client):
    run = populate()
    for model in HISTORY_MODELS:
        obj = model.objects.filter(run=run).first() if model is not Run else run
        assert admin_client.get(_url(model, "add")).status_code == 403
        assert admin_client.get(_url(model, "delete", obj.pk)).status_code == 403
        response = admin_client.post(_url(model, "change", obj.pk), {"status": "succeeded"})
        assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


def test_run_page_shows_steps_inline_and_payloads(admin_client):
    run = drive(durable.start("cli.echo", {"n": 41}).id)
    content = admin_client.get(_url(Run, "change", run.id)).content.decode()
    assert "&quot;n&quot;: 41" in content  # input and output, pretty-printed
    assert "&quot;echo&quot;: {" in content
    assert re.search(r'class="field-step_id">\s*<p>echo</p>', content)


def test_run_page_inlines_only_the_first_steps(admin_client, monkeypatch):
    from durable.admin import runs as run_admin

    monkeypatch.setattr(run_admin, "INLINE_STEPS", 2)
    run = durable.start("cli.echo", 1)
    for pos in range(3):
        Step.objects.create(run=run, step_id=f"s{pos}", position=pos, status="succeeded")
    content = admin_client.get(_url(Run, "change", run.id)).content.decode()
    shown = re.findall(r'class="field-step_id">\s*<p>(s\d)</p>', content)
    assert shown == ["s0", "s1"]


def test_lists_filtered_to_a_run_are_in_run_order(admin_client):
    run = durable.start("cli.echo", 1)
    for pos in (2, 0, 1):
        Step.objects.create(run=run, step_id=f"s{pos}", position=pos, status="succeeded")
    response = admin_client.get(_url(Step, "changelist") + f"?run__id__exact={run.id}")
    assert [s.position for s in response.context["cl"].result_list] == [0, 1, 2]
    response = admin_client.get(_url(Step, "changelist"))
    assert [s.position for s in response.context["cl"].result_list] == [1, 0, 2]  # newest first


# --- escaping and secrets ------------------------------------------------------------


def test_payloads_and_errors_with_script_tags_are_escaped(admin_client):
    ok = drive(durable.start("cli.echo", {"note": "<script>alert('in')</script>"}).id)
    failed = drive(durable.start("cli.fail", {"why": "<script>alert('err')</script>"}).id)
    assert failed.status == RunStatus.FAILED
    pages = admin_pages(admin_client)
    for url, content in pages.items():
        assert "<script>alert(" not in content, url
    assert "&lt;script&gt;alert(&#x27;in&#x27;)&lt;/script&gt;" in pages[_url(Run, "change", ok.id)]
    assert "&lt;script&gt;alert(" in pages[_url(Run, "change", failed.id)]
    attempt = StepAttempt.objects.get(run=failed)
    assert "&lt;script&gt;alert(" in pages[_url(StepAttempt, "change", attempt.pk)]


def test_a_secret_in_a_run_input_is_shown_on_no_admin_page(admin_client):
    run = drive(durable.start("cli.echo", {"api_key": "sk-test-XYZ123456"}).id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.input_value() == {"api_key": "sk-test-XYZ123456"}  # stored, encrypted
    populate()
    pages = admin_pages(admin_client)
    for url, content in pages.items():
        assert "XYZ123456" not in content, url
    run_page = pages[_url(Run, "change", run.id)]
    assert "&quot;api_key&quot;: &quot;[REDACTED]&quot;" in run_page
    step = Step.objects.get(run=run)
    assert "[REDACTED]" in pages[_url(Step, "change", step.pk)]


# --- operation actions ---------------------------------------------------------------


def _act(client, action: str, ops):
    return client.post(
        _url(Operation, "changelist"),
        {"action": action, "_selected_action": [op.pk for op in ops]},
        follow=True,
    )


def test_action_it_did_not_happen_retries_the_write(admin_client):
    run, op = unknown_outcome_run(amount=9)
    response = _act(admin_client, "reconcile_not_happened", [op])
    assert response.status_code == 200
    texts = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("1 operation(s) will be called again" in t for t in texts), texts
    op.refresh_from_db()
    assert op.status == OperationStatus.FAILED and op.resolved_by == "admin"
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert cw.CALLS == [("cli_charge", op.idempotency_key)] * 2


def test_action_abort_fails_the_run(admin_client):
    run, op = unknown_outcome_run()
    _act(admin_client, "reconcile_abort", [op])
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error_type == "AbortedByOperator"
    assert "admin aborted the run" in run.error["message"]


def test_action_on_an_operation_without_unknown_outcome_reports_an_error(admin_client):
    settled = drive(durable.start("cli.charge", {"amount": 1}).id)
    done_op = Operation.objects.get(run=settled)
    _, op = unknown_outcome_run()
    response = _act(admin_client, "reconcile_not_happened", [done_op, op])
    msgs = [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]
    key = f"{done_op.pk} ({done_op.idempotency_key})"
    expected = (
        f"Operation {key} was not changed: operation {key} is succeeded; only an "
        "unknown outcome can be reconciled"
    )
    assert ("error", expected) in msgs
    assert any(level == "success" and "1 operation(s)" in text for level, text in msgs)
    done_op.refresh_from_db()
    assert done_op.status == OperationStatus.SUCCEEDED


def test_reconcile_actions_need_the_change_operation_permission(client, django_user_model):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_operation"))
    client.force_login(user)
    run, op = unknown_outcome_run()
    response = client.get(_url(Operation, "changelist"))
    assert response.status_code == 200
    assert "reconcile_not_happened" not in response.content.decode()
    _act(client, "reconcile_abort", [op])
    op.refresh_from_db()
    assert op.resolution == "" and Run.objects.get(pk=run.id).status == RunStatus.WAITING


# --- tools ---------------------------------------------------------------------------


def _tool_form(**changes):
    data = {
        "description": "",
        "safety": "read_only",
        "retry_policy": "",
        "timeout_seconds": "",
        "approver_group": "",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


@pytest.mark.parametrize(
    "policy, error",
    [
        ('{"max_attempts": 0}', "RetryPolicy.max_attempts must be an int from 1 to 100,000, got 0"),
        ('{"tries": 3}', "unknown retry policy keys: [&#x27;tries&#x27;]"),
        ("[1, 2]", "Enter a JSON object"),
        ('{"max_attempts": "3"}', "max_attempts must be a whole number"),
        ('{"max_attempts": 2.5}', "max_attempts must be a whole number"),
        (
            '{"initial_interval": -1}',
            "RetryPolicy.initial_interval: -1 is not a duration that can "
            "be scheduled: it must not be negative",
        ),
        ('{"max_interval": 1e12}', "RetryPolicy.max_interval: 1000000000000.0 is not a duration"),
        ('{"backoff_coefficient": true}', "backoff_coefficient must be a number"),
        ('{"jitter": "yes"}', "jitter must be true or false"),
        ('{"max_attempts": 3', "Enter a valid JSON."),
    ],
)
def test_tool_form_rejects_a_bad_retry_policy_on_the_field(admin_client, policy, error):
    toolsync.sync_tools()
    tool = Tool.objects.get(name="cli_lookup")
    before = tool.retry_policy
    response = admin_client.post(_url(Tool, "change", tool.pk), _tool_form(retry_policy=policy))
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert list(form.errors) == ["retry_policy"], form.errors
    assert error in response.content.decode()
    tool.refresh_from_db()
    assert tool.retry_policy == before


def test_tool_form_saves_a_valid_policy_that_then_takes_effect(admin_client):
    toolsync.sync_tools()
    tool = Tool.objects.get(name="cli_lookup")
    group = Group.objects.create(name="ops")
    response = admin_client.post(
        _url(Tool, "change", tool.pk),
        _tool_form(
            retry_policy='{"max_attempts": 5, "initial_interval": 0.5}',
            timeout_seconds="2.5",
            requires_approval="on",
            approver_group=str(group.pk),
            name="renamed",
        ),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    tool.refresh_from_db()
    assert tool.name == "cli_lookup"  # the name is read-only once the row exists
    assert tool.retry_policy == {"max_attempts": 5, "initial_interval": 0.5}
    assert tool.timeout_seconds == 2.5 and tool.requires_approval
    effective = registry.effective_tool(registry.get_tool("cli_lookup"), tool)
    assert effective.retry.max_attempts == 5 and effective.retry.initial_interval == 0.5
    assert effective.retry.jitter is False  # the rest comes from the code's policy
    assert effective.approver_group == "ops"


def test_tool_form_empty_policy_means_the_code_policy(admin_client):
    toolsync.sync_tools()
    tool = Tool.objects.get(name="cli_lookup")
    response = admin_client.post(_url(Tool, "change", tool.pk), _tool_form(retry_policy="{}"))
    assert response.status_code == 302
    tool.refresh_from_db()
    assert tool.retry_policy is None


@pytest.mark.parametrize("timeout", ["0", "-1"])
def test_tool_form_rejects_a_non_positive_timeout(admin_client, timeout):
    toolsync.sync_tools()
    tool = Tool.objects.get(name="cli_lookup")
    response = admin_client.post(_url(Tool, "change", tool.pk), _tool_form(timeout_seconds=timeout))
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["timeout_seconds"]


def test_tool_changelist_shows_safety_and_code_declaration(admin_client):
    toolsync.sync_tools()
    content = admin_client.get(_url(Tool, "changelist")).content.decode()
    assert "cli_charge" in content and "unsafe_write" in content
    assert "3 tries, 0.01s ×2 ≤ 60s" in content
    tool = Tool.objects.get(name="cli_charge")
    page = admin_client.get(_url(Tool, "change", tool.pk)).content.decode()
    assert "tests.durable.cli_workflows.cli_charge" in page


# --- toolsync ------------------------------------------------------------------------


def test_sync_tools_creates_rows_from_code_and_never_overwrites():
    Tool.objects.all().delete()  # a flush's post_migrate may have created them
    created = toolsync.sync_tools()
    assert {"cli_charge", "cli_lookup"} <= set(created)
    lookup = Tool.objects.get(name="cli_lookup")
    assert lookup.safety == "read_only" and not lookup.requires_approval
    assert lookup.retry_policy == {
        "max_attempts": 3,
        "initial_interval": 0.01,
        "backoff_coefficient": 2.0,
        "max_interval": 60.0,
        "jitter": False,
    }
    charge = Tool.objects.get(name="cli_charge")
    assert charge.safety == "unsafe_write" and charge.retry_policy is None
    assert charge.description.startswith("Charge a card")

    Tool.objects.filter(name="cli_lookup").update(
        retry_policy={"max_attempts": 9}, safety="idempotent_write"
    )
    Tool.objects.filter(name="cli_charge").delete()
    assert toolsync.sync_tools() == ["cli_charge"]
    lookup.refresh_from_db()
    assert lookup.retry_policy == {"max_attempts": 9} and lookup.safety == "idempotent_write"
    assert Tool.objects.filter(name="cli_lookup").count() == 1


def test_post_migrate_of_the_durable_app_creates_tool_rows():
    Tool.objects.all().delete()
    post_migrate.send(
        sender=apps.get_app_config("auth"),
        app_config=apps.get_app_config("auth"),
        verbosity=0,
        interactive=False,
        using="default",
        apps=apps,
        plan=[],
    )
    assert not Tool.objects.exists()  # only the durable app's signal syncs
    durable_app = apps.get_app_config("durable")
    post_migrate.send(
        sender=durable_app,
        app_config=durable_app,
        verbosity=0,
        interactive=False,
        using="default",
        apps=apps,
        plan=[],
    )
    names = set(Tool.objects.values_list("name", flat=True))
    assert {t.name for t in registry.tools()} == names


@pytest.mark.django_db
def test_tools_are_not_added_in_the_admin_and_an_empty_group_says_it_means_the_codes(
    admin_client,
):
    """A tool is declared in code (its row comes from the registry); an empty approver
    group falls back to the code's, and the form says so."""
    from durable.models import Tool
    from durable.services.toolsync import sync_tools

    sync_tools()
    tool = Tool.objects.order_by("name").first()
    assert tool is not None
    assert admin_client.get("/admin/durable/tool/add/").status_code == 403
    page = admin_client.get(f"/admin/durable/tool/{tool.pk}/change/").content.decode()
    assert "Empty: the group the code declares" in page


def test_a_registered_tool_is_reset_to_its_code_declaration_not_deleted(admin_client):
    """Deleting a registered tool's row silently dropped the operator's settings; the
    admin offers "reset to code" instead, and deletes only rows no code registers."""
    toolsync.sync_tools()
    tool = Tool.objects.get(name="cli_lookup")
    declared = toolsync.tool_defaults(registry.get_tool("cli_lookup"))
    tool.safety, tool.requires_approval, tool.timeout_seconds = "unsafe_write", True, 9.0
    tool.approver_group = Group.objects.create(name="ops")
    tool.save()
    assert admin_client.get(_url(Tool, "delete", tool.pk)).status_code == 403
    changelist = admin_client.get(_url(Tool, "changelist")).content.decode()
    assert "delete_selected" not in changelist and "reset_to_code" in changelist

    stale = Tool.objects.create(name="gone.from.code", safety="read_only")
    response = admin_client.post(
        _url(Tool, "changelist"),
        {"action": "reset_to_code", "_selected_action": [str(tool.pk), str(stale.pk)]},
        follow=True,
    )
    text = response.content.decode()
    assert "Reset to the code&#x27;s declaration: cli_lookup." in text
    assert "Not registered in code, left as they are: gone.from.code." in text
    tool.refresh_from_db()
    assert {f: getattr(tool, f) for f in declared} == declared
    assert tool.approver_group is None

    assert admin_client.post(_url(Tool, "delete", stale.pk), {"post": "yes"}).status_code == 302
    assert not Tool.objects.filter(pk=stale.pk).exists()
