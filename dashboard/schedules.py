"""The Schedules page: every schedule, its next slot and last run; pause, resume, run now.

Form posts (POST/redirect/GET with a message); the table follows the runs' live feed,
so a slot's new run shows as the last run without a reload. Declaring and editing
schedules is done in code (``durable.schedule``) or in the admin; this page operates
them (``durable.operate_run``).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST, require_safe
from django.views.decorators.vary import vary_on_headers

from approvals.access import require_perm
from approvals.roles import OPERATE_RUN, VIEW_RUN
from durable.exceptions import DurableError
from durable.models import Run, Schedule
from durable.services import schedules as service

from . import selectors
from .views import page_or_fragment

ACTIONS = ("pause", "resume", "run-now")


@require_safe
@vary_on_headers("HX-Request")
@require_perm(VIEW_RUN)
def schedules(request: HttpRequest) -> HttpResponse:
    """The schedules, with each one's next slot (shown in its own zone) and its last run."""
    since = selectors.last_event_id()  # before the rows: see views.runs()
    rows = list(Schedule.objects.all()[:500])
    last = {
        r.id: r
        for r in Run.objects.filter(pk__in=[s.last_run_id for s in rows if s.last_run_id]).only(
            "id", "status"
        )
    }
    for row in rows:
        row.last_run = last.get(row.last_run_id)  # type: ignore[attr-defined]
    context = {
        "schedules": rows,
        "nav": "schedules",
        "may_operate": request.user.has_perm(OPERATE_RUN),
        "since": since,
    }
    return page_or_fragment(request, "dashboard/schedules.html", "content", context)


@require_POST
@require_perm(OPERATE_RUN)
def schedule_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    """Pause, resume or run now; back to the page with what happened."""
    if action not in ACTIONS:
        raise Http404(f"There is no schedule action “{action}”.")
    try:
        if action == "pause":
            service.pause(name, by=request.user)
            messages.success(request, f"Schedule {name} is paused: it starts no run until resumed.")
        elif action == "resume":
            row = service.resume(name, by=request.user)
            messages.success(
                request,
                f"Schedule {name} is running again; next slot "
                f"{row.next_slot_at:%Y-%m-%d %H:%M} UTC.",
            )
        else:
            run = service.run_now(name, by=request.user)
            messages.success(request, f"Started run {run.id} of schedule {name}.")
    except service.ScheduleNotFound as exc:
        raise Http404(str(exc)) from None
    except (DurableError, ValueError) as exc:  # e.g. its workflow is not registered here
        messages.error(request, f"Schedule {name}: {exc}")
    return redirect("dashboard:schedules")
