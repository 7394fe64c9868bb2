"""A run's step timeline, rendered in Python rather than by one ``{% include %}`` a step.

A run page shows up to 100 steps (the first and last 50); through the template engine
each cost about 1.5 ms (the include, ~40 variable lookups, two ``{% url %}``). The common
parts of a step (its head, bar, error and payload links) are built here with the
template's escaping and filters; the rarer parts with many cases, a step's operation and
its attempts, are still the templates ``_step_op.html`` and ``_step_attempts.html``. The
HTML is the one ``_step.html`` made, byte for byte (tests/dashboard/test_rows.py compares
it with that template, kept in tests/dashboard/reference/).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.template.loader import get_template
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from durable.models import StepKind, StepStatus

from .rows import _e, _label
from .templatetags.dashboard_tags import duration, safety_label, size_label

__all__ = ["step_rows"]

_KIND_LABELS = {str(value): str(label) for value, label in StepKind.choices}
_STATUS_LABELS = {str(value): str(label) for value, label in StepStatus.choices}
#: a payload key the URL pattern accepts and no run id can hold after the run id's place
_PK_MARKER = "918273645546372819"


#: the marker of a step whose checkpoint was group-committed (durable/runtime/batching.py)
_BATCHED = (
    '<span class="batched" title="Batched checkpoint: committed together with the steps '
    'around it; a crash before that commit runs it again">batched</span>'
)


def _group(row: Any) -> str:
    """The marker of a call of a parallel group (durable/runtime/parallel.py)."""
    size = row.group_size
    return (
        '<span class="group" title="Parallel group: its calls ran concurrently; their '
        f'checkpoints are in list order">parallel group {_e(row.group)} · {_e(size)} '
        f"call{'' if size == 1 else 's'}</span>"
    )


def _stringformat(value: Any) -> str:
    """``value|stringformat:'.2f'``: "" for what ``%.2f`` refuses."""
    try:
        return "%.2f" % value  # noqa: UP031 - the filter's own formatting
    except (ValueError, TypeError):
        return ""


def _error_dict_value(error: Any, key: str) -> Any:
    """``s.error.<key>`` as the template resolves it: a dict's key, else "" (invalid)."""
    if isinstance(error, dict):
        return error.get(key, "")
    return getattr(error, key, "")


class _Links:
    """The payload links of one run's steps, reversed once per kind."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.heads: dict[str, tuple[str, str]] = {}

    def payload(self, kind: str, pk: Any) -> str:
        if kind not in self.heads:
            url = reverse("dashboard:payload", args=[self.run_id, kind, _PK_MARKER])
            head, _, tail = url.rpartition(_PK_MARKER)
            self.heads[kind] = (head, tail)
        head, tail = self.heads[kind]
        if isinstance(pk, int) and pk >= 0 and len(str(pk)) <= 18:
            return head + str(pk) + tail
        return reverse("dashboard:payload", args=[self.run_id, kind, pk])


def _payload_cell(links: _Links, title: str, kind: str, what: str, s: Any, p: Any) -> str:
    if p.empty:
        return f'<div><h3>{title}</h3><p class="muted">—</p></div>'
    link = _e(links.payload(kind, s.pk))
    return (
        f'<div><h3>{title}</h3><div class="payload" id="payload-{kind}-{_e(s.pk)}" '
        f'hx-get="{link}" hx-trigger="toggle once from:closest details" hx-swap="outerHTML">'
        f'<a href="{link}">Show the {what}</a> <span class="muted">'
        f"({_e(size_label(p.size))})</span></div></div>"
    )


def _step(row: Any, run: Any, links: _Links, op_template: Any, attempts_template: Any) -> str:
    s = row.step
    op = row.operation
    pk = _e(s.pk)
    status = _e(s.status)
    out = [
        f'\n<li class="step step-{status}" id="step-{pk}">\n<div class="step-head">\n'
        f'<span class="pos" title="Position">#{_e(s.position)}</span>\n'
        f'<span class="kind">{_e(_label(_KIND_LABELS, s.kind))}</span>\n'
        f'<span class="mono step-id">{_e(s.step_id)}</span>\n'
    ]
    if s.tool_name and s.tool_name != s.step_id:
        out.append(f'<span class="tool mono">{_e(s.tool_name)}</span>')
    out.append("\n")
    if row.child:  # a ctx.start_child step: the child run it started
        link = _e(reverse("dashboard:run", args=[row.child]))
        out.append(f'<a class="mono child-run" href="{link}" title="Child run">{_e(row.child)}</a>')
    out.append("\n")
    if row.safety:
        out.append(
            f'<span class="safety safety-{_e(row.safety)}">{_e(safety_label(row.safety))}</span>'
        )
    out.append("\n")
    if s.durability == "batched":
        out.append(_BATCHED)
    out.append("\n")
    if row.group:
        out.append(_group(row))
    if s.replay_count:
        executed = f"replayed {_e(s.replay_count)}×"
    elif s.attempts:
        executed = "executed"
    else:
        executed = "recorded"
    out.append(
        f'\n<span class="badge status-{status}">{_e(_label(_STATUS_LABELS, s.status))}</span>\n'
        f'<span class="exec">{executed}</span>\n'
        f'<span class="dur">{_e(duration(s.duration))}</span>\n</div>\n'
        '<svg class="bar" aria-hidden="true" focusable="false" viewBox="0 0 100 6" '
        f'preserveAspectRatio="none"><rect x="{_e(_stringformat(row.bar_left))}" '
        f'width="{_e(_stringformat(row.bar_width))}" height="6"/></svg>\n'
    )
    if s.error:
        classification = _error_dict_value(s.error, "classification")
        out.append(
            f'\n<p class="step-error"><span class="mono">{_e(_error_dict_value(s.error, "type"))}'
            "</span>"
        )
        if classification:
            c = _e(classification)
            out.append(f' <span class="class class-{c}">{c}</span>')
        out.append(f": {_e(_error_dict_value(s.error, 'message'))}</p>\n")
    out.append("\n")
    context = {"s": s, "op": op, "row": row, "run": run}
    if op:
        out.append("\n" + op_template.render(context).strip() + "\n")
    out.append('\n<div class="step-more">\n')
    if row.attempts or s.attempts > 1:
        out.append("\n" + attempts_template.render(context).strip() + "\n")
    out.append("\n")
    if not row.input.empty or not row.output.empty:
        out.append(
            f'\n<details class="io-step" id="io-{pk}">\n<summary>Input and output</summary>\n'
            '<div class="io-grid">\n'
            + _payload_cell(links, "Input", "step-input", "input", s, row.input)
            + "\n"
            + _payload_cell(links, "Output", "step-output", "output", s, row.output)
            + "\n</div>\n</details>\n"
        )
    out.append("\n</div>\n</li>\n\n")
    return "".join(out)


def step_rows(rows: Iterable[Any], run: Any) -> SafeString:
    """The ``<li>`` of each :class:`dashboard.selectors.StepRow` of ``run``'s timeline,
    as ``_step.html`` rendered them (HTML, every value escaped)."""
    links = _Links(run.id)
    op_template = get_template("dashboard/_step_op.html")
    attempts_template = get_template("dashboard/_step_attempts.html")
    # every value is escaped by _e or by the templates
    return mark_safe(
        "".join(_step(row, run, links, op_template, attempts_template) for row in rows)
    )
