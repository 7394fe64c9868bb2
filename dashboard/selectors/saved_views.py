"""The runs list's saved views as the list shows them, and the rules a view to save must
meet (:mod:`dashboard.saved_views` saves, renames and deletes them)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.db.models import Q, QuerySet
from django.http import HttpRequest, QueryDict

from durable.queries.filters import FIELDS, RunFilters, parse_filters

from ..models import VIEW_NAME_MAX, VIEW_QUERY_MAX, SavedView


class InvalidView(ValueError):
    """What is wrong with a view to save, said for the page (``field``: the form's)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def normal_query(params: QueryDict | dict[str, str]) -> str:
    """The list's filters in ``params`` as a query string, in the list's field order,
    empty values and everything that is not a filter left out. Raises
    :class:`InvalidView` naming an invalid filter."""
    picked = {name: str(params.get(name) or "").strip() for name in FIELDS}
    picked = {name: value for name, value in picked.items() if value}
    filters, errors = parse_filters(picked)
    if errors:
        name, message = next(iter(errors.items()))
        raise InvalidView("query", f"The filter “{name}” cannot be saved: {message}")
    default = RunFilters()  # a filter at its default (the sort the form always sends) is no filter
    picked = {n: v for n, v in picked.items() if getattr(filters, n) != getattr(default, n)}
    text = urlencode(picked)
    if len(text) > VIEW_QUERY_MAX:
        raise InvalidView("query", f"These filters are over {VIEW_QUERY_MAX} characters.")
    return text


def clean_name(value: str) -> str:
    name = " ".join(str(value or "").split())
    if not name:
        raise InvalidView("name", "Give the view a name.")
    if len(name) > VIEW_NAME_MAX:
        raise InvalidView("name", f"A view's name is at most {VIEW_NAME_MAX} characters.")
    return name


def visible_views(user) -> QuerySet[SavedView]:  # type: ignore[no-untyped-def]
    """Your views, then the others' shared ones, each by name."""
    return (
        SavedView.objects.filter(Q(owner=user) | Q(shared=True))
        .select_related("owner")
        .order_by("-shared", "name", "id")
    )


def views_for_list(request: HttpRequest) -> list[dict[str, object]]:
    """The views the runs list offers, each with ``current`` (the list shows it now)."""
    try:
        shown = normal_query(request.GET)
    except InvalidView:
        shown = None
    views = list(visible_views(request.user))  # one query
    mine = [v for v in views if v.owner_id == request.user.pk]
    theirs = [v for v in views if v.owner_id != request.user.pk]
    return [
        {"view": v, "current": v.query == shown, "mine": v.owner_id == request.user.pk}
        for v in (*mine, *theirs)
    ]
