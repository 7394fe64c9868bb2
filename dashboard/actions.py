"""The dashboard's POST actions: thin wrappers around the services.

Each action checks its permission (403 naming it), validates a small form (422 with the
errors), calls one service, and answers:

- HTMX: the page's refreshed fragment with a message -- 200 when it worked, 409 when the
  action became illegal while the page was open (``IllegalTransition``,
  ``AlreadyDecided``), 422 for bad input;
- a plain form post: a redirect to the page with a message (POST/redirect/GET), or the
  whole page with the message and the same status codes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from approvals.access import require_perm
from approvals.models import ApprovalRequest
from approvals.roles import DECIDE_APPROVAL, OPERATE_RUN
from approvals.services import (
    AlreadyDecided,
    ApprovalExpired,
    ApprovalNotFound,
    ArgumentsChanged,
    InvalidEdit,
    NotAllowed,
    approval_decide,
)
from durable.exceptions import IllegalTransition, PayloadError, RunNotFound
from durable.models import TERMINAL, Operation, Run, RunStatus
from durable.services.forks import fork_points
from durable.services.runs import (
    OperationNotFound,
    operation_lookup,
    operation_reconcile,
    run_cancel,
    run_compensate,
    run_fork,
    run_resume,
    run_signal,
)

from . import views
from .forms import DecisionForm, ForkForm, ReasonForm, ReconcileForm, ResumeForm, SignalForm

SUCCESS, WARNING, ERROR = "success", "warning", "error"
_LEVELS = {SUCCESS: messages.SUCCESS, WARNING: messages.WARNING, ERROR: messages.ERROR}


def _flash(level: str, text: str) -> dict[str, str]:
    return {"level": level, "text": text}


def _answer(
    request: HttpRequest,
    *,
    page: str,
    run_id: str = "",
    level: str,
    text: str,
    status: int = 200,
    extra: dict[str, Any] | None = None,
    show: bool = False,
) -> HttpResponse:
    """Re-render ``page`` ("detail", "attention" or "approvals") with a message; a plain
    form post that worked is redirected to it, unless ``show`` (``extra`` is what the
    page must show, such as a lookup's answer: nothing changed, so nothing is lost by
    posting again)."""
    extra = dict(extra or {})
    if page == "attention":
        template, fragment = "dashboard/attention.html", "content"
        url = reverse("dashboard:attention")
        build: Callable[..., dict[str, Any]] = views.attention_context
        args: tuple = ()
    elif page == "approvals":
        template, fragment = "dashboard/approvals.html", "inbox"
        url = reverse("dashboard:approvals")
        build, args = views.inbox_context, ()
    else:
        template, fragment = "dashboard/run_detail.html", "main"
        url = reverse("dashboard:run", args=[run_id])
        build, args = views.run_context, (run_id,)
    if not views.wants_fragment(request) and status == 200 and not show:
        messages.add_message(request, _LEVELS.get(level, messages.ERROR), text)
        return redirect(url)
    context = build(request, *args, flash=_flash(level, text), **extra)
    return views.page_or_fragment(request, template, fragment, context, status=status)


def _form_errors(form: Any) -> str:
    parts = []
    for field_name, errors in form.errors.items():
        label = form.fields[field_name].label if field_name in form.fields else ""
        label = label or field_name.replace("_", " ").capitalize()
        parts.append(
            f"{label}: {' '.join(errors)}" if field_name != "__all__" else " ".join(errors)
        )
    return "Please correct the form. " + " ".join(parts)


def _kept(form: Any, key: Any, **extra: Any) -> dict[str, Any]:
    """What the user typed into a refused form, to show it again with its errors."""
    data = {name: form.data.get(name, "") for name in form.fields}
    return {"refused": {"key": key, "data": data, "errors": form.errors, **extra}}


def _return_to(form: Any, default: str = "detail") -> str:
    value = form.data.get("return_to")
    return value if value in ("detail", "attention") else default


# --- runs ------------------------------------------------------------------------------

RUN_ACTIONS = {
    "cancel": (
        ReasonForm,
        ("Cancelled run {id}. Steps already done stay done; compensate to undo its writes."),
    ),
    "compensate": (
        ReasonForm,
        ("Compensation of run {id} started: its completed writes are undone, newest first."),
    ),
    "resume": (
        ResumeForm,
        ("Resumed run {id}: completed steps replay, the failed step runs again."),
    ),
    "fork": (ForkForm, "Forked run {id} into {new}."),
}


@require_POST
@require_perm(OPERATE_RUN)
def run_action(request: HttpRequest, run_id: str, action: str) -> HttpResponse:
    if action not in RUN_ACTIONS:
        raise Http404(f"There is no action “{action}”.")
    form_class, done = RUN_ACTIONS[action]
    run = views.selectors.get_run(run_id)
    if run is None:
        raise Http404(f"There is no run with the id “{run_id}”.")
    if form_class is ForkForm:
        form = ForkForm(
            request.POST,
            step_ids=fork_points(
                run.steps.order_by("position").only("run_id", "step_id", "kind", "status")
            ),
        )
    else:
        form = form_class(request.POST)
    page = _return_to(form)
    if not form.is_valid():
        return _answer(
            request, page=page, run_id=run_id, level=ERROR, text=_form_errors(form), status=422
        )
    data = form.cleaned_data
    reason = data.get("reason") or ""
    try:
        if action == "cancel":
            run_cancel(run_id=run_id, by=request.user, reason=reason)
        elif action == "compensate":
            run_compensate(run_id=run_id, by=request.user, reason=reason)
        elif action == "resume":
            minutes = data.get("deadline_minutes")
            run_resume(
                run_id=run_id,
                by=request.user,
                reason=reason,
                extra_steps=data.get("extra_steps") or 0,
                deadline_seconds=minutes * 60 if minutes else None,
            )
        else:
            fork = run_fork(
                run_id=run_id, from_step=data["from_step"], by=request.user, reason=reason
            )
            messages.success(request, done.format(id=run_id, new=fork.id))
            url = reverse("dashboard:run", args=[fork.id])
            if views.wants_fragment(request):
                return HttpResponseClientRedirect(url)
            return redirect(url)
    except RunNotFound as exc:
        raise Http404(str(exc)) from exc
    except IllegalTransition as exc:
        return _answer(
            request,
            page=page,
            run_id=run_id,
            level=ERROR,
            status=409,
            text=f"Nothing changed: {exc}. The page now shows the run as it is.",
        )
    except ValueError as exc:
        return _answer(request, page=page, run_id=run_id, level=ERROR, text=str(exc), status=422)
    return _answer(
        request, page=page, run_id=run_id, level=SUCCESS, text=done.format(id=run_id, new="")
    )


@require_POST
@require_perm(OPERATE_RUN)
def run_signal_view(request: HttpRequest, run_id: str) -> HttpResponse:
    """Send a signal from the run page; the answer says whether a wait took it or it was
    kept in the mailbox, and names the waits of the run when the name matches none."""
    if views.selectors.get_run(run_id) is None:
        raise Http404(f"There is no run with the id “{run_id}”.")
    form = SignalForm(request.POST)
    if not form.is_valid():
        return _answer(
            request,
            page="detail",
            run_id=run_id,
            level=ERROR,
            text=_form_errors(form),
            status=422,
            extra=_kept(form, "signal"),
        )
    data = form.cleaned_data
    try:
        sent = run_signal(
            run_id=run_id, name=data["name"], payload=data.get("payload"), by=request.user
        )
    except RunNotFound as exc:
        raise Http404(str(exc)) from exc
    except IllegalTransition as exc:
        return _answer(
            request,
            page="detail",
            run_id=run_id,
            level=ERROR,
            status=409,
            text=f"Nothing changed: {exc}. The page now shows the run as it is.",
        )
    except (PayloadError, ValueError) as exc:
        return _answer(
            request,
            page="detail",
            run_id=run_id,
            level=ERROR,
            text=str(exc),
            status=422,
            extra=_kept(form, "signal"),
        )
    text = sent.message[:1].upper() + sent.message[1:] + "."
    return _answer(
        request,
        page="detail",
        run_id=run_id,
        level=WARNING if sent.misaddressed else SUCCESS,
        text=text,
    )


# --- operations -----------------------------------------------------------------------

RECONCILED = {
    "happened": "Recorded that {tool} happened; run {run} continues with that result.",
    "not_happened": "Recorded that {tool} did not happen; run {run} calls it again with "
    "the same idempotency key.",
    "abort": "Aborted run {run} at the unknown outcome of {tool}.",
}


@require_POST
@require_perm(OPERATE_RUN)
def operation_reconcile_view(request: HttpRequest, operation_id: int) -> HttpResponse:
    op = Operation.objects.filter(pk=operation_id).only("pk", "run_id", "tool_name").first()
    if op is None:
        raise Http404(f"There is no operation {operation_id}.")
    form = ReconcileForm(request.POST)
    page = _return_to(form, default="attention")
    if not form.is_valid():
        return _answer(
            request,
            page=page,
            run_id=op.run_id,
            level=ERROR,
            text=_form_errors(form),
            status=422,
            extra=_kept(form, f"op-{op.pk}-{form.data.get('outcome', '')}"),
        )
    data = form.cleaned_data
    try:
        operation_reconcile(
            operation_id=op.pk,
            outcome=data["outcome"],
            result=data.get("result"),
            external_id=data.get("external_id") or "",
            by=request.user,
            reason=data.get("reason") or "",
        )
    except OperationNotFound as exc:
        raise Http404(str(exc)) from exc
    except IllegalTransition as exc:
        return _answer(
            request,
            page=page,
            run_id=op.run_id,
            level=ERROR,
            status=409,
            text=f"Nothing changed: {exc}. The page now shows what is left to decide.",
        )
    except (PayloadError, ValueError) as exc:
        return _answer(
            request,
            page=page,
            run_id=op.run_id,
            level=ERROR,
            text=str(exc),
            status=422,
            extra=_kept(form, f"op-{op.pk}-{data['outcome']}"),
        )
    status = Run.objects.filter(pk=op.run_id).values_list("status", flat=True).first()
    if status == RunStatus.COMPENSATING:
        text = (
            f"Recorded that {op.tool_name} "
            f"{'happened' if data['outcome'] == 'happened' else 'did not happen'}; "
            f"the compensation of run {op.run_id} goes on."
        )
    elif status in TERMINAL and data["outcome"] != "abort":
        text = (
            f"Recorded in the ledger that {op.tool_name} "
            f"{'happened' if data['outcome'] == 'happened' else 'did not happen'}; "
            f"run {op.run_id} stays {status}."
        )
    else:
        text = RECONCILED[data["outcome"]].format(tool=op.tool_name, run=op.run_id)
    return _answer(request, page=page, run_id=op.run_id, level=SUCCESS, text=text)


@require_POST
@require_perm(OPERATE_RUN)
def operation_lookup_view(request: HttpRequest, operation_id: int) -> HttpResponse:
    """ "Look it up again": the tool's reconcile hook, asked now; the page shows its answer
    on the operation's card, with the decision it suggests filled in. Nothing changes
    until the operator decides (:func:`operation_reconcile_view`)."""
    op = Operation.objects.filter(pk=operation_id).only("pk", "run_id", "tool_name").first()
    if op is None:
        raise Http404(f"There is no operation {operation_id}.")
    page = _return_to(ReasonForm(request.POST), default="attention")
    try:
        found = operation_lookup(operation_id=op.pk)
    except OperationNotFound as exc:
        raise Http404(str(exc)) from exc
    except IllegalTransition as exc:
        return _answer(
            request,
            page=page,
            run_id=op.run_id,
            level=ERROR,
            status=409,
            text=f"Nothing to look up: {exc}. The page now shows what is left to decide.",
        )
    if found.found is True:
        level, text = (
            SUCCESS,
            (
                f"The reconcile hook of {op.tool_name} found the write: it happened. Check its "
                "result below, then record it."
            ),
        )
    elif found.found is False:
        level, text = (
            SUCCESS,
            (
                f"The reconcile hook of {op.tool_name} did not find the write: it did not "
                "happen. Record that to call it again with the same idempotency key."
            ),
        )
    else:
        level, text = WARNING, f"The lookup could not tell: {found.error}."
    result = (
        ""
        if found.found is not True
        else json.dumps(found.result, indent=2, default=str, ensure_ascii=False)
    )
    context = {
        "lookup": {
            "op": op.pk,
            "found": found.found,
            "result": result,
            "external_id": found.external_id,
            "error": found.error,
        }
    }
    return _answer(
        request, page=page, run_id=op.run_id, level=level, text=text, extra=context, show=True
    )


# --- approvals ------------------------------------------------------------------------


@require_POST
@require_perm(DECIDE_APPROVAL)
def approval_decide_view(request: HttpRequest, request_id: int) -> HttpResponse:
    """Decide a request from the inbox, or in place on its run's page (``return_to=detail``:
    the answer is that page). Both call the same service, with the same checks."""
    run_id = ApprovalRequest.objects.filter(pk=request_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise Http404(f"There is no approval request {request_id}.")
    form = DecisionForm(request.POST)
    page = "detail" if form.data.get("return_to") == "detail" else "approvals"
    if not form.is_valid():
        return _answer(
            request,
            page=page,
            run_id=run_id,
            level=ERROR,
            text=_form_errors(form),
            status=422,
            extra=_kept(form, f"approval-{request_id}"),
        )
    data = form.cleaned_data
    approve = data["decision"] in ("approve", "edit")
    edited = data.get("parameters")
    try:
        req = approval_decide(
            request_id=request_id,
            user=request.user,
            approve=approve,
            comment=data.get("comment") or "",
            edited=edited,
            version=data.get("version"),
        )
    except ApprovalNotFound as exc:
        raise Http404(str(exc)) from exc
    except ApprovalExpired as exc:
        # the deadline passed: the timeout decided (rejected, or escalated) instead
        return _answer(
            request, page=page, run_id=run_id, level=ERROR, status=409, text=f"Refused: {exc}."
        )
    except ArgumentsChanged as exc:
        return _answer(
            request,
            page=page,
            run_id=run_id,
            level=ERROR,
            status=409,
            text=f"Nothing recorded: {exc}.",
        )
    except NotAllowed as exc:
        return _answer(
            request,
            page=page,
            run_id=run_id,
            level=ERROR,
            status=403,
            text=f"Not allowed: {exc}. Missing: {', '.join(exc.missing)}.",
        )
    except (AlreadyDecided, IllegalTransition) as exc:
        return _answer(
            request,
            page=page,
            run_id=run_id,
            level=ERROR,
            status=409,
            text=f"Nothing changed: {exc}.",
        )
    except InvalidEdit as exc:
        # the field errors go next to the edit box; the request stays pending
        return _answer(
            request,
            page=page,
            run_id=run_id,
            level=ERROR,
            status=422,
            text="The edited parameters were refused; the request is still "
            "pending. " + _edit_errors(exc),
            extra=_kept(
                form,
                f"approval-{request_id}",
                arg_errors=[{"field": f, "messages": m} for f, m in exc.errors.items()],
            ),
        )
    except (PayloadError, ValueError) as exc:
        return _answer(
            request,
            page=page,
            run_id=run_id,
            level=ERROR,
            text=str(exc),
            status=422,
            extra=_kept(form, f"approval-{request_id}"),
        )
    if req.status == "pending":
        text = (
            f"Your approval of “{req.title}” is recorded; it needs "
            f"{req.required_approvals} approvals in all."
        )
        if edited is not None and req.required_approvals > 1:
            text += " You edited the arguments: earlier approvals no longer count."
    elif approve:
        text = (
            f"Approved “{req.title}”"
            + (" with edited parameters." if edited is not None else ".")
            + f" Run {req.run_id} continues."
        )
    else:
        text = f"Rejected “{req.title}”. The agent of run {req.run_id} receives your comment."
    return _answer(request, page=page, run_id=run_id, level=SUCCESS, text=text)


def _edit_errors(exc: InvalidEdit) -> str:
    return " ".join(
        f"{field}: {'; '.join(msgs)}." if field else f"{'; '.join(msgs)}."
        for field, msgs in exc.errors.items()
    )


@require_POST
@require_perm(DECIDE_APPROVAL)
def approve_identical_view(request: HttpRequest) -> HttpResponse:
    """Approve several identical low-risk requests with one comment (the inbox's batch).

    ``requests``: ``"<id>:<version>"`` each, as the inbox showed them. The server checks
    again that they ask the same (:func:`dashboard.selectors.inbox.identity`) of a tool
    whose class may be batched (:data:`~dashboard.selectors.inbox.BATCH_SAFETY`), with one
    approval each; then each is decided on its own through the same service as a single
    decision (audited per request in the approver's name). A request decided, edited or
    expired meanwhile is skipped, and the answer says which and why."""
    from approvals.models import ApprovalRequest as Request

    from .selectors.inbox import BATCH_SAFETY, identity

    wanted: dict[int, int] = {}
    for raw in request.POST.getlist("requests"):
        pk, _, version = raw.partition(":")
        if not (pk.isdigit() and version.isdigit()):
            return _answer(
                request, page="approvals", level=ERROR, status=422, text=f"Bad request id {raw!r}."
            )
        wanted[int(pk)] = int(version)
    comment = (request.POST.get("comment") or "").strip()[:4000]
    found = list(Request.objects.select_related("arguments").filter(pk__in=wanted))
    if len(wanted) < 2 or len(found) != len(wanted):
        return _answer(
            request,
            page="approvals",
            level=ERROR,
            status=422,
            text="Approving together needs two or more requests that exist.",
        )
    if len({identity(r) for r in found}) != 1:
        return _answer(
            request,
            page="approvals",
            level=ERROR,
            status=422,
            text="These requests are not identical (tool and arguments); decide them one by one.",
        )
    if found[0].safety not in BATCH_SAFETY or any(r.required_approvals > 1 for r in found):
        return _answer(
            request,
            page="approvals",
            level=ERROR,
            status=422,
            text=f"{found[0].tool_name} is a {found[0].safety.replace('_', ' ') or 'workflow'} "
            "request or needs several approvals: decide each on its own.",
        )
    approved, skipped = [], []
    for r in sorted(found, key=lambda r: (r.created_at, r.pk)):
        try:
            approval_decide(
                request_id=r.pk,
                user=request.user,
                approve=True,
                comment=comment,
                version=wanted[r.pk],
            )
        except (
            ApprovalNotFound,
            ApprovalExpired,
            ArgumentsChanged,
            NotAllowed,
            AlreadyDecided,
            IllegalTransition,
        ) as exc:
            skipped.append(f"#{r.pk}: {exc}")
        else:
            approved.append(r)
    text = f"Approved {len(approved)} identical request(s) for {found[0].tool_name}."
    if skipped:
        text += " Not approved: " + "; ".join(skipped) + "."
    return _answer(request, page="approvals", level=WARNING if skipped else SUCCESS, text=text)
