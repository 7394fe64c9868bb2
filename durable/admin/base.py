"""The admin's shared pieces: the read-only base classes and payload rendering.

Every history admin derives from :class:`ReadOnlyAdmin` (no add, change or delete: the
history changes through :mod:`durable.services.runs`) and shows payload columns through
:func:`shown`, which decodes with :func:`durable.values.codec.decode_for_display`, escapes and
never decrypts. Apart so each admin module imports these without importing the others.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from durable.values import codec

#: characters of a pretty-printed payload shown before it is cut
PAYLOAD_DISPLAY_CHARS = 100_000

#: styled by durable/static/durable/admin.css (no inline style: the CSP forbids it)
_PRE = "durable-payload"


# --- display helpers -----------------------------------------------------------------


def pre_html(text: str) -> SafeString:
    """``text`` escaped in a ``<pre>``, cut after :data:`PAYLOAD_DISPLAY_CHARS`."""
    if len(text) > PAYLOAD_DISPLAY_CHARS:
        text = text[:PAYLOAD_DISPLAY_CHARS] + f"\n… cut: {len(text)} characters in all"
    return format_html('<pre class="{}">{}</pre>', _PRE, text)


def payload_html(text: str | None) -> SafeString | str:
    """A stored payload, pretty-printed and escaped; redacted values stay redacted."""
    if text is None:
        return "-"
    try:
        value = codec.decode_for_display(text)
    except ValueError as exc:
        return format_html("<em>unreadable payload: {}</em>", str(exc))
    return pre_html(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def json_html(value: Any) -> SafeString | str:
    """A JSON column (errors, event data), pretty-printed and escaped."""
    if value is None:
        return "-"
    return pre_html(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def first_line(text: str | None, limit: int = 100) -> str:
    """The first line of ``text`` for a list column, cut at ``limit`` characters."""
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _run_link(run_id: str) -> SafeString:
    url = reverse("admin:durable_run_change", args=[run_id])
    return format_html('<a href="{}">{}</a>', url, run_id)


# --- read-only base ------------------------------------------------------------------


def shown(field: str, *, json_field: bool = False, description: str | None = None) -> Any:
    """A read-only admin display of a payload column: decoded for display (never
    decrypted) and escaped, pretty-printed."""
    render = json_html if json_field else payload_html

    @admin.display(description=description or field.replace("_", " "))
    def display(self: Any, obj: Any) -> SafeString | str:
        return render(getattr(obj, field))

    return display


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewing only: the history changes through services, never through a form.

    Lists are newest first (by primary key, which is indexed); a list filtered to one run
    (``?run__id__exact=...``) is in the run's own order, ``run_ordering``.
    """

    show_full_result_count = False
    list_per_page = 50
    ordering: ClassVar[tuple[str, ...]] = ("-pk",)
    run_ordering: tuple[str, ...] = ("pk",)

    def get_ordering(self, request: HttpRequest) -> list[str] | tuple[str, ...]:
        if "run__id__exact" in request.GET:
            return self.run_ordering
        return super().get_ordering(request)

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: Any) -> SafeString:
        """A link to the row's run (every history row belongs to one)."""
        return _run_link(obj.run_id)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
