"""The hot tables' rows, rendered in Python rather than by the template engine.

A page of 50 runs costs the Django template engine about 1 ms a row (variable lookups,
filters and tags, each resolved per row); the same HTML built here with the same escaping
(:func:`django.utils.html.conditional_escape`) and the same filters costs a tenth of
that. The markup is the one the templates had, byte for byte (tests/dashboard compare
it); the templates call these through ``{% runs_rows %}``.

Every value that comes from a run is escaped here; constant markup is not.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from datetime import datetime, tzinfo
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from durable.models import RunStatus, WaitKind
from durable.queries.parsing import RunIdConverter

from .templatetags.dashboard_tags import ago, compact_json, duration, short_id, since

__all__ = ["event_rows", "failed_rows", "options", "runs_rows"]

_RUN_ID = re.compile(RunIdConverter.regex)
_STATUS_LABELS = {str(value): str(label) for value, label in RunStatus.choices}
_WAIT_LABELS = {str(value): str(label) for value, label in WaitKind.choices}


def _e(value: Any) -> str:
    """A value as the template engine shows it in HTML (Django's ``conditional_escape``:
    ``html.escape`` of its text unless it is already safe HTML)."""
    if hasattr(value, "__html__"):
        return str(value.__html__())
    return html.escape(str(value))


class _Page:
    """What every row of one render shares: the time zone and the run URL's pattern."""

    def __init__(self) -> None:
        self.tz: tzinfo = timezone.get_current_timezone()
        marker = "0RUNID0"
        url = reverse("dashboard:run", args=[marker])
        self.url_head, self.url_tail = url.split(marker, 1)

    def run_url(self, run_id: str) -> str:
        if _RUN_ID.fullmatch(run_id):  # only URL-safe characters: nothing to quote
            return self.url_head + run_id + self.url_tail
        return reverse("dashboard:run", args=[run_id])  # raises NoReverseMatch, as before

    def times(self, when: datetime | None) -> tuple[str, str]:
        """``when|date:'c'`` and ``when|date:'Y-m-d H:i:s T'`` in the current time zone."""
        if when is None:
            return "", ""
        if timezone.is_naive(when):
            return date_format(when, "c"), date_format(when, "Y-m-d H:i:s T")
        local = when.astimezone(self.tz)
        return local.isoformat(), local.strftime("%Y-%m-%d %H:%M:%S ") + str(local.tzname())


def _label(labels: dict[str, str], value: Any) -> str:
    return labels.get(value, value) if isinstance(value, str) else str(value)


def _run_row(page: _Page, row: Any) -> str:
    run = row.run
    out = [
        "\n        <tr",
        ' class="needs-attention"' if row.needs_attention else "",
        '>\n          <td data-label="Status">\n            <span class="badge status-',
        _e(run.status),
        '">',
        _e(_label(_STATUS_LABELS, run.status)),
        "</span>\n            ",
    ]
    if getattr(run, "attention", False):
        out.append(
            '<span class="badge badge-warn" title="A write\'s outcome is unknown">'
            "unknown outcome</span>"
        )
    run_id = _e(run.id)
    out += [
        '\n          </td>\n          <td data-label="Run">\n            '
        '<a class="mono run-link" href="',
        _e(page.run_url(run.id)),
        '" title="',
        run_id,
        '">',
        _e(short_id(run.id)),
        "</a>\n            ",
    ]
    for tag in run.tags or ():
        out += ['<span class="tag">', _e(tag), "</span>"]
    when = run.started_at or run.created_at
    iso, title = page.times(when)
    out += [
        '\n          </td>\n          <td data-label="Workflow">',
        _e(run.workflow_name),
        '<span class="muted">@',
        _e(run.workflow_version),
        '</span></td>\n          <td data-label="Started">\n            \n            '
        '<time datetime="',
        _e(iso),
        '" title="',
        _e(title),
        '">',
        _e(ago(when)),
        "</time>\n            \n            ",
    ]
    if run.started_by_name or run.started_by:
        out += ['<span class="muted">by ', _e(run.starter_label), "</span>"]
    out += [
        '\n          </td>\n          <td data-label="Duration">',
        _e(duration(row.duration)),
        '</td>\n          <td data-label="Steps" class="num">',
        _e(run.steps_executed),
        '</td>\n          <td data-label="Waiting on">\n            ',
    ]
    wait = row.current_wait
    if wait is not None:
        out += [
            '\n              <span class="wait-kind">',
            _e(_label(_WAIT_LABELS, wait.kind)),
            "</span>\n              ",
            _e(Truncator(wait.title or wait.key).chars(60)),
            '\n              <span class="muted">for ',
            _e(since(wait.created_at)),
            "</span>\n            ",
        ]
    else:
        out.append('<span class="muted">—</span>')
    out.append("\n          </td>\n        </tr>\n        ")
    return "".join(out)


