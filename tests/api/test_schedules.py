"""Schedules through the API: the Schedules page's pause, resume and run now."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run, Schedule
from tests.api.conftest import api_for
from tests.api.test_runs import assert_problem

pytestmark = pytest.mark.django_db(transaction=True)


def test_list_pause_resume_and_run_now(operator_api, viewer):
    durable.schedule("daily-echo", "dash.echo", {"x": 1}, cron="0 12 * * *")
    (row,) = operator_api.get("/schedules").json()
    assert row["name"] == "daily-echo" and row["paused"] is False
    paused = operator_api.post("/schedules/daily-echo/pause")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert Schedule.objects.get(name="daily-echo").paused
    assert operator_api.post("/schedules/daily-echo/resume").json()["paused"] is False
    started = operator_api.post("/schedules/daily-echo/run-now").json()["started_run_id"]
    assert Run.objects.filter(pk=started, workflow_name="dash.echo").exists()
    assert_problem(operator_api.post("/schedules/nope/pause"), 404)
    assert_problem(operator_api.post("/schedules/daily-echo/explode"), 422)
    assert_problem(api_for(viewer).post("/schedules/daily-echo/pause"), 403)
    assert Schedule.objects.get(name="daily-echo").paused is False
