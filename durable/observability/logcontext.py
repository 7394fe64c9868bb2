"""Structured logs (docs/observability.md#logs): every log line says which run, step and
attempt it is about, and never carries a secret.

The engine binds ``run_id`` while it executes a run and ``step_id`` / ``attempt`` while
a step's try runs (:func:`bound`, a context variable, so threads and Celery tasks do not
mix them up). :class:`ContextFilter`, on the handler, copies them onto every record
(``-`` when unbound); the formatters (:class:`RedactingFormatter`, and
:class:`JsonFormatter` with ``DURABLE_LOG_FORMAT=json``: one JSON object per line) blank
secrets out of the message and its traceback with :func:`durable.values.redaction.redact_text`,
the same patterns as everything stored.
This module imports nothing of the engine at import time: logging is configured before
the Django apps are.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any

__all__ = ["FIELDS", "ContextFilter", "JsonFormatter", "RedactingFormatter", "bound", "current"]

#: the fields bound on log records, in the order they are shown
FIELDS = ("run_id", "step_id", "attempt")

_context: ContextVar[dict[str, Any] | None] = ContextVar("durable_log_context", default=None)


class bound:
    """Bind ``fields`` (``run_id=``, ``step_id=``, ``attempt=``) to every log record
    made inside the ``with`` block, over what an outer block bound; ``None`` values are
    ignored. A class, not a generator: every try of a step enters one (a generator
    context manager costs it ~3 us more)."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any) -> None:
        self._fields = fields
        self._token: Token[dict[str, Any] | None] | None = None

    def __enter__(self) -> None:
        outer = _context.get() or {}
        self._token = _context.set(
            {**outer, **{k: v for k, v in self._fields.items() if v is not None}}
        )

    def __exit__(self, *exc_info: object) -> None:
        assert self._token is not None
        _context.reset(self._token)
        self._token = None


def current() -> dict[str, Any]:
    """The fields bound now (a copy)."""
    return dict(_context.get() or {})


def _redact(text: str) -> str:
    try:
        from durable.values.redaction import redact_text

        return redact_text(text)
    except Exception:  # noqa: BLE001 - settings not ready: a log line must still go out
        return text


class ContextFilter(logging.Filter):
    """Puts the bound fields on the record (``-`` when unbound). It leaves the message
    and its arguments alone: other handlers (a test's capture) see the record as made;
    the formatters redact what they write."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound_now = _context.get() or {}
        for name in FIELDS:
            if getattr(record, name, None) in (None, "-"):
                setattr(record, name, bound_now.get(name, "-"))
        return True


#: Celery's loggers of a task's receipt and end, and of beat sending one
_TASK_LOGGERS = frozenset({"celery.worker.strategy", "celery.app.trace", "celery.beat"})


class HousekeepingFilter(logging.Filter):
    """Drops Celery's INFO lines about the periodic housekeeping tasks of
    ``CELERY_BEAT_SCHEDULE`` (the sweep, schedule and webhook ticks every few seconds:
    "received", "succeeded in ...", beat's "Sending due task"), nine lines every five
    seconds that bury the lines about runs. Their warnings and errors go through, and so
    do their own log lines (``durable sweep: {...}`` when a sweep did something). With
    ``DJANGO_LOG_LEVEL=DEBUG`` nothing is dropped."""

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._tasks: tuple[str, ...] | None = None

    def _housekeeping(self) -> tuple[str, ...]:
        if self._tasks is None:
            try:
                from django.conf import settings

                schedule = getattr(settings, "CELERY_BEAT_SCHEDULE", {}) or {}
                self._tasks = tuple(
                    f"{entry['task']}[" for entry in schedule.values() if "task" in entry
                ) + tuple(f"Sending due task {name} " for name in schedule)
            except Exception:  # noqa: BLE001 - settings not ready: drop nothing
                return ()
        return self._tasks

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or record.name not in _TASK_LOGGERS:
            return True
        if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
            return True
        message = record.getMessage()
        return not any(marker in message for marker in self._housekeeping())


class RedactingFormatter(logging.Formatter):
    """A plain ``logging.Formatter`` whose whole output (message and traceback) goes
    through :func:`durable.values.redaction.redact_text`."""

    def format(self, record: logging.LogRecord) -> str:
        for name in FIELDS:  # a handler without the filter: still formattable
            if not hasattr(record, name):
                setattr(record, name, "-")
        return _redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``{"ts", "level", "logger", "message", "run_id",
    "step_id", "attempt"}`` plus ``"exc"`` (the redacted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": _redact(record.getMessage()),
        }
        for name in FIELDS:
            value = getattr(record, name, "-")
            doc[name] = None if value == "-" else value
        if record.exc_info:
            doc["exc"] = _redact(self.formatException(record.exc_info))
        elif record.exc_text:
            doc["exc"] = _redact(record.exc_text)
        return json.dumps(doc, ensure_ascii=False, default=str)
