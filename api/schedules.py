"""Schedules: list them, pause, resume, run now -- the Schedules page's actions, through
the same services (``durable/services/schedules.py``). Declaring schedules stays in code or the
admin, as on the page."""

from __future__ import annotations

from typing import Literal

from django.http import HttpRequest
from ninja import Path, Router

from durable.models import RUN_ID_PATTERN, Schedule
from durable.services import schedules as service

from .problems import REFUSALS
from .schemas import Problem, ScheduleOut

router = Router(tags=["schedules"])


def schedule_out(row: Schedule, started: str = "") -> dict:
    return {
        "name": row.name,
        "workflow": row.workflow_name,
        "cron": row.cron,
        "timezone": row.timezone,
        "paused": row.paused,
        "next_slot_at": row.next_slot_at,
        "last_slot_at": row.last_slot_at,
        "last_run_id": row.last_run_id,
        "started_run_id": started or None,
    }


@router.get("/schedules", response={200: list[ScheduleOut], REFUSALS: Problem}, summary="List")
def list_schedules(request: HttpRequest) -> list[dict]:
    return [schedule_out(row) for row in Schedule.objects.all()[:500]]


@router.post(
    "/schedules/{name}/{action}",
    response={200: ScheduleOut, REFUSALS: Problem},
    summary="Pause, resume or run now",
)
def schedule_action(
    request: HttpRequest,
    action: Literal["pause", "resume", "run-now"],
    name: str = Path(..., pattern=RUN_ID_PATTERN, max_length=128),
) -> dict:
    """``run-now`` starts one run outside the slots (``started_run_id``); 404 for an
    unknown schedule, 422 when its workflow is not registered here."""
    started = ""
    if action == "pause":
        row = service.pause(name, by=request.user)
    elif action == "resume":
        row = service.resume(name, by=request.user)
    else:
        started = service.run_now(name, by=request.user).id
        row = Schedule.objects.get(name=name)
    return schedule_out(row, started)
