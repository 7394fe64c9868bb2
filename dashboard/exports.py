"""The run page's audit export (durable/services/export.py): a JSON download and a readable page.

Both read only and need the viewer permission, as the run page does: the document holds
nothing the run page does not show (secrets stay ``[REDACTED]``). The export names the
user who asked for it.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from approvals.access import require_perm
from approvals.roles import VIEW_RUN
from durable.exceptions import RunNotFound
from durable.services import export


def _document(request: HttpRequest, run_id: str) -> dict:
    try:
        return export.export_run(run_id, by=request.user.get_username())
    except RunNotFound:
        raise Http404(f"There is no run with the id “{run_id}”.") from None


@require_safe
@require_perm(VIEW_RUN)
def run_export_json(request: HttpRequest, run_id: str) -> HttpResponse:
    """The audit document as a JSON file download (``run-<id>.json``)."""
    doc = _document(request, run_id)
    response = HttpResponse(export.to_json(doc), content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run_id}.json"'
    return response


@require_safe
@require_perm(VIEW_RUN)
def run_export(request: HttpRequest, run_id: str) -> HttpResponse:
    """The audit document as a page of the dashboard, made to be printed (or saved as PDF
    from the browser's print dialog)."""
    context = export.template_context(_document(request, run_id))
    return render(request, "dashboard/run_export.html", {"run_id": run_id, **context})
