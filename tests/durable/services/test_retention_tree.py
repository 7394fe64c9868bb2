"""Retention respects the run tree: a run that an unfinished run may still read, or that a
live run belongs to, is kept (durable/services/retention.py); a parent whose child row
vanished fails naming the child instead of receiving ``None``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import Q
from django.test import Client

import durable
from api.models import WebhookCursor, WebhookSubscription, token_create
from api.scopes import SCOPES
from durable.models import Run, RunStatus, TraceEvent
from durable.services import retention
from durable.testing import drive
from tests.dashboard.conftest import make_user
from tests.durable.runtime import child_workflows as cwf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _reset(settings):
    settings.DURABLE = {**settings.DURABLE, "PRUNE_PAUSE_SECONDS": 0}
    cwf.reset()
    yield
    cwf.reset()


def tree(root_id: str) -> list[Run]:
    return list(Run.objects.filter(Q(pk=root_id) | Q(pk__startswith=f"{root_id}.")).order_by("id"))


def settle(root_id: str) -> Run:
    """Drive every due run of the tree until none is due; the fresh root."""
    due = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.RETRYING)
    for _ in range(20):
        runs = [r.id for r in tree(root_id) if r.status in due]
        if not runs:
            break
        for run_id in runs:
            drive(run_id)
    return Run.objects.get(pk=root_id)


def test_s29_a_failed_parent_is_kept_while_its_child_waits_and_the_child_keeps_its_parent():
    run = durable.start(
        "tests.children.starts_and_fails",
        {"leaf": {"n": 1, "wait_signal": True}, "fail": True, "policy": "abandon"},
    )
    parent = settle(run.id)
    child_id = f"{run.id}.c"
    assert parent.status == RunStatus.FAILED
    assert Run.objects.get(pk=child_id).status == RunStatus.WAITING

    out = StringIO()
    call_command("durable", "prune", "--older-than", "0", "--dry-run", stdout=out)
    assert f"kept run {run.id}: its child run {child_id} is waiting, not finished" in (
        out.getvalue()
    )
    out = StringIO()
    call_command("durable", "prune", "--older-than", "0", stdout=out)
    assert "pruned 0 runs" in out.getvalue()
    assert Run.objects.get(pk=child_id).parent_run_id == run.id
    assert Run.objects.filter(pk=run.id).exists()

    # the child ends: the whole tree goes, leaves first, in one prune
    durable.signal(child_id, "go", {})
    assert drive(child_id).status == RunStatus.SUCCEEDED
    assert retention.prune(older_than=0, dry_run=True)["runs"] == 2
    assert retention.prune(older_than=0)["runs"] == 2
    assert tree(run.id) == []


def test_a_finished_child_is_kept_while_its_parent_may_still_read_its_end():
    run = durable.start("tests.children.late_wait", {})
    assert drive(run.id).status == RunStatus.WAITING
    child = drive(f"{run.id}.early")
    assert child.status == RunStatus.SUCCEEDED
    assert retention.prune(older_than=0)["runs"] == 0
    reason = retention.why_kept(child)
    assert reason == f"its parent run {run.id} is waiting and may still read this child's end"
    durable.signal(run.id, "now", {})
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED
    assert done.output_value() == {"double": 10}


def test_a_parent_whose_child_row_vanished_fails_naming_the_child():
    run = durable.start("tests.children.late_wait", {})
    assert drive(run.id).status == RunStatus.WAITING
    child_id = f"{run.id}.early"
    assert drive(child_id).status == RunStatus.SUCCEEDED
    Run.objects.filter(pk=child_id).delete()  # by hand, or by an older retention
    durable.signal(run.id, "now", {})
    parent = drive(run.id)
    assert parent.status == RunStatus.FAILED, parent.output_value()
    assert parent.error["type"] == "ChildRunMissing"
    assert f"child run {child_id} of run {run.id} no longer exists" in parent.error["message"]


def test_a_parent_reaching_the_wait_after_the_child_row_vanished_fails_naming_the_child():
    run = durable.start("tests.children.parent", {"items": [{"n": 1, "id": "x"}]})
    child_id = f"{run.id}.x"
    assert drive(run.id).status == RunStatus.WAITING
    assert drive(child_id).status == RunStatus.SUCCEEDED
    # the child's end resolved the parent's wait; the row is gone before the parent reads it
    Run.objects.filter(pk=child_id).delete()
    parent = drive(run.id)
    assert parent.status == RunStatus.FAILED
    assert child_id in parent.error["message"] and "no longer exists" in parent.error["message"]


def test_the_api_and_the_run_page_say_why_a_finished_run_is_kept():
    run = durable.start(
        "tests.children.starts_and_fails",
        {"leaf": {"n": 1, "wait_signal": True}, "fail": True, "policy": "abandon"},
    )
    settle(run.id)
    reason = f"its child run {run.id}.c is waiting, not finished"
    user = make_user("root", is_superuser=True, is_staff=True)
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/runs/{run.id}/")
    assert page.status_code == 200
    assert "kept: " + reason in page.content.decode()
    _, token = token_create(user=user, name="tests", scopes=list(SCOPES))
    detail = Client().get(f"/api/v1/runs/{run.id}", headers={"Authorization": f"Bearer {token}"})
    assert detail.status_code == 200
    assert detail.json()["kept_because"] == reason
    child = Client().get(f"/api/v1/runs/{run.id}.c", headers={"Authorization": f"Bearer {token}"})
    assert child.json()["kept_because"] is None  # unfinished: kept for the obvious reason
    page = browser.get(f"/runs/{run.id}.c/").content.decode()
    assert "(parent close policy: abandon)" in page


def test_runs_whose_webhook_events_are_not_delivered_yet_are_kept():
    WebhookSubscription.objects.create(url="https://example.test/hook", secret="s", events=[])
    run = drive(durable.start("tests.children.leaf", {"n": 2}).id)
    assert run.status == RunStatus.SUCCEEDED
    assert retention.prune(older_than=0)["runs"] == 0
    assert "is not delivered to the webhook subscribers yet" in retention.why_kept(run)
    newest = TraceEvent.objects.order_by("-id").values_list("id", flat=True).first()
    WebhookCursor.objects.update_or_create(name="events", defaults={"last_event_id": newest})
    assert retention.why_kept(run) is None
    assert retention.prune(older_than=0)["runs"] == 1
