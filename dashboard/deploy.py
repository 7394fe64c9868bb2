"""The Deploy check page: per workflow, the open runs by version beside the versions this
code registers, and the last replay check (``manage.py durable replay-check``) run here.

Viewers see; an operator runs the check (a POST: it replays up to :data:`CHECK_SAMPLE`
open runs dry in this web process, reading only, and keeps the report for the page).
The page runs the command itself (``call_command``) and reads its documented JSON
(docs/deploying.md#the-json-report): one definition of the check and of its report, and
the dashboard does not import the engine's replay (its import chain would pass the
architecture's bound, tests/durable/test_import_cycles.py).
The check against the code about to be deployed belongs in CI (docs/deploying.md); this
page shows whether the code running now still fits the runs in flight, and which
versions still have runs.
"""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

from django.contrib import messages
from django.core.management import CommandError, call_command
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_POST, require_safe
from django.views.decorators.vary import vary_on_headers

from approvals.access import require_perm
from approvals.roles import OPERATE_RUN, VIEW_RUN

from . import selectors
from .views import page_or_fragment

#: open runs replayed by one check from the page, at most (a random sample beyond)
CHECK_SAMPLE = 2000


@require_safe
@vary_on_headers("HX-Request")
@require_perm(VIEW_RUN)
def deploy_check(request: HttpRequest) -> HttpResponse:
    """The open runs by version, and the last check's report."""
    last = selectors.last_report()
    context = {
        "workflows": selectors.open_runs_by_version(),
        "last": last,
        "groups": last["report"]["groups"] if last else [],
        "sample": CHECK_SAMPLE,
        "nav": "deploy",
        "may_operate": request.user.has_perm(OPERATE_RUN),
    }
    return page_or_fragment(request, "dashboard/deploy.html", "content", context)


@require_POST
@require_perm(OPERATE_RUN)
def deploy_check_run(request: HttpRequest) -> HttpResponse:
    """Replay the open runs (a sample of :data:`CHECK_SAMPLE`) against this code."""
    report = _replay_check()
    selectors.keep_report(report, at=timezone.now().isoformat(), by=request.user.get_username())
    if report["diverged"]:
        messages.error(
            request,
            f"{report['diverged']} of {report['checked']} open runs diverge from this code.",
        )
    else:
        messages.success(request, f"All {report['checked']} open runs checked replay on this code.")
    return redirect("dashboard:deploy")


def _replay_check() -> dict[str, Any]:
    """``manage.py durable replay-check --json`` over a sample of the open runs; its report
    (exit 1 only says that a run diverged: the report says which)."""
    out = StringIO()
    args = ["replay-check", "--json", "--status", "open", "--sample", str(CHECK_SAMPLE)]
    try:
        call_command("durable", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        if exc.returncode != 1:
            raise
    report: dict[str, Any] = json.loads(out.getvalue())
    return report
