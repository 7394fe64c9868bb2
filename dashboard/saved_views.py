"""The runs list's saved views: save the list's filters under a name, personal or shared,
then apply them with one click (``/?<query>``); rename and delete your own.

A view holds only filters the list understands: the query is parsed with the list's own
rules (:func:`durable.queries.filters.parse_filters`), an invalid filter refuses the
save naming it (422), and what is not a filter (the page cursor, unknown names) is left
out. Saving under a name you already use replaces that view's filters. Sharing needs
the operator permission or staff; every role may keep personal views. Only the owner or
staff renames or deletes a view: a shared view of someone else's is a 403, a personal
view of someone else's a 404 (it is not shown to you at all).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from approvals.access import require_perm
from approvals.roles import OPERATE_RUN, VIEW_RUN

from .models import VIEW_NAME_MAX, VIEW_QUERY_MAX, SavedView
from .selectors.saved_views import InvalidView, clean_name, normal_query, visible_views
from .views import runs_context


def _back(request: HttpRequest, query: str = "") -> HttpResponse:
    return redirect(f"/?{query}" if query else "/")


def _refused(
    request: HttpRequest, error: InvalidView, query: str, renaming: SavedView | None = None
) -> HttpResponse:
    """The runs list again, for the query the form was on, with the error beside the
    form that was sent: the save form, or the rename form of ``renaming`` (422: nothing
    changed)."""
    request.GET = QueryDict(query)  # type: ignore[misc]
    error_info = {"field": error.field, "message": str(error)}
    name = str(request.POST.get("name", ""))[:VIEW_NAME_MAX]
    if renaming is None:
        extra = {"view_error": error_info, "view_name": name}
    else:
        extra = {"rename_error": {**error_info, "pk": renaming.pk, "name": name}}
    context = runs_context(request, **extra)
    return render(request, "dashboard/runs.html", context, status=422)


@require_POST
@require_perm(VIEW_RUN)
def save_view(request: HttpRequest) -> HttpResponse:
    query_text = str(request.POST.get("query", ""))[: VIEW_QUERY_MAX * 2]
    params = QueryDict(query_text)
    shared = bool(request.POST.get("shared"))
    try:
        name = clean_name(request.POST.get("name", ""))
        query = normal_query(params)
        if shared and not (request.user.has_perm(OPERATE_RUN) or request.user.is_staff):
            raise InvalidView("shared", "Sharing a view needs the operator role.")
    except InvalidView as exc:
        return _refused(request, exc, query_text)
    view, created = SavedView.objects.update_or_create(
        owner=request.user, name=name, defaults={"query": query, "shared": shared}
    )
    what = "Saved" if created else "Updated"
    messages.success(request, f"{what} the view “{view.name}”{' (shared)' if shared else ''}.")
    return _back(request, query)


def _own(request: HttpRequest, pk: int) -> SavedView:
    view = visible_views(request.user).filter(pk=pk).first()
    if view is None:
        raise Http404("There is no such view.")
    if view.owner_id != request.user.pk and not request.user.is_staff:
        from django.core.exceptions import PermissionDenied

        raise PermissionDenied("Only its owner renames or deletes a shared view.")
    return view


@require_POST
@require_perm(VIEW_RUN)
def rename_view(request: HttpRequest, pk: int) -> HttpResponse:
    view = _own(request, pk)
    try:
        name = clean_name(request.POST.get("name", ""))
        if SavedView.objects.filter(owner=view.owner, name=name).exclude(pk=view.pk).exists():
            raise InvalidView("name", f"There is already a view named “{name}”.")
    except InvalidView as exc:
        return _refused(request, exc, view.query, renaming=view)
    old, view.name = view.name, name
    view.save(update_fields=["name", "updated_at"])
    messages.success(request, f"Renamed the view “{old}” to “{name}”.")
    return _back(request, view.query)


@require_POST
@require_perm(VIEW_RUN)
def delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    view = _own(request, pk)
    name = view.name
    view.delete()
    messages.success(request, f"Deleted the view “{name}”.")
    return _back(request)
