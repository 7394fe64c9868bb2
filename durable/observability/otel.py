"""Turning OpenTelemetry on (docs/observability.md#tracing): off unless configured.

With ``DURABLE['OTEL']`` true (``DURABLE_OTEL=1``) and the ``durable[otel]`` extra
installed, :func:`configure` installs an SDK ``TracerProvider`` named by
``OTEL_SERVICE_NAME`` (default ``durable``) that exports through OTLP/HTTP (the standard
``OTEL_EXPORTER_OTLP_*`` variables), and the official Django and Celery
instrumentations: a request's span is the parent of the ``durable.start`` it makes, and
the Celery instrumentation carries the trace context in the task message to the worker,
whose ``durable.run`` span joins it. A prefork child configures itself again after the
fork (an exporter's thread does not survive one). Without the setting nothing is
installed and the engine's spans are the API's no-ops.

Every span is exported redacted, the instrumentations' too: the exporting processor sits
behind :class:`~durable.observability.redacting.RedactingSpanProcessor`, which blanks
secrets out of names, attributes, exception events and status descriptions with the
redaction of stored values.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from durable import conf

logger = logging.getLogger("durable.otel")

_configured_pid = 0


def enabled() -> bool:
    return bool(conf.get("OTEL"))


def configure(exporter: Any = None) -> bool:
    """Install the provider and the instrumentations once per process; ``exporter``
    replaces OTLP (tests pass an in-memory one). Returns whether tracing is on."""
    global _configured_pid
    if _configured_pid == os.getpid():
        return True
    try:
        from opentelemetry import trace
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.instrumentation.django import DjangoInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError as exc:
        logger.warning("DURABLE_OTEL is set but %s; pip install 'durable[otel]'", exc)
        return False
    from durable.observability.redacting import RedactingSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "durable")})
    )
    if exporter is not None:
        provider.add_span_processor(RedactingSpanProcessor(SimpleSpanProcessor(exporter)))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporting = BatchSpanProcessor(OTLPSpanExporter())
            provider.add_span_processor(RedactingSpanProcessor(exporting))
        except ImportError:
            logger.warning("no OTLP exporter installed: spans are made but not exported")
    trace.set_tracer_provider(provider)
    if not DjangoInstrumentor().is_instrumented_by_opentelemetry:
        DjangoInstrumentor().instrument()
    if not CeleryInstrumentor().is_instrumented_by_opentelemetry:
        CeleryInstrumentor().instrument()
    _configured_pid = os.getpid()
    return True


def trace_url(trace_id: str) -> str:
    """``DURABLE['TRACE_URL']`` with ``{trace_id}`` filled in (the run page's link to
    the tracing system), or ``""`` when either is empty."""
    template = str(conf.get("TRACE_URL") or "")
    return template.replace("{trace_id}", trace_id) if template and trace_id else ""


def trace_url_errors(template: str) -> list[str]:
    """What is wrong with a ``TRACE_URL`` template (checked at start, durable.E009)."""
    if not template:
        return []
    problems = []
    if not template.startswith(("http://", "https://")):
        problems.append("it must start with http:// or https://")
    if "{trace_id}" not in template:
        problems.append("it must contain {trace_id}")
    return problems


def _after_fork(**kwargs: Any) -> None:  # pragma: no cover - a Celery prefork child
    if enabled():
        configure()


def connect() -> None:
    """Configure now when enabled, and again in each Celery prefork child."""
    if not enabled():
        return
    from celery.signals import worker_process_init

    worker_process_init.connect(_after_fork, weak=False, dispatch_uid="durable.otel")
    configure()
