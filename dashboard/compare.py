"""Comparing two runs: ``GET /runs/compare/?a=<run id>&b=<run id>``.

The runs' header (workflow, version, status, duration), their inputs and outputs as JSON
diffs, and their steps side by side, paired by position (a fork replays its source's
steps at the same positions; a run of a changed workflow shows where the two went
apart). The *first divergence* is the first position where the step id, kind, tool or
status differ, or the input or output do; it is marked and linked at the top. Payloads
are shown as the run page shows them (redacted, decoded for display), and at most
:data:`MAX_STEPS` steps of each run are compared.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from approvals.access import require_perm
from approvals.roles import VIEW_RUN
from durable.models import Run, Step
from durable.queries.parsing import BadParameter, clean_text
from durable.values import codec

from . import selectors

#: steps of each run compared, at most (the rest is said, not shown)
MAX_STEPS = 500
#: lines of one diff shown, at most
MAX_DIFF_LINES = 200


@dataclass
class Pair:
    """One position of the two runs: ``a`` and ``b`` (a ``Step`` or ``None``), and what
    differs between them (``"id"``, ``"status"``, ``"input"``, ``"output"``)."""

    position: int
    a: Step | None
    b: Step | None
    differs: list[str]
    input_diff: list[str]
    output_diff: list[str]


def _shown(text: str | None) -> Any:
    if not text:
        return None
    try:
        return codec.decode_for_display(text)
    except (ValueError, TypeError):
        return "(cannot be shown)"


def _lines(value: Any) -> list[str]:
    if value is None:
        return []
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str).splitlines()


def diff(a: Any, b: Any) -> list[str]:
    """A unified diff of two JSON values (sorted keys; empty when equal), cut at
    :data:`MAX_DIFF_LINES` lines."""
    lines = list(difflib.unified_diff(_lines(a), _lines(b), "a", "b", lineterm="", n=2))
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"… {len(lines) - MAX_DIFF_LINES} more lines"]
    return lines


def _what(step: Step | None) -> tuple[Any, ...]:
    return (step.step_id, step.kind, step.tool_name) if step is not None else ()


def pairs(a: Run, b: Run) -> tuple[list[Pair], bool]:
    """The two runs' first :data:`MAX_STEPS` steps paired by position, and whether either
    has more."""
    steps_a = list(Step.objects.filter(run=a).order_by("position")[: MAX_STEPS + 1])
    steps_b = list(Step.objects.filter(run=b).order_by("position")[: MAX_STEPS + 1])
    truncated = len(steps_a) > MAX_STEPS or len(steps_b) > MAX_STEPS
    by_a = {s.position: s for s in steps_a[:MAX_STEPS]}
    by_b = {s.position: s for s in steps_b[:MAX_STEPS]}
    out = []
    for position in sorted(by_a.keys() | by_b.keys()):
        sa, sb = by_a.get(position), by_b.get(position)
        differs = []
        if _what(sa) != _what(sb):
            differs.append("id")
        if sa is not None and sb is not None and sa.status != sb.status:
            differs.append("status")
        in_a, in_b = (_shown(s.input) if s else None for s in (sa, sb))
        out_a, out_b = (_shown(s.output) if s else None for s in (sa, sb))
        input_diff = diff(in_a, in_b) if in_a != in_b else []
        output_diff = diff(out_a, out_b) if out_a != out_b else []
        if input_diff:
            differs.append("input")
        if output_diff:
            differs.append("output")
        out.append(Pair(position, sa, sb, differs, input_diff, output_diff))
    return out, truncated


def _run(request: HttpRequest, key: str) -> Run | None:
    value = request.GET.get(key, "")
    if not value:
        return None
    try:
        run_id = clean_text(value[:200])
    except BadParameter as exc:
        raise Http404(str(exc)) from None
    run = selectors.get_run(run_id)
    if run is None:
        raise Http404(f"There is no run with the id “{run_id}” (run {key}).")
    return run


@require_safe
@require_perm(VIEW_RUN)
def compare_runs(request: HttpRequest) -> HttpResponse:
    """Two runs side by side (see the module); a form to name them when one is missing."""
    a, b = _run(request, "a"), _run(request, "b")
    context: dict[str, Any] = {"nav": "runs", "a": a, "b": b}
    if a is None or b is None:
        context["a_id"] = request.GET.get("a", "")[:200]
        context["b_id"] = request.GET.get("b", "")[:200]
        return render(request, "dashboard/compare.html", context)
    rows, truncated = pairs(a, b)
    first = next((p for p in rows if p.differs), None)
    input_a, input_b = _shown(a.input), _shown(b.input)
    output_a, output_b = _shown(a.output), _shown(b.output)
    context.update(
        rows=rows,
        truncated=truncated,
        first=first,
        max_steps=MAX_STEPS,
        input_diff=diff(input_a, input_b),
        output_diff=diff(output_a, output_b),
        same_workflow=(a.workflow_name, a.workflow_version)
        == (b.workflow_name, b.workflow_version),
    )
    return render(request, "dashboard/compare.html", context)
