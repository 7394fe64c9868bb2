"""The dashboard's pages. Each page is one template with inline partials; an HTMX request
gets only the partial it swaps (``"page.html#name"``), a normal request the whole page.

The POST actions are in :mod:`dashboard.actions`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from django.apps import apps
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.template import loader
from django.views import defaults
from django.views.decorators.http import require_safe
from django.views.decorators.vary import vary_on_headers
from django_htmx.middleware import HtmxDetails

from approvals.access import require_perm
from approvals.roles import DECIDE_APPROVAL, OPERATE_RUN, VIEW_RUN
from durable import postgres
from durable.models import RunStatus, StepKind, StepStatus, transitions
from durable.observability import otel
from durable.queries import streams
from durable.queries.parsing import BadParameter, clean_text, parse_int

from . import selectors
from .forms import RunFilterForm
from .selectors.saved_views import views_for_list

logger = logging.getLogger("dashboard")


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def wants_fragment(request: HttpRequest) -> bool:
    """An HTMX request that swaps a fragment (not a history restore, which needs a page)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request


def page_or_fragment(
    request: HttpRequest, template: str, fragment: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    fragment_only = wants_fragment(request)
    name = f"{template}#{fragment}" if fragment_only else template
    return render(request, name, {**context, "is_fragment": fragment_only}, status=status)


# --- runs list -----------------------------------------------------------------------


ADVANCED_FILTERS = (
    "version",
    "started_by",
    "created_from",
    "created_to",
    "waiting_minutes",
    "retries",
)


@require_safe
@vary_on_headers("HX-Request")
@require_perm(VIEW_RUN)
def runs(request: HtmxHttpRequest) -> HttpResponse:
    return page_or_fragment(request, "dashboard/runs.html", "table", runs_context(request))


def runs_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    """The runs list's context for ``request.GET`` (also the saved views' error page)."""
    # the live cursor is read before the rows: an event written while the page renders
    # is then after it, and the socket sends a refresh at once (no read skew)
    since = selectors.last_event_id()
    form = RunFilterForm(
        request.GET or None,
        workflows=selectors.workflow_names(_clean_or_empty(request.GET.get("workflow", "")[:200])),
    )
    filters = form.filters() if request.GET else selectors.RunFilters()
    page = selectors.runs_page(
        filters, after=request.GET.get("after", ""), before=request.GET.get("before", "")
    )
    # an empty list says when the system's own runs (hidden) would have matched
    hidden_system = not page.rows and not filters.system and selectors.system_runs_match(filters)
    context = {
        "form": form,
        "advanced_fields": [form[name] for name in ADVANCED_FILTERS],
        "filters": filters,
        "page": page,
        "counts": selectors.status_counts(filters, since),
        "hidden_system": hidden_system,
        "status_links": _status_links(),
        "since": since,
        "current_url": request.get_full_path(),
        "nav": "runs",
        "may_operate": request.user.has_perm(OPERATE_RUN),
        "saved_views": views_for_list(request),
        "may_share": request.user.has_perm(OPERATE_RUN) or request.user.is_staff,
        "query": request.GET.urlencode(),
    }
    context.update(extra)
    return context


def _clean_or_empty(value: str) -> str:
    try:
        return clean_text(value)
    except BadParameter:
        return ""  # not offered as a choice: the form then reports the field as invalid


def _status_links() -> list[tuple[str, str]]:
    return (
        [("", "All")]
        + [
            (selectors.STATUS_ATTENTION, "Needs attention"),
            (selectors.STATUS_APPROVAL, "Waiting for approval"),
            (selectors.STATUS_LIMIT, "Waiting for a limit"),
        ]
        + list(RunStatus.choices)
    )


# --- run detail ----------------------------------------------------------------------


def run_context(request: HttpRequest, run_id: str, **extra: Any) -> dict[str, Any]:
    """The run page's context; raises Http404 for an unknown run."""
    since = selectors.last_event_id(run_id)  # before the run is read: see runs()
    run = selectors.get_run(run_id)
    if run is None:
        raise Http404(f"There is no run with the id “{run_id}”.")
    matching, fold = _trace_view(request)
    detail = selectors.run_detail(run, matching=matching, fold=fold)
    may_operate = request.user.has_perm(OPERATE_RUN)
    actions = {
        name: may_operate and transitions.can(name, run)
        for name in ("cancel", "compensate", "resume", "fork")
    }
    actions["fork"] = actions["fork"] and bool(detail.step_ids)
    actions["signal"] = may_operate and transitions.can("signal", run)
    may_decide = request.user.has_perm(DECIDE_APPROVAL)
    # the run's pending approvals this user may decide, decided in place: the inbox's rule
    # and cards (selectors.inbox), so the checks and what is shown cannot differ
    decidable: list[Any] = []
    if may_decide and run.status == RunStatus.WAITING and detail.pending_approvals:
        decidable, _total = selectors.inbox(request.user, run_id=run.id)
    context = {
        "run": run,
        "detail": detail,
        "actions": actions,
        "any_action": any(actions.values()),
        "may_operate": may_operate,
        "may_decide": may_decide,
        "decidable": decidable,
        "server_now_ms": int(time.time() * 1000),
        "trace_url": otel.trace_url(run.trace_id),
        "since": since,
        "has_stream": streams.has_stream(run.id, run.status),
        "graph": _graph_of(run),
        "step_statuses": StepStatus.choices,
        "step_kinds": StepKind.choices,
        "nav": "runs",
    }
    context.update(extra)
    return context


@require_safe
@vary_on_headers("HX-Request")
@require_perm(VIEW_RUN)
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    return page_or_fragment(
        request, "dashboard/run_detail.html", "main", run_context(request, run_id)
    )


def _graph_of(run: Any) -> Any:
    """The drawing of a LangGraph run (``durable.contrib.langgraph.drawing``), or None:
    another workflow, the integration not installed, or a graph that cannot be drawn
    here (logged: the page shows the run without it)."""
    if not apps.is_installed("durable.contrib.langgraph"):
        return None
    try:
        from durable.contrib.langgraph.drawing import graph_drawing

        return graph_drawing(run)
    except Exception:  # noqa: BLE001 - a graph that fails to build must not cost the page
        logger.warning("durable: cannot draw the graph of run %s", run.id, exc_info=True)
        return None


def _trace_view(request: HttpRequest) -> tuple[selectors.StepFilter, bool]:
    """The step filter and the folding of repeats a run page's query asks for (400 for a
    value that is not a step status or kind)."""
    try:
        matching = selectors.step_filter(
            request.GET.get("step_status"), request.GET.get("step_kind")
        )
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return matching, request.GET.get("repeats") != "all"


def _position(value: str | None, name: str) -> int | None:
    try:
        return parse_int(value, what=f"The step position “{name}”", max_digits=9)
    except BadParameter as exc:
        raise BadRequest(str(exc)) from None


@require_safe
@vary_on_headers("HX-Request")
@require_perm(VIEW_RUN)
def run_steps(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The steps of a long run that the run page leaves out ("load more"): the next
    ``selectors.STEPS_PAGE`` after position ``after`` (keyset), up to ``before``."""
    run = selectors.get_run(run_id)
    if run is None:
        raise Http404(f"There is no run with the id “{run_id}”.")
    after = _position(request.GET.get("after"), "after")
    if after is None:
        after = -1
    before = _position(request.GET.get("before"), "before")
    matching, fold = _trace_view(request)
    page = selectors.step_page(run, after, before, matching=matching, fold=fold)
    context = {"run": run, "page": page, "after": after, "nav": "runs"}
    return page_or_fragment(request, "dashboard/steps.html", "rows", context)


@require_safe
@require_perm(VIEW_RUN)
def run_payload(request: HtmxHttpRequest, run_id: str, kind: str, pk: str) -> HttpResponse:
    """The whole of one payload (what "show all" loads)."""
    found = selectors.full_payload(run_id, kind, pk)
    if found is None:
        raise Http404(f"Run “{run_id}” has no {kind.replace('-', ' ')} {pk}.")
    context = {"payload": found, "run_id": run_id, "kind": kind, "pk": pk}
    return page_or_fragment(request, "dashboard/payload.html", "full", context)


# --- approvals -----------------------------------------------------------------------


def inbox_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    since = selectors.last_event_id()  # before the rows: see runs()
    items, total = selectors.inbox(request.user)
    # the navigation's badge shows the same number: count it once per request
    request._dashboard_inbox_count = total  # type: ignore[attr-defined]
    # the countdown (dashboard/static/dashboard/countdown.js) corrects the browser's clock by this
    context = {
        "items": items,
        "total": total,
        "batches": selectors.batches(items),
        "since": since,
        "nav": "approvals",
        "server_now_ms": int(time.time() * 1000),
    }
    context.update(extra)
    return context


@require_safe
@vary_on_headers("HX-Request")
@require_perm(DECIDE_APPROVAL)
def approvals(request: HtmxHttpRequest) -> HttpResponse:
    return page_or_fragment(request, "dashboard/approvals.html", "inbox", inbox_context(request))


# --- needs attention -----------------------------------------------------------------


def attention_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    since = selectors.last_event_id()  # before the rows: see runs()
    operations = selectors.unknown_operations()
    failed = selectors.failed_runs(limit=selectors.FAILED_SHOWN + 1)
    context = {
        "operations": operations,
        "params": selectors.operation_payloads(operations),
        "failed": failed[: selectors.FAILED_SHOWN],
        "failed_more": len(failed) > selectors.FAILED_SHOWN,
        "may_operate": request.user.has_perm(OPERATE_RUN),
        "since": since,
        "nav": "attention",
    }
    context.update(extra)
    return context


@require_safe
@vary_on_headers("HX-Request")
@require_perm(VIEW_RUN)
def attention(request: HtmxHttpRequest) -> HttpResponse:
    return page_or_fragment(
        request, "dashboard/attention.html", "content", attention_context(request)
    )


# --- errors --------------------------------------------------------------------------


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: 503 with ``Retry-After`` when the database did not answer (the
    request waited in vain for one of the web process's pooled connections, or its
    connection was ended by a restart or a failover:
    :func:`durable.postgres.database_unavailable`), else Django's 500 page. Both render without a
    database query, which could fail the same way."""
    exc = sys.exc_info()[1]
    if postgres.database_unavailable(exc):
        context = {"unavailable": not postgres.pool_exhausted(exc)}
        response = HttpResponse(loader.render_to_string("503.html", context), status=503)
        response["Retry-After"] = str(postgres.BUSY_RETRY_AFTER)
        return response
    return defaults.server_error(request)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler400``: the 400 page, with the parser's message (Django's default shows
    none). Messages come from :mod:`durable.queries.parsing` and never echo the input."""
    message = str(exception) if isinstance(exception, BadRequest | BadParameter) else ""
    return render(request, "400.html", {"exception": message}, status=400)
