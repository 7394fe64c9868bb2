"""The Schedules page and the schedules admin: what they show, who may operate them, and
that both save through the same checks as ``durable.schedule``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.urls import reverse

import durable
from durable.models import Run, Schedule
from tests import schedule_workflows  # noqa: F401  (registers sched.report)

pytestmark = pytest.mark.django_db


def declare(**kwargs):
    options = {"cron": "30 2 * * *", "timezone": "Europe/Berlin", **kwargs}
    return durable.schedule("nightly", "sched.report", {"team": "ops"}, **options)


def action(name: str, what: str) -> str:
    return reverse("dashboard:schedule_action", args=[name, what])


def test_the_page_lists_each_schedule_with_its_next_slot_in_its_own_zone(viewer_client):
    row = declare()
    row.next_slot_at = datetime(2026, 3, 29, 1, tzinfo=UTC)  # 03:00 CEST, after the change
    row.save()
    page = viewer_client.get("/schedules/").content.decode()
    assert "nightly" in page and "sched.report" in page and "30 2 * * *" in page
    assert "2026-03-29 03:00 CEST" in page
    assert "Pause" not in page  # a viewer sees, an operator operates


def test_an_operator_pauses_resumes_and_runs_a_schedule_now(operator, operator_client):
    declare()
    response = operator_client.post(action("nightly", "pause"), follow=True)
    assert "Schedule nightly is paused" in response.content.decode()
    assert Schedule.objects.get(name="nightly").paused
    response = operator_client.post(action("nightly", "run-now"), follow=True)
    run = Run.objects.get(id__startswith="schedule.nightly.manual.")
    assert f"Started run {run.id} of schedule nightly." in response.content.decode()
    assert run.started_by_name == operator.username
    response = operator_client.post(action("nightly", "resume"), follow=True)
    assert "Schedule nightly is running again" in response.content.decode()
    assert not Schedule.objects.get(name="nightly").paused


def test_a_viewer_may_not_operate_and_unknown_names_or_actions_are_404(
    viewer_client, operator_client
):
    declare()
    assert viewer_client.post(action("nightly", "pause")).status_code == 403
    assert not Schedule.objects.get(name="nightly").paused
    assert operator_client.post(action("nope", "pause")).status_code == 404
    assert operator_client.post(action("nightly", "delete")).status_code == 404
    assert operator_client.get(action("nightly", "pause")).status_code == 405


# --- the admin ----------------------------------------------------------------------------


def _form(**fields):
    data = {
        "name": "nightly",
        "workflow_name": "sched.report",
        "input_json": '{"team": "ops"}',
        "cron": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "catchup": "one",
    }
    data.update(fields)
    return data


def test_the_admin_adds_a_schedule_through_the_same_checks(admin_client):
    url = reverse("admin:durable_schedule_add")
    bad = admin_client.post(url, _form(cron="99 * * * *", timezone="Mars/Olympus"))
    assert bad.status_code == 200
    errors = bad.context["adminform"].form.errors
    assert "timezone 'Mars/Olympus' is not a known IANA zone" in " ".join(errors["timezone"])
    bad = admin_client.post(url, _form(cron="99 * * * *"))
    assert "cron '99 * * * *' is not valid" in " ".join(
        bad.context["adminform"].form.errors["cron"]
    )
    bad = admin_client.post(url, _form(name="bad name!"))
    assert "schedule name 'bad name!' is not valid" in " ".join(
        bad.context["adminform"].form.errors["name"]
    )
    bad = admin_client.post(url, _form(input_json="{not json"))
    assert "Not valid JSON" in " ".join(bad.context["adminform"].form.errors["input_json"])
    assert not Schedule.objects.exists()

    assert admin_client.post(url, _form(paused="on")).status_code == 302
    row = Schedule.objects.get(name="nightly")
    assert row.paused and row.next_slot_at is not None and row.updated_by == "admin"
    assert durable.values.codec.decode(row.input) == {"team": "ops"}


def test_the_admin_actions_pause_resume_and_run_now(admin_client):
    row = declare()
    url = reverse("admin:durable_schedule_changelist")
    admin_client.post(url, {"action": "pause", "_selected_action": [str(row.pk)]})
    assert Schedule.objects.get(pk=row.pk).paused
    admin_client.post(url, {"action": "resume", "_selected_action": [str(row.pk)]})
    assert not Schedule.objects.get(pk=row.pk).paused
    admin_client.post(url, {"action": "run_now", "_selected_action": [str(row.pk)]})
    assert Run.objects.filter(id__startswith="schedule.nightly.manual.").count() == 1


def test_the_page_follows_the_live_feed_and_refreshes_only_its_table(viewer_client):
    declare()
    page = viewer_client.get("/schedules/").content.decode()
    assert 'data-live-url="/ws/runs/"' in page and 'id="schedules" data-live' in page
    fragment = viewer_client.get("/schedules/", headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith('<div id="schedules"') and "<html" not in fragment
    assert "nightly" in fragment


def test_the_admin_list_shows_slots_in_the_schedules_zone_and_says_missed(admin_client):
    row = declare()
    row.next_slot_at = datetime(2026, 3, 29, 1, tzinfo=UTC)
    row.skipped_slots = 3
    row.save()
    page = admin_client.get(reverse("admin:durable_schedule_changelist")).content.decode()
    assert "2026-03-29 03:00 CEST" in page
    assert "Missed" in page and "Skipped slots" not in page
    detail = admin_client.get(reverse("admin:durable_schedule_change", args=[row.pk]))
    assert detail.status_code == 200 and "2026-03-29 03:00 CEST" in detail.content.decode()
