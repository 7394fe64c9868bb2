"""Audit export: one run as a self-contained JSON document (and a readable HTML page).

Invariant: the document shows what the database recorded and nothing more secret than
the dashboard does. Every payload goes through :func:`durable.values.codec.decode_for_display`
(encrypted values become ``"[REDACTED]"``, nothing is decrypted) and every place a
value was redacted is listed under ``redactions``, so an auditor sees that something
was withheld and where. Upper layers add their sections (approval decisions) through
the ``run_exporting`` signal, so the engine does not import them.

Shape (``format`` ``"durable.run-export/1"``): ``run`` (header, input, output, error),
``steps`` (each with its failed ``attempts``), ``ledger`` (writes with idempotency keys,
external ids, resolution, ownership), ``waits`` (with who resolved them and when),
``signals``, ``compensation`` (the compensation steps and events), ``events`` (the
whole trace), the sections of receivers (``approvals``), and ``redactions``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.utils import timezone

from durable.exceptions import RunNotFound
from durable.hooks import run_exporting
from durable.models import Operation, Run, Signal, Step, StepAttempt, TraceEvent, Wait
from durable.values import codec
from durable.values.redaction import REDACTED
from durable.vocabulary import EventKind, StepKind

__all__ = ["FORMAT", "export_run", "redactions", "render_html", "template_context", "to_json"]

#: the document's format name and version
FORMAT = "durable.run-export/1"

#: event kinds that belong to compensation (listed again under ``compensation``)
COMPENSATION_EVENTS = (EventKind.COMPENSATING, EventKind.COMPENSATION_WAITING)


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return codec.decode_for_display(text)
    except ValueError:
        return {"undecodable": True, "chars": len(text)}


def export_run(run_id: str, *, by: str = "") -> dict[str, Any]:
    """The audit document of run ``run_id`` (shape: module docstring), JSON-able.

    ``by`` names who exported (kept in the document). Raises
    :class:`~durable.exceptions.RunNotFound`. Reads only; payloads are never decrypted.
    """
    run = Run.objects.filter(pk=str(run_id)).first()
    if run is None:
        raise RunNotFound(run_id)
    steps = list(Step.objects.filter(run=run).order_by("position"))
    attempts: dict[int, list[dict[str, Any]]] = {}
    for a in StepAttempt.objects.filter(run=run).order_by("step_id", "attempt"):
        attempts.setdefault(a.step_id, []).append(
            {
                "attempt": a.attempt,
                "outcome": a.outcome,
                "classification": a.classification,
                "error_type": a.error_type,
                "message": a.message,
                "traceback": a.traceback,
                "retry_delay_seconds": a.retry_delay,
                "started_at": _when(a.started_at),
                "finished_at": _when(a.finished_at),
            }
        )
    step_docs = [_step(s, attempts.get(s.pk, [])) for s in steps]
    events = [_event(e) for e in TraceEvent.objects.filter(run=run).order_by("id")]
    document: dict[str, Any] = {
        "format": FORMAT,
        "exported_at": _when(timezone.now()),
        "exported_by": by,
        "run": _run(run),
        "steps": step_docs,
        "ledger": [
            _operation(op) for op in Operation.objects.filter(run=run).order_by("created_at", "pk")
        ]
        + [
            {**_operation(op), "adopted_from_run": op.run_id}
            for op in Operation.objects.filter(owner_run=run)
            .exclude(run=run)
            .order_by("created_at", "pk")
        ],
        "waits": [_wait(w) for w in Wait.objects.filter(run=run).order_by("position", "pk")],
        "signals": [_signal(s) for s in Signal.objects.filter(run=run).order_by("id")],
        "compensation": {
            "steps": [d for d in step_docs if d["kind"] == StepKind.COMPENSATION],
            "events": [e for e in events if e["kind"] in COMPENSATION_EVENTS],
        },
        "events": events,
    }
    for _receiver, sections in run_exporting.send(sender=Run, run=run):
        if isinstance(sections, dict):
            document.update(sections)
    document["redactions"] = redactions(document)
    return document


def _run(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "workflow": run.workflow_name,
        "version": run.workflow_version,
        "status": run.status,
        "started_by": run.starter_label,
        "requesters": run.requesters,
        "tags": run.tags,
        "forked_from": run.forked_from_id,
        "parent_run": run.parent_run_id,
        "trace_id": run.trace_id or None,
        "created_at": _when(run.created_at),
        "started_at": _when(run.started_at),
        "finished_at": _when(run.finished_at),
        "input": _payload(run.input),
        "output": _payload(run.output),
        "error": run.error,
        "tokens_used": run.tokens_used,
        "steps_executed": run.steps_executed,
        "steps_replayed": run.steps_replayed,
    }


def _step(s: Step, attempts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "position": s.position,
        "step_id": s.step_id,
        "kind": s.kind,
        "tool": s.tool_name,
        "status": s.status,
        "durability": s.durability,
        "attempts": s.attempts,
        "replay_count": s.replay_count,
        "started_at": _when(s.started_at),
        "finished_at": _when(s.finished_at),
        "input": _payload(s.input),
        "output": _payload(s.output),
        "error": s.error,
        "failed_attempts": attempts,
    }


def _operation(op: Operation) -> dict[str, Any]:
    return {
        "idempotency_key": op.idempotency_key,
        "step_id": op.step_id,
        "tool": op.tool_name,
        "safety": op.safety,
        "status": op.status,
        "external_id": op.external_id,
        "params": _payload(op.params),
        "result": _payload(op.result),
        "error": op.error,
        "attempts": op.attempts,
        "resolved_by": op.resolved_by,
        "resolution": op.resolution,
        "owner_run": op.owner_id,
        "owners": op.owners,
        "created_at": _when(op.created_at),
        "updated_at": _when(op.updated_at),
    }


def _wait(w: Wait) -> dict[str, Any]:
    return {
        "wait_id": w.wait_id,
        "position": w.position,
        "kind": w.kind,
        "key": w.key,
        "status": w.status,
        "title": w.title,
        "payload": _payload(w.payload),
        "result": _payload(w.result),
        "created_at": _when(w.created_at),
        "wake_at": _when(w.wake_at),
        "resolved_at": _when(w.resolved_at),
        "resolved_by": w.resolved_by,
    }


def _signal(s: Signal) -> dict[str, Any]:
    return {
        "name": s.name,
        "payload": _payload(s.payload),
        "sent_by": s.sent_by,
        "dedupe_key": s.dedupe_key,
        "created_at": _when(s.created_at),
        "consumed_at": _when(s.consumed_at),
    }


def _event(e: TraceEvent) -> dict[str, Any]:
    return {
        "id": e.pk,
        "kind": e.kind,
        "step_id": e.step_id,
        "message": e.message,
        "actor": e.actor,
        "data": e.data,
        "created_at": _when(e.created_at),
    }


def redactions(document: Any, path: str = "") -> list[str]:
    """The paths (``steps[2].input.api_key``) of every value in ``document`` shown as
    ``[REDACTED]`` or holding it in its text, in document order."""
    found: list[str] = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "redactions":
                continue
            found += redactions(value, f"{path}.{key}" if path else str(key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            found += redactions(value, f"{path}[{i}]")
    elif isinstance(document, str) and REDACTED in document:
        found.append(path)
    return found


def to_json(document: dict[str, Any]) -> str:
    """The document as indented JSON text (UTF-8, keys in document order)."""
    return json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n"


def render_html(document: dict[str, Any]) -> str:
    """The document as a whole, self-contained HTML page (no inline style, which the
    CSP test forbids: tables carry border attributes; every
    value escaped by the template); a page of the dashboard includes
    ``durable/export_body.html`` with :func:`template_context` instead."""
    from django.template.loader import render_to_string

    return render_to_string("durable/export_page.html", template_context(document))


def template_context(document: dict[str, Any]) -> dict[str, Any]:
    """``{"doc": ..., "format": ...}`` for ``durable/export_body.html``: the document
    with each nested payload as indented JSON text."""
    return {"doc": _shown(document), "format": FORMAT}


def _shown(value: Any, top: bool = True) -> Any:
    """The document for the template: in each row, a nested value (a payload, an error)
    becomes indented JSON text and ``None`` an empty string; the lists of rows stay."""
    if isinstance(value, dict):
        return {k: _shown(v, top=False) for k, v in value.items()} if top else _cell_row(value)
    if isinstance(value, list):
        return [_shown(v, top=top) for v in value]
    return value


def _cell_row(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in ROW_LISTS and isinstance(value, list):
            out[key] = [_cell_row(v) if isinstance(v, dict) else v for v in value]
        elif isinstance(value, dict | list):
            out[key] = json.dumps(value, indent=2, ensure_ascii=False, default=str)
        else:
            out[key] = "" if value is None else value
    return out


#: keys whose value is a list of rows (rendered as tables, not as JSON text)
ROW_LISTS = ("failed_attempts", "steps", "events", "decisions")
