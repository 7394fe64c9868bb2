"""``{% runs_rows rows %}``: the runs table's rows, rendered by :mod:`dashboard.rows`."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString

from ..rows import runs_rows as _runs_rows

register = template.Library()


@register.simple_tag
def runs_rows(rows: Any) -> SafeString:
    """The ``<tr>`` of each row of a runs page (a list of ``selectors.RunRow``)."""
    return _runs_rows(rows)
