"""Audit export (durable/services/export.py, ``manage.py durable export``): one run as a JSON
document and a readable page, with steps, attempts, ledger, waits, decisions,
compensation and the places where a value was redacted."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.models import Operation, RunStatus
from durable.services import export
from durable.services import runs as services
from durable.services.reconcile import operation_reconcile
from durable.testing import drive
from tests import waits_workflows as ww
from tests.durable import cli_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-live0123456789abcdef"


@pytest.fixture(autouse=True)
def _reset():
    cw.reset()
    ww.EFFECTS.clear()
    yield
    cw.reset()
    ww.EFFECTS.clear()


def export_json(run_id: str) -> dict:
    out = StringIO()
    call_command("durable", "export", run_id, stdout=out)
    return json.loads(out.getvalue())


def test_export_lists_steps_with_failed_attempts_and_redacts_secrets():
    cw.FAILURES["cli_lookup"] = 1
    run = drive(durable.start("cli.lookup", {"query": "q", "api_key": SECRET}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error

    doc = export_json(run.pk)

    assert doc["format"] == "durable.run-export/1"
    assert doc["run"]["id"] == run.pk and doc["run"]["status"] == "succeeded"
    assert doc["run"]["input"] == {"query": "q", "api_key": "[REDACTED]"}
    assert doc["run"]["output"] == "found q"
    [step] = doc["steps"]
    assert (step["step_id"], step["kind"], step["tool"], step["attempts"]) == (
        "cli_lookup",
        "tool",
        "cli_lookup",
        2,
    )
    [failed] = step["failed_attempts"]
    assert failed["classification"] == "transient"
    assert "503 from upstream" in failed["message"]
    assert "run.input.api_key" in doc["redactions"]
    assert SECRET not in json.dumps(doc)
    kinds = [e["kind"] for e in doc["events"]]
    assert "attempt_failed" in kinds and "completed" in kinds


def test_export_shows_the_ledger_with_keys_external_ids_and_who_resolved():
    cw.FAILURES["cli_charge"] = 1
    run = drive(durable.start("cli.charge", {"amount": 7}).id)
    op = Operation.objects.get(run=run)
    operation_reconcile(
        operation_id=op.pk,
        outcome="happened",
        result={"charge_id": "ch_7"},
        external_id="ch_ext_7",
        by="olga",
        reason="seen in the provider",
    )
    run = drive(run.pk)
    assert run.status == RunStatus.SUCCEEDED, run.error

    doc = export_json(run.pk)

    [entry] = doc["ledger"]
    assert entry["idempotency_key"] == f"{run.pk}:cli_charge"
    assert entry["external_id"] == "ch_ext_7"
    assert entry["resolved_by"] == "olga"
    assert entry["status"] == "succeeded"
    [wait] = doc["waits"]
    assert wait["kind"] == "reconcile" and wait["resolved_by"] == "olga"
    assert wait["resolved_at"]


def test_export_shows_each_approval_decision_with_who_and_when():
    user = get_user_model().objects.create_user("boss", password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    run = drive(durable.start("tests.approval", {"n": 1}).id)
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=user, approve=False, comment="too much")
    drive(run.pk)

    doc = export_json(run.pk)

    [approval] = doc["approvals"]
    assert approval["key"] == "budget" and approval["status"] == "rejected"
    [decision] = approval["decisions"]
    assert decision["user"] == "boss"
    assert decision["approved"] is False
    assert decision["comment"] == "too much"
    assert decision["at"]
    [wait] = doc["waits"]
    assert wait["kind"] == "approval" and wait["resolved_at"]


def test_export_lists_the_compensation():
    run = drive(durable.start("tests.charge_then_fail", {}).id)
    assert run.status == RunStatus.FAILED
    services.run_compensate(run_id=run.pk, by="olga", reason="undo")
    run = drive(run.pk)
    assert run.status == RunStatus.COMPENSATED, run.error

    doc = export_json(run.pk)

    comp = doc["compensation"]
    writes = [e["step_id"] for e in doc["ledger"]]
    assert len(writes) == 2
    # undone newest first, each as a step of its own
    assert [s["step_id"] for s in comp["steps"]] == [f"compensate:{w}" for w in reversed(writes)]
    assert all(s["status"] == "succeeded" for s in comp["steps"])
    assert [e["actor"] for e in comp["events"] if e["kind"] == "compensating"] == ["olga"]


def test_export_html_is_a_readable_escaped_page(tmp_path):
    run = drive(durable.start("cli.echo", {"note": "<script>alert(1)</script>"}).id)
    target = tmp_path / "run.html"
    out = StringIO()
    call_command("durable", "export", run.pk, "--format", "html", "-o", str(target), stdout=out)
    html = target.read_text()
    assert f"wrote {target}" in out.getvalue()
    assert html.startswith("<!doctype html>")
    assert f'Run <span class="mono">{run.pk}</span>' in html
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Nothing was redacted." in html


def test_export_of_an_unknown_run_exits_2():
    with pytest.raises(CommandError) as info:
        call_command("durable", "export", "no-such-run", stdout=StringIO())
    assert info.value.returncode == 2
    assert "no-such-run does not exist" in str(info.value)


def test_redactions_lists_every_path_holding_the_marker():
    doc = {"run": {"input": {"a": "[REDACTED]", "b": ["x", "key [REDACTED] here"]}}}
    assert export.redactions(doc) == ["run.input.a", "run.input.b[1]"]


def test_export_names_a_childs_parent_and_the_trace_it_joined(tmp_path):
    from durable.models import Run
    from tests.durable.runtime import child_workflows as chw

    chw.reset()
    parent = drive(durable.start("tests.children.parent", {"items": [{"n": 1, "id": "a"}]}).id)
    child = Run.objects.get(parent_run_id=parent.id)
    trace = "0af7651916cd43dd8448eb211c80319c"
    Run.objects.filter(pk=child.id).update(
        trace_context={"traceparent": f"00-{trace}-b7ad6b7169203331-01"}
    )
    doc = export_json(child.id)
    assert doc["run"]["parent_run"] == parent.id and doc["run"]["trace_id"] == trace
    assert export_json(parent.id)["run"]["parent_run"] is None
    target = tmp_path / "child.html"
    call_command("durable", "export", child.id, "--format", "html", "-o", str(target))
    html = target.read_text()
    assert f'<dt>Parent run</dt><dd class="mono">{parent.id}</dd>' in html
    assert f'<dt>Trace</dt><dd class="mono">{trace}</dd>' in html