def runs_rows(rows: Iterable[Any]) -> SafeString:
    """The ``<tr>`` of each :class:`dashboard.selectors.RunRow`, as the runs table shows
    them (HTML, every value escaped)."""
    page = _Page()
    return mark_safe("".join(_run_row(page, row) for row in rows))


def event_rows(events: Iterable[Any]) -> SafeString:
    """The ``<tr>`` of each trace event of a run page's event log (HTML, escaped)."""
    tz = timezone.get_current_timezone()
    out = []
    for e in events:
        when = e.created_at
        if when is None:
            iso = title = short = ""
        elif timezone.is_naive(when):
            iso, title, short = (date_format(when, f) for f in ("c", "Y-m-d H:i:s.u", "H:i:s"))
        else:
            local = when.astimezone(tz)
            iso = local.isoformat()
            title = local.strftime("%Y-%m-%d %H:%M:%S.") + f"{local.microsecond:06d}"
            short = local.strftime("%H:%M:%S")
        extra = compact_json(e.data)
        data = f' <span class="muted event-data">{_e(extra)}</span>' if extra else ""
        out.append(
            f'\n        <tr>\n          <td data-label="Time" class="nowrap"><time datetime="'
            f'{_e(iso)}" title="{_e(title)}">{_e(short)}</time></td>\n'
            f'          <td data-label="Event"><span class="event-kind">{_e(e.kind)}</span></td>\n'
            f'          <td data-label="Step" class="mono">{_e(e.step_id)}</td>\n'
            f'          <td data-label="By" class="nowrap">{_e(e.actor)}</td>\n'
            f'          <td data-label="Message">{_e(e.message)}{data}</td>\n        </tr>\n      '
        )
    return mark_safe("".join(out))


def options(values: Iterable[Any]) -> SafeString:
    """``<option value="v">v</option>`` for each value (the fork form's steps)."""
    return mark_safe("".join(f'<option value="{v}">{v}</option>' for v in map(_e, values)))


def _csrf_input(csrf_token: Any) -> str:
    """What ``{% csrf_token %}`` renders for this token."""
    token = str(csrf_token) if csrf_token else ""
    if not token or token == "NOTPROVIDED":
        return ""
    return f'<input type="hidden" name="csrfmiddlewaretoken" value="{_e(token)}">'


def _error_part(error: Any, key: str) -> Any:
    if isinstance(error, dict):
        return error.get(key, "")
    return getattr(error, key, "")


def failed_rows(runs: Iterable[Any], may_operate: bool, csrf_token: Any) -> SafeString:
    """The ``<tr>`` of each failed run of the "needs attention" page (HTML, escaped)."""
    page = _Page()
    csrf = _csrf_input(csrf_token)
    out = []
    for run in runs:
        run_id = _e(run.id)
        iso, title = page.times(run.finished_at)
        when = (
            f'<time datetime="{_e(iso)}" title="{_e(title)}">{_e(ago(run.finished_at))}</time>'
            if run.finished_at
            else ""
        )
        message = _error_part(run.error, "message")
        error = (
            f'<span class="mono">{_e(_error_part(run.error, "type") or run.error_type)}</span>'
            + (f": {_e(Truncator(message).chars(200))}" if message else "")
        )
        out.append(
            f'\n        <tr>\n          <td data-label="Run"><a class="mono" href="'
            f'{_e(page.run_url(run.id))}">{_e(short_id(run.id))}</a> <span class="badge '
            f'status-{_e(run.status)}">{_e(_label(_STATUS_LABELS, run.status))}</span></td>\n'
            f'          <td data-label="Workflow">{_e(run.workflow_name)}<span class="muted">@'
            f"{_e(run.workflow_version)}</span></td>\n"
            f'          <td data-label="Failed">{when}</td>\n'
            f'          <td data-label="Error">{error}</td>\n          '
        )
        if may_operate:
            out.append('\n          <td data-label="Decide" class="row-actions">\n            ')
            if run.status == "failed":
                url = _e(reverse("dashboard:run_action", args=[run.id, "resume"]))
                out.append(
                    f'\n            <form method="post" action="{url}" hx-post="{url}" '
                    'hx-target="#attention" hx-swap="outerHTML" hx-confirm="Resume run '
                    f'{run_id}? Completed steps replay and the failed step runs again.">\n'
                    f'              {csrf}<input type="hidden" name="return_to" value="attention">'
                    '\n              <button type="submit" class="btn small primary">'
                    "Resume</button>"
                    "\n            </form>\n            "
                )
            url = _e(reverse("dashboard:run_action", args=[run.id, "compensate"]))
            out.append(
                f'\n            <form method="post" action="{url}" hx-post="{url}" '
                'hx-target="#attention" hx-swap="outerHTML" hx-confirm="Compensate run '
                f'{run_id}? Its completed writes are undone, newest first.">\n'
                f'              {csrf}<input type="hidden" name="return_to" value="attention">'
                '\n              <button type="submit" class="btn small warn">Compensate</button>'
                "\n            </form>\n          </td>\n          "
            )
        out.append("\n        </tr>\n      ")
    return mark_safe("".join(out))
