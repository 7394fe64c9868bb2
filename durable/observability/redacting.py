"""Spans leave the process redacted (docs/security.md#telemetry-and-logs).

:class:`RedactingSpanProcessor` sits between the provider and the exporting processor
that :func:`durable.observability.otel.configure` installs: every ended span -- the
engine's (``durable.start``, ``durable.run``, ``durable.step``, ``chat <model>``) and
the Django and Celery instrumentations' -- is passed on as a copy whose name,
attributes, events' attributes (an ``exception`` event's message and stacktrace), links'
attributes and status description went through the redaction of stored values
(:mod:`durable.values.redaction`):

- an attribute whose key's last dotted segment is a secret key
  (:func:`~durable.values.redaction.is_secret_key`: ``http.request.header.authorization``,
  ``...x_api_key``, ``...cookie``) reads ``[REDACTED]``, whatever its type;
- every other string (and string in a sequence) goes through
  :func:`~durable.values.redaction.redact_text`: ``REDACT_PATTERNS`` matches (``sk-...``,
  ``Authorization: ...``, ``Bearer``/``Basic`` credentials, ``user:password@`` in a URL),
  secret-named URL parameters, and the secrets the run knows by value.

It redacts in ``on_end``, in the thread that ends the span, so the secrets a run knows
(a context variable, :func:`~durable.values.redaction.secrets_scope`) are still known:
an exporter's batch thread would not see them. A span is read-only by then, hence the
copy (the pattern of OpenTelemetry's own processors that change what is exported: wrap
the next processor). A span with nothing to redact is passed on as it is. A span whose
redaction fails is dropped, not exported in clear.

This module imports the OpenTelemetry SDK: only :mod:`durable.observability.otel` imports
it, once the ``durable[otel]`` extra is known to be installed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import Link, Status
from opentelemetry.util.types import Attributes

from durable.values.redaction import REDACTED, is_secret_key, redact_text

__all__ = ["RedactingSpanProcessor", "redacted_span"]

logger = logging.getLogger("durable.otel")


def _secret_key(key: str) -> bool:
    """``http.request.header.x_api_key`` -> ``x_api_key`` is secret; the last segment
    only, so ``gen_ai.usage.input_tokens`` stays (``input_tokens`` is allowed)."""
    return is_secret_key(key.rsplit(".", 1)[-1])


def _value(key: str, value: Any) -> Any:
    if _secret_key(key):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: _value(k, v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        return tuple(redact_text(v) if isinstance(v, str) else v for v in value)
    return value


def _attributes(attributes: Attributes, dropped: int = 0) -> Attributes | None:
    """``attributes`` redacted, or ``None`` when nothing in them changes; ``dropped``
    (the count the SDK's limits dropped, which exporters send) is kept."""
    if not attributes:
        return None
    changed = {key: _value(key, value) for key, value in attributes.items()}
    if all(_same(changed[key], value) for key, value in attributes.items()):
        return None
    if not dropped:
        return changed
    bounded = BoundedAttributes(attributes=changed, immutable=True)
    bounded.dropped = dropped
    return bounded


def _same(new: Any, old: Any) -> bool:
    if isinstance(old, Mapping):
        return isinstance(new, Mapping) and all(_same(new.get(k), v) for k, v in old.items())
    if isinstance(old, Sequence) and not isinstance(old, str | bytes):
        return not isinstance(new, str) and tuple(new) == tuple(old)
    return bool(new == old)


def _counted(items: list[Any], dropped: int) -> Sequence[Any]:
    """``items``, keeping the original span's count of dropped ones."""
    if not dropped:
        return tuple(items)
    bounded: BoundedList = BoundedList.from_seq(None, items)
    bounded.dropped = dropped
    return bounded


def redacted_span(span: ReadableSpan) -> ReadableSpan:
    """``span``, or a copy of it with its secrets blanked out (module docstring)."""
    name = redact_text(span.name)
    attributes = _attributes(span.attributes, span.dropped_attributes)
    events = [(e, _attributes(e.attributes, e.dropped_attributes)) for e in span.events]
    links = [(link, _attributes(link.attributes, link.dropped_attributes)) for link in span.links]
    status = span.status
    if status.description:
        description = redact_text(status.description)
        if description != status.description:
            status = Status(status.status_code, description)
    if (
        name == span.name
        and attributes is None
        and all(new is None for _, new in events + links)
        and status is span.status
    ):
        return span
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=span.attributes if attributes is None else attributes,
        events=_counted(
            [e if new is None else Event(e.name, new, e.timestamp) for e, new in events],
            span.dropped_events,
        ),
        links=_counted(
            [link if new is None else Link(link.context, new) for link, new in links],
            span.dropped_links,
        ),
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class RedactingSpanProcessor(SpanProcessor):
    """Passes each ended span to ``inner`` (the exporting processor) redacted."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            clean = redacted_span(span)
        except Exception:  # noqa: BLE001 - telemetry never changes what the engine does
            logger.warning("a span was dropped: redacting it failed", exc_info=True)
            return
        self.inner.on_end(clean)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
