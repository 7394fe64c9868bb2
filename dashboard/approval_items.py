"""The approvals inbox's requests, the plain ones rendered in Python.

The inbox shows up to 50 requests; through the template engine each cost about 2 ms.
A plain request (no edited arguments, no re-ask, no four-eyes note, no edit box, no
refused form to show again) is built here with the template's escaping and filters;
any other goes through ``_approval.html``, which stays the one definition of the markup
(tests/dashboard/test_rows.py checks that both give the same HTML, byte for byte).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.template.loader import get_template
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from durable.models import StepStatus

from .rows import _csrf_input, _e, _label, _Page
from .templatetags.dashboard_tags import ago, kept, safety_label, size_label

__all__ = ["approval_items"]

_STEP_LABELS = {str(value): str(label) for value, label in StepStatus.choices}


def _plain(item: Any, k: Any) -> bool:
    r = item.request
    return not (
        item.reasked
        or item.diff
        or k
        or item.own
        or r.allow_edit
        or (r.four_eyes and r.requester_unknown)
    )


def _payload(p: Any, kind: str, pk: Any, run_id: str) -> str:
    """``_payload.html`` (then its include's indentation)."""
    if p.empty:
        return '<p class="muted">—</p>\n'
    out = [
        f'\n<div class="payload" id="payload-{kind}-{_e(pk)}">\n  <pre tabindex="0"><code>',
        _e(p.text),
        "</code></pre>\n  ",
    ]
    if p.truncated:
        url = _e(reverse("dashboard:payload", args=[run_id, kind, pk]))
        out.append(
            f'\n    <p class="truncated">Showing the first {_e(size_label(len(p.text)))} of '
            f'{_e(size_label(p.size))}.\n      <a href="{url}" hx-get="{url}" '
            f'hx-target="#payload-{kind}-{_e(pk)}" hx-swap="outerHTML">Show all</a></p>\n  '
        )
    out.append("\n</div>\n\n")
    return "".join(out)


def _item(page: _Page, item: Any, csrf: str) -> str:
    r = item.request
    pk = _e(r.pk)
    expired = item.expired
    out = [
        f'\n  <article class="card approval{" is-expired" if expired else ""}" id="approval-{pk}" '
        f'aria-labelledby="approval-{pk}-title" data-approval>\n    <header class="approval-head">'
        f'\n      <h2 id="approval-{pk}-title">{_e(r.title)}</h2>\n'
        '      <div class="chips">\n        '
    ]
    if r.tool_name:
        out.append(f'<span class="tool mono">{_e(r.tool_name)}</span>')
    out.append("\n        ")
    if r.safety:
        out.append(
            f'<span class="safety safety-{_e(r.safety)}">{_e(safety_label(r.safety))}</span>'
        )
    out.append("\n        ")
    if r.expires_at:
        _, title = page.times(r.expires_at)
        shown = (
            _e(item.expired_text)
            if expired
            else f"expires {_e(ago(r.expires_at))}, then {_e(item.timeout_then)}"
        )
        out.append(
            f'<span class="expires" data-countdown data-deadline="{_e(item.deadline_ms)}" '
            f'data-then="{_e(item.timeout_then)}" data-expired-text="{_e(item.expired_text)}" '
            f'title="{_e(title)}">{shown}</span>'
        )
    out.append("\n        ")
    version = item.version
    if version > 1:
        out.append(f'<span class="version-chip">arguments v{_e(version)}</span>')
    run = r.run
    starter = run.starter_label
    iso, title = page.times(r.created_at)
    out.append(
        '\n      </div>\n    </header>\n    <p class="meta">Run <a class="mono" href="'
        f'{_e(page.run_url(r.run_id))}">{_e(r.run_id)}</a>\n      · {_e(run.workflow_name)}'
        f'<span class="muted">@{_e(run.workflow_version)}</span>\n      · started by '
        + (_e(starter) if starter != "unknown" else '<span class="muted">unknown</span>')
        + f'\n      · requested <time datetime="{_e(iso)}" title="{_e(title)}">'
        f"{_e(ago(r.created_at))}</time>\n      "
    )
    if r.approver_group:
        out.append(f"· for the group {_e(r.approver_group.name)}")
    out.append("\n      ")
    if r.required_approvals > 1:
        out.append(
            f"· {_e(item.approvals_so_far)} of {_e(r.required_approvals)} approvals so far"
            + (f" of version {_e(version)}" if version > 1 else "")
        )
    heading = "Parameters" if item.kind == "params" else "Details"
    if version > 1:
        heading += f' <span class="muted">(version {_e(version)})</span>'
    out.append(
        '\n    </p>\n    \n    <p class="note expired-note"'
        + ("" if expired else " hidden")
        + ">This request is past its deadline: decisions are refused and the timeout "
        'applies.</p>\n    <div class="approval-body">\n      <div>\n        '
        f"<h3>{heading}</h3>\n        \n        "
        + _payload(item.payload, "approval-payload", r.pk, r.run_id)
        + "\n        \n      </div>\n      <div>\n        <h3>Last steps of the run</h3>\n        "
    )
    if item.last_steps:
        out.append('\n        <ol class="mini-steps">\n          ')
        for s in item.last_steps:
            out.append(
                f'<li><span class="badge status-{_e(s.status)}">'
                f'{_e(_label(_STEP_LABELS, s.status))}</span> <span class="mono">{_e(s.step_id)}'
                "</span>"
            )
            if s.tool_name and s.tool_name != s.step_id:
                out.append(f' <span class="muted">{_e(s.tool_name)}</span>')
            out.append("</li>")
        out.append("\n        </ol>\n        ")
    else:
        out.append('<p class="muted">No steps yet.</p>')
    decide = _e(reverse("dashboard:decide", args=[r.pk]))
    disabled = " disabled" if expired else ""
    out.append(
        "\n      </div>\n    </div>\n    \n"
        f'    <form class="decide" method="post" action="{decide}" hx-post="{decide}" '
        'hx-target="#inbox" hx-swap="outerHTML">\n      '
        + csrf
        + f'\n      <input type="hidden" name="version" value="{_e(version)}">\n'
        '      <div class="field">\n'
        f'        <label for="comment-{pk}">Comment <span class="muted">(required to reject; '
        "the agent receives it)</span></label>\n"
        f'        <textarea name="comment" id="comment-{pk}" rows="2" maxlength="4000">'
        "</textarea>\n        \n      </div>\n      \n      \n      \n"
        '      <div class="decide-buttons">\n        \n'
        '        <button type="submit" name="decision" value="approve" class="btn primary"'
        f"{disabled}>Approve</button>\n        \n"
        '        <button type="submit" name="decision" value="reject" class="btn danger"'
        f"{disabled}>Reject</button>\n      </div>\n    </form>\n  </article>\n  "
    )
    return "".join(out)


def approval_items(items: Iterable[Any], refused: Any, csrf_token: Any) -> SafeString:
    """The ``<article>`` of each :class:`dashboard.selectors.InboxItem` (HTML, every value
    escaped), as ``_approval.html`` renders them."""
    page = _Page()
    csrf = _csrf_input(csrf_token)
    template = None
    out = []
    for item in items:
        k = kept(refused, "approval", item.request.pk)
        if _plain(item, k):
            out.append(_item(page, item, csrf))
            continue
        template = template or get_template("dashboard/_approval.html")
        context = {"item": item, "r": item.request, "refused": refused, "csrf_token": csrf_token}
        out.append("\n  " + template.render(context).strip() + "\n  ")
    # every value is escaped by _e or by the template
    return mark_safe("".join(out))
