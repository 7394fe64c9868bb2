"""The dashboard's hot partials, Jinja2 templates (``dashboard/jinja2/dashboard/rows/``,
:mod:`dashboard.jinja_env`), as tags of its Django pages:

- ``{% runs_rows rows %}``: the runs table's ``<tr>`` (``RunRow``);
- ``{% step_rows rows run %}``: a run's timeline ``<li>`` (``selectors.StepRow``);
- ``{% event_rows events %}``: a run's event log ``<tr>``;
- ``{% approval_items items refused csrf_token [on] [heading] %}``: the inbox's
  ``<article>`` (also on a run's page, decided in place);
- ``{% failed_rows runs may_operate csrf_token %}``: "needs attention"'s failed runs;
- ``{% options values %}``: an ``<option>`` a value;
- ``{% payload p kind pk run_id %}``: a stored payload with "Show all".

Each returns safe HTML in which Jinja2 escaped every value.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django import template
from django.template import engines
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@cache
def _template(name: str) -> Any:
    # the jinja2.Template itself: Django's wrapper would add the request's context
    # processors, which these partials do not read
    return engines["jinja2"].get_template(f"dashboard/rows/{name}.html").template


def render(name: str, **context: Any) -> SafeString:
    """``dashboard/rows/<name>.html`` rendered with ``context`` (escaped HTML)."""
    return mark_safe(_template(name).render(context))


@register.simple_tag
def runs_rows(rows: Any, select: bool = False) -> SafeString:
    """The ``<tr>`` of each row of a runs page (a list of ``RunRow``); ``select``: with a
    checkbox that picks the run for the bulk action's form (``#bulk-form``)."""
    return render("runs", rows=rows, select=select)


@register.simple_tag
def step_rows(rows: Any, run: Any) -> SafeString:
    """The ``<li>`` of each step row of ``run``'s timeline (``selectors.StepRow``)."""
    return render("steps", rows=rows, run=run)


@register.simple_tag
def approval_items(
    items: Any, refused: Any, csrf_token: Any, on: str = "inbox", heading: int = 2
) -> SafeString:
    """The ``<article>`` of each request of the approvals inbox (``selectors.InboxItem``).
    ``on``: the page they are decided on, ``"inbox"`` or ``"detail"`` (a run's page: the
    decision answers with that page's main part); ``heading``: the level of their title."""
    return render(
        "approvals",
        items=items,
        refused=refused,
        csrf_token=csrf_token,
        on=on,
        heading=heading,
    )


@register.simple_tag
def event_rows(events: Any) -> SafeString:
    """The ``<tr>`` of each trace event of a run page's event log."""
    return render("events", events=events)


@register.simple_tag
def options(values: Any) -> SafeString:
    """An ``<option>`` for each value, its text and its value the same."""
    return render("options", values=values)


@register.simple_tag
def failed_rows(runs: Any, may_operate: Any, csrf_token: Any) -> SafeString:
    """The ``<tr>`` of each failed run of the "needs attention" page."""
    return render("failed", runs=runs, may_operate=bool(may_operate), csrf_token=csrf_token)


@register.simple_tag
def payload(p: Any, kind: str, pk: Any, run_id: str) -> SafeString:
    """A stored payload (``selectors.Payload``), cut with a "Show all" link."""
    return render("payload", p=p, kind=kind, pk=pk, run_id=run_id)
