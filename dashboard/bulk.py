"""A bulk action over the runs the list's filters match: ``POST /runs/bulk/``.

Two steps, as Temporal's batch operations and Stripe's dashboard do: a preview (how many
runs match, which of them can take the action and which cannot, and why), then the
confirmation, which starts ``dashboard.bulk_action`` (:mod:`dashboard.workflows`) with
the eligible runs' ids as previewed: a run of its own, so it survives a restart, shows
its progress batch by batch on its page, and acts on each run through the single-run
service (checked, locked and audited per run, in the operator's name). The runs are
the rows the operator ticked (``selected``), else every run the filters match. At most
:data:`MAX_RUNS` runs per action; a reason is required.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

import durable
from approvals.access import require_perm
from approvals.roles import OPERATE_RUN
from durable.models import Run, transitions
from durable.queries.parsing import RunIdConverter
from durable.queries.runs import filter_runs

from .forms import RunFilterForm
from .workflows import ACTIONS

_RUN_ID = re.compile(RunIdConverter.regex)
#: runs one bulk action may take, at most
MAX_RUNS = 1000
#: ineligible runs listed in the preview, at most (the count says the rest)
SHOWN = 50


def _matching(query: str) -> tuple[list[Run], int]:
    """The runs the runs list's ``query`` (its GET parameters) matches, newest first: at
    most :data:`MAX_RUNS`, and how many match in all."""
    form = RunFilterForm(QueryDict(query[:4000]) or None)
    qs = filter_runs(form.filters()).order_by("-created_at", "-id")
    runs = list(qs.only("id", "status", "workflow_name")[: MAX_RUNS + 1])
    total = len(runs) if len(runs) <= MAX_RUNS else qs.count()
    return runs[:MAX_RUNS], total


@require_POST
@require_perm(OPERATE_RUN)
def bulk_action(request: HttpRequest) -> HttpResponse:
    """The preview (without ``confirm``), or the start of the action (with it)."""
    action = str(request.POST.get("action", ""))
    reason = str(request.POST.get("reason", "")).strip()
    query = str(request.POST.get("query", ""))
    context: dict[str, Any] = {"nav": "runs", "action": action, "reason": reason, "query": query}
    errors = []
    if action not in ACTIONS:
        errors.append(f"Choose an action: {', '.join(ACTIONS)}.")
    if not reason or len(reason) > 500:
        errors.append("Give a reason (at most 500 characters): it is recorded on every run.")
    if errors:
        context["errors"] = errors
        return render(request, "dashboard/bulk.html", context, status=422)
    if request.POST.get("confirm"):
        try:
            given = json.loads(request.POST.get("run_ids", "[]"))
        except ValueError:
            given = None
        # run ids only (the alphabet of durable.start), as the preview wrote them
        ids = (
            [i for i in given if isinstance(i, str) and _RUN_ID.fullmatch(i)][:MAX_RUNS]
            if isinstance(given, list)
            else []
        )
        if not ids:
            context["errors"] = ["No run to act on: preview again."]
            return render(request, "dashboard/bulk.html", context, status=422)
        run = durable.start(
            "dashboard.bulk_action",
            {"action": action, "run_ids": ids, "by": request.user.get_username(), "reason": reason},
            started_by=request.user,
            tags=["bulk", action],
        )
        messages.success(request, f"Bulk {action} of {len(ids)} runs started as run {run.id}.")
        return redirect("dashboard:run", run_id=run.id)
    selected = [i for i in request.POST.getlist("selected") if _RUN_ID.fullmatch(i)]
    if selected:  # the rows the operator ticked, not every run the filters match
        runs = list(
            Run.objects.filter(id__in=selected[:MAX_RUNS])
            .only("id", "status", "workflow_name")
            .order_by("-created_at", "-id")
        )
        total = len(runs)
        context["selected"] = True
    else:
        runs, total = _matching(query)
    eligible = [r for r in runs if transitions.can(action, r)]
    refused = [r for r in runs if not transitions.can(action, r)]
    context.update(
        total=total,
        capped=total > MAX_RUNS,
        max_runs=MAX_RUNS,
        eligible=eligible,
        refused=refused[:SHOWN],
        refused_count=len(refused),
        run_ids=json.dumps([r.id for r in eligible]),
        past={"cancel": "cancelled", "resume": "resumed", "compensate": "compensated"}[action],
    )
    return render(request, "dashboard/bulk.html", context)
