"""Template helpers of the dashboard: durations, the approvals badge, safety labels."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import template

from approvals.roles import DECIDE_APPROVAL

from .. import selectors

register = template.Library()

SAFETY_LABELS = {
    "read_only": "read-only",
    "idempotent_write": "idempotent write",
    "unsafe_write": "unsafe write",
}


@register.filter
def duration(value: Any) -> str:
    """A timedelta or seconds as "0.22 ms", "4.5 ms", "850 ms", "4.2 s", "3 min 5 s",
    "2 h 4 min", "3 d 5 h" (a step shorter than a millisecond is not "0 ms")."""
    if value is None or value == "":
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds <= 0:
        return "0 ms"
    if seconds < 0.01:
        return f"{seconds * 1000:.2g} ms"
    if seconds < 0.9995:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@register.filter
def safety_label(value: str) -> str:
    return SAFETY_LABELS.get(value or "", value or "")


@register.filter
def size_label(chars: int) -> str:
    """Characters as "1,234 characters" / "1.2 MB" (rough, for "show all")."""
    if chars >= 1_000_000:
        return f"{chars / 1_000_000:.1f} M characters"
    if chars >= 10_000:
        return f"{chars / 1000:.0f} k characters"
    return f"{chars:,} characters"


@register.simple_tag(takes_context=True)
def pending_approvals(context: template.Context) -> int | None:
    """Approvals the current user may decide and has not decided; None without the
    permission (then the navigation shows no badge). One query, cached per render."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.has_perm(DECIDE_APPROVAL):
        return None
    cache = getattr(request, "_dashboard_inbox_count", None)
    if cache is None:
        cache = selectors.inbox_count(user, cached=True)
        request._dashboard_inbox_count = cache
    return cache


@register.filter
def lookup(mapping: Any, key: Any) -> Any:
    """``counts|lookup:status``: a dict value by a variable key."""
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def compact_json(value: Any, limit: int = 300) -> str:
    """A JSON value on one line, cut at ``limit`` characters (for the event log)."""
    import json

    if value in (None, "", {}, []):
        return ""
    text = json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


@register.filter
def ago(value: Any) -> str:
    """How long ago a datetime was: "just now", "42 s ago", "5 min ago", "3 h ago",
    "2 d ago"; older than 30 days: the date."""
    from django.utils import timezone

    if not value:
        return "—"
    seconds = (timezone.now() - value).total_seconds()
    if seconds < 0:
        return "in " + since(value)
    if seconds < 5:
        return "just now"
    if seconds > 30 * 86400:
        return timezone.localtime(value).strftime("%Y-%m-%d")
    return since(value) + " ago"


@register.filter
def since(value: Any) -> str:
    """The time between a datetime and now, short: "42 s", "5 min", "3 h 10 min",
    "2 d 23 h" (whole units, cut, never rounded up; a zero last unit is left out: "2 d")."""
    from django.utils import timezone

    if not value:
        return "—"
    seconds = abs(int((timezone.now() - value).total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


#: the longest run id a table shows whole
SHORT_ID_MAX = 32


@register.filter
def short_id(value: Any) -> str:
    """A run id for tables: a UUID's first 8 characters, other ids up to 32 (a chosen id
    such as ``refund-ticket-4242-20261201`` is told apart by its middle, so it is kept
    whole when it can be)."""
    text = str(value or "")
    if len(text) == 36 and text.count("-") == 4:
        return text[:8] + "…"
    return text if len(text) <= SHORT_ID_MAX else text[: SHORT_ID_MAX - 1] + "…"


@register.simple_tag
def kept(refused: Any, *parts: Any) -> Any:
    """``{% kept refused "approval" r.pk as k %}``: the refused form's data and errors if
    it was this form (its key is the parts joined by "-"), else None."""
    if not isinstance(refused, dict):
        return None
    key = "-".join(str(p) for p in parts)
    return refused if refused.get("key") == key else None


@register.simple_tag
def looked_up(lookup: Any, op_pk: Any) -> Any:
    """``{% looked_up lookup op.pk as lk %}``: the "look it up again" answer if it is
    this operation's, else None."""
    return lookup if isinstance(lookup, dict) and lookup.get("op") == op_pk else None


@register.filter
def has_reconcile_hook(tool_name: str) -> bool:
    """Whether tool ``tool_name`` is registered here with a ``reconcile`` hook."""
    from durable import registry

    try:
        return registry.get_tool(tool_name).reconcile is not None
    except Exception:  # noqa: BLE001 - ToolNotFound: nothing to ask
        return False


@register.filter
def requesters_label(principals: Any) -> str:
    """A run's or request's requesters as text: ``"otto, os:alice and someone unknown"``."""
    from durable.requesters import describe

    return describe(principals if isinstance(principals, list) else [])
