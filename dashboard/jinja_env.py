"""The Jinja2 environment of the dashboard's hot partials (``dashboard/jinja2/``).

The tables that grow with the data (the runs list, a run's step timeline and event log,
the approvals inbox, the failed runs of "needs attention", the fork form's step list)
are Jinja2 templates: Jinja2 compiles a template to Python, so a row costs a tenth of
what the Django template engine spends on the same markup (variable lookups, filters and
tags resolved per row), and the markup stays in one template. The pages around them are
Django templates that call them through ``{% load dashboard_rows %}`` tags.

Autoescaping is on (Django's Jinja2 backend turns it on; markupsafe escapes ``& < > " '``).
The filters are the Django templates' own (:mod:`dashboard.templatetags.dashboard_tags`),
so both engines show a value the same way.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime
from typing import Any

from django.urls import NoReverseMatch, get_script_prefix, reverse
from django.utils import timezone
from django.utils.text import Truncator
from jinja2 import ChainableUndefined, Environment

from durable.vocabulary import (
    AttemptOutcome,
    Classification,
    OperationStatus,
    RunStatus,
    StepKind,
    StepStatus,
    WaitKind,
)

from .templatetags.dashboard_tags import (
    ago,
    compact_json,
    duration,
    kept,
    safety_label,
    short_id,
    since,
    size_label,
)

__all__ = ["environment"]


def _labels(choices: Any) -> dict[str, str]:
    return {str(value): str(label) for value, label in choices}


_LABELS = {
    "run": _labels(RunStatus.choices),
    "step": _labels(StepStatus.choices),
    "kind": _labels(StepKind.choices),
    "wait": _labels(WaitKind.choices),
    "op": _labels(OperationStatus.choices),
    "outcome": _labels(AttemptOutcome.choices),
    "class": _labels(Classification.choices),
}


def label(value: Any, of: str) -> str:
    """A status or kind as its choice label (``{{ run.status|label("run") }}``); an unknown
    value as itself."""
    return _LABELS[of].get(value, value) if isinstance(value, str) else str(value)


def truncate(value: Any, length: int) -> str:
    """Django's ``truncatechars``: at most ``length`` characters, "…" included."""
    return Truncator(value).chars(length)


def localtime(when: datetime | None, fmt: str = "iso") -> str:
    """A datetime in the current time zone: ``"iso"`` (Django's ``date:'c'``), ``"title"``
    (``Y-m-d H:i:s T``), ``"micro"`` (``Y-m-d H:i:s.u``) or ``"clock"`` (``H:i:s``);
    "" for None."""
    if when is None:
        return ""
    local = timezone.localtime(when) if timezone.is_aware(when) else when
    if fmt == "iso":
        return local.isoformat()
    if fmt == "title":
        return local.strftime("%Y-%m-%d %H:%M:%S ") + str(local.tzname() or "")
    if fmt == "micro":
        return local.strftime("%Y-%m-%d %H:%M:%S.") + f"{local.microsecond:06d}"
    return local.strftime("%H:%M:%S")


def fixed(value: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals (Django's ``stringformat:'.2f'``); "" for what is
    not a number."""
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return ""


def url(name: str, *args: Any) -> str:
    """Django's ``{% url name args... %}`` (raises ``NoReverseMatch``).

    A row template asks for the same route once a row (a run page of 200 steps: ~600
    ``reverse()`` calls, 15 % of its time), so the route is reversed once per name, arity
    and script prefix with numbered markers in place of its arguments, and each call fills
    them in. Arguments that would need quoting, or a route the markers do not fit (a
    converter that takes no digits), go through ``reverse()`` itself."""
    if all(type(a) is int or (type(a) is str and _PLAIN_ARG.fullmatch(a)) for a in args):
        template = _url_template(name, len(args), get_script_prefix())
        if template is not None:
            head, *rest = template
            return head + "".join(str(a) + part for a, part in zip(args, rest, strict=True))
    return reverse(name, args=args)


#: arguments a URL carries as they are (reverse() quotes none of these characters)
_PLAIN_ARG = re.compile(r"[A-Za-z0-9_.~-]+")
#: the markers _url_template reverses with: digits, which str, int and slug converters take
_MARKER = "8642097531{}"


@functools.lru_cache(maxsize=512)
def _url_template(name: str, arity: int, prefix: str) -> tuple[str, ...] | None:
    """``reverse(name)`` split around its ``arity`` arguments, or None when the markers do
    not reverse (or not each exactly once). ``prefix``: the script prefix it was reversed
    under (part of the key: reverse() puts it in front)."""
    markers = [_MARKER.format(i) for i in range(arity)]
    try:
        text = reverse(name, args=markers)
    except NoReverseMatch:
        return None
    parts = []
    for marker in markers:
        if text.count(marker) != 1:
            return None
        head, text = text.split(marker)
        parts.append(head)
    return (*parts, text)


def environment(**options: Any) -> Environment:
    """The environment Django's Jinja2 backend builds (``TEMPLATES[...]['OPTIONS']``)."""
    # no trim_blocks: the newline after a tag stays, as in Django templates, where it is
    # the space between inline elements ("next try after 10 ms · 02:38:32")
    # a missing attribute shows as "", as in Django templates (``k.data.comment`` of no k)
    options["undefined"] = ChainableUndefined
    env = Environment(**options)
    env.filters.update(
        ago=ago,
        compact_json=compact_json,
        duration=duration,
        fixed=fixed,
        label=label,
        localtime=localtime,
        safety_label=safety_label,
        short_id=short_id,
        since=since,
        size_label=size_label,
        truncate=truncate,
    )
    env.globals.update(url=url, kept=kept)
    return env
