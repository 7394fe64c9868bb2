"""Stored payloads prepared for humans, and the "show all" endpoint's lookup.

A payload is shown with :func:`durable.values.codec.decode_for_display`, never ``decode``: the
dashboard must not decrypt secrets, so they read as [REDACTED]. Long payloads are cut to
a preview; the whole text is fetched by kind and id, and only from the run named in the
URL (:data:`PAYLOAD_FIELDS` is the closed list of what may be fetched).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from approvals.models import ApprovalRequest
from durable.models import Operation, Run, Signal, Step, Wait
from durable.queries.parsing import BadParameter, parse_int
from durable.values import codec

#: characters of a payload shown before "show all"
PAYLOAD_PREVIEW_CHARS = 2000
#: characters of a step's input or output shown (collapsed) before "show all"
STEP_PAYLOAD_PREVIEW_CHARS = 500


@dataclass
class Payload:
    """A stored payload prepared for humans: pretty JSON, secrets shown as [REDACTED]."""

    text: str
    truncated: bool
    size: int
    empty: bool = False


def display_value(text: str | None) -> str:
    """Pretty-print codec text with :func:`durable.values.codec.decode_for_display` (never
    ``decode``: that would decrypt secrets). Text that is not JSON is shown as it is."""
    if text is None:
        return ""
    try:
        value = codec.decode_for_display(text)
    except ValueError:
        return str(text)
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def payload(text: str | None, *, limit: int | None = PAYLOAD_PREVIEW_CHARS) -> Payload:
    if text is None:
        return Payload(text="", truncated=False, size=0, empty=True)
    shown = display_value(text)
    size = len(shown)
    if limit is not None and size > limit:
        return Payload(text=shown[:limit], truncated=True, size=size)
    return Payload(text=shown, truncated=False, size=size)


def json_payload(value: Any, *, limit: int | None = PAYLOAD_PREVIEW_CHARS) -> Payload:
    """A payload already decoded (a JSONField, e.g. a step's error dict)."""
    if value is None:
        return Payload(text="", truncated=False, size=0, empty=True)
    shown = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if limit is not None and len(shown) > limit:
        return Payload(text=shown[:limit], truncated=True, size=len(shown))
    return Payload(text=shown, truncated=False, size=len(shown))


#: kind of payload -> (model, field); the "show all" link names one of these
PAYLOAD_FIELDS: dict[str, tuple[type, str]] = {
    "run-input": (Run, "input"),
    "run-output": (Run, "output"),
    "step-input": (Step, "input"),
    "step-output": (Step, "output"),
    "op-params": (Operation, "params"),
    "op-result": (Operation, "result"),
    "wait-payload": (Wait, "payload"),
    "wait-result": (Wait, "result"),
    "approval-payload": (ApprovalRequest, "payload"),
    "signal-payload": (Signal, "payload"),
}


def full_payload(run_id: str, kind: str, pk: str) -> Payload | None:
    """The whole payload ``kind`` of object ``pk`` belonging to run ``run_id``; None if
    there is no such object (or it belongs to another run)."""
    if kind not in PAYLOAD_FIELDS:
        return None
    model, field_name = PAYLOAD_FIELDS[kind]
    if model is Run:
        qs = Run.objects.filter(pk=run_id)
    else:
        try:
            number = parse_int(str(pk), what="The id")
        except BadParameter:
            return None
        if number is None:
            return None
        qs = model.objects.filter(pk=number, run_id=run_id)
    row = qs.values_list(field_name, flat=True)
    found = list(row[:1])
    if not found:
        return None
    return payload(found[0], limit=None)
