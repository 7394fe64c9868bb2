"""``{% runs_rows rows %}``, ``{% step_rows rows run %}`` and ``{% approval_items items
refused csrf_token %}``: the hot tables, rendered in Python (:mod:`dashboard.rows`,
:mod:`dashboard.step_rows`, :mod:`dashboard.approval_items`)."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString

from ..approval_items import approval_items as _approval_items
from ..rows import event_rows as _event_rows
from ..rows import failed_rows as _failed_rows
from ..rows import options as _options
from ..rows import runs_rows as _runs_rows
from ..step_rows import step_rows as _step_rows

register = template.Library()


@register.simple_tag
def runs_rows(rows: Any) -> SafeString:
    """The ``<tr>`` of each row of a runs page (a list of ``selectors.RunRow``)."""
    return _runs_rows(rows)


@register.simple_tag
def step_rows(rows: Any, run: Any) -> SafeString:
    """The ``<li>`` of each step row of ``run``'s timeline (``selectors.StepRow``)."""
    return _step_rows(rows, run)


@register.simple_tag
def approval_items(items: Any, refused: Any, csrf_token: Any) -> SafeString:
    """The ``<article>`` of each request of the approvals inbox (``selectors.InboxItem``)."""
    return _approval_items(items, refused, csrf_token)


@register.simple_tag
def event_rows(events: Any) -> SafeString:
    """The ``<tr>`` of each trace event of a run page's event log."""
    return _event_rows(events)


@register.simple_tag
def options(values: Any) -> SafeString:
    """An ``<option>`` for each value, its text and its value the same."""
    return _options(values)


@register.simple_tag
def failed_rows(runs: Any, may_operate: Any, csrf_token: Any) -> SafeString:
    """The ``<tr>`` of each failed run of the "needs attention" page."""
    return _failed_rows(runs, bool(may_operate), csrf_token)
